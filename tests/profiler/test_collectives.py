"""Collectives: gloo pairing and nccl-tests bandwidths on tiny frames; byte counts on real runs."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import collective_skew, collective_stats, collectives, load_traces, stragglers
from tests.profiler.conftest import kernel, launch, make_events, step

RANKS = pl.DataFrame({"run": ["r"], "rank": [0], "pg_config": ['[{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]'],
                      "world_size": [2]}).with_columns(pl.col("run").cast(pl.Categorical), pl.col("rank").cast(pl.Int32))


def gloo_rank(rank: int, offset: float) -> pl.DataFrame:
    # Main thread enqueues an all-reduce of 10 floats then a reduce-scatter of 8 -> 4 floats;
    # gloo runs them (the reduce-scatter as an all-reduce of the 8) on two worker threads.
    return make_events([
        step(1, 0, 1000),
        dict(name="c10d::allreduce_", kind="enqueue", ts_us=10 + offset, dur_us=2, arg_nelems=[10, None], arg_types=["TensorList", ""]),
        dict(name="c10d::_reduce_scatter_base_", kind="enqueue", ts_us=20 + offset, dur_us=2, arg_nelems=[4, 8], arg_types=["float", "float"]),
        dict(name="gloo:all_reduce", kind="comm", tid=2, ts_us=12 + offset, dur_us=100, arg_nelems=[10], arg_types=["float"]),
        dict(name="gloo:all_reduce", kind="comm", tid=3, ts_us=200 + offset, dur_us=50, arg_nelems=[8], arg_types=["float"]),
    ], rank=rank)


def test_gloo_pairing_and_bytes():
    c = collectives(gloo_rank(0, 0), RANKS).sort("start_us")
    assert c["collective"].to_list() == ["all_reduce", "reduce_scatter"]
    assert c["algo"].to_list() == ["all_reduce", "all_reduce"]
    assert c["in_bytes"].to_list() == [40, 32]
    assert c["out_bytes"].to_list() == [40, 16]
    assert c["size_bytes"].to_list() == [40, 32]
    assert c["group_size"].to_list() == [2, 2]
    assert c["note"][1] is not None and "all_reduce" in c["note"][1]


def test_busbw_uses_nccl_tests_factors():
    c = collectives(gloo_rank(0, 0), RANKS)
    s = collective_stats(c).sort("collective")
    # all-reduce: 40 B in 100 µs = 0.0004 GB/s algbw; busbw * 2(n-1)/n = 1 at n=2
    ar = s.filter(pl.col("collective") == "all_reduce").row(0, named=True)
    assert ar["algbw_gbps"] == pytest.approx(40 / 100 / 1e3)
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * (2 - 1) / 2)


def test_gpu_collectives_from_kernel_names_and_args():
    ev = make_events([
        step(1, 0, 100), launch(1, 1), launch(2, 2),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "comm", 10, 10, 1,
               collective="_allgather_base", in_nelems=100, out_nelems=400, dtype="Float", group_size=4, group_ranks="[0, 1, 2, 3]"),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "comm", 30, 10, 2),
    ])
    c = collectives(ev).sort("start_us")
    assert c["collective"].to_list() == ["all_gather", "all_reduce"]
    assert c["size_bytes"].to_list() == [1600, None]  # all-gather size = output; no args -> unknown
    assert c["dtype"].to_list() == ["Float", "float"]
    s = collective_stats(c).filter(pl.col("collective") == "all_gather").row(0, named=True)
    assert s["busbw_gbps"] == pytest.approx(1600 / 10 / 1e3 * 3 / 4)


def test_skew_and_straggler():
    both = pl.concat([gloo_rank(0, 0), gloo_rank(1, 7)])
    ranks = pl.concat([RANKS, RANKS.with_columns(rank=pl.lit(1, pl.Int32))])
    skew = collective_skew(collectives(both, ranks))
    assert skew["spread_us"].to_list() == [7, 7] and skew["last_rank"].to_list() == [1, 1]
    s = stragglers(skew).row(0, named=True)
    assert (s["rank"], s["times_last"], s["share_pct"]) == (1, 2, 100.0)


@pytest.mark.multirank
def test_ddp_all_reduces_move_the_parameters_each_step(runs):
    run = runs("ddp", 2)
    traces = load_traces(run)
    param_bytes = traces.runs[run.name]["model"]["n_params"] * 4
    c = collectives(traces.events, traces.ranks).filter(pl.col("collective") == "all_reduce")
    per_step = c.group_by("rank", "step").agg(pl.col("in_bytes").sum())
    assert per_step.height == 2 * 2  # 2 ranks x 2 profiled steps
    assert (per_step["in_bytes"] == param_bytes).all(), per_step


@pytest.mark.multirank
def test_fsdp_gathers_and_scatters_the_shards(runs):
    run = runs("fsdp", 2)
    traces = load_traces(run)
    shard_bytes = {r["rank"]: r["memory"]["params_at_rest_bytes"] for r in traces.runs[run.name]["ranks"]}
    c = collectives(traces.events, traces.ranks)
    assert set(c["collective"]) == {"all_gather", "reduce_scatter"}
    rs = c.filter(pl.col("collective") == "reduce_scatter")
    # each step reduce-scatters every gradient once: the outputs are this rank's shards
    per_step = rs.group_by("rank", "step").agg(pl.col("out_bytes").sum(), pl.col("in_bytes").sum())
    for row in per_step.iter_rows(named=True):
        assert row["out_bytes"] == shard_bytes[row["rank"]]
        assert row["in_bytes"] == 2 * shard_bytes[row["rank"]]
    assert rs["algo"].unique().to_list() == ["all_reduce"]  # gloo's reduce-scatter is an all-reduce
    ag = c.filter(pl.col("collective") == "all_gather")
    # forward gathers every unit once: inputs are the shards
    first_pass = ag.filter(pl.col("seq") < ag.group_by("rank", "step").len()["len"].min() // 2)
    assert first_pass.height > 0
    assert (ag["out_bytes"] == 2 * ag["in_bytes"]).all()

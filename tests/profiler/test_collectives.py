"""Collectives: gloo pairing and nccl-tests bandwidths on tiny frames; byte counts on real runs."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import collective_skew, collective_stats, collectives, load_traces, stragglers, temporal_breakdown
from tests.profiler.conftest import GPU_NCCL, kernel, launch, make_events, step

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
    # no pg_config: the group is unknown (not the world size), so busbw is refused
    bare = collectives(gloo_rank(0, 0), RANKS.with_columns(pg_config=pl.lit(None, pl.String)))
    assert bare["group_size"].to_list() == [None, None]
    assert collective_stats(bare)["busbw_gbps"].to_list() == [None, None]


def test_busbw_uses_nccl_tests_factors():
    c = collectives(gloo_rank(0, 0), RANKS)
    s = collective_stats(c).sort("collective")
    # all-reduce: 40 B in 100 µs = 0.0004 GB/s algbw; busbw * 2(n-1)/n = 1 at n=2
    ar = s.filter(pl.col("collective") == "all_reduce").row(0, named=True)
    assert ar["algbw_gbps"] == pytest.approx(40 / 100 / 1e3)
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * (2 - 1) / 2)


def test_gloo_sends_and_receives_keep_their_time_but_get_no_bandwidth():
    # gloo's isend / irecv: a main-thread span from the post to the wait that completes it
    # (sample-1f1b-2r: 16 KiB "taking" 2.5 ms each): not the transfer, so no bandwidth and no α–β fit.
    from profiler.alphabeta import fit_alpha_beta
    from profiler.collectives import GLOO_P2P_NOTE

    events = make_events([
        step(1, 0, 1000),
        dict(name="c10d::allreduce_", kind="enqueue", ts_us=10, dur_us=2, arg_nelems=[10, None], arg_types=["TensorList", ""]),
        dict(name="gloo:all_reduce", kind="comm", tid=2, ts_us=12, dur_us=100, arg_nelems=[10], arg_types=["float"]),
        dict(name="c10d::send", kind="enqueue", ts_us=400, dur_us=5, arg_nelems=[1024, None], arg_types=["TensorList", ""]),
        dict(name="gloo:send", kind="comm", ts_us=402, dur_us=300, arg_nelems=[1024], arg_types=["float"]),
        dict(name="c10d::recv_", kind="enqueue", ts_us=710, dur_us=5, arg_nelems=[1024, None], arg_types=["TensorList", ""]),
        dict(name="gloo:recv", kind="comm", ts_us=712, dur_us=200, arg_nelems=[1024], arg_types=["float"]),
    ], rank=0)
    c = collectives(events, RANKS)
    p2p = c.filter(pl.col("collective").is_in(["send", "recv"])).sort("start_us")
    assert p2p["collective"].to_list() == ["send", "recv"] and p2p["size_bytes"].to_list() == [4096, 4096]
    assert p2p["note"].to_list() == [GLOO_P2P_NOTE] * 2
    s = {r["collective"]: r for r in collective_stats(c).iter_rows(named=True)}
    assert (s["send"]["total_us"], s["recv"]["total_us"]) == (300.0, 200.0)  # the time is kept
    assert [s[k][b] for k in ("send", "recv") for b in ("algbw_gbps", "busbw_gbps")] == [None] * 4
    assert s["all_reduce"]["busbw_gbps"] == pytest.approx(40 / 100 / 1e3)  # the collectives keep theirs
    fits = {r["collective"]: r for r in fit_alpha_beta(c, RANKS.with_columns(backend=pl.lit("gloo"))).iter_rows(named=True)}
    assert fits["send"]["beta_gbps"] is None and fits["send"]["note"] == "span = post to wait, not the transfer: no fit"
    assert fits["recv"]["n_calls"] == 1 and fits["recv"]["alpha_us"] is None
    # NCCL's send / recv kernels are the transfer (with the peer's wait, as nccl-tests times them): bandwidth kept.
    nccl = p2p.with_columns(source=pl.lit("nccl"), note=pl.lit(None, pl.String))
    assert collective_stats(nccl)["algbw_gbps"].is_not_null().all()


def test_calls_in_flight_together_count_once_in_the_wall_time_and_the_bandwidth():
    # a ring's two irecvs of 1000 B in flight together: [0, 100) and [50, 150) µs
    c = pl.DataFrame({"run": ["r", "r"], "rank": [0, 0], "collective": ["recv", "recv"], "algo": ["recv", "recv"],
                      "group": ["0", "0"], "group_size": [2, 2], "dtype": ["float", "float"], "size_bytes": [1000, 1000],
                      "start_us": [0.0, 50.0], "end_us": [100.0, 150.0], "dur_us": [100.0, 100.0], "note": [None, None]},
                     schema_overrides={"rank": pl.Int32, "note": pl.String})
    s = collective_stats(c).row(0, named=True)
    assert (s["count"], s["total_us"], s["wall_us"]) == (2, 200.0, 150.0)  # summed call time vs their union
    assert s["algbw_gbps"] == pytest.approx(2000 / 150 / 1e3) and s["busbw_gbps"] == s["algbw_gbps"]  # recv: factor 1
    # apart, the union is the sum
    apart = collective_stats(c.with_columns(start_us=pl.Series([0.0, 200.0]), end_us=pl.Series([100.0, 300.0]))).row(0, named=True)
    assert apart["wall_us"] == apart["total_us"] == 200.0


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


SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def nccl_call(op: str, ts: float, corr: int, nelems: int, dtype: str, *, c10d: tuple | None = None, tid: int = 1) -> list[dict]:
    """An older torch's NCCL collective: `c10d::<op>_` > `nccl:<op>` (Input Dims of the input) >
    cudaLaunchKernel, and no args on the kernel."""
    rows = [dict(name=f"nccl:{op}", kind="enqueue", cat="user_annotation", ts_us=ts, dur_us=5, tid=tid,
                 arg_nelems=[nelems], arg_types=[dtype]),
            launch(ts + 2, corr, tid=tid)]
    if c10d:
        name, nelems_args, types = c10d
        rows.append(dict(name=name, kind="enqueue", ts_us=ts - 1, dur_us=7, tid=tid, arg_nelems=nelems_args, arg_types=types))
    return rows


def test_gpu_collectives_from_the_annotation_around_the_launch():
    # A SendRecv kernel (no args) inside nccl:all_to_all is an all-to-all of the annotation's 100 floats
    # over the trace's 4-rank group; an all-gather's group is its output / input (pg_config is silent
    # when it lists two groups); a kernel with no annotation keeps what its name says.
    ranks = pl.DataFrame({"run": ["r"], "rank": [0], "world_size": [8],
                          "pg_config": ['[{"pg_name": "0", "pg_size": 4, "ranks": [0, 1, 2, 3]}]']}).with_columns(
        pl.col("run").cast(pl.Categorical), pl.col("rank").cast(pl.Int32))
    ev = make_events([
        step(1, 0, 1000),
        *nccl_call("all_to_all", 10, 1, 100, "float", c10d=("c10d::alltoall_base_", [120, 100, None], ["float", "float", "Scalar"])),
        kernel(SENDRECV, "comm", 20, 10, 1),
        *nccl_call("_all_gather_base", 100, 2, 50, "c10::BFloat16", c10d=("c10d::_allgather_base_", [400, 50], ["c10::BFloat16"] * 2)),
        kernel(SENDRECV, "comm", 120, 20, 2),
        launch(300, 3), kernel(SENDRECV, "comm", 310, 10, 3),
    ])
    c = collectives(ev, ranks).sort("start_us")
    assert c["collective"].to_list() == ["all_to_all", "all_gather", "send_recv"]
    assert c["dtype"].to_list() == ["float", "c10::BFloat16", "int8_t"]
    assert c["in_bytes"].to_list() == [400, 100, None]
    assert c["out_bytes"].to_list() == [480, 800, None]
    assert c["size_bytes"].to_list() == [400, 800, None]  # all-to-all: what it sends; all-gather: its output
    assert c["group_size"].to_list() == [4, 8, 4]  # the trace's only group, else the all-gather's own
    s = collective_stats(c)
    a2a = s.filter(pl.col("collective") == "all_to_all").row(0, named=True)
    assert a2a["busbw_gbps"] == pytest.approx(400 / 10 / 1e3 * 3 / 4)
    ag = s.filter(pl.col("collective") == "all_gather").row(0, named=True)
    assert ag["busbw_gbps"] == pytest.approx(800 / 20 / 1e3 * 7 / 8)
    # one nccl:all_reduce around two comm launches (a coalesced group): the op, but no sizes
    group = make_events([
        step(1, 0, 1000), *nccl_call("all_reduce", 10, 1, 100, "float"), launch(13, 2),
        kernel(SENDRECV, "comm", 20, 10, 1), kernel(SENDRECV, "comm", 40, 10, 2),
    ])
    g = collectives(group, ranks)
    assert g["collective"].to_list() == ["all_reduce"] * 2 and g["in_bytes"].to_list() == [None, None]
    # two groups in pg_config and no name on the call: the all-to-all's group is unknown (never the
    # world size guessed), and so is its busbw
    two = ranks.with_columns(pg_config=pl.lit('[{"pg_name": "0", "pg_size": 4}, {"pg_name": "1", "pg_size": 2}]'))
    c2 = collectives(ev, two).sort("start_us")
    assert c2["group_size"].to_list() == [None, 8, None]
    assert collective_stats(c2).filter(pl.col("collective") == "all_to_all")["busbw_gbps"].to_list() == [None]


def test_sizes_of_an_older_nccl_trace_match_an_independent_count():
    # gpu_nccl_2_of_128 rank 0: NCCL kernels without args, all of them SendRecv; counted by hand
    # from its nccl:<op> / c10d annotations (issue 12).
    traces = load_traces(GPU_NCCL)
    stats = collective_stats(collectives(traces.events, traces.ranks)).filter(pl.col("rank") == 0)
    by = stats.group_by("collective").agg(pl.col("total_bytes", "total_us").sum(), pl.col("group_size").first())
    got = {r["collective"]: r for r in by.iter_rows(named=True)}
    assert set(got) == {"all_gather", "all_reduce", "all_to_all"}  # no send_recv left
    assert got["all_gather"]["total_bytes"] == 2_147_483_648 and got["all_gather"]["total_us"] == 106_140
    assert got["all_gather"]["group_size"] == 64
    ag = stats.filter(pl.col("collective") == "all_gather").row(0, named=True)
    assert ag["busbw_gbps"] == pytest.approx(19.9, abs=0.05)
    assert got["all_reduce"]["total_bytes"] == 314_195_708
    assert got["all_to_all"]["total_bytes"] == 850_250_752
    assert "int8_t" not in stats["dtype"].to_list()
    # the all-to-alls are matched across the two ranks (they were point-to-point send_recv before):
    # each rank's raw trace holds 4 `nccl:all_to_all` annotations (counted with gzip + json)
    skew = collective_skew(collectives(traces.events, traces.ranks))
    assert skew.filter(pl.col("algo") == "all_to_all").height == 4


def test_skew_and_straggler():
    both = pl.concat([gloo_rank(0, 0), gloo_rank(1, 7)])
    ranks = pl.concat([RANKS, RANKS.with_columns(rank=pl.lit(1, pl.Int32))])
    skew = collective_skew(collectives(both, ranks))
    assert skew["spread_us"].to_list() == [7, 7] and skew["last_rank"].to_list() == [1, 1]
    s = stragglers(skew).row(0, named=True)
    assert (s["rank"], s["times_last"], s["share_pct"]) == (1, 2, 100.0)


def test_comm_kernels_count_alike_in_the_breakdown_and_the_collectives():
    # Three NCCL kernels without args: one launched in the step, one with no correlation at all
    # (placed by its start), and one whose launch is not in the trace (launched before profiling:
    # no step, as in HTA, with two steps or more). The breakdown's comm time and the collectives
    # table hold the same two.
    ev = make_events([
        step(1, 0, 1000), step(2, 1000, 1000),
        launch(10, 1), kernel(SENDRECV, "comm", 20, 10, 1),
        kernel(SENDRECV, "comm", 100, 30, None),
        kernel(SENDRECV, "comm", 500, 70, 99),
        launch(600, 2), kernel("void gemm()", "compute", 900, 50, 2),
    ])
    comm_us = temporal_breakdown(ev)["comm_us"].to_list()
    c = collectives(ev)
    assert comm_us == [40.0]
    assert c["dur_us"].sum() == 40.0 and c.height == 2
    assert collective_stats(c)["total_us"].sum() == 40.0


def test_gloo_spans_count_alike_in_the_breakdown_and_the_collectives():
    # Two gloo all-reduces on gloo's worker thread: one inside the profiled step, one after it
    # (between steps: no step). Only the first is comm time, and only it is in the table.
    def gloo(ts):
        return dict(name="gloo:all_reduce", kind="comm", cat="user_annotation", ts_us=ts, dur_us=30.0, tid=2,
                    thread="pt_gloo_runloop", arg_nelems=[4], arg_types=["Float"])

    ev = make_events([step(1, 0, 100), dict(name="aten::mm", kind="op", ts_us=5, dur_us=10), gloo(40), gloo(150)])
    assert temporal_breakdown(ev)["comm_us"].to_list() == [30.0]
    c = collectives(ev)
    assert c["dur_us"].to_list() == [30.0] and c["step"].to_list() == [1]


def test_stragglers_cover_all_to_all_run_as_send_recv():
    # Two ranks, five all-to-alls that NCCL runs as SendRecv kernels (no kernel args): rank 1
    # starts four of them last, by up to 7.6 ms; rank 0 starts the third last.
    late = [1000, 7600, -300, 2500, 400]  # rank 1's delay per all-to-all, µs

    def rank(r: int) -> pl.DataFrame:
        rows = [step(1, 0, 100_000)]
        for i, d in enumerate(late):
            t = 10_000 * (i + 1) + (d if r == 1 else 0)
            rows += [*nccl_call("all_to_all", t - 10, i + 1, 1000, "float"), kernel(SENDRECV, "comm", t, 500, i + 1)]
        return make_events(rows, rank=r)

    ranks = pl.concat([RANKS, RANKS.with_columns(rank=pl.lit(1, pl.Int32))])
    skew = collective_skew(collectives(pl.concat([rank(0), rank(1)]), ranks))
    assert skew["algo"].to_list() == ["all_to_all"] * 5
    assert skew["last_rank"].to_list() == [1, 1, 0, 1, 1]
    assert skew["spread_us"].max() == 7600
    s = stragglers(skew).row(0, named=True)
    assert (s["rank"], s["times_last"], s["share_pct"]) == (1, 4, 80.0)


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


def phase_span(name: str, ts: float, dur: float, **kw) -> dict:
    return dict(name=name, kind="annotation", cat="user_annotation", ts_us=ts, dur_us=dur, **kw)


def test_phase_is_the_span_around_the_enqueue_or_the_launch():
    # gloo: the all-reduce is enqueued inside ptprof/backward, the reduce-scatter after it (no phase),
    # though gloo runs both later; the phase spans' GPU copies are not main-thread spans.
    ev = pl.concat([gloo_rank(0, 0), make_events([phase_span("ptprof/backward", 5, 10),
                                                  phase_span("ptprof/optimizer", 20, 0.5, device="gpu")])])
    c = collectives(ev, RANKS).sort("start_us")
    assert c["phase"].to_list() == ["backward", None]
    # NCCL: launched on another thread (CUDA's autograd thread) inside a pipeline action span of
    # the main thread: the span holds the launch by time, whatever the thread; after both, none.
    ev = make_events([step(1, 0, 1000), phase_span("ptprof/pp/B s1 mb0", 5, 20), phase_span("ptprof/pp/F s1 mb1", 40, 20),
                      *nccl_call("all_reduce", 10, 1, 100, "float", tid=2), kernel(SENDRECV, "comm", 70, 10, 1),
                      *nccl_call("all_reduce", 45, 2, 100, "float", tid=2), kernel(SENDRECV, "comm", 80, 10, 2),
                      *nccl_call("all_reduce", 65, 3, 100, "float", tid=2), kernel(SENDRECV, "comm", 90, 10, 3)])
    assert collectives(ev).sort("start_us")["phase"].to_list() == ["backward", "forward", None]
    # pipedream's U action (its AdamW step after a backward) is the optimizer phase.
    ev = make_events([step(1, 0, 1000), phase_span("ptprof/pp/U s0 mb3", 5, 20),
                      *nccl_call("all_reduce", 10, 1, 100, "float", tid=2), kernel(SENDRECV, "comm", 70, 10, 1)])
    assert collectives(ev)["phase"].to_list() == ["optimizer"]


def test_a_collective_inside_a_recompute_span_is_recompute_the_innermost_span_wins():
    # --recompute: ptprof/recompute spans nest inside ptprof/backward (or a pipeline B action). A
    # collective enqueued inside one is "recompute"; one after it, still inside backward, "backward"
    # (the nested span must not hide it); after both, none.
    ev = make_events([step(1, 0, 1000), phase_span("ptprof/backward", 5, 50), phase_span("ptprof/recompute", 8, 12),
                      phase_span("ptprof/pp/B s0 mb0", 60, 30), phase_span("ptprof/recompute", 62, 10),
                      *nccl_call("all_reduce", 10, 1, 100, "float", tid=2), kernel(SENDRECV, "comm", 100, 5, 1),
                      *nccl_call("all_reduce", 30, 2, 100, "float", tid=2), kernel(SENDRECV, "comm", 110, 5, 2),
                      *nccl_call("all_reduce", 65, 3, 100, "float", tid=2), kernel(SENDRECV, "comm", 120, 5, 3),
                      *nccl_call("all_reduce", 80, 4, 100, "float", tid=2), kernel(SENDRECV, "comm", 130, 5, 4),
                      *nccl_call("all_reduce", 95, 5, 100, "float", tid=2), kernel(SENDRECV, "comm", 140, 5, 5)])
    assert collectives(ev).sort("start_us")["phase"].to_list() == ["recompute", "backward", "recompute", "backward", None]


def test_calls_of_no_known_group_are_not_paired_where_ranks_are_in_several_groups(tmp_path):
    """A hybrid gloo run (tp groups {0,1} and {2,3}, pp {0,2} and {1,3}): gloo names no group, and
    pairing the k-th all-reduce of rank 0 with rank 2's (another tp group's, 50 ms later) made
    stragglers whose mean wait × calls exceeded the window (trial). Where a rank is in two or more
    groups of different ranks, such calls get no skew or stragglers, and a warning says why; a
    world-only run (ddp) still pairs them."""
    import json

    from profiler import analyze
    from profiler.collectives import unpaired_group_runs

    def write(folder, groups_of, world=4):
        folder.mkdir()
        for r in range(world):
            t0 = 1e15 + (50_000 if r >= 2 else 0)
            events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1e15,
                       "dur": 100_000}]
            for k in range(3):
                events += [{"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": t0 + 1000 * k, "dur": 2},
                           {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": t0 + 1000 * k + 1, "dur": 100}]
            pg = [{"pg_name": str(i), "pg_size": len(g), "ranks": g} for i, g in enumerate(groups_of(r))]
            (folder / f"rank{r}.json").write_text(json.dumps({"traceEvents": events, "distributedInfo": {
                "backend": "gloo", "rank": r, "world_size": world, "pg_config": pg}}))

    tp = lambda r: [[0, 1], [2, 3]][r // 2]  # noqa: E731
    write(tmp_path / "hyb", lambda r: [[0, 1, 2, 3], tp(r), [r % 2, r % 2 + 2]])
    traces = load_traces(tmp_path / "hyb", progress=False)
    assert unpaired_group_runs(traces.ranks) == ["hyb"]
    a = analyze(traces)
    assert a.skew.is_empty() and a.stragglers.is_empty()
    assert any(w.startswith("run hyb: its collectives name no process group (gloo records none)") for w in a.warnings)
    # one group of every rank: the k-th call is the same collective on every rank, paired
    write(tmp_path / "world", lambda r: [[0, 1, 2, 3]])
    a = analyze(load_traces(tmp_path / "world", progress=False))
    assert a.skew.height == 3 and a.skew["spread_us"].to_list() == [50_000] * 3
    assert not any("name no process group" in w for w in a.warnings)

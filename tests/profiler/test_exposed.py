"""Exposed communication per collective: hand-computed tiny traces, and the breakdown's total on real runs."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import load_traces, temporal_breakdown
from profiler.collectives import collectives
from profiler.exposed import EXPOSED_COLUMNS, exposed_comm
from profiler.report import analyze
from tests.conftest import SHARED_TRACES
from tests.profiler.conftest import GPU_NCCL, kernel, launch, make_events, step

# One step [0, 300). Compute [0, 100) and [180, 250); an all-reduce [50, 150) on stream 9 and an
# all-gather [120, 200) on stream 10. Exposed (comm, no compute) = [100, 180) = 80 µs:
# [100, 120) all-reduce alone (20), [120, 150) both (30, split 15 + 15), [150, 180) all-gather alone (30).
# So all-reduce 35, all-gather 45.
GPU = [
    step(1, 0, 300),
    launch(1, 1), launch(2, 2), launch(3, 3), launch(4, 4),
    kernel("gemm", "compute", 0, 100, 1),
    kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "comm", 50, 100, 2, stream=9),
    kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "comm", 120, 80, 3, stream=10),
    kernel("gemm2", "compute", 180, 70, 4),
]
# CPU (gloo): main-thread ops [0, 40) and [60, 90), the enqueue [20, 25) inside the first; gloo
# span [22, 70) on a worker thread. Compute = op minus enqueue; exposed = [22, 25) + [40, 60) = 23.
CPU = [
    step(1, 0, 100),
    dict(name="aten::mm", kind="op", ts_us=0, dur_us=40),
    dict(name="c10d::allreduce_", kind="enqueue", ts_us=20, dur_us=5, arg_nelems=[10], arg_types=["float"]),
    dict(name="aten::add", kind="op", ts_us=60, dur_us=30),
    dict(name="gloo:all_reduce", kind="comm", cat="user_annotation", tid=2, ts_us=22, dur_us=48, arg_nelems=[10],
         arg_types=["float"]),
]


def test_overlapping_collectives_split_their_exposed_time():
    ev = make_events(GPU)
    out = exposed_comm(ev, collectives(ev))
    got = {k: (n, c, e) for k, n, c, e in out.select("collective", "calls", "comm_us", "exposed_us").iter_rows()}
    assert got == {"all_reduce": (1, 100.0, 35.0), "all_gather": (1, 80.0, 45.0)}
    assert out["phase"].to_list() == [None, None]  # the collectives carry no phase here
    assert out["exposed_us"].sum() == temporal_breakdown(ev)["exposed_comm_us"][0] == 80.0


def test_a_phase_column_is_kept():
    ev = make_events(GPU)
    colls = collectives(ev).sort("start_us").with_columns(phase=pl.Series(["backward", "forward"]))
    out = exposed_comm(ev, colls)
    assert dict(out.select("phase", "exposed_us").iter_rows()) == {"backward": 35.0, "forward": 45.0}


def test_gloo_compute_is_ops_outside_the_enqueues():
    ev = make_events(CPU)
    out = exposed_comm(ev, collectives(ev))
    assert out.select("collective", "step", "comm_us", "exposed_us").row(0) == ("all_reduce", 1, 48.0, 23.0)
    assert temporal_breakdown(ev)["exposed_comm_us"][0] == 23.0


def test_no_collectives_is_an_empty_frame():
    ev = make_events([step(1, 0, 100), dict(name="aten::mm", kind="op", ts_us=0, dur_us=40)])
    out = exposed_comm(ev, collectives(ev))
    assert out.is_empty() and out.columns == list(EXPOSED_COLUMNS)


@pytest.mark.multirank
@pytest.mark.parametrize("paradigm", ["fsdp", "tp"])
def test_exposed_sums_to_the_breakdowns_exposed_comm(runs, paradigm):
    a = analyze(load_traces(runs(paradigm, 2)))
    per_rank = a.exposed.group_by("rank").agg(pl.col("exposed_us").sum()).sort("rank")
    joined = per_rank.join(a.breakdown.select("rank", "exposed_comm_us"), on="rank")
    assert joined.height == 2
    # every collective counted whole: equal up to communication crossing a step boundary
    assert joined["exposed_us"].to_list() == pytest.approx(joined["exposed_comm_us"].to_list(), rel=0.02)
    # (dur_us and end - start differ in the last float bits)
    assert (a.exposed["exposed_us"] <= a.exposed["comm_us"] * (1 + 1e-6) + 1e-3).all()


@pytest.mark.parametrize("path", [GPU_NCCL, SHARED_TRACES / "single" / "a100_rank3_of_8.json.gz"])
def test_exposed_per_collective_sums_to_the_breakdown_on_nccl_traces(path):
    # GPU: every comm kernel is one collective row, all in a step: the sums are equal.
    a = analyze(load_traces([path]))
    per_rank = a.exposed.group_by("rank").agg(pl.col("exposed_us").sum())
    joined = per_rank.join(a.breakdown.select("rank", "exposed_comm_us"), on="rank")
    assert joined.height == a.breakdown.height > 0
    assert joined["exposed_us"].to_list() == pytest.approx(joined["exposed_comm_us"].to_list(), rel=1e-9)


def test_exposed_is_in_the_json_report():
    from profiler.report import build_report

    a = analyze(load_traces([GPU_NCCL]))
    rows = build_report(a)["runs"][0]["exposed"]
    assert len(rows) == a.exposed.height > 0
    assert set(rows[0]) == set(EXPOSED_COLUMNS) - {"run"}


def test_random_overlaps_agree_with_a_unit_grid_count():
    # Integer intervals on [0, 200): each unit of time with communication and no compute is shared
    # evenly by the calls running in it, counted here one unit at a time.
    import random

    rnd = random.Random(7)
    calls = [(f"c{i}", s, s + rnd.randint(1, 30)) for i, s in enumerate(rnd.sample(range(170), 25))]
    comp = [(s, s + rnd.randint(1, 20)) for s in rnd.sample(range(180), 20)]
    expected = dict.fromkeys((c for c, _, _ in calls), 0.0)
    for t in range(200):
        if any(s <= t < e for s, e in comp):
            continue
        running = [c for c, s, e in calls if s <= t < e]
        for c in running:
            expected[c] += 1 / len(running)
    events = pl.DataFrame({"run": "r", "rank": 0, "device": "gpu", "pid": 0, "kind": "compute", "step": 1,
                           "ts_us": [float(s) for s, _ in comp], "end_us": [float(e) for _, e in comp]})
    colls = pl.DataFrame({"run": "r", "rank": 0, "step": 1, "source": "nccl", "collective": [c for c, _, _ in calls],
                          "start_us": [float(s) for _, s, _ in calls], "end_us": [float(e) for _, _, e in calls],
                          "dur_us": [float(e - s) for _, s, e in calls]})
    got = dict(exposed_comm(events, colls).select("collective", "exposed_us").iter_rows())
    assert got == pytest.approx(expected)

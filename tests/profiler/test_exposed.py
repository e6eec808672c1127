"""Exposed communication per collective: hand-computed tiny traces, and the breakdown's total on real runs."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import load_traces, temporal_breakdown
from profiler.collectives import collectives
from profiler.exposed import EXPOSED_COLUMNS, exposed_comm
from profiler.report import analyze
from tests.conftest import REPO, SHARED_TRACES
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


# A CPU pipeline rank, one step [0, 100): action F [10, 40) holding ops [10, 14) and [30, 40); an
# async send posted at 15, completed at 90; a recv [50, 70); an op [70, 80). Inside the action the
# open send is no communication (breakdown.cpu_comm): comm = [40, 90) = 50, compute 24 (ops),
# exposed = [40, 70) + [80, 90) = 40, overlap [70, 80) = 10, idle 100 - (4 + 60) = 36. Per call:
# [40, 50) the send alone (10), [50, 70) the recv the rank waits on (20: sends give way), [80, 90)
# the send (10): recv 20, send 20. Counting the open send inside the action, as before, gave 55.
PIPELINE_CPU = [
    step(1, 0, 100),
    dict(name="ptprof/pp/F s0 mb0", kind="annotation", cat="user_annotation", ts_us=10, dur_us=30),
    dict(name="aten::mm", kind="op", ts_us=10, dur_us=4),
    dict(name="c10d::send", kind="enqueue", ts_us=14, dur_us=1, arg_nelems=[10], arg_types=["float"]),
    dict(name="gloo:send", kind="comm", cat="user_annotation", ts_us=15, dur_us=75, arg_nelems=[10], arg_types=["float"]),
    dict(name="aten::add", kind="op", ts_us=30, dur_us=10),
    dict(name="c10d::recv_", kind="enqueue", ts_us=49, dur_us=1, arg_nelems=[10], arg_types=["float"]),
    dict(name="gloo:recv", kind="comm", cat="user_annotation", ts_us=50, dur_us=20, arg_nelems=[10], arg_types=["float"]),
    dict(name="aten::mul", kind="op", ts_us=70, dur_us=10),
]


def test_an_async_send_inside_a_pipeline_action_is_no_communication_and_gives_way_to_a_recv():
    ev = make_events(PIPELINE_CPU)
    b = temporal_breakdown(ev).select("window_us", "compute_us", "comm_us", "exposed_comm_us", "overlap_us", "idle_us")
    assert b.row(0) == (100.0, 24.0, 50.0, 40.0, 10.0, 36.0)
    got = dict(exposed_comm(ev, collectives(ev)).select("collective", "exposed_us").iter_rows())
    assert got == {"recv": 20.0, "send": 20.0}
    # Without the action span the same transfers are communication throughout: [15, 90) less ops.
    plain = make_events([r for r in PIPELINE_CPU if not r["name"].startswith("ptprof/pp/")])
    assert temporal_breakdown(plain)["exposed_comm_us"][0] == 55.0


def test_gloo_classes_and_actions_agree_with_a_unit_grid_count():
    # Integer intervals on [0, 200) on one CPU rank: each unit with communication and no compute is
    # shared by the collectives and receives running in it (a send or receive only outside an
    # action span), else by the sends running outside an action span; counted one unit at a time.
    import random

    rnd = random.Random(11)
    kinds = ["all_reduce", "recv", "send"]
    calls = [(f"{rnd.choice(kinds)}", i, s, s + rnd.randint(1, 40)) for i, s in enumerate(rnd.sample(range(160), 24))]
    ops = [(s, s + rnd.randint(1, 15)) for s in rnd.sample(range(185), 14)]
    acts = [(s, s + rnd.randint(5, 30)) for s in rnd.sample(range(170), 5)]
    expected: dict[int, float] = dict.fromkeys((i for _, i, _, _ in calls), 0.0)
    for t in range(200):
        if any(s <= t < e for s, e in ops):
            continue
        free = not any(s <= t < e for s, e in acts)
        running = [(k, i) for k, i, s, e in calls if s <= t < e]
        first = [i for k, i in running if k == "all_reduce" or (k == "recv" and free)]
        sends = [i for k, i in running if k == "send" and free]
        for i in first or sends:
            expected[i] += 1 / len(first or sends)
    rows = [step(1, 0, 200)]
    rows += [dict(name="aten::mm", kind="op", ts_us=s, dur_us=e - s) for s, e in ops]
    rows += [dict(name=f"ptprof/pp/F s0 mb{j}", kind="annotation", cat="user_annotation", ts_us=s, dur_us=e - s)
             for j, (s, e) in enumerate(acts)]
    events = make_events(rows)
    # Each call's index in its phase column, so that exposed_comm's rows are one per call.
    colls = pl.DataFrame({"run": "r", "rank": 0, "step": 1, "source": "gloo", "phase": [str(i) for _, i, _, _ in calls],
                          "collective": [k for k, _, _, _ in calls],
                          "start_us": [float(s) for _, _, s, _ in calls], "end_us": [float(e) for _, _, _, e in calls],
                          "dur_us": [float(e - s) for _, _, s, e in calls]}).with_columns(
        pl.col("run").cast(pl.Categorical), pl.col("rank").cast(pl.Int32))
    got = {int(p): e for p, e in exposed_comm(events, colls).select("phase", "exposed_us").iter_rows()}
    assert got == pytest.approx(expected)
    assert {k for k, _, _, _ in calls} == set(kinds) and sum(expected.values()) > 20  # every class, and exposure to share


@pytest.mark.parametrize("sample", ["sample-1f1b-2r", "sample-zbv-2r", "sample-ring-2r"])
def test_exposed_sums_to_the_breakdown_on_the_shipped_gloo_p2p_runs(sample):
    a = analyze(load_traces([REPO / "traces" / sample]))
    per_rank = a.exposed.group_by("rank").agg(pl.col("exposed_us").sum())
    joined = per_rank.join(a.breakdown.select("rank", "exposed_comm_us"), on="rank")
    assert joined.height == 2 and (joined["exposed_comm_us"] > 0).all()
    # every call counted whole in the step it started in: equal up to calls crossing a step's end
    assert joined["exposed_us"].to_list() == pytest.approx(joined["exposed_comm_us"].to_list(), rel=0.02)


def test_an_operator_around_a_synchronous_collective_waits_it_does_not_compute():
    """Ulysses' `_AllToAll` (a custom autograd Function) runs on through its blocking all-to-all:
    counted as compute, a trial's Ulysses run read 63 % of its all-to-alls hidden (rank 0: 78 %). Step [0, 100):
    `_AllToAll` [0, 80) enqueues at [10, 15), gloo's span runs [16, 70) and the thread starts
    nothing until [72, 78): the wait [15, 70) is not compute, so compute = 10 + 10 = 20, comm 54,
    all of it exposed, alike in the breakdown and per collective. (The async case, an operator that
    starts others while its collective runs, keeps its compute: test_gloo_compute_is_ops_outside_the_enqueues.)"""
    ev = make_events([
        step(1, 0, 100),
        dict(name="_AllToAll", kind="op", ts_us=0, dur_us=80),
        dict(name="c10d::alltoall_base_", kind="enqueue", ts_us=10, dur_us=5, arg_nelems=[16, 16], arg_types=["float", "float"]),
        dict(name="gloo:all_to_all", kind="comm", cat="user_annotation", tid=2, ts_us=16, dur_us=54),
        dict(name="aten::add", kind="op", ts_us=72, dur_us=6),
    ])
    row = temporal_breakdown(ev).row(0, named=True)
    assert (row["compute_us"], row["comm_us"], row["overlap_us"], row["exposed_comm_us"]) == (20, 54, 0, 54)
    out = exposed_comm(ev, collectives(ev))
    assert out.select("collective", "comm_us", "exposed_us").row(0) == ("all_to_all", 54.0, 54.0)


def test_the_breakdown_and_exposed_find_the_same_waits_beside_an_annotation():
    """The breakdown gave blocking_waits every span (an annotation among them), exposed only the
    operators: an annotation starting inside the wait cut it in one and not the other (review)."""
    ev = make_events([
        step(1, 0, 100),
        dict(name="_AllToAll", kind="op", ts_us=0, dur_us=80),
        dict(name="c10d::alltoall_base_", kind="enqueue", ts_us=10, dur_us=5, arg_nelems=[16, 16], arg_types=["float", "float"]),
        dict(name="gloo:all_to_all", kind="comm", cat="user_annotation", tid=2, ts_us=16, dur_us=54),
        dict(name="ptprof/forward", kind="annotation", cat="user_annotation", ts_us=20, dur_us=5),
        dict(name="aten::add", kind="op", ts_us=72, dur_us=6),
    ])
    row = temporal_breakdown(ev).row(0, named=True)
    out = exposed_comm(ev, collectives(ev))
    assert (row["compute_us"], row["exposed_comm_us"]) == (20, 54) and out["exposed_us"].sum() == 54.0

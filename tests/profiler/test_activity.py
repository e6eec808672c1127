"""profiler/activity.py: busy share per (rank, lane, category) in time bins, against shares worked out by hand."""

from __future__ import annotations

import polars as pl
import pytest

from profiler.activity import ACTIVITY_COLUMNS, activity, lane_spans
from tests.profiler.conftest import kernel, launch, make_events, step

# One rank, drawn spans over [0, 100) µs: with 10 bins each bin is 10 µs.
ROWS = [
    step(1, 0, 100),  # an annotation: marks tid 1 as the main thread, drawn nowhere
    dict(name="a", kind="op", ts_us=0, dur_us=15),  # main compute [0, 15)
    dict(name="b", kind="op", ts_us=10, dur_us=10),  # overlaps a: the union [0, 20) counts once
    launch(25, 1),  # main other [25, 26)
    dict(name="gloo:all_reduce", kind="comm", ts_us=30, dur_us=25, tid=2),  # comm lane [30, 55)
    dict(name="worker", kind="op", ts_us=95, dur_us=5, tid=3),  # threads lane [95, 100)
    kernel("gemm", "compute", 40, 2, corr=1),  # gpu s7 compute [40, 42)
    kernel("Memcpy HtoD", "memory", 60, 4, corr=2),  # gpu s7 memory [60, 64)
    dict(name="[memory]", kind="memory_event", ph="i", ts_us=70, dur_us=0),  # an instant: not activity
]
# (lane, category) -> {bin: busy share}, by hand
EXPECTED = {
    ("main", "compute"): {0: 1.0, 1: 1.0},
    ("main", "other"): {2: 0.1},
    ("comm", "comm"): {3: 1.0, 4: 1.0, 5: 0.5},
    ("threads", "compute"): {9: 0.5},
    ("gpu s7", "compute"): {4: 0.2},
    ("gpu s7", "memory"): {6: 0.4},
}


def _shares(act: pl.DataFrame) -> dict:
    out = {}
    for lane, cat, b, busy in act.select("lane", "category", "bin", "busy").iter_rows():
        out.setdefault((lane, cat), {})[b] = round(busy, 6)
    return out


def test_busy_shares_per_lane_and_category_by_hand():
    act = activity(make_events(ROWS), n_bins=10)
    assert dict(act.schema) == ACTIVITY_COLUMNS
    assert _shares(act) == EXPECTED  # sparse: only bins with activity
    assert set(act["t0_us"]) == {0.0} and set(act["bin_us"]) == {10.0}
    # lanes in the viewer's order: main, threads, comm, then GPU streams
    assert act.select("lane", "lane_key").unique().sort("lane_key")["lane"].to_list() == ["main", "threads", "comm", "gpu s7"]


def test_each_rank_has_its_own_window():
    later = make_events([{**r, "ts_us": r["ts_us"] + 1000} for r in ROWS], rank=1)
    act = activity(pl.concat([make_events(ROWS), later]), n_bins=10)
    r1 = act.filter(pl.col("rank") == 1)
    assert set(r1["t0_us"]) == {1000.0} and set(r1["bin_us"]) == {10.0}
    assert _shares(r1) == EXPECTED


def test_no_drawn_spans_no_rows():
    act = activity(make_events([step(1, 0, 100), dict(name="[memory]", kind="memory_event", ph="i", ts_us=5, dur_us=0)]))
    assert act.is_empty() and dict(act.schema) == ACTIVITY_COLUMNS


@pytest.mark.parametrize("n_bins", [1, 7])
def test_shares_add_up_to_the_busy_time(n_bins):
    # Whatever the bins, share x bin width summed over bins is each (lane, category)'s busy µs.
    act = activity(make_events(ROWS), n_bins=n_bins)
    busy_us = act.group_by("lane", "category").agg((pl.col("busy") * pl.col("bin_us")).sum())
    got = {(lane, cat): round(v, 3) for lane, cat, v in busy_us.iter_rows()}
    assert got == {("main", "compute"): 20.0, ("main", "other"): 1.0, ("comm", "comm"): 25.0, ("threads", "compute"): 5.0,
                   ("gpu s7", "compute"): 2.0, ("gpu s7", "memory"): 4.0}


def test_subtract_keeps_a_spans_parts_outside_the_covers():
    from profiler.intervals import subtract

    spans = pl.DataFrame({"rank": [0, 0, 0, 1], "name": ["a", "b", "c", "d"],
                          "start_us": [0.0, 50.0, 95.0, 0.0], "end_us": [100.0, 60.0, 99.0, 100.0]})
    cover = pl.DataFrame({"rank": [0, 0, 0, 1], "start_us": [10.0, 30.0, 35.0, 90.0], "end_us": [20.0, 40.0, 55.0, 120.0]})
    got = subtract(spans, cover, ["rank"]).rows()
    # a: [0, 100) less [10, 20) and [30, 55) (two covers merged); b starts inside a cover; c is
    # touched by none; d's cover runs past its end.
    assert got == [(0, "a", 0.0, 10.0), (0, "a", 20.0, 30.0), (0, "a", 55.0, 100.0), (0, "b", 55.0, 60.0),
                   (0, "c", 95.0, 99.0), (1, "d", 0.0, 90.0)]
    assert subtract(spans, cover.clear(), ["rank"]).equals(spans)


def test_an_async_send_is_drawn_only_outside_the_pipeline_actions():
    from tests.profiler.test_exposed import PIPELINE_CPU

    drawn = lane_spans(make_events(PIPELINE_CPU)).filter(pl.col("name").str.starts_with("gloo:"))
    # the send posted at 15 inside action F [10, 40), completed at 90: drawn [40, 90); the recv whole
    assert sorted(drawn.select("name", "ts_us", "end_us").rows()) == [("gloo:recv", 50.0, 70.0), ("gloo:send", 40.0, 90.0)]
    plain = lane_spans(make_events([r for r in PIPELINE_CPU if not r["name"].startswith("ptprof/pp/")]))
    assert ("gloo:send", 15.0, 90.0) in plain.select("name", "ts_us", "end_us").rows()


def test_subtract_agrees_with_cutting_one_cover_at_a_time():
    # Random spans and covers of two runs (touching ends, nested and equal starts among them),
    # against a plain cut of each span by each cover in turn.
    import random

    from profiler.intervals import subtract

    rnd = random.Random(3)
    for _ in range(200):
        spans = [(rnd.choice("ab"), f"s{i}", float(s), float(s + rnd.randint(1, 30)))
                 for i, s in enumerate(rnd.choices(range(100), k=rnd.randint(1, 8)))]
        covers = [(rnd.choice("ab"), float(s), float(s + rnd.randint(1, 25))) for s in rnd.choices(range(100), k=rnd.randint(1, 6))]
        expected = []
        for run, name, s, e in spans:
            pieces = [(s, e)]
            for r, a, b in covers:
                if r == run:
                    pieces = [p for x, y in pieces for p in ([(x, y)] if b <= x or a >= y else [(x, min(y, a)), (max(x, b), y)])
                              if p[1] > p[0]]
            expected += [(run, name, x, y) for x, y in pieces]
        got = subtract(pl.DataFrame(spans, schema={"run": pl.Categorical, "name": pl.String, "start_us": pl.Float64,
                                                   "end_us": pl.Float64}, orient="row"),
                       pl.DataFrame(covers, schema={"run": pl.String, "start_us": pl.Float64, "end_us": pl.Float64},
                                    orient="row"), ["run"])
        assert _joined(sorted(got.rows())) == _joined(sorted(expected)), (spans, covers)


def _joined(rows: list[tuple]) -> list[tuple]:
    """Pieces of one span that touch, as one (two covers that touch cut nothing between them)."""
    out: list[tuple] = []
    for r in rows:
        if out and out[-1][:2] == r[:2] and out[-1][3] == r[2]:
            out[-1] = (*r[:2], out[-1][2], r[3])
        else:
            out.append(r)
    return out


def test_a_blocking_wait_inside_an_operator_is_drawn_as_communication():
    """As the breakdown counts it (breakdown.blocking_waits): `_AllToAll` [0, 80) enqueues at [10, 15)
    and waits for gloo's span [16, 70) starting nothing; the main lane draws [15, 70) as
    communication, not compute (bins of 10 µs over [0, 100))."""
    ev = make_events([
        step(1, 0, 100),
        dict(name="_AllToAll", kind="op", ts_us=0, dur_us=80),
        dict(name="c10d::alltoall_base_", kind="enqueue", ts_us=10, dur_us=5),
        dict(name="gloo:all_to_all", kind="comm", cat="user_annotation", tid=2, ts_us=16, dur_us=54),
        dict(name="aten::add", kind="op", ts_us=72, dur_us=6),
        dict(name="tail", kind="op", ts_us=95, dur_us=5),
    ])
    a = activity(ev, n_bins=10)
    got = {(lane, cat): dict(zip(g["bin"], g["busy"])) for (lane, cat), g in
           ((k, v.to_dict(as_series=False)) for k, v in a.group_by("lane", "category", maintain_order=True))}
    assert got[("main", "compute")] == pytest.approx({0: 1.0, 1: 0.5, 7: 1.0, 9: 0.5})
    # the enqueue [10, 15) is drawn as communication too (activity.KIND_CATEGORY)
    assert got[("main", "comm")] == pytest.approx({1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0})

"""Top operators by self time (nesting without a call tree) and top kernels by total time."""

from __future__ import annotations

import random

import polars as pl
import pytest

from profiler import self_times, top_kernels, top_operators
from tests.profiler.conftest import kernel, make_events, step


def op(name: str, ts: float, dur: float, **kw) -> dict:
    return dict(name=name, kind="op", ts_us=ts, dur_us=dur, **kw)


# thread 1: linear [0,100) > mm [10,30) > copy [12,20); add [50,60) inside linear; mm [100,110) after
# it (sharing the instant 100). thread 2: mm [0,40), overlapping thread 1 in time only.
EVENTS = make_events([
    step(1, 0, 200),
    op("aten::linear", 0, 100), op("aten::mm", 10, 20), op("aten::copy_", 12, 8), op("aten::add", 50, 10),
    op("aten::mm", 100, 10),
    op("aten::mm", 0, 40, tid=2),
    kernel("gemm", "compute", 5, 30, 1), kernel("gemm", "compute", 50, 10, 2), kernel("ncclKernel_AllReduce", "comm", 40, 25, 3),
    dict(name="gpu annotation", kind="annotation", device="gpu", cat="gpu_user_annotation", ts_us=0, dur_us=500),
])


def test_zero_length_spans_own_no_time():
    # a 0 µs span inside a parent: its close ties with its own open and must not take the parent's rest
    st = self_times(make_events([op("parent", 0, 10), op("marker", 5, 0)])).sort("ts_us")
    assert st.select("name", "self_us").rows() == [("parent", 10.0), ("marker", 0.0)]


def test_identical_spans_nest_in_trace_order():
    st = self_times(make_events([op("A", 0, 10), op("B", 0, 10)]))
    assert st.select("name", "self_us").rows() == [("A", 0.0), ("B", 10.0)]


def test_self_time_subtracts_direct_children_only():
    st = self_times(EVENTS).filter(pl.col("kind") == "op").sort("tid", "ts_us")
    got = [(r["tid"], r["name"], r["ts_us"], r["self_us"]) for r in st.iter_rows(named=True)]
    assert got == [
        (1, "aten::linear", 0.0, 100 - 20 - 10),
        (1, "aten::mm", 10.0, 20 - 8),
        (1, "aten::copy_", 12.0, 8),
        (1, "aten::add", 50.0, 10),
        (1, "aten::mm", 100.0, 10),
        (2, "aten::mm", 0.0, 40),
    ]
    # the step annotation is a span too: everything outside its operators is its own
    assert self_times(EVENTS).filter(pl.col("kind") == "annotation")["self_us"].to_list() == [200 - 100 - 10]


def test_top_operators_sum_per_name_and_keep_n():
    top = top_operators(EVENTS, n=2)
    assert top.select("name", "count", "self_us", "total_us").rows() == [("aten::linear", 1, 70, 100), ("aten::mm", 3, 12 + 10 + 40, 70)]


def test_top_kernels_by_total_time_without_annotations():
    top = top_kernels(EVENTS)
    assert top.select("name", "kind", "count", "total_us", "mean_us").rows() == [
        ("gemm", "compute", 2, 40.0, 20.0), ("ncclKernel_AllReduce", "comm", 1, 25.0, 25.0)]


def test_ties_are_listed_in_trace_order_and_cut_the_same_way():
    # Four operators and four kernels of one equal time: the first n in the trace are kept, in
    # trace order (a hashed order listed them differently from one load to the next).
    names = ["d", "b", "c", "a"]
    ev = make_events([op(n, 20 * i, 10) for i, n in enumerate(names)]
                     + [kernel(n, "compute", 20 * i, 10, i) for i, n in enumerate(names)])
    for _ in range(3):
        assert top_operators(ev, n=3)["name"].to_list() == ["d", "b", "c"]
        assert top_kernels(ev, n=3)["name"].to_list() == ["d", "b", "c"]


@pytest.mark.parametrize("threads", [3, 11])  # the sweep sorts by thread a pass per thread up to 8, else by argsort
def test_self_times_of_many_threads_are_each_span_less_its_children(threads):
    # Random span trees on each thread (whole µs, children inside their parent, siblings apart or
    # back to back), listed with the threads interleaved: a span's self time is its duration less
    # its direct children's, known from the tree as it is built.
    rng = random.Random(threads)
    rows, want = [], {}

    def grow(tid: int, ts: int, dur: int, depth: int) -> None:
        kids, t = 0, ts
        while depth < 4 and rng.random() < 0.8:
            gap, d = rng.randint(0, 3), rng.randint(1, 12)
            if t + gap + d > ts + dur or d >= dur:
                break
            grow(tid, t + gap, d, depth + 1)
            kids += d
            t += gap + d
        rows.append(op(f"op{depth}", ts, dur, tid=tid))
        want[(tid, float(ts), float(dur))] = float(dur - kids)

    for tid in range(1, threads + 1):
        t = 0
        for _ in range(20):
            t += rng.randint(0, 5)
            d = rng.randint(5, 60)
            grow(tid, t, d, 0)
            t += d
    rng.shuffle(rows)
    st = self_times(make_events(rows))
    got = {(r["tid"], r["ts_us"], r["dur_us"]): r["self_us"] for r in st.iter_rows(named=True)}
    assert len(want) > 40 * threads and got == want



def test_a_batch_of_ranks_with_tied_starts_gives_each_rank_its_self_times_alone():
    # Four ranks recorded together: each holds the same spans (every start ties with the other
    # ranks', as in a batch of copies; listed in another order on each rank), with ties of its
    # own: identical spans (they nest in trace order) and spans starting together (the longer is
    # the parent). A batch's sweep orders only each thread's own ties: every rank's self times
    # and operator table must be those it has alone, and the hand-counted ones.
    rows = [op("outer", 0, 100), op("mid", 0, 60), op("inner", 0, 20), op("twin", 70, 10), op("twin", 70, 10),
            op("other", 0, 50, tid=2), op("leaf", 0, 50, tid=2), op("late", 55, 5, tid=2)]
    want = [("inner", 20.0), ("late", 5.0), ("leaf", 50.0), ("mid", 40.0), ("other", 0.0), ("outer", 30.0),
            ("twin", 0.0), ("twin", 10.0)]
    ranks = [make_events(rows[k:] + rows[:k], rank=r) for r, k in enumerate([0, 0, 3, 5])]
    batch = pl.concat(ranks)
    together, ops_together = self_times(batch), top_operators(batch, n=3)
    for r, alone in enumerate(ranks):
        mine = self_times(alone)
        assert sorted(mine.select("name", "self_us").rows()) == want
        assert together.filter(pl.col("rank") == r).equals(mine)
        assert ops_together.filter(pl.col("rank") == r).equals(top_operators(alone, n=3))



@pytest.mark.parametrize("unit", [1.0, 0.1])  # whole µs: all ranks summed at once; fractions: rank by rank
def test_a_batch_of_ranks_gives_each_rank_its_top_kernels_alone(unit, monkeypatch):
    # Three ranks, each with kernels of equal total time (ties, listed in another order on each
    # rank), a null duration (counted, adds nothing, not in the mean) and more kernels than n.
    import profiler.top_ops as top_ops

    def rank_rows(r: int) -> list[dict]:
        names = ["a", "b", "c", "d"][r:] + ["a", "b", "c", "d"][:r]
        rows = [kernel(x, "compute", 100 * i + 10 * k, 3 * unit, i) for i, x in enumerate(names) for k in range(2)]
        rows += [kernel("e", "memory", 900, 1 * unit, 9), kernel("e", "memory", 950, 2 * unit, 10), kernel("e", "memory", 960, 4 * unit, 10)]
        return rows + [kernel("f", "other", 990, 5 * unit, 11)]

    no_dur = pl.when(pl.col("name") == "f").then(None).otherwise("dur_us").alias("dur_us")
    ranks = [make_events(rank_rows(r), rank=r).with_columns(no_dur) for r in range(3)]
    alone = [top_kernels(ev, n=3) for ev in ranks]
    real, queries = top_ops._top_kernels, []
    monkeypatch.setattr(top_ops, "_top_kernels", lambda ev, n: queries.append(n) or real(ev, n))
    together = top_kernels(pl.concat(ranks), n=3)
    assert len(queries) == (0 if unit == 1.0 else 3)
    for r, mine in enumerate(alone):
        assert together.filter(pl.col("rank") == r).equals(mine)
        names = ["a", "b", "c", "d"][r:] + ["a", "b", "c", "d"][:r]
        assert mine.select("name", "count").rows() == [("e", 3), (names[0], 2), (names[1], 2)]
    whole = top_kernels(pl.concat(ranks), n=9).filter(pl.col("rank") == 0)
    assert whole.filter(pl.col("name") == "f").select("count", "total_us", "mean_us").row(0) == (1, 0.0, None)
    if unit == 1.0:
        assert whole.filter(pl.col("name") == "e").select("total_us", "mean_us").row(0) == (7.0, 7 / 3)

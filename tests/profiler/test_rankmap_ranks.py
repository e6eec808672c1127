"""rankmap.analyze_rank: the per-rank analyses give each rank the same rows whether its events come
alone or with other ranks' (they group by run and rank; the speed paths for one rank's frame,
profiler.intervals.varying, must not change a number)."""

from __future__ import annotations

import polars as pl
import pytest

from profiler.intervals import last_at_instant, sweep, varying
from profiler.load import load_traces
from profiler.rankmap import analyze_rank
from profiler.report import _concat
from tests.conftest import REPO
from tests.profiler.conftest import GPU_NCCL


@pytest.mark.parametrize("path", [REPO / "traces" / "sample-ring-2r", GPU_NCCL], ids=["gloo", "nccl"])
def test_two_ranks_together_give_each_rank_its_own_rows(path):
    traces = load_traces(path, workers=1)  # in this process: no worker start-up
    alone = [analyze_rank(ev, traces.ranks, traces.runs, step=None, top_n=15) for ev in traces.rank_events()]
    together = analyze_rank(pl.concat(list(traces.rank_events())), traces.ranks, traces.runs, step=None, top_n=15)
    assert set(together) == set(alone[0])
    for name, frame in together.items():
        expected = _concat([a[name] for a in alone])
        assert frame.schema == expected.schema, name
        assert frame.equals(expected, null_equal=True), name


def test_varying_names_only_the_keys_with_several_values():
    frame = pl.DataFrame({"run": ["a", "a", "a"], "rank": [0, 1, 1], "step": [None, None, None]})
    assert varying(frame, ["run", "rank", "step"]) == ["rank"]
    assert varying(frame.head(1), ["run", "rank"]) == []
    assert varying(pl.DataFrame({"rank": [0, None]}), ["rank"]) == ["rank"]  # a null is a value of its own


def test_last_at_instant_keeps_the_last_row_of_each_group_and_instant():
    frame = pl.DataFrame({"g": [1, 1, 1, 2, 2], "t": [0.0, 0.0, 5.0, 5.0, 5.0]})
    assert frame.filter(last_at_instant(["g"]))["t"].to_list() == [0.0, 5.0, 5.0]
    assert frame.filter(last_at_instant([])).height == 2  # no group: the instants 0 and 5


def test_sweep_of_two_groups_is_each_group_swept_alone():
    # rank 0: a [0, 10) and b [5, 20); rank 1: a [0, 4), touching b [4, 6)
    iv = pl.DataFrame({"rank": [0, 0, 1, 1], "label": ["a", "b", "a", "b"],
                       "start_us": [0.0, 5.0, 0.0, 4.0], "end_us": [10.0, 20.0, 4.0, 6.0]})
    both = sweep(iv, ["rank"], ["a", "b"])
    assert both.select("rank", "start_us", "end_us", "a", "b").rows() == [
        (0, 0.0, 5.0, True, False), (0, 5.0, 10.0, True, True), (0, 10.0, 20.0, False, True),
        (1, 0.0, 4.0, True, False), (1, 4.0, 6.0, False, True),
    ]
    for r in (0, 1):
        assert sweep(iv.filter(pl.col("rank") == r), ["rank"], ["a", "b"]).equals(both.filter(pl.col("rank") == r))

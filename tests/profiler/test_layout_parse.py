"""--layout reads back every form a layout is printed in: Layout.short() and plan's table cell
(plan_report.compact), so a plan winner pastes into `ptprof project --layout`."""

import itertools

import pytest

from profiler.layout import Layout, LayoutError, parse_layout
from profiler.plan_report import compact


def _layouts():
    for schedule, v in (("1f1b", 1), ("gpipe", 1), ("zero-bubble", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 6)):
        for zero, rc, sp in itertools.product((0, 1, 2, 3), ("none", "selective", "full"), (False, True)):
            yield Layout(dp=4, tp=2, pp=4, zero=zero, microbatch=2, microbatches=8, schedule=schedule,
                         stages_per_rank=v, recompute=rc, sp=sp)
    yield Layout(dp=8, ep=4, tp=1, pp=1, zero=1, microbatch=1, microbatches=4)  # pp=1: no schedule printed
    yield Layout(dp=2, cp=2, tp=4, pp=1, zero=3, microbatch=4, microbatches=1, recompute="full", sp=True)


@pytest.mark.parametrize("layout", list(_layouts()), ids=lambda lay: lay.short())
def test_short_and_plan_table_forms_read_back_to_the_same_layout(layout):
    assert parse_layout(layout.short())[0] == layout
    if layout.cp == 1:  # plan searches no context parallelism: its table prints no cp
        assert parse_layout(compact(layout))[0] == layout


def test_plan_winner_as_printed_pastes_into_layout():
    lay, given = parse_layout("dp=32 tp=2 pp=16 z1 mb=1x48 i1f1b v=6 rc=sel sp")
    assert lay == Layout(dp=32, tp=2, pp=16, zero=1, microbatch=1, microbatches=48, schedule="interleaved-1f1b",
                         stages_per_rank=6, recompute="selective", sp=True)
    assert given == {"dp", "tp", "pp", "zero", "microbatch", "microbatches", "schedule", "stages_per_rank",
                     "recompute", "sp"}
    # commas and spaces mixed, spaces around '=', abbreviations as values
    assert parse_layout("dp=2, pp = 2,schedule=zb mb=1x4")[0] == Layout(dp=2, pp=2, schedule="zero-bubble",
                                                                       microbatch=1, microbatches=4)
    assert parse_layout("dp=2,tp=2,pp=2,m=4,schedule=i1f1b,v=2,rc=none")[0].schedule == "interleaved-1f1b"


@pytest.mark.parametrize("text, words", [
    ("dp=2 z1 zero=2", "zero is given twice"), ("mb=1x4 m=8", "microbatches is given twice"),
    ("dp=2 1f1b schedule=gpipe", "schedule is given twice"),
    ("dp=2 zz1", "expected KEY=VALUE .* bare z0..z3 .* i1f1b, zb"), ("dp=2 rc=some", "recompute one of none, sel"),
    ("pp=2 schedule=zb2", "schedule one of"), ("mb=1x", "whole number"), ("dp=2 z5", "zero=5"),
])
def test_short_forms_keep_the_refusals(text, words):
    with pytest.raises(LayoutError, match=words):
        parse_layout(text)

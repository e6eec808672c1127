"""The pieces of a pipeline replay that profiler.pipeline and `ptprof project` share: the
schedule's planned order from run.json and the measured duration of every planned action."""

from __future__ import annotations

import polars as pl

from profiler.discover import manifest_field


def action_durations(acts: pl.DataFrame, plan: list[list[tuple[str, int, int]]], last_stage: int) -> dict[tuple[str, int, int], float]:
    """(kind, stage, microbatch) -> measured µs for every planned action, the loss folded into the
    last stage's F; an action missing from the trace takes the mean of its (kind, stage), else of
    its kind, else 0."""
    measured = {(a, s, i): d for a, s, i, d in acts.select("action", "stage", "microbatch", "dur_us").iter_rows()}
    for (a, s, i), d in list(measured.items()):
        if a == "L" and ("F", last_stage, i) in measured:
            measured[("F", last_stage, i)] += d
    by_stage = dict(((a, s), d) for a, s, d in acts.group_by("action", "stage").agg(pl.col("dur_us").mean()).iter_rows())
    by_kind = dict(acts.group_by("action").agg(pl.col("dur_us").mean()).iter_rows())
    return {
        x: measured.get(x, by_stage.get((x[0], x[1]), by_kind.get(x[0], 0.0)))
        for order in plan for x in order
    }


def ideal_order(manifest: dict | None) -> list[list[tuple[str, int, int]]] | None:
    """run.json's `pipeline.ideal_order`: per pipeline rank, its (kind, stage, microbatch) actions in
    the order the schedule plans them; None where absent or of a shape not known."""
    order = manifest_field(manifest, "pipeline", "ideal_order")
    try:
        return [[(str(a), int(s), int(i)) for a, s, i in rank] for rank in order]
    except (TypeError, ValueError):
        return None  # absent, or a shape we do not know: no ideal rather than a wrong one

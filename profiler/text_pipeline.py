"""The pipeline sections of the text report (profiler.text): each rank's bubble against the
textbook and the ideal order replayed, where the bubble comes from (the schedule, unequal stages,
communication), and the order each rank ran its actions in."""

from __future__ import annotations

import polars as pl

from profiler.pipeline import slowest_over_steps, theory_bubble_pct
from profiler.textfmt import (
    NONE, collapse, collapsed_table, fmt_pct, fmt_time, per_run, plural, sig3, strings, table, title, wrap, _number,
)

SPLIT_LABELS = {"pipeline_bubble_pct": "pipeline bubble (all ranks)", "schedule_bubble_pct": "  the schedule's own",
                "imbalance_pct": "  + unequal stages", "comm_wait_pct": "  + communication wait"}


def _bubble_caption(part: pl.DataFrame, schedule: str) -> list[str]:
    """What the pipeline table's bubbles measure: the trials read them as one number three ways."""
    window = ("each rank's own step (a stream: no flush)" if schedule == "pipedream"
              else "the pipeline's window (its first action to its last, over its ranks)")
    textbook = ("the schedule's idle share of an ideal pipeline, equal stages and free communication"
                if part["theory_pct"].is_not_null().any()
                else f"none, {schedule} has no closed form here" if schedule else "none, the schedule is not known (no run.json)")
    return wrap(f"(measured: the share of {window} a rank spends outside its actions, waits and transfers between them "
                f"included (the breakdown's idle is only time with nothing running); textbook: {textbook}; ideal order "
                "replayed: the rank's measured actions run in the schedule's order, communication free)", "  ", "   ")


def pipeline_sections(a, runs: list[str], full: bool) -> list[str]:
    """The pipeline bubble (measured, textbook, ideal order replayed; its split) and the order each
    rank ran its actions in; [] without pipeline actions."""
    if a.pipeline is None or a.pipeline.is_empty():
        return []
    out = [title("Pipeline bubble", "share of the pipeline's window a rank waits (measured, textbook, ideal order)")]
    labels = {"bubble_pct": "measured bubble", "theory_pct": "textbook (p-1)/(m+p-1)", "ideal_pct": "ideal order replayed"}
    p = strings(a.pipeline)
    split = [c for c in SPLIT_LABELS if c in p.columns]  # the bubble split (profiler.pipeline, docs/profiler.md)

    def render(part: pl.DataFrame) -> list[str]:
        r0 = part.row(0, named=True)
        head = (f"{r0['schedule'] or 'schedule unknown'}: {plural(r0['pp_ranks'], 'pipeline rank')}, "
                f"{plural(r0['microbatches'], 'microbatch')}, {plural(r0['stages_per_rank'], 'stage')} per rank")
        if full:
            header = ["rank", "step", "window", "busy", "bubble", "measured", "textbook", "ideal"]
            rows = [[str(r["rank"]), str(r["step"]), fmt_time(r["window_us"]), fmt_time(r["busy_us"]), fmt_time(r["bubble_us"]),
                     fmt_pct(r["bubble_pct"]), fmt_pct(r["theory_pct"]), fmt_pct(r["ideal_pct"])]
                    for r in part.sort("rank", "step").to_dicts()]
            lines = wrap(head, "  ", "    ") + table(header, rows, "r" * 8, shrink=None) + _bubble_caption(part, r0["schedule"])
            if split:  # one row per pipeline and step: every rank of a pipeline carries the same split
                rows = part.select("step", *split, *[c for c in ("slowest_stage", "slowest_stage_ratio") if c in part.columns]
                                   ).unique(maintain_order=True).sort("step")
                lines += [""] + table(["step", "pipeline bubble", "schedule", "unequal stages", "comm wait", "slowest stage"],
                                      [[str(r["step"]), *[fmt_pct(r[c]) for c in split], _slowest(r)] for r in rows.to_dicts()],
                                      "rrrrrl", shrink=None)
            return lines
        mean = part.group_by("run", "rank").agg(pl.col(list(labels) + split).mean())  # over the steps
        # a formula only beside a value it gave (zbv, an unknown schedule: none)
        named = labels | {"theory_pct": _textbook_label(r0["schedule"]) if part["theory_pct"].is_not_null().any() else "textbook"}
        if r0["schedule"] == "pipedream":  # a stream: each rank's window is its own step
            # What the flush would have cost: the same P and M under synchronous 1F1B.
            flushed = theory_bubble_pct(r0["pp_ranks"], r0["microbatches"])
            head += (f"; asynchronous, no flush (each rank over its own step); 1F1B with a flush would idle "
                     f"(p-1)/(m+p-1) = {fmt_pct(flushed)}")
        lines = wrap(head, "  ", "    ") + collapsed_table(collapse(mean, list(labels)), named, fmt_pct)
        lines += _bubble_caption(part, r0["schedule"])
        if split and mean.select(pl.col(split).is_not_null().any()).row(0) != (False,) * len(split):
            lines += wrap("where the bubble comes from (% of the pipeline's rank-time, mean of the steps; the schedule's own: "
                          "its idle time with equal stages, as a share of the measured window, not of an ideal pipeline's "
                          "as the textbook's):", "  ", "    ")
            lines += collapsed_table(collapse(mean, split), {c: SPLIT_LABELS[c] for c in split}, fmt_pct)
            if (slowest := slowest_over_steps(part)) is not None:  # the one the finding names
                stage, ratio = slowest
                lines.append(f"  slowest stage: {_slowest({'slowest_stage': stage, 'slowest_stage_ratio': ratio})} "
                             "(its compute over the mean stage's, in the steps it was slowest)")
        return lines

    out += per_run(runs, p, render)
    if a.pipeline_grid is not None and not a.pipeline_grid.is_empty():
        # U: pipedream's AdamW step after each backward (its per-step optimizer phase is empty)
        out.append(title("Pipeline order", "actions by rank (F forward, B backward, I/W input/weight grad, U weight update)"))
        grid = strings(a.pipeline_grid).sort("run", "rank", "step")
        out += per_run(runs, grid, lambda g: _orders(g, full))
    return out


def _textbook_label(schedule: str | None) -> str:
    """The textbook row's label: the formula profiler.pipeline.schedule_theory_pct used for it (an
    interleaved 1F1B run's 11.1 % was labelled (p-1)/(m+p-1), which gives 20 %: trial)."""
    return {"pipedream": "textbook (no flush)", "interleaved-1f1b": "textbook (p-1)/(v·m+p-1)",
            "zero-bubble": "textbook ZB-H1 (p-1)(F+I-W)"}.get(schedule or "", "textbook (p-1)/(m+p-1)")


def _slowest(r: dict) -> str:
    stage, ratio = r.get("slowest_stage"), r.get("slowest_stage_ratio")
    return NONE if stage is None else f"stage {stage}" + ("" if _number(ratio) is None else f", {sig3(ratio)}×")


def _orders(grid: pl.DataFrame, full: bool) -> list[str]:
    out = []
    for (rank,), g in grid.group_by("rank", maintain_order=True):
        orders = g["order"].to_list()
        if full or len(set(orders)) > 1:
            for step, order in zip(g["step"], orders):
                first = f"  rank {rank} step {step}: "
                out += wrap(order or NONE, first, " " * len(first))
        else:
            first = f"  rank {rank}: "
            out += wrap(orders[0] or NONE, first, " " * len(first))
    return out

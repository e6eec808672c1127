"""Findings rule 8: runs compared. The step time of each run against the first run given, and the
component (compute, idle, exposed communication by collective and phase) that explains most of the
difference; only between runs of the same model and global batch (docs/findings.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from profiler.discover import manifest_field
from profiler.findings_base import (COMPARE_MIN_PCT, MAX_COMPARISON_FINDINGS, Row, _finite, _pipeline_run, _row, _runs,
                                    _str_run)
from profiler.findings_text import collective_change, ms, num, pct, phase_text

if TYPE_CHECKING:
    from profiler.report import Analysis


def comparison_rule(a: "Analysis") -> list[Row]:
    """The step time difference of each run against the first, and the component that explains most of it."""
    # Only runs of the same model and global batch are compared (a step time of another model says
    # nothing about the setup); runs without run.json are not compared at all.
    keys = {run: _model_key(a.runs.get(run) if isinstance(a.runs, dict) else None) for run in _runs(a)}
    by_key: dict[tuple, list[str]] = {}
    for run, key in keys.items():
        if key is not None:
            by_key.setdefault(key, []).append(run)
    pairs = [(same[0], run) for same in by_key.values() for run in same[1:]]
    parts = {run: _step_parts(a, run) for pair in pairs for run in pair}
    out = []
    for base, run in pairs:
        if parts[base] is None or parts[run] is None:
            continue
        (slow, (s_step, s_parts)), (fast, (f_step, f_parts)) = sorted(
            [(run, parts[run]), (base, parts[base])], key=lambda kv: -kv[1][0])
        diff = s_step - f_step
        score = 100 * diff / s_step
        if score < COMPARE_MIN_PCT:
            continue
        # Every part's change from the faster run to the slower one; they sum to the difference.
        deltas = {k: s_parts.get(k, 0.0) - f_parts.get(k, 0.0) for k in {*s_parts, *f_parts}}
        cause, delta = min(deltas.items(), key=lambda kv: (-kv[1], kv[0]))  # ties by name: the same text every time
        text = f"{slow}'s step is {num(s_step / f_step)}× {fast}'s ({ms(s_step)} vs {ms(f_step)}); "
        if delta <= diff:
            text += f"{pct(100 * delta / diff)} of the difference is {cause} (+{ms(delta)})"
        else:  # other parts got faster: this one alone adds more than the whole difference
            text += f"{cause} adds {ms(delta)}, more than the whole difference ({ms(diff)}; other parts take less time)"
        evidence = f"mean per rank and step, {slow} minus {fast}: " + ", ".join(
            f"{k} {'+' if v >= 0 else '−'}{ms(abs(v))}" for k, v in sorted(deltas.items(), key=lambda kv: (-abs(kv[1]), kv[0]))[:4])
        change = f"look at {cause} in {slow} first: " + _cause_change(cause, manifest_field((getattr(a, "runs", None) or {}).get(slow), "paradigm"))
        out.append(_row("comparison", None, None, score, text + ".", evidence, change))
    return sorted(out, key=lambda r: -r["score"])[:MAX_COMPARISON_FINDINGS]


# n_params too: an MoE model (experts) or another mlp_ratio shares the other dims with a dense one.
MODEL_KEYS = ("vocab_size", "d_model", "n_layers", "seq_len", "n_params")


def _model_key(manifest: dict | None) -> tuple | None:
    """run.json's model dimensions and global batch, or None where any is missing (not comparable)."""
    key = (*(manifest_field(manifest, "model", k) for k in MODEL_KEYS), manifest_field(manifest, "global_batch_size"))
    # A damaged run.json may hold a list or an object there: not a dimension, and not hashable.
    return None if any(isinstance(v, bool) or not isinstance(v, (int, float, str)) for v in key) else key


def _step_parts(a: "Analysis", run: str) -> tuple[float, dict[str, float]] | None:
    """(mean step µs, component -> mean µs per rank and step): compute, idle, other non-compute and
    the exposed communication of each (collective, phase); the components sum to the step."""
    b = _str_run(a.breakdown_steps)
    b = b.filter((pl.col("run") == run) & (pl.col("window_us") > 0)) if b is not None else None
    if b is None or b.is_empty():
        return None
    n = b.height  # (rank, step) pairs
    step = b["window_us"].mean()
    parts = {"compute": b["compute_us"].mean(), "idle": b["idle_us"].mean()}
    exposed = _str_run(getattr(a, "exposed", None))
    exp_total = b["exposed_comm_us"].fill_null(0).mean()
    by_coll: dict[str, float] = {}
    if exposed is not None and exposed.height:
        e = exposed.join(b.select("run", pl.col("rank").cast(exposed.schema["rank"]), "step"), on=["run", "rank", "step"], how="semi")
        pipeline = _pipeline_run(a, run)
        for kind, phase, us in e.group_by("collective", "phase").agg(pl.col("exposed_us").sum()).iter_rows():
            by_coll[f"{kind} exposed {phase_text(phase, kind, pipeline)}"] = us / n
    if by_coll:
        parts |= by_coll
        exp_total = sum(by_coll.values())
    elif exp_total:
        parts["communication exposed"] = exp_total
    parts["other non-compute (copies, unclassified)"] = b["non_compute_us"].mean() - exp_total
    if not _finite(step, *parts.values()):
        return None
    return step, parts


def _cause_change(cause: str, paradigm: str | None = None) -> str:
    if cause == "compute":
        return ("compare the two runs' top operators and kernels: the extra compute is in those whose time grew "
                "(parameter copies and casts of a sharded layout, recomputation, smaller and less efficient kernels)")
    if cause == "idle":
        return "idle time: waits on other ranks, the host or data loading; see the straggler and pipeline findings"
    if " exposed " in cause:
        kind, where = cause.split(" exposed ", 1)  # phase_text's words: "in forward", or no phase known
        return collective_change(kind, where.removeprefix("in ") if where.startswith("in ") else None, paradigm,
                                 pipeline=where == phase_text(None, kind, pipeline=True))
    return "memory copies and unclassified kernels: pinned memory, fewer host-device transfers"

"""Findings on activation checkpointing (docs/findings.md, rules `recompute` and
`recompute-comparison`): what `--recompute` cost in time and saved in memory, from the recompute
frame (profiler/recompute.py), the memory peaks and profiler.theory_recompute. Run by profiler.findings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from profiler.discover import manifest_field
from profiler.findings_base import Row, _finite, _row, _step_us, _str_run
from profiler.findings_text import bytes_text, ms, num, pct
from profiler.recompute import ratio_on_compute
from profiler.theory_recompute import activation_drop, recompute_on

if TYPE_CHECKING:
    from profiler.report import Analysis

SELECTIVE = "selective recomputation (only the attention core, as Korthikanti et al. 2022, or every other block)"


def _per_rank(a: "Analysis", run: str) -> pl.DataFrame:
    """The run's recompute frame, mean per step for each rank (ranks with numbers only)."""
    rc = _str_run(getattr(a, "recompute", None))
    if rc is None or rc.is_empty():
        return pl.DataFrame()
    r = rc.filter((pl.col("run") == run) & pl.col("recompute_us").is_not_null() & pl.col("forward_us").is_not_null())
    comm = [c for c in ("forward_comm_us", "recompute_comm_us") if c in r.columns]
    return (r.group_by("rank").agg(pl.col("recompute_us", "forward_us", "recompute_spans", *comm).mean(),
                                   pl.col("predicted_over_forward").first())
            .with_columns(ratio=ratio_on_compute(), forward_compute_us=pl.col("forward_us") - (
                pl.col("forward_comm_us").fill_null(0.0) if comm else 0.0))
            .sort("recompute_us", "rank", descending=[True, False]))


def gathers_in_forward(a: "Analysis", run: str) -> bool:
    """The run's forward all-gathers parameters (fsdp / ZeRO-2/3, a hybrid run's dp dimension): its
    time holds the gathers and their copies, which the recomputation (on the parameters backward
    gathered) does not repeat. Read from theory's forward all-gather rows of the data-parallel dim:
    tp's logits and sp's activation gathers (dim tp) are not parameters."""
    comm = _str_run(getattr(a, "theory_comm", None))
    if comm is None or comm.is_empty():
        return False
    return comm.filter((pl.col("run") == run) & (pl.col("collective") == "all_gather") & (pl.col("phase") == "forward")
                       & (pl.col("dim") == "dp")).height > 0


NOT_COMPARABLE = ("; not comparable with the prediction: the forward also all-gathers parameters (and copies them "
                  "in and out), which the recomputation, on the parameters backward gathered, does not repeat")


def _forward_text(fwd_us: float, compute_us: float) -> str:
    """The forward's time, and its compute time where exposed communication took part of it."""
    if _finite(compute_us) and compute_us < 0.95 * fwd_us:
        return f"forward {ms(fwd_us)}, {ms(compute_us)} of it compute, the rest collective waits"
    return f"forward {ms(fwd_us)}"


def _prediction(pred) -> str:
    return f"; predicted ≈ {num(pred)}×, one more forward of the blocks" if _finite(pred) else ""


def recompute_rule(a: "Analysis") -> list[Row]:
    """Per run that recomputed: the recomputation's share of the step (the rank where it is largest),
    beside its forward, and the saved activations theory predicts."""
    rc = _str_run(getattr(a, "recompute", None))
    if rc is None or rc.is_empty():
        return []
    steps = _step_us(a)
    out = []
    for run in rc["run"].unique(maintain_order=True).to_list():
        per_rank, step = _per_rank(a, run), steps.get(run)
        if per_rank.is_empty() or step is None:
            continue
        rank, rc_us, fwd_us, spans, pred, ratio, fwd_compute = per_rank.select(
            "rank", "recompute_us", "forward_us", "recompute_spans", "predicted_over_forward", "ratio", "forward_compute_us").row(0)
        if not _finite(rc_us, fwd_us, ratio) or fwd_us <= 0:
            continue
        share = 100 * rc_us / step
        text = (f"Recomputation (--recompute) takes {pct(share)} of the step on rank {rank}: {ms(rc_us)} per step, "
                f"{num(ratio)}× its forward's compute ({_forward_text(fwd_us, fwd_compute)}{_prediction(pred)})")
        if gathers_in_forward(a, run):
            text += NOT_COMPARABLE
        drop = activation_drop(((getattr(a, "runs", None) or {}).get(run)) or {})
        if drop:
            text += (f"; it saves about {bytes_text(drop['drop_bytes'])} of activations per rank "
                     f"(predicted: {drop['formula']})")
        evidence = f"run {run}, rank {rank}: {spans:g} ptprof/recompute spans per step, mean step {ms(step)}"
        change = (f"keep it where activation memory limits the batch or the model; with memory to spare, drop "
                  f"--recompute to win back about {pct(share)} of the step, or use {SELECTIVE}")
        out.append(_row("recompute", run, rank, share, text + ".", evidence, change))
    return out


def _peak(a: "Analysis", run: str) -> int | None:
    """The run's allocation high-water mark (largest over ranks and devices), or None."""
    p = _str_run(getattr(a, "memory_peaks", None))
    if p is None or p.is_empty():
        return None
    v = p.filter(pl.col("run") == run)["peak_allocated_bytes"].drop_nulls()
    return int(v.max()) if v.len() else None


def recompute_comparison_rule(a: "Analysis") -> list[Row]:
    """Two loaded runs of one paradigm, model and batch, one with --recompute and one without: how much
    the memory peak dropped (and theory's drop) and how much compute the recomputation added."""
    runs = getattr(a, "runs", None) or {}
    loaded = _str_run(a.ranks)["run"].unique(maintain_order=True).to_list()
    keyed = {r: _key(runs.get(r)) for r in loaded}
    steps = _step_us(a)
    out = []
    for on in loaded:
        if keyed[on] is None or not recompute_on(runs[on]):
            continue
        for off in loaded:
            if off == on or keyed[off] != keyed[on] or recompute_on(runs[off]):
                continue
            before, after = _peak(a, off), _peak(a, on)
            per_rank = _per_rank(a, on)
            if before is None or after is None or before <= 0 or per_rank.is_empty():
                continue
            rc_us, fwd_us, pred, ratio, fwd_compute = (per_rank[c].mean() for c in (
                "recompute_us", "forward_us", "predicted_over_forward", "ratio", "forward_compute_us"))
            if not _finite(rc_us, fwd_us, ratio) or fwd_us <= 0:
                continue
            dropped = before - after
            text = (f"With --recompute ({on}) the memory peak {'dropped' if dropped >= 0 else 'grew'} by "
                    f"{bytes_text(abs(dropped))} against {off} ({bytes_text(before)} → {bytes_text(after)}, "
                    f"{'−' if dropped >= 0 else '+'}{pct(100 * abs(dropped) / before)}")
            drop = activation_drop(runs[on])
            if drop:
                text += f"; predicted −{bytes_text(drop['drop_bytes'])} of saved activations"
            text += (f"); the recomputation takes {ms(rc_us)} per step, {num(ratio)}× its forward's compute "
                     f"({_forward_text(fwd_us, fwd_compute)}{_prediction(pred)})")
            if gathers_in_forward(a, on):
                text += NOT_COMPARABLE
            c_off, c_on = _compute(a, off), _compute(a, on)
            if _finite(c_off, c_on) and c_off > 0:
                grew = c_on - c_off
                text += (f"; measured compute {ms(c_off)} → {ms(c_on)} per step ({'+' if grew >= 0 else '−'}"
                         f"{pct(100 * abs(grew) / c_off)})")
                if grew < 0.5 * rc_us or grew > 2 * rc_us:  # far from the recomputation the spans time
                    how = ("less" if grew < 0 else "less than half the recomputation" if grew < 0.5 * rc_us
                           else "more than twice the recomputation")
                    text += (f", {how}: the two runs' timings differ by more than the "
                             "recomputation explains (CPU timings of short runs are noisy), so the time comparison is "
                             "inconclusive; the ptprof/recompute spans time the recomputation itself")
            if steps.get(on) and steps.get(off):
                text += f"; step {ms(steps[off])} → {ms(steps[on])} ({'+' if steps[on] >= steps[off] else '−'}" \
                        f"{pct(100 * abs(steps[on] - steps[off]) / steps[off])})"
            evidence = f"runs {off} and {on}: peaks the largest over ranks, times the mean per rank and step"
            change = ("recompute where the activations (not parameters or optimizer state) limit the batch; it buys "
                      f"their memory for one more forward; {SELECTIVE} buys most of it for less")
            out.append(_row("recompute-comparison", None, None, 100 * max(dropped, 0) / before, text + ".", evidence, change))
    return out


def _compute(a: "Analysis", run: str) -> float | None:
    """The run's compute time, mean per rank and profiled step (profiler.breakdown), or None."""
    b = _str_run(getattr(a, "breakdown_steps", None))
    if b is None or b.is_empty() or "compute_us" not in b.columns:
        return None
    v = b.filter((pl.col("run") == run) & (pl.col("window_us") > 0))["compute_us"].drop_nulls()
    return float(v.mean()) if v.len() else None


VARIANT_OPTIONS = ("sp", "loss_parallel", "offload", "schedule", "microbatches", "stages_per_rank", "stage_layers",
                   "experts", "top_k", "capacity_factor", "dp", "pp", "tp", "seq_len", "batch_size", "model")


def _key(manifest: dict | None) -> tuple | None:
    """What must be equal for two runs to compare: paradigm, model dims, global batch, world size."""
    if not isinstance(manifest, dict):
        return None
    key = (manifest_field(manifest, "paradigm"), manifest_field(manifest, "world_size"),
           manifest_field(manifest, "global_batch_size"),
           *(manifest_field(manifest, "model", k) for k in ("vocab_size", "d_model", "n_layers", "seq_len", "n_params")))
    if any(v is None for v in key):
        return None
    # Every other option that changes the run (tp --sp, --loss-parallel, a schedule, microbatches,
    # experts, ...) must be equal too, or the difference is not the recomputation's.
    options = manifest.get("options") if isinstance(manifest.get("options"), dict) else {}
    same = tuple((k, repr(options.get(k))) for k in VARIANT_OPTIONS)
    return key + same

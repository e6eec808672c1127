"""Findings: what a run's numbers mean and what to change, from explicit rules (docs/findings.md).

Each rule is a small pure function over the frames of an Analysis, with a stable id (RULES), its
thresholds as named constants below, and one row per finding: a plain sentence with its number
(`text`), where it was seen (`evidence`: run, rank, step, collective, phase) and a concrete change
to try (`change`). `score` is the share of step time (or of memory) at stake, 0-100; findings are
ranked by it. A rule says nothing from a number that is missing, NaN or infinite, and nothing
where its input is absent (foreign traces without run.json, CPU runs, one rank, no collectives).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import polars as pl

from profiler.discover import manifest_field
from profiler.pipeline import schedule_theory_pct, slowest_over_steps
from profiler.textfmt import device_word, plural
from profiler.findings_text import (bytes_text, collective_change, ms, num, one_time_change, pct, phase_text, steps_text)

if TYPE_CHECKING:
    from profiler.report import Analysis

# One row per finding, most important first (score: the share of step time or memory at stake, 0-100).
# run is null for a finding about several runs (a comparison).
FINDING_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "rule": pl.String, "score": pl.Float64, "text": pl.String,
    "evidence": pl.String, "change": pl.String,
}

# Thresholds and helpers: profiler/findings_base.py; the memory rules: profiler/findings_memory.py.
from profiler.findings_base import (  # noqa: F401  (thresholds re-exported: docs/findings.md names them here)
    ACTIVATION_MIN_PCT, ALPHA_MIN_SHARE_PCT, BUBBLE_MIN_PCT, BUBBLE_PART_MIN_PCT, COMPARE_MIN_PCT, EXPOSED_COMM_MIN_PCT, IDLE_MIN_PCT,
    FIT_MIN_R2, LATENCY_MAX_BW_FRACTION, LATENCY_MIN_PCT, MAX_COMPARISON_FINDINGS, MAX_FINDINGS, MEMORY_SAVING_MIN_PCT,
    SKEW_MIN_PCT, STRAGGLER_MIN_SHARE_PCT, STRAGGLER_MIN_TIMES, VOLUME_MIN_PCT, Row, _finite, _pipeline_run, _row, _runs, _step_us,
    _str_run)
from profiler.findings_memory import activation_memory_rule, persistent_memory_rule  # noqa: F401
from profiler.findings_recompute import recompute_comparison_rule, recompute_rule  # noqa: F401
from profiler.findings_compare import comparison_rule  # noqa: F401
from profiler.findings_collectives import MEMORY_QUANTITY_RE, bandwidth_rule, comm_volume_rule, straggler_rule  # noqa: F401
from profiler.findings_outlier import outlier_rule  # noqa: F401


def findings(a: "Analysis") -> pl.DataFrame:
    """FINDING_COLUMNS: every rule over one analysis, ranked by score."""
    rows = [row for _rule, check in RULES.items() for row in check(a)]
    frame = pl.DataFrame(rows, schema=FINDING_COLUMNS) if rows else pl.DataFrame(schema=FINDING_COLUMNS)
    order = {rule: i for i, rule in enumerate(RULES)}
    # Ties between runs in the order they were given (docs/report.md: runs keep the command line's
    # order), not by name: two copies of one run tie on every rule.
    runs = {r: i for i, r in enumerate(a.ranks["run"].cast(pl.String).unique(maintain_order=True).to_list())}
    return (frame.with_columns(_order=pl.col("rule").replace_strict(order, return_dtype=pl.Int64),
                               _run=pl.col("run").replace_strict(runs, default=len(runs), return_dtype=pl.Int64))
            .sort(["score", "_order", "_run"], descending=[True, False, False], nulls_last=True)
            .drop("_order", "_run").head(MAX_FINDINGS))


# ---------------------------------------------------------------------------------------------
# 1. Exposed communication


def worst_of(shares: pl.Series) -> str:
    """" (the worst of N)" beside the rank a finding names, " (all N ranks alike)" where every rank's
    share is the same to 0.1 % points (ten copies of one trace: no rank is the worst), "" for one rank."""
    if shares.len() < 2:
        return ""
    return (f" (all {shares.len():,} ranks alike)" if shares.max() - shares.min() < 0.1
            else f" (the worst of {shares.len():,})")


def exposed_comm_rule(a: "Analysis") -> list[Row]:
    """Communication with no compute under it, as a share of the step, and its main collective and phase."""
    b = _str_run(a.breakdown)
    if b is None or b.is_empty():
        return []
    b = b.filter((pl.col("window_us") > 0) & pl.col("exposed_comm_us").is_finite() & (pl.col("exposed_comm_us") > 0))
    b = b.with_columns(share_pct=100 * pl.col("exposed_comm_us") / pl.col("window_us"))
    exposed = _str_run(getattr(a, "exposed", None))
    steps = _str_run(a.breakdown_steps)
    out = []
    for run in _runs(a):
        rb = b.filter(pl.col("run") == run)
        worst = rb.sort("share_pct", "rank", descending=[True, False]).head(1)  # ties: the lowest rank
        if worst.is_empty() or worst["share_pct"][0] < EXPOSED_COMM_MIN_PCT:
            continue
        rank, share, exp_us, win_us = worst.select("rank", "share_pct", "exposed_comm_us", "window_us").row(0)
        n_ranks = rb.height
        rank_steps = steps.filter((pl.col("run") == run) & (pl.col("rank") == rank)) if steps is not None else None
        step_list = rank_steps["step"].to_list() if rank_steps is not None else []
        text = (f"Communication with no compute under it takes {pct(share)} of rank {rank}'s step time "
                f"({ms(exp_us)} of {ms(win_us)} over {steps_text(step_list)})")
        evidence = f"run {run}, rank {rank}" + worst_of(rb["share_pct"]) + f", {steps_text(step_list)}"
        kind, phase, once, size = None, None, False, None
        pipeline = _pipeline_run(a, run)
        if exposed is not None and not exposed.is_empty():
            by = (exposed.filter((pl.col("run") == run) & (pl.col("rank") == rank))
                  .group_by("collective", "phase").agg(pl.col("exposed_us", "comm_us", "calls").sum())
                  .sort("exposed_us", descending=True))
            if by.height and by["exposed_us"][0] > 0:
                kind, phase, top_us, comm_us, calls = by.row(0)
                top_pct = 100 * top_us / exp_us
                size = _median_size(a, run, rank, kind, phase)
                text += (f"; {'most of it' if top_pct >= 50 else 'the largest part'} is {kind} {phase_text(phase, kind, pipeline)}: "
                         f"{ms(top_us)}, {pct(top_pct)} of the exposed time, in {plural(calls, 'call')}"
                         + (f" of {bytes_text(size)} (median)" if size else ""))
                # A collective in fewer profiled steps than the rank ran is no per-step cost (DDP's bucket
                # rebuild broadcasts once, in step 1): say where it happened, never "every step".
                mine = exposed.filter((pl.col("run") == run) & (pl.col("rank") == rank) & (pl.col("collective") == kind)
                                      & (pl.col("phase").is_null() if phase is None else pl.col("phase") == phase))
                seen = sorted(mine.filter(pl.col("calls") > 0)["step"].drop_nulls().unique().to_list())
                # A step cut short lost its later events: missing there, a collective is not rare.
                cut = _str_run(getattr(a, "cut_steps", None))
                cut = set() if cut is None else set(cut.filter((pl.col("run") == run) & (pl.col("rank") == rank))["step"].to_list())
                once = bool(seen) and len([s for s in step_list if s not in cut]) > len([s for s in seen if s not in cut])
                if once:
                    text += f", only in {steps_text(seen)} of {steps_text(step_list)}"
                evidence += "; exposed by collective: " + ", ".join(
                    # c sums the calls' durations: overlapping calls count each, so it is no wall time
                    # and may exceed the window: said as a sum over the calls, and where it does, why.
                    f"{k} {phase_text(p, k, pipeline)} {ms(e)} exposed of {ms(c)} summed over its calls"
                    + (" (in flight together, each counted: more than the window)" if c > win_us else "")
                    for k, p, e, c, _ in by.head(3).iter_rows())
        manifest = (getattr(a, "runs", None) or {}).get(run)
        paradigm = manifest_field(manifest, "paradigm")
        # The schedule the pipeline ran (a hybrid run's --schedule zbv is no zero-bubble paradigm).
        pp = _str_run(getattr(a, "pipeline", None))
        schedule = (next(iter(pp.filter(pl.col("run") == run)["schedule"].drop_nulls()), None)
                    if pp is not None and "schedule" in pp.columns else None)
        change = collective_change(kind, phase, paradigm, pipeline, schedule=schedule, size_bytes=size,
                                   sp=manifest_field(manifest, "options", "sp") is True)
        if kind is not None and once:
            change = one_time_change(kind, phase, pipeline)
        out.append(_row("exposed-comm", run, rank, share, text + ".", evidence, change))
    return out


def _median_size(a: "Analysis", run: str, rank: int, kind: str, phase: str | None) -> float | None:
    """The median message size (nccl-tests' size) of a rank's calls of one collective in one
    phase; None where no call has one (gloo without recorded shapes)."""
    c = _str_run(getattr(a, "collectives", None))
    if c is None or c.is_empty() or "size_bytes" not in c.columns:
        return None
    sel = (pl.col("run") == run) & (pl.col("rank") == rank) & (pl.col("collective") == kind)
    sel &= pl.col("phase").is_null() if phase is None else pl.col("phase") == phase
    sizes = c.filter(sel)["size_bytes"].drop_nulls()
    # "lower": a size some call sent (the interpolated median of 16 and 32 B calls, 24 B, is none: trial)
    return float(sizes.quantile(0.5, interpolation="lower")) if sizes.len() else None


# ---------------------------------------------------------------------------------------------
# 2. Pipeline bubble


def pipeline_bubble_rule(a: "Analysis") -> list[Row]:
    """The pipeline's idle share split into schedule, stage imbalance and communication wait; the slowest stage."""
    p = _str_run(a.pipeline)
    if p is None or p.is_empty():
        return []
    have_split = {"schedule_bubble_pct", "imbalance_pct", "comm_wait_pct"} <= set(p.columns)
    partial = getattr(a, "missing_ranks", None) or {}
    out = []
    for run in p["run"].unique(maintain_order=True).to_list():
        rp = p.filter((pl.col("run") == run) & pl.col("bubble_pct").is_finite())
        if rp.is_empty() or run in partial:  # stages missing: no bubble, split or slowest stage of the pipeline
            continue
        mean = lambda c: rp[c].mean() if c in rp.columns and rp[c].null_count() == 0 else None  # noqa: E731
        # The pipeline module's own split (% of the pipeline's rank-time) where it has one; else the
        # ranks' measured bubble, split from the textbook theory and the replay (docs/findings.md).
        bubble = mean("pipeline_bubble_pct") if have_split and _finite(mean("pipeline_bubble_pct")) else mean("bubble_pct")
        if not _finite(bubble) or bubble < BUBBLE_MIN_PCT:
            continue
        sched, imb, wait = (mean("schedule_bubble_pct"), mean("imbalance_pct"), mean("comm_wait_pct")) if have_split else (None,) * 3
        if not _finite(sched, imb, wait):
            theory, ideal = mean("theory_pct"), mean("ideal_pct")
            if _finite(theory, ideal):
                sched, imb, wait = min(theory, ideal), max(0.0, ideal - theory), bubble - ideal
            elif _finite(ideal):
                sched, imb, wait = ideal, None, bubble - ideal
        schedule, p_ranks, m = rp.select("schedule", "pp_ranks", "microbatches").row(0)
        per_rank = rp.group_by("rank").agg(pl.col("busy_us", "bubble_pct").mean()).sort("busy_us", descending=True)
        actions = a.pipeline_actions.filter(pl.col("run").cast(pl.String) == run)
        text = f"The pipeline is idle {pct(bubble)} of its window (mean over {plural(per_rank.height, 'rank')})"
        parts = []
        if _finite(sched):
            what = f"{schedule}'s own bubble" if schedule else "the schedule's own bubble"
            v = rp["stages_per_rank"][0]
            parts.append(f"{pct(sched)} is {what}" + (f" (p={p_ranks}, m={m}" + (f", v={v}" if v and v > 1 else "") + ")"
                                                       if p_ranks and m else ""))
        if _finite(imb):
            parts.append(f"{pct(imb)} stage imbalance")
        if _finite(wait):
            parts.append(f"{pct(max(0.0, wait))} waiting for communication")
        if parts:
            text += ": " + ", ".join(parts)
        if (slowest := slowest_over_steps(rp)) is not None:
            # the stage most often the slowest over the steps (as the report's table), and its rank
            stage, ratio = slowest
            holders = actions.filter(pl.col("stage") == stage)["rank"].unique().sort().to_list()
            slow_rank = holders[0] if holders else None
            text += (f"; the slowest stage is stage {stage}" + (f" (rank {slow_rank})" if slow_rank is not None else "")
                     + f", {num(ratio)}× the mean stage's compute.")
            where = f"stage {stage}"
        else:
            slow_rank, slow_busy, _ = per_rank.row(0)
            fast_busy = per_rank["busy_us"].min()
            stages = ", ".join(map(str, sorted(set(actions.filter(pl.col("rank") == slow_rank)["stage"].to_list()))))
            text += (f"; the slowest stage is rank {slow_rank} (stage {stages}), busy {ms(slow_busy)} per step"
                     + (f", {num(slow_busy / fast_busy)}× the least busy rank" if fast_busy and fast_busy > 0 else "") + ".")
            where = f"rank {slow_rank}'s stage"
        evidence = f"run {run}, {steps_text(rp['step'].unique().sort().to_list())}; bubble per rank: " + ", ".join(
            f"rank {r} {pct(bp)}" for r, _, bp in per_rank.sort("rank").iter_rows())
        remedies = {
            "schedule": _schedule_change(schedule, p_ranks, m, rp["stages_per_rank"][0]),
            "imbalance": f"move layers off {where}: a pipeline runs at the pace of its slowest stage",
            "comm": "overlap the stage-boundary sends and receives with compute (post irecv early, batch_isend_irecv), "
                    "or put pipeline neighbours on the fastest link",
        }
        if _cpu_run(a, run):  # gloo ranks as processes: no link to speak of, and cores shared with the neighbour
            remedies["comm"] = ("on CPU ranks this wait is mostly for the neighbouring rank (processes sharing cores, "
                                "gloo's own latency), not a link's bandwidth: measure on the target devices before "
                                "acting on it")
        # Every part worth acting on, largest first (at least the largest).
        ranked = sorted([(v, k) for k, v in (("schedule", sched), ("imbalance", imb), ("comm", wait)) if _finite(v)], reverse=True)
        chosen = [k for i, (v, k) in enumerate(ranked) if i == 0 or v >= BUBBLE_PART_MIN_PCT] or ["schedule"]
        change = "; then ".join(remedies[k] for k in chosen)
        out.append(_row("pipeline-bubble", run, slow_rank, bubble, text, evidence, change))
    return out


def _device_word(a: "Analysis", run: str, rank: int) -> str:
    """textfmt.device_word of a rank's device_kind (fakes without the column: "GPU")."""
    r = a.ranks.filter((pl.col("run").cast(pl.String) == run) & (pl.col("rank") == rank)) if "device_kind" in a.ranks.columns else None
    return device_word(r["device_kind"][0] if r is not None and r.height else None)


def _cpu_run(a: "Analysis", run: str) -> bool:
    """Whether every rank of `run` ran on the CPU (device_kind cpu: gloo ranks as processes)."""
    kinds = a.ranks.filter(pl.col("run").cast(pl.String) == run)["device_kind"] if "device_kind" in a.ranks.columns else None
    return kinds is not None and kinds.len() > 0 and (kinds == "cpu").all()


# The textbook bubble's formula by schedule (profiler.pipeline.schedule_theory_pct computes it).
BUBBLE_FORMULA = {"gpipe": "(p−1)/(m+p−1)", "1f1b": "(p−1)/(m+p−1)", "interleaved-1f1b": "(p−1)/(v·m+p−1)"}


def _schedule_change(schedule: str | None, p: int | None, m: int | None, v: int | None) -> str:
    """More microbatches, with the schedule's textbook bubble (a share of an ideal pipeline's time, not of
    the measured window) at m and 2m, and the schedules that cut it: never the one in use."""
    v = v or 1
    theory = lambda mb, vv=v: schedule_theory_pct(schedule, p, mb, vv, {}) if p and mb else None  # noqa: E731
    change = "raise the microbatch count"
    if schedule in BUBBLE_FORMULA and _finite(theory(m), theory(2 * m)):
        change += (f": {schedule}'s textbook bubble {BUBBLE_FORMULA[schedule]}, a share of an ideal pipeline's time (no "
                   f"imbalance, no communication), is {pct(theory(m))} at m={m}, {pct(theory(2 * m))} at m={2 * m}")
    if schedule == "interleaved-1f1b":
        more_v = theory(m, v + 1)
        return change + (f"; or more stages per rank: {pct(more_v)} at v={v + 1}" if _finite(more_v) else "") + "; or a zero-bubble schedule"
    if schedule in ("gpipe", "1f1b") or schedule is None:
        return change + "; or an interleaved (v > 1 stages per rank) or zero-bubble schedule"
    return change  # already a zero-bubble kind of schedule (zero-bubble, zbv, dualpipev)


# ---------------------------------------------------------------------------------------------
# 9. The device idle: it waits on the host


def idle_rule(a: "Analysis") -> list[Row]:
    """A GPU with nothing to run for a large share of the window: the step is bound by the host."""
    b = _str_run(a.breakdown)
    if b is None or b.is_empty() or "device" not in b.columns:
        return []
    # CPU accounting (gloo ranks) has no device to leave idle: its "idle" is the host's own gaps.
    b = b.filter((pl.col("device") == "gpu") & (pl.col("window_us") > 0) & pl.col("idle_us").is_finite())
    # A device active in under 3/4 of its steps (report.late_devices): the time before its first
    # work or after its last is the host's too, so the share is of the steps' span, not the window.
    late = getattr(a, "late_devices", None)
    late = (late.select(pl.col("run").cast(pl.String), pl.col("rank").cast(b.schema["rank"]), "span_us")
            if late is not None and late.height else pl.DataFrame(schema={"run": pl.String, "rank": b.schema["rank"], "span_us": pl.Float64}))
    b = (b.join(late, on=["run", "rank"], how="left")
         .with_columns(outside_us=(pl.col("span_us") - pl.col("window_us")).fill_null(0.0).clip(0.0),
                       of_us=pl.coalesce("span_us", "window_us"))
         .with_columns(share_pct=100 * (pl.col("idle_us") + pl.col("outside_us")) / pl.col("of_us")))
    out = []
    for run in b["run"].unique(maintain_order=True).to_list():
        rb = b.filter(pl.col("run") == run).sort("share_pct", "rank", descending=[True, False])  # ties: the lowest rank
        rank, share, idle_us, win_us, outside_us, of_us = rb.select("rank", "share_pct", "idle_us", "window_us", "outside_us",
                                                                    "of_us").row(0)
        if not _finite(share) or share < IDLE_MIN_PCT:
            continue
        top = _str_run(a.top_operators)
        ops = (top.filter((pl.col("run") == run) & (pl.col("rank") == rank)).sort("self_us", descending=True).head(3)
               if top is not None and "self_us" in top.columns else None)
        device = _device_word(a, run, rank)
        if outside_us > 0:
            text = (f"The {device} of rank {rank} has nothing to run for {pct(share)} of its profiled steps "
                    f"({ms(idle_us + outside_us)} of {ms(of_us)}: {ms(outside_us)} before its first work or after its last, "
                    f"{ms(idle_us)} between): the step waits on the host")
        else:
            text = (f"The {device} of rank {rank} has nothing to run for {pct(share)} of its profiled window "
                    f"({ms(idle_us)} of {ms(win_us)}): the step waits on the host")
        evidence = f"run {run}, rank {rank}" + worst_of(rb["share_pct"])
        if ops is not None and ops.height:
            evidence += "; top CPU operators by self time: " + ", ".join(
                f"{name} {ms(us)}" for name, us in ops.select("name", "self_us").iter_rows())
        change = ("find what the host does between kernels (the top CPU operators above, the trace's gaps): data "
                  "loading (more DataLoader workers, pin_memory, prefetch), Python overhead and many small kernels "
                  "(CUDA graphs, torch.compile, larger batches), synchronisations (.item(), .cpu(), prints) in the step")
        out.append(_row("idle", run, rank, share, text + ".", evidence, change))
    return out


RULES: dict[str, Callable[["Analysis"], list[Row]]] = {
    "exposed-comm": exposed_comm_rule,
    "pipeline-bubble": pipeline_bubble_rule,
    "persistent-memory": persistent_memory_rule,
    "straggler": straggler_rule,
    "comm-volume": comm_volume_rule,
    "bandwidth": bandwidth_rule,
    "activation-memory": activation_memory_rule,
    "idle": idle_rule,
    "outlier": outlier_rule,
    "comparison": comparison_rule,
    "recompute": recompute_rule,
    "recompute-comparison": recompute_comparison_rule,
}

"""All analyses of a set of traces, as frames (`analyze`) and as the JSON report (`build_report`,
schema in docs/report.md); the text report is profiler.text. No I/O here: the CLI writes.
"""

from __future__ import annotations

import dataclasses
import re

import polars as pl

from profiler.activity import ACTIVITY_COLUMNS
from profiler.collectives import GLOO_P2P_NOTE, collective_skew, collective_stats, stragglers, unpaired_group_runs
from profiler.discover import manifest_field, model_of
from profiler.errors import collapsed_problems
from profiler.load import Traces
from profiler.memory import CURVE_COLUMNS, persistent_memory
from profiler.damaged import DAMAGED
from profiler.intervals import union
from profiler.pipeline import pipeline_grid, pipeline_summary
from profiler.rankmap import analyze_rank
from profiler.steps import CUT_TAIL_PCT, NO_STEP, step_time_stats
from profiler.recompute import RECOMPUTE_COLUMNS, with_compute, with_prediction
from profiler.alphabeta import alpha_beta_predict, fit_alpha_beta
from profiler.findings import FINDING_COLUMNS, findings
from profiler.findings_base import incomplete_runs
from profiler.theory import predict_comm
from profiler.theory_check import theory_check
from profiler.textfmt import device_word, fmt_pct, fmt_time
from profiler.theory_memory import activation_peak, memory_notes, memory_whatif, predict_memory

REPORT_SCHEMA = "ptprof.report/1"
RANK_METRICS = ["window_us", "compute_us", "non_compute_us", "idle_us", "comm_us", "overlap_us", "exposed_comm_us", "overlap_pct"]


@dataclasses.dataclass(frozen=True)
class Analysis:
    """Every analysis of one load, as tidy frames with run and rank columns."""

    ranks: pl.DataFrame  # Traces.ranks
    runs: dict[str, dict | None]
    steps: pl.DataFrame
    step_stats: pl.DataFrame
    breakdown: pl.DataFrame  # per rank (over the selected steps)
    breakdown_steps: pl.DataFrame  # per rank and step
    collectives: pl.DataFrame
    exposed: pl.DataFrame  # exposed communication per (rank, step, collective, phase): profiler/exposed.py
    collective_stats: pl.DataFrame
    skew: pl.DataFrame
    stragglers: pl.DataFrame
    memory_peaks: pl.DataFrame
    persistent_memory: pl.DataFrame
    pipeline: pl.DataFrame | None  # per rank and step; None without pipeline action spans
    pipeline_grid: pl.DataFrame | None  # per rank and step: the order its actions ran in
    pipeline_actions: pl.DataFrame  # one row per pipeline action span (profiler.pipeline_actions); empty without
    top_operators: pl.DataFrame
    top_kernels: pl.DataFrame
    warnings: list[str]
    problems: list[str]
    # Theory beside measurement (issue 13): profiler/theory.py, theory_memory.py, alphabeta.py.
    theory_comm: pl.DataFrame  # predicted communication per rank, dim, phase and collective
    theory_memory: pl.DataFrame  # predicted persistent memory per rank
    memory_whatif: pl.DataFrame  # the same model under each ZeRO stage
    theory_check: pl.DataFrame  # predicted beside measured, with a verdict
    alpha_beta: pl.DataFrame  # α and β fitted per (backend, collective, group size)
    alpha_beta_calls: pl.DataFrame  # each collective call's α + n/β beside its measured time
    activation: pl.DataFrame  # the activation share of each rank's memory peak (theory_memory.activation_peak)
    findings: pl.DataFrame  # profiler/findings.py, ranked; filled in last (the rules read the rest)
    # allocated bytes over time, ≤ 64 buckets per (rank, device): the sparklines of the text report
    memory_curve: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=CURVE_COLUMNS))
    # per rank and step of runs with ptprof/recompute spans: forward, recompute, backward time (profiler/recompute.py)
    recompute: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=RECOMPUTE_COLUMNS))
    # busy share per (rank, lane, category) in time bins of each rank's window (profiler/activity.py): the viewer's lanes at scale
    activity: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=ACTIVITY_COLUMNS))
    # GPU ranks active in under 3/4 of their steps (late_devices): the idle finding counts the rest as the host's
    late_devices: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=LATE_DEVICE_COLUMNS))
    # {run: (ranks loaded, world size)} of runs missing a rank (findings_base.incomplete_runs); {} under --rank
    missing_ranks: dict = dataclasses.field(default_factory=dict)
    # (run, rank, step) of each rank's last step cut short (cut_steps): its later events are missing,
    # so a collective absent from it is not "in some steps only"
    cut_steps: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=CUT_STEP_COLUMNS))
    # `problems` as the text report shows them: each kind's first files, the rest counted (errors.collapsed_problems)
    skipped: list[str] = dataclasses.field(default_factory=list)


def analyze(traces: Traces, *, rank: int | None = None, step: int | None = None, top_n: int = 15) -> Analysis:
    """`profiler.analyze` (api.py). The per-rank analyses come from the summaries the map made
    where each file was parsed (`rank_summaries`; made again here, one rank at a time, only for
    other options); the rest is the reduce over them: this process never holds the events of all
    ranks."""
    ranks = traces.ranks
    if rank is not None:
        ranks = ranks.filter(pl.col("rank") == rank)
        if ranks.is_empty():
            skipped = [p for p in traces.problems if p.problem.startswith((f"rank {rank}:", f"rank {rank}, "))
                       or re.match(rf"ranks (\d+, )*{rank}(, \d+)*:", p.problem)]
            why = f"; its file was skipped: {skipped[0]}" if skipped else ""
            raise ValueError(f"rank {rank} is not in the traces (ranks there: {_spans(sorted(set(traces.ranks['rank'])))}){why}")
    per_rank = rank_summaries(traces, ranks, rank=rank, step=step, top_n=top_n)
    # --step S: a rank without step S is left out (and named); no rank with it is an error.
    have_step = [r for r in per_rank if "breakdown" in r]
    if not have_step:
        have = sorted(set(pl.concat([r["all_steps"] for r in per_rank])["step"]))
        empty = [r["empty_steps"] for r in per_rank if "empty_steps" in r]
        if empty and step in set(pl.concat(empty)["step"]):
            raise ValueError(f"step {step} holds no CPU event (the step prof.step() opens after the loop's last iteration: "
                             f"left out of the steps); steps there: {', '.join(map(str, have)) or 'none'}")
        raise ValueError(f"step {step} is not in the traces (steps there: {', '.join(map(str, have)) or 'none'})")
    missing = [r["all_steps"] for r in per_rank if "breakdown" not in r]
    out = {k: _concat([r[k] for r in have_step]) for k in have_step[0]}
    steps = out["steps"]
    colls, actions = out["collectives"], out["actions"]
    pipeline = pipeline_summary(actions, traces.runs, steps=steps)
    unpaired = unpaired_group_runs(ranks)
    skew = collective_skew(colls.filter(~(pl.col("group").is_null() & pl.col("run").cast(pl.String).is_in(unpaired))))
    warnings = list(traces.notes)  # the load's own (cache unusable, a folder split into its jobs, rank 0 assumed)
    warnings += [f"run {run}: its collectives name no process group (gloo records none) while its ranks are in "
                 "several process groups of different ranks (distributedInfo.pg_config), so the k-th call of two ranks may be two "
                 "groups' collectives: no skew or stragglers for them" for run in unpaired
                 if colls.filter((pl.col("run").cast(pl.String) == run) & pl.col("group").is_null()).height]
    if rank is not None:  # a run without rank R drops out of every table: said, as a missing step is
        lacking = [r for r in traces.ranks["run"].cast(pl.String).unique(maintain_order=True).to_list()
                   if r not in set(ranks["run"].cast(pl.String))]
        warnings += [f"--rank {rank}: run{'s' if len(lacking) > 1 else ''} {', '.join(lacking)} "
                     f"{'have' if len(lacking) > 1 else 'has'} no rank {rank}; left out"] if lacking else []
    warnings += [
        f"run {run} rank {r}: no ProfilerStep spans; the whole trace is one window (step {NO_STEP})"
        for run, r in steps.filter(~pl.col("has_profiler_steps")).select("run", "rank").iter_rows()
    ]
    warnings += [f"run {f['run'][0]} rank {f['rank'][0]}: no step {step} (its steps: {', '.join(map(str, f['step']))}); left out"
                 for f in missing if f.height]
    for run, r, has_gpu, backend in ranks.select("run", "rank", "has_gpu", "backend").iter_rows():
        if backend == "nccl" and not has_gpu:
            warnings.append(f"run {run} rank {r}: an NCCL job's trace with no GPU activity; "
                            "breakdown and collectives use CPU events only")
    warnings += [
        f"run {run} rank {r}: one process driving {n} GPUs (torch.nn.DataParallel); the per-GPU breakdown of a "
        "multi-GPU process is not supported yet: no time breakdown, overlap or exposed communication for it "
        "(its operators, kernels, collectives and memory per GPU are shown)"
        for run, r, n in out["multi_gpu"].iter_rows()
    ]
    warnings += dropped_warnings(ranks)
    warnings += cut_trace_warnings(out.get("step_tails"), ranks)
    late = late_devices(out.get("breakdown"), out.get("steps"), out.get("step_tails"), ranks)
    warnings += late_device_warnings(late)
    warnings += empty_step_warnings(_concat([r["empty_steps"] for r in per_rank if "empty_steps" in r]) if per_rank else None)
    warnings += missing_rank_warnings(ranks) if rank is None else []
    warnings += memory_notes({r: m for r, m in traces.runs.items() if r in set(ranks["run"].cast(pl.String))})
    # Never a silent CPU accounting of a device's activity: categories no rule knows are named.
    unknown = ranks.filter(pl.col("unknown_categories").is_not_null()).select("run", "rank", "unknown_categories")
    for run, r, cats in unknown.iter_rows():
        warnings.append(f"run {run} rank {r}: events of categories ptprof does not know, counted as CPU operators: {cats}; "
                        "if they are a device's activity, that device is not supported (its time is not device time here)")
    # Each note of the collectives once (gloo's reduce-scatter run as an all-reduce): not gloo's
    # send / recv, whose missing bandwidth the Collectives table says beside it (and each row's note).
    warnings += colls.filter(pl.col("note").is_not_null() & (pl.col("note") != GLOO_P2P_NOTE))["note"].unique(maintain_order=True).to_list()
    analysis = Analysis(
        ranks=ranks,
        missing_ranks={} if rank is not None else incomplete_runs(ranks),
        runs=traces.runs,
        steps=steps,
        step_stats=step_time_stats(steps),
        breakdown=out["breakdown"],
        breakdown_steps=out["breakdown_steps"],
        collectives=colls,
        exposed=out["exposed"],
        collective_stats=collective_stats(colls),
        skew=skew,
        stragglers=stragglers(skew),
        memory_peaks=out["memory_peaks"],
        memory_curve=out["memory_curve"],
        **({"activity": out["activity"]} if "activity" in out else {}),  # loaded with MapOptions(activity=True)
        recompute=with_compute(with_prediction(out["recompute"], traces.runs), out["exposed"]),
        persistent_memory=persistent_memory(traces.runs).join(ranks.select("run", "rank"), on=["run", "rank"], how="semi"),
        late_devices=late,
        cut_steps=cut_steps(out.get("step_tails")),
        pipeline=pipeline,
        pipeline_grid=pipeline_grid(actions) if pipeline is not None else None,
        pipeline_actions=actions,
        top_operators=out["top_operators"],
        top_kernels=out["top_kernels"],
        warnings=warnings,
        problems=[str(p) for p in traces.problems],
        skipped=collapsed_problems(traces.problems),
        **_theory(traces.runs, ranks, colls, out["memory_peaks"]),
    )
    analysis.warnings.extend(comparison_warnings(analysis))
    # Last: the rules read every other analysis (and the comparison warning above).
    analysis = dataclasses.replace(analysis, findings=findings(analysis))
    return analysis


def _theory(runs: dict[str, dict | None], ranks: pl.DataFrame, colls: pl.DataFrame, peaks: pl.DataFrame) -> dict:
    # Predictions for the runs (and ranks) loaded; foreign traces have no run.json and get none.
    keep = ranks.select(pl.col("run").cast(pl.String), "rank")
    comm = predict_comm(runs).join(keep, on=["run", "rank"], how="semi")
    memory = predict_memory(runs).join(keep, on=["run", "rank"], how="semi")
    persistent = persistent_memory(runs).with_columns(pl.col("run").cast(pl.String)).join(keep, on=["run", "rank"], how="semi")
    # The fastest call of each size: a call that waited for a late peer says nothing about the link.
    fits = fit_alpha_beta(colls, ranks, fastest_per_size=True)
    return {
        "theory_comm": comm,
        "theory_memory": memory,
        "memory_whatif": memory_whatif(runs).join(keep.select("run").unique(), on="run", how="semi"),
        "theory_check": theory_check(runs, comm, colls, memory, persistent),
        "alpha_beta": fits,
        "alpha_beta_calls": alpha_beta_predict(colls, ranks, fits),
        "activation": activation_peak(peaks, memory, runs),
        "findings": pl.DataFrame(schema=FINDING_COLUMNS),
    }


def missing_rank_warnings(ranks: pl.DataFrame) -> list[str]:
    """Per run, a warning where the ranks loaded do not fit its traces' world size (distributedInfo):
    fewer (at scale an incomplete folder is the usual case, and skew, stragglers and groups then
    cover only the ranks that are there), or ranks at or past it (ranks taken from file names,
    --rank-from-filename, over copies or files of several jobs: then no single job is described)."""
    out, incomplete = [], incomplete_runs(ranks)
    for run, have, world in ranks.group_by("run", maintain_order=True).agg(
            have=pl.col("rank").unique().sort(), world=pl.col("world_size").max()).iter_rows():
        if world is None:
            continue
        if beyond := [r for r in have if r >= world]:
            out.append(f"run {run}: {len(beyond):,} of the {len(have):,} ranks loaded ({_spans(beyond)}) are at or past "
                       f"its traces' world size, {world:,}: ranks from file names over copies or several jobs' files? "
                       "cross-rank numbers treat them as one job")
        if str(run) not in incomplete:  # (a world of 4 with ranks 0, 1, 2, 7 still misses rank 3)
            continue
        missing = sorted(set(range(world)) - set(have))
        out.append(f"run {run}: {len(have) - len(beyond):,} of {world:,} ranks loaded (its traces' world size); missing "
                   f"{_spans(missing)}: cross-rank numbers (skew, stragglers, groups) cover the loaded ranks only")
    return out


def _spans(ranks: list[int], most: int = 6) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (at most `most` spans, then how many more)."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:most]]
    return ", ".join(text) + (f" and {len(spans) - most:,} more spans" if len(spans) > most else "")


CUT_STEP_COLUMNS = {"run": pl.String, "rank": pl.Int32, "step": pl.Int64}


def cut_steps(tails: pl.DataFrame | None) -> pl.DataFrame:
    """(run, rank, step) of each rank's last step that runs on past the trace's last event by more
    than CUT_TAIL_PCT of the step: the steps cut_trace_warnings names."""
    if tails is None or tails.is_empty():
        return pl.DataFrame(schema=CUT_STEP_COLUMNS)
    return tails.filter(_cut()).select("run", "rank", "step").cast(CUT_STEP_COLUMNS)


def _cut() -> pl.Expr:
    """Whether a step_tails row is a step cut short: its tail past CUT_TAIL_PCT of the step (one test
    for cut_steps, the cut-trace warning and the late devices)."""
    return pl.col("tail_us") > CUT_TAIL_PCT / 100 * pl.col("dur_us")


def cut_trace_warnings(tails: pl.DataFrame | None, ranks: pl.DataFrame) -> list[str]:
    """One warning per run whose ranks' last step runs on past the trace's last event by more than
    CUT_TAIL_PCT of the step (steps.step_tails): a trace cut short. The step time (the span's)
    counts that time; a GPU rank's profiled window (first to last GPU activity) does not, so a step
    can outlast it, and a CPU rank's breakdown (window = the step span) counts it as idle. Names the
    ranks and the largest tail, with its rank, step and share of the step."""
    if tails is None or tails.is_empty():
        return []
    cut = (tails.filter(_cut())
           .join(ranks.select("run", "rank", "has_gpu"), on=["run", "rank"], how="left"))
    out = []
    for (run,), f in cut.group_by("run", maintain_order=True):
        worst = f.sort(["tail_us", "rank"], descending=[True, False]).row(0, named=True)
        lo, hi = f["tail_us"].min(), worst["tail_us"]
        who = f"rank {worst['rank']}" if f.height == 1 else f"{f.height:,} ranks ({_spans(sorted(f['rank'].to_list()))})"
        by = fmt_time(hi) if fmt_time(lo) == fmt_time(hi) else f"{fmt_time(lo)}–{fmt_time(hi)}"
        where = "" if f.height == 1 else f"most on rank {worst['rank']}: "
        gpu = f["has_gpu"].fill_null(False)
        so = (["the profiled window (first to last GPU activity) does not, so a step can outlast it"] if gpu.any() else []) + (
            ["a CPU rank's breakdown counts it as idle"] if not gpu.all() else [])
        out.append(f"run {run}: the trace of {who} ends {by} before its last step does ({where}step {worst['step']}, "
                   f"{fmt_pct(100 * hi / worst['dur_us'])} of its {fmt_time(worst['dur_us'])} with no event): the trace "
                   f"was cut short, or the step's end not traced. Step times count that time; {'; '.join(so)}")
    return out


WINDOW_COVER_MIN_PCT = 75.0  # a GPU rank's window under this share of its steps' span: warned


LATE_DEVICE_COLUMNS = {"run": pl.String, "rank": pl.Int32, "window_us": pl.Float64, "idle_us": pl.Float64,
                       "span_us": pl.Float64, "cover_pct": pl.Float64, "stepped": pl.Boolean, "device_kind": pl.String}


def late_devices(breakdown: pl.DataFrame | None, steps: pl.DataFrame | None, tails: pl.DataFrame | None,
                 ranks: pl.DataFrame) -> pl.DataFrame:
    """The GPU ranks whose profiled window (HTA's: first to last GPU activity) covers under
    WINDOW_COVER_MIN_PCT % of their profiled steps' span (`span_us`, `cover_pct`): the device
    started late in the steps or stopped early, and its idle time, counted inside the window only,
    leaves out the rest (a trace whose kernels start 269 ms into a 391 ms step read 1.41 ms idle).
    A rank whose trace was cut short is left out: cut_trace_warnings says its steps outrun its
    events, which is no host's doing."""
    if breakdown is None or breakdown.is_empty() or steps is None or steps.is_empty() or "device" not in breakdown.columns:
        return pl.DataFrame(schema=LATE_DEVICE_COLUMNS)
    span = steps.group_by("run", "rank").agg(span_us=pl.col("dur_us").sum(), stepped=pl.col("has_profiler_steps").all())
    short = (breakdown.filter(pl.col("device") == "gpu").join(span, on=["run", "rank"])
             .filter(pl.col("window_us") < WINDOW_COVER_MIN_PCT / 100 * pl.col("span_us"))
             .with_columns(cover_pct=100 * pl.col("window_us") / pl.col("span_us"))
             .join(ranks.select("run", "rank", "device_kind"), on=["run", "rank"], how="left"))
    if tails is not None and tails.height:
        short = short.join(tails.filter(_cut()).select("run", "rank"), on=["run", "rank"], how="anti")
    return short.select(pl.col(c).cast(t) for c, t in LATE_DEVICE_COLUMNS.items())


def late_device_warnings(late: pl.DataFrame) -> list[str]:
    """One warning per run of `late_devices`' ranks, naming them and the one covered least."""
    out = []
    for (run,), f in late.group_by("run", maintain_order=True):
        w = f.sort(["cover_pct", "rank"]).row(0, named=True)
        device = device_word(w["device_kind"])
        who = f"rank {w['rank']}" if f.height == 1 else f"{f.height:,} ranks ({_spans(sorted(f['rank'].to_list()))}; least on rank {w['rank']})"
        of = "of profiled steps" if w["stepped"] else "of trace (no ProfilerStep: one window)"
        out.append(f"run {run}: the {device} of {who} was active, first to last, in {fmt_time(w['window_us'])} of its "
                   f"{fmt_time(w['span_us'])} {of} ({fmt_pct(w['cover_pct'])}): HTA's window, which the breakdown "
                   f"uses, runs from the first to the last {device} activity, so its idle ({fmt_time(w['idle_us'])}) leaves "
                   f"out the {fmt_time(w['span_us'] - w['window_us'])} before the {device}'s first work or after its last, "
                   "when the host ran alone")
    return out


def empty_step_warnings(empty: pl.DataFrame | None) -> list[str]:
    """One warning per run whose ranks' last ProfilerStep holds nothing (steps.empty_last_steps):
    left out of the steps, so the step times and windows are those of the steps that ran."""
    if empty is None or empty.is_empty() or "step" not in empty.columns:
        return []
    out = []
    for (run,), f in empty.group_by("run", maintain_order=True):
        f = f.sort("rank")
        who = f"rank {f['rank'][0]}" if f.height == 1 else f"{f.height:,} ranks ({_spans(f['rank'].to_list())})"
        steps = sorted(set(f["step"]))
        longest = f["dur_us"].max()
        out.append(f"run {run}: the last ProfilerStep of {who} holds no CPU event (step {', '.join(map(str, steps))}, "
                   f"{'0 µs long' if not longest else f'at most {fmt_time(longest)} long'}): the step prof.step() opens "
                   "after the loop's last iteration; left out of the step times and windows")
    return out


def dropped_warnings(ranks: pl.DataFrame) -> list[str]:
    """One warning per trace file that had events with impossible values (dropped, so the numbers
    cover the rest): how many, and why (profiler.damaged.DAMAGED)."""
    out = []
    for run, r, file, dropped in ranks.select("run", "rank", "file", "dropped").iter_rows():
        why = [f"{n:,} {DAMAGED[k]}" for k, n in (dropped or {}).items() if n]
        if why:
            n = sum(dropped.values())
            out.append(f"run {run} rank {r}: dropped {n:,} event{'s' if n != 1 else ''} with impossible values "
                       f"from {file}: {'; '.join(why)}")
    return out


def rank_summaries(traces: Traces, ranks: pl.DataFrame, *, rank: int | None, step: int | None,
                   top_n: int) -> list[dict[str, pl.DataFrame]]:
    """Each loaded (run, rank)'s per-rank analyses: the summaries made where it was parsed
    (rankmap.py) when they were made with these options, else made again here from its events,
    one rank in memory at a time."""
    same = (traces.options.step, traces.options.top_n) == (step, top_n)
    out = []
    for part in traces.parts:
        if rank is not None and part.rank != rank:
            continue
        if part.frames is not None and same:
            out.append(part.frames)
        else:
            out.append(analyze_rank(part.events(), ranks, traces.runs, step=step, top_n=top_n,
                                    with_activity=traces.options.activity))
    return out


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    # Per-rank results: an empty part may lack columns or have null-typed ones.
    full = [f for f in frames if f.width]
    return pl.concat(full, how="diagonal_relaxed") if full else frames[0]


# ---------------------------------------------------------------------------------------------
# JSON


def _records(frame: pl.DataFrame | None, drop: tuple[str, ...] = ()) -> list[dict]:
    if frame is None:
        return []
    frame = frame.drop([c for c in drop if c in frame.columns])
    return _finite(frame.with_columns(pl.col(pl.Categorical).cast(pl.String))).to_dicts()


def _finite(frame: pl.DataFrame) -> pl.DataFrame:
    """NaN and inf as null: they are not JSON, and a number is right or it is absent (in polars, not per value)."""
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    return frame.with_columns(pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c) for c in floats) if floats else frame


def build_report(a: Analysis) -> dict:
    """The JSON report (docs/report.md), schema "ptprof.report/1"."""
    runs = []
    for run in a.ranks["run"].cast(pl.String).unique(maintain_order=True):
        sel = pl.col("run") == run
        manifest = a.runs.get(run)
        per_rank = a.breakdown.filter(sel).join(a.step_stats.filter(sel).drop("has_profiler_steps"), on=["run", "rank"], how="left")
        per_rank = per_rank.join(
            a.memory_peaks.filter(sel).group_by("run", "rank").agg(peak_allocated_bytes=pl.col("peak_allocated_bytes").max()),
            on=["run", "rank"], how="left",
        )
        runs.append({
            "run": run,
            "paradigm": manifest_field(manifest, "paradigm"),
            "model": model_of(manifest),
            "world_size": manifest_field(manifest, "world_size") or _first(a.ranks.filter(sel)["world_size"]),
            "backend": manifest_field(manifest, "backend") or _first(a.ranks.filter(sel)["backend"]),
            "files": _records(a.ranks.filter(sel).select("rank", "file", "device_kind", "device_name", "has_gpu", "n_events", "dropped")),
            "ranks": _records(per_rank, drop=("run",)),
            "steps": _records(a.breakdown_steps.filter(sel), drop=("run",)),
            "collectives": _records(a.collective_stats.filter(sel), drop=("run",)),
            "exposed": _records(a.exposed.filter(sel), drop=("run",)),
            "stragglers": _records(a.stragglers.filter(sel), drop=("run",)),
            "pipeline": _records(a.pipeline.filter(sel), drop=("run",)) if a.pipeline is not None and a.pipeline.filter(sel).height else None,
            "pipeline_grid": _records(a.pipeline_grid.filter(sel), drop=("run",)) if a.pipeline_grid is not None and a.pipeline_grid.filter(sel).height else None,
            "memory": {
                "peaks": _records(a.memory_peaks.filter(sel), drop=("run",)),
                "persistent": _records(a.persistent_memory.filter(sel), drop=("run",)),
                "curve": _records(a.memory_curve.filter(sel), drop=("run",)),
            },
            "recompute": _records(a.recompute.filter(sel), drop=("run",)),
            "top_operators": _records(a.top_operators.filter(sel), drop=("run",)),
            "top_kernels": _records(a.top_kernels.filter(sel), drop=("run",)),
            "theory": {
                "communication": _records(a.theory_comm.filter(sel), drop=("run",)),
                "memory": _records(a.theory_memory.filter(sel), drop=("run",)),
                "memory_whatif": _records(a.memory_whatif.filter(sel), drop=("run",)),
                "check": _records(a.theory_check.filter(sel), drop=("run",)),
                "alpha_beta": _records(a.alpha_beta.filter(sel), drop=("run",)),
                "alpha_beta_calls": _records(a.alpha_beta_calls.filter(sel), drop=("run",)),
                "activation": _records(a.activation.filter(sel), drop=("run",)),
            },
            "findings": _records(a.findings.filter(sel), drop=("run",)),
        })
    report = {"schema": REPORT_SCHEMA, "findings": _records(a.findings), "runs": runs, "warnings": a.warnings,
              "problems": a.problems}
    if len(runs) > 1:
        report["comparison"] = _records(compare_runs(a))
    return report


def _first(series: pl.Series):
    return series[0] if series.len() else None


def compare_runs(a: Analysis) -> pl.DataFrame:
    """Side by side: per metric (mean over ranks unless its name says `_max`), one column per run,
    and each run's change from the first run (`<run>_diff_pct`; `<run>_diff_pts` for `_pct` metrics).
    Where a run is a pipeline: its measured bubble and the textbook's for its schedule and shape
    (`bubble_pct`, `bubble_textbook_pct`: means over its pipeline ranks and steps; null for the
    other runs)."""
    ranks = a.breakdown.select("run", "rank")
    b = a.breakdown.group_by("run").agg(pl.col(RANK_METRICS).mean())
    s = a.step_stats.group_by("run").agg(step_mean_us=pl.col("mean_us").mean())
    # Each rank's time in collectives (0 for a rank with none): the union of its calls, as calls in
    # flight together (a ring's isend and irecv) are one stretch of time; then the mean over ranks.
    calls = a.collectives.filter(pl.col("end_us") >= pl.col("start_us")).select("run", "rank", "start_us", "end_us")
    per_rank = (union(calls, ["run", "rank"]).group_by("run", "rank")
                .agg(collective_us=(pl.col("end_us") - pl.col("start_us")).sum()))
    c = (ranks.join(per_rank, on=["run", "rank"], how="left").fill_null(0.0)
         .group_by("run").agg(pl.col("collective_us").mean()))
    # A peak is a high-water mark: the largest over ranks is the one that limits the job.
    m = a.memory_peaks.group_by("run").agg(peak_allocated_bytes_max=pl.col("peak_allocated_bytes").max().cast(pl.Float64))
    wide = b.join(s, on="run", how="left").join(c, on="run", how="left").join(m, on="run", how="left")
    if a.pipeline is not None and a.pipeline.height:  # what a pipeline change is for: its bubble, beside the textbook's
        bubble = a.pipeline.group_by("run").agg(bubble_pct=pl.col("bubble_pct").mean(), bubble_textbook_pct=pl.col("theory_pct").mean())
        wide = wide.join(bubble.with_columns(pl.col("run").cast(wide.schema["run"])), on="run", how="left")
    # Runs in load order, those with a breakdown only: with --step S, a run that lacks step S has
    # ranks but no row to compare (the report says so per run).
    present = set(wide["run"].cast(pl.String).to_list())
    order = [r for r in a.ranks["run"].cast(pl.String).unique(maintain_order=True).to_list() if r in present]
    if not order:
        return pl.DataFrame(schema={"metric": pl.String})
    metrics = [c for c in wide.columns if c != "run"]
    long = wide.with_columns(pl.col("run").cast(pl.String)).unpivot(index="run", on=metrics, variable_name="metric")
    table = long.pivot(on="run", index="metric", values="value").select("metric", *order)
    base = order[0]
    pct = pl.col("metric").str.ends_with("_pct")  # a percentage's change is in points, not a percent of a percent
    return table.with_columns(
        [e for r in order[1:] for e in (
            # from 0 there is no percent change (it would be inf or NaN): null
            pl.when(~pct & (pl.col(base) != 0)).then(100 * (pl.col(r) - pl.col(base)) / pl.col(base).abs())
            .alias(f"{r}_diff_pct"),
            pl.when(pct).then(pl.col(r) - pl.col(base)).alias(f"{r}_diff_pts"))]
    )


def comparison_warnings(a: Analysis) -> list[str]:
    """A warning where the compared runs profiled different numbers of steps (their `_us` totals differ by that)."""
    if a.ranks["run"].n_unique() < 2 or a.step_stats.is_empty():
        return []
    steps = a.step_stats.group_by("run", maintain_order=True).agg(pl.col("n_steps").unique().sort())
    if steps["n_steps"].n_unique() < 2:
        return []
    said = "; ".join(f"{run}: {'/'.join(map(str, n))}" for run, n in steps.iter_rows())
    return [f"the compared runs profiled different numbers of steps ({said}): window_us, compute_us, collective_us "
            "and the other _us totals cover different lengths; compare step_mean_us, or profile the same steps"]

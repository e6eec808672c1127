"""Frames for the Compare page, from loaded runs (viewer.data's RunData): one tidy frame per
figure (viewer.figures), the findings and the theory check. Split from viewer/data.py at this
seam: data.py finds, loads and caches runs; this module turns several of them into what the
cards draw (scale_data.py does the same for runs drawn as groups)."""

from __future__ import annotations

import dataclasses
import logging

import polars as pl

from profiler import findings as profiler_findings
from profiler import ideal_orders
from profiler.pipeline import positive_int, schedule_theory_pct
from profiler.report import Analysis, comparison_warnings

from viewer import aggregate
from viewer.data import RunData

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Frames for the Compare page: several runs, one tidy frame per figure (viewer.figures)


def _ok(runs: list[RunData]) -> list[RunData]:
    return [d for d in runs if d.ok]


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [f.with_columns(pl.col("run").cast(pl.String)) for f in frames if f is not None and f.height]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame(schema={"run": pl.String})


def timeline_segments(runs: list[RunData], x_range: tuple[float, float] | None = None) -> pl.DataFrame:
    """The timeline's segments of every run over one shared x range (ms; None = all of every run)."""
    parts = [d.timeline() for d in _ok(runs)]
    if not parts:
        return pl.DataFrame(schema={"run": pl.String})
    if x_range is None:
        spans = [aggregate.extent(iv) for iv, _ in parts if iv.height]
        x_range = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0.0, 1.0)
    return _concat([aggregate.visible_timeline(iv, merged, x_range) for iv, merged in parts if iv.height])


def breakdown_frame(runs: list[RunData]) -> pl.DataFrame:
    return _concat([d.relabel(d.analysis.breakdown) for d in _ok(runs)])


def steps_frame(runs: list[RunData]) -> pl.DataFrame:
    return _concat([d.relabel(d.analysis.steps) for d in _ok(runs)])


def persistent_frame(runs: list[RunData]) -> pl.DataFrame:
    return _concat([d.relabel(d.analysis.persistent_memory) for d in _ok(runs)])


def collectives_frames(runs: list[RunData]) -> tuple[pl.DataFrame, pl.DataFrame]:
    ok = _ok(runs)
    return (_concat([d.relabel(d.analysis.collective_stats) for d in ok]), _concat([d.relabel(d.analysis.skew) for d in ok]))


def memory_frames(runs: list[RunData], max_points: int = 800) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(curves, peaks): allocated bytes over time per rank (decimated, ms from the run's origin)
    and the profiler's peaks."""
    curves, peaks = [], []
    for d in _ok(runs):
        tl = d.memory()
        if tl.is_empty():
            continue
        origin = d.origin_us()
        curve = tl.select("run", "rank", "mem_device", "allocated_bytes", t_ms=(pl.col("ts_us") - origin) / 1e3)
        curves.append(d.relabel(aggregate.decimate_curve(curve, by=["run", "rank", "mem_device"], x="t_ms", y="allocated_bytes",
                                                         max_points=max_points)))
        peaks.append(d.relabel(d.analysis.memory_peaks.with_columns(peak_t_ms=(pl.col("peak_ts_us") - origin) / 1e3)))
    return _concat(curves), _concat(peaks)


def pipeline_ranks(d: RunData) -> list[int] | None:
    """The ranks the pipeline card draws of a run: all (None) up to SCALE_RANKS ranks, else one
    pipeline: the lowest rank of each stage (group)."""
    if not d.at_scale:
        return None
    return d.groups().group_by("group").agg(pl.col("rank").min())["rank"].sort().to_list()


def pipeline_frames(runs: list[RunData]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(actions, ideal, summary) for the pipeline grid.

    actions: the profiler's pipeline actions of each run's last profiled step, ms from that step's
    start. ideal: run.json's `pipeline.ideal_order` on the global ranks (profiler.ideal_orders), one
    slot per action. summary: per run, the profiler's measured bubble and theory (means over
    ranks); where nothing was measured, the schedule's textbook bubble from run.json's shape (None
    without one, or when the shape is missing or not positive integers).
    """
    acts, summary = [], []
    ideal = _concat([ideal_orders({d.run_id: d.manifest for d in _ok(runs)})])  # pp coordinates -> global ranks (hybrid runs)
    shown = {d.run_id: pipeline_ranks(d) for d in _ok(runs)}
    cut = [r for r, keep in shown.items() if keep is not None]
    if ideal.height and cut:
        kept = pl.DataFrame([(r, k) for r in cut for k in shown[r]], schema={"run": pl.String, "rank": ideal.schema["rank"]}, orient="row")
        ideal = pl.concat([ideal.filter(~pl.col("run").is_in(cut)), ideal.join(kept, on=["run", "rank"], how="semi")])
    for d in _ok(runs):  # run.json's shape was checked when it was read (MANIFEST_TYPES)
        a = d.pipeline_actions()
        if shown[d.run_id] is not None:
            a = a.filter(pl.col("rank").is_in(shown[d.run_id]))
        if a.height and d.analysis.steps.height:
            last = d.analysis.steps["step"].max()
            t0 = float(d.analysis.steps.filter(pl.col("step") == last)["start_us"].min())
            a = a.filter(pl.col("step") == last)  # each action's own step (the profiler's assignment)
            acts.append(d.relabel(a.select("run", "rank", "action", "microbatch",
                                           start_ms=(pl.col("start_us") - t0) / 1e3, end_ms=(pl.col("end_us") - t0) / 1e3)))
        measured = d.analysis.pipeline
        cfg = (d.manifest or {}).get("pipeline") or {}
        p, m = positive_int(cfg.get("ranks")), positive_int(cfg.get("microbatches"))
        v = positive_int(cfg.get("stages_per_rank", 1))
        if measured is not None and measured.height:
            summary.append(d.relabel(measured).group_by("run").agg(pl.col("bubble_pct", "theory_pct", "ideal_pct").mean()))
        elif p and m:
            theory = schedule_theory_pct(cfg.get("schedule"), p, m, v, {}) if v else None
            summary.append(pl.DataFrame({"run": [d.run_id], "bubble_pct": [None], "ideal_pct": [None], "theory_pct": [theory]},
                                        schema={"run": pl.String, **dict.fromkeys(["bubble_pct", "ideal_pct", "theory_pct"], pl.Float64)}))
    return _concat(acts), ideal, _concat(summary)


# ---------------------------------------------------------------------------------------------
# Findings and theory for the Compare page's first two cards


def merged_analysis(runs: list[RunData]) -> Analysis:
    """The analyses of several runs as one `Analysis`, labelled by run id, as `ptprof analyze a b`
    makes it: what the findings rules need to compare runs (each run is analysed on its own here)."""
    fields = {}
    for f in dataclasses.fields(Analysis):
        parts = [getattr(d.analysis, f.name) for d in runs]
        if f.name == "runs":  # one run.json (or None) per folder, under the run id
            fields[f.name] = {d.run_id: next(iter(d.analysis.runs.values()), None) for d in runs}
        elif f.name == "activity":  # the timeline's bins: no rule reads them, and at 1,024 ranks they are the largest frame
            continue
        elif all(isinstance(p, list) for p in parts):  # warnings, problems
            fields[f.name] = [x for p in parts for x in p]
        elif all(p is None or isinstance(p, pl.DataFrame) for p in parts):  # pipeline frames are None without pipeline spans
            kept = [_keep_type(d, p) for d, p in zip(runs, parts) if p is not None]
            fields[f.name] = pl.concat(kept, how="diagonal_relaxed") if kept else None
        else:  # nothing else today; a scalar field added later is the first run's, not a crash
            fields[f.name] = parts[0]
    merged = Analysis(**fields)
    merged.warnings.extend(comparison_warnings(merged))  # as analyze adds them to a load of several runs
    return merged


def _keep_type(d: RunData, frame: pl.DataFrame) -> pl.DataFrame:
    # The run id in the frame's own dtype (Categorical in most, String in the theory frames).
    return frame.with_columns(pl.lit(d.run_id).cast(frame.schema["run"]).alias("run")) if "run" in frame.columns else frame


def findings_frame(runs: list[RunData]) -> tuple[pl.DataFrame, str | None]:
    """(findings, None) of the runs that loaded, most important first: a run's own, and for 2+
    runs those about the comparison (run null), from the profiler's rules over the merged analyses;
    (each run's own findings, why) where the comparison failed."""
    ok = _ok(runs)
    own = _concat([d.relabel(d.analysis.findings) for d in ok])
    if len(ok) < 2:
        return own, None
    # The rules over merged analyses take ~1 s at 1,024 ranks: kept with the first run, for exactly
    # these RunData objects and rules (a reloaded run is a new object: nothing stale is served).
    key = (tuple(d.run_id for d in ok), profiler_findings.findings)
    with ok[0]._lock:
        memo = ok[0]._derived.setdefault("comparisons", {})
        hit = memo.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], ok)):
            return hit[1]
        if len(memo) >= 4:  # like the other memos: a few selections, never every one ever shown
            memo.pop(next(iter(memo)))
        memo[key] = (tuple(ok), result := _compared_findings(ok, own))
        return result


def _compared_findings(ok: list[RunData], own: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    try:
        found = profiler_findings.findings(merged_analysis(ok))
    except (Exception, pl.exceptions.PanicException) as e:  # noqa: BLE001 -- shown on the card, never a 500
        log.warning("findings over %s failed: %s", [d.run_id for d in ok], e)
        return own, f"the findings comparing these runs failed ({type(e).__name__}: {e}); each run's own are shown"
    return found.with_columns(pl.col("run").cast(pl.String)), None


def theory_frame(runs: list[RunData]) -> tuple[pl.DataFrame, dict[str, bool]]:
    """(theory_check of the runs that loaded, whether each has a run.json)."""
    ok = _ok(runs)
    return _concat([d.relabel(d.analysis.theory_check) for d in ok]), {d.run_id: d.manifest is not None for d in ok}

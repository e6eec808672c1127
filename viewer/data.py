"""The viewer's one door to the profiler: find runs under the traces root, load and analyze each
run once, and turn what users type or upload into paths that cannot leave the root.

Every callback goes through a `RunStore`. A run is a folder under the root holding a run.json or
trace files (`*.json`, `*.json.gz`); its id is the folder's path relative to the root
(`sample-ddp-2r`, `team/foreign-run`). Loaded runs are cached in memory, keyed by the folder and
the size and mtime of every file in it, so a rewritten trace is reloaded and an unchanged one is
never parsed twice (the profiler's parquet cache also makes a reload after a restart fast).

A run that fails to load is cached too, as a `RunData` whose `error` says why: pages show that
error in place of the run's figures and everything else keeps working. So is a run refused before
loading: a run.json that is not a small JSON object, a file linked to outside the root.

The Runs page never waits for analyses: `peek` returns a run only if it is already analysed, and
`load_in_background` analyses the rest, one at a time, in one thread the page polls.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import threading
from pathlib import Path

import polars as pl

from profiler import TraceError, Traces, analyze, ideal_orders, load_traces, memory_timeline
from profiler import findings as profiler_findings
from profiler.discover import MAX_MANIFEST_BYTES, RUN_MANIFEST, TRACE_SUFFIXES, find_sources, is_trace_file, manifest_problem
from profiler.pipeline import positive_int, schedule_theory_pct
from profiler.rankmap import MapOptions
from profiler.report import Analysis, comparison_warnings

from viewer import aggregate, scale

log = logging.getLogger(__name__)

# run.json keys the viewer reads, and the JSON type each must have when present (null allowed):
# {"pipeline": [1]} refuses the run with a reason instead of failing deep inside. Every field the
# profiler reads is then checked by its own rules (profiler.discover.manifest_problem), so the
# viewer never shows a run that `ptprof analyze` refuses, nor the other way round.
MANIFEST_TYPES = {"mesh": dict, "pipeline": dict, "hybrid": dict}
PENDING = "analysing…"  # the status of a run whose analysis is not done yet


class PathRefused(ValueError):
    """A path that is not inside the traces root (or not a name we accept); `str()` says which."""


def resolve_under(root: Path, path: str | Path) -> Path:
    """The absolute, symlink-free form of `path` (relative to `root`, or absolute) if it lies
    inside `root`; PathRefused otherwise. `..` and symlinks are resolved before the check."""
    text = str(path)
    if not text.strip() or "\x00" in text:
        raise PathRefused("empty or invalid path")
    root = root.resolve()
    candidate = (root / text).resolve()  # an absolute `text` replaces root here
    if candidate != root and not candidate.is_relative_to(root):
        raise PathRefused(f"{text!r} is outside the traces root")
    return candidate


def _is_run_folder(p: Path) -> bool:
    return p.is_dir() and not p.name.startswith(".") and (
        (p / RUN_MANIFEST).is_file() or any(is_trace_file(f) for f in p.iterdir())
    )


def _links_out(root: Path, folder: Path) -> str | None:
    """Why a run folder is refused for its files: one linked to outside the root, as a folder
    link out is (the profiler would follow it and read any file on the server). Checked on the
    folder's own entries and on exactly the files the profiler will load from it, which may lie in
    sub-folders (a folder of run folders) reached through a link."""
    for p in sorted(folder.iterdir()):
        if p.is_symlink() and not p.resolve().is_relative_to(root):
            return f"{p.name} links to outside the traces root: refused"
    try:
        sources = find_sources([folder])
    except TraceError:
        return None  # no trace files at all: load_traces says so in its own words
    for src in sources:
        if not src.path.resolve().is_relative_to(root):
            shown = src.path.relative_to(folder).as_posix() if src.path.is_relative_to(folder) else src.path.name
            return f"{shown} links to outside the traces root: refused"
    return None


@dataclasses.dataclass
class RunData:
    """One run as the pages see it: its analyses, or the error that stopped them."""

    run_id: str  # folder relative to the root: the name used in URLs, tables and figures
    folder: Path
    manifest: dict | None = None
    traces: Traces | None = None
    analysis: Analysis | None = None
    error: str | None = None
    _derived: dict = dataclasses.field(default_factory=dict, repr=False)
    _lock: threading.RLock = dataclasses.field(default_factory=threading.RLock, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def _once(self, key: str, make):
        with self._lock:
            if key not in self._derived:
                self._derived[key] = make()
            return self._derived[key]

    @property
    def events(self) -> pl.DataFrame:
        # Frames carry the run id as `run` (not run.json's run_id) so runs concat and label cleanly.
        return self._once("events", lambda: self.traces.events.with_columns(run=pl.lit(self.run_id, pl.Categorical)))

    def relabel(self, frame: pl.DataFrame | None) -> pl.DataFrame | None:
        if frame is None or "run" not in frame.columns:
            return frame
        return frame.with_columns(run=pl.lit(self.run_id))

    def origin_us(self) -> float:
        """Time zero of this run's figures: the start of its first profiled step (any rank)."""
        return self._once("origin", lambda: float(self.analysis.steps["start_us"].min()))

    def timeline(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(intervals, merged) for the timeline (viewer.aggregate), in ms from `origin_us`."""
        return self._once("timeline", lambda: aggregate.timeline_intervals(self.events, origin_us=self.origin_us()))

    def memory(self) -> pl.DataFrame:
        return self._once("memory", lambda: memory_timeline(self.events))

    # -- at scale (viewer/scale.py): summaries only, events one rank at a time ------------------

    @property
    def n_ranks(self) -> int:
        ranks = getattr(self.analysis, "ranks", None)  # a hand-made analysis in tests may have none: not at scale
        return ranks.height if ranks is not None else 0

    @property
    def at_scale(self) -> bool:
        return scale.at_scale(self.n_ranks)

    def groups(self) -> pl.DataFrame:
        """rank, group, group_key (viewer.scale.rank_groups from run.json)."""
        return self._once("groups", lambda: scale.rank_groups(self.analysis.ranks["rank"].to_list(), self.manifest))

    def rank_metrics(self) -> pl.DataFrame:
        return self._once("rank_metrics", lambda: self.relabel(scale.rank_metrics(self.analysis.steps, self.analysis.breakdown)))

    def outliers(self) -> pl.DataFrame:
        return self._once("outliers", lambda: scale.outliers(self.rank_metrics(), self.groups()))

    def activity(self) -> pl.DataFrame:
        return self._once("activity", lambda: self.relabel(self.analysis.activity))

    def activity_extent(self) -> tuple[float, float]:
        return self._once("activity_extent", lambda: scale.activity_extent(self.analysis.activity, self.origin_us()))

    def activity_bands(self, x_range: tuple[float, float], groups: list[str] | None = None, *, keep: bool = False) -> pl.DataFrame:
        """The timeline's bands over x_range (ms), of every group or only `groups`; `keep`: remember
        them (the whole range: what every first visit of Compare draws; zooms are not kept)."""
        g = self.groups() if groups is None else self.groups().filter(pl.col("group").is_in(groups))
        keys, cum = self._once("activity_cumulative", lambda: scale.cumulative(self.activity()))
        picked = keys.with_row_index("_i").join(g.select("rank"), on="rank", how="semi")
        idx = picked["_i"].to_numpy()
        make = lambda: scale.activity_bands((picked.drop("_i"), cum[idx]), g, self.origin_us(), x_range)  # noqa: E731
        if not keep:
            return make()
        with self._lock:
            kept = self._derived.setdefault("whole_bands", {})
            if (x_range, str(groups)) not in kept:
                kept[(x_range, str(groups))] = make()
                while len(kept) > 4:
                    kept.pop(next(iter(kept)))
            return kept[(x_range, str(groups))]

    def rank_timeline(self, ranks: list[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(intervals, merged) of these ranks only, from their own events (one file each): the
        drill-down never builds the whole run's event frame. The last few asked are kept."""
        key = tuple(sorted(set(ranks)))
        with self._lock:
            memo = self._derived.setdefault("rank_timelines", {})
            if key not in memo:
                parts = [p for p in self.traces.parts if p.rank in set(key)]
                events = pl.concat([p.events() for p in parts]) if parts else self.traces.parts[0].events().clear()
                memo[key] = aggregate.timeline_intervals(events.with_columns(run=pl.lit(self.run_id, pl.Categorical)),
                                                         origin_us=self.origin_us())
                while len(memo) > 4:
                    memo.pop(next(iter(memo)))
            return memo[key]

    def pipeline_actions(self) -> pl.DataFrame:
        # Found by `analyze` already (with run.json's span_format); only the run label is ours.
        return self._once("pipeline_actions", lambda: self.relabel(self.analysis.pipeline_actions))


class RunStore:
    """The runs under one traces root, loaded on demand and cached."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self._cache: dict[str, tuple[tuple, RunData]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._queue: list[str] = []  # run ids the background thread analyses next, in order
        self._worker: threading.Thread | None = None
        self.uploading: set[str] = set()  # upload folders still being checked (viewer.upload): not listed yet

    # -- finding runs ---------------------------------------------------------------------------

    def resolve(self, path: str | Path) -> Path:
        return resolve_under(self.root, path)

    def run_ids(self) -> list[str]:
        """Run folders directly under the root (and one level below, for grouped runs), sorted.

        A folder we cannot look into (unreadable, a link to outside the root) is listed too, so
        its row says why instead of it vanishing or taking the page down.
        """
        if not self.root.is_dir():
            return []
        found = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".") or d.name in self.uploading:
                continue
            try:
                if d.is_symlink() and d.is_dir() and not d.resolve().is_relative_to(self.root):
                    found.append(d.name)  # refused by run_id_of; listed so its row says so
                elif _is_run_folder(d):
                    found.append(d.name)
                elif d.is_dir():
                    found += [f"{d.name}/{s.name}" for s in sorted(d.iterdir()) if _is_run_folder(s)]
            except OSError:
                found.append(d.name)  # unreadable: its row shows the error
        return found

    def run_id_of(self, path: str | Path) -> str:
        """The run id (relative folder) of a path inside the root; PathRefused if it is no run folder."""
        folder = self.resolve(path)
        try:
            is_run = folder != self.root and _is_run_folder(folder)
        except OSError as e:  # a name too long for the file system, a folder we may not read, ...
            raise PathRefused(f"{str(path)[:80]!r}: {e.strerror or e}") from None
        if not is_run:
            raise PathRefused(f"{str(path)!r} is not a run folder (no run.json or *.json[.gz] traces in it)")
        return folder.relative_to(self.root).as_posix()

    # -- loading --------------------------------------------------------------------------------

    def get(self, run_id: str) -> RunData:
        """The run's data, loading and analyzing it on first use or when its files changed."""
        run_id = self.run_id_of(run_id)  # refuses the root, group folders and made-up ids: nothing cached for them
        folder = self.root / run_id
        with self._guard:
            lock = self._locks.setdefault(run_id, threading.Lock())
        with lock:
            key = _folder_key(folder)
            hit = self._cache.get(run_id)
            if hit is not None and hit[0] == key:
                return hit[1]
            data = _load_run(run_id, folder, self.root)
            self._cache[run_id] = (key, data)
            return data

    def get_many(self, run_ids: list[str]) -> list[RunData]:
        out = []
        for r in run_ids:
            try:
                out.append(self.get(r))
            except PathRefused as e:
                out.append(RunData(run_id=str(r), folder=self.root, error=str(e)))
        return out

    def peek(self, run_id: str) -> RunData | None:
        """The run if it is analysed and its files are unchanged, else None; never loads.
        PathRefused for ids get() refuses."""
        run_id = self.run_id_of(run_id)
        hit = self._cache.get(run_id)
        return hit[1] if hit is not None and hit[0] == _folder_key(self.root / run_id) else None

    def forget(self, run_id: str) -> None:
        """Drop a run from the cache (its folder was removed: a refused upload)."""
        self._cache.pop(run_id, None)

    # -- analysing in the background --------------------------------------------------------------

    def load_in_background(self, run_ids: list[str]) -> None:
        """Analyse these runs, one at a time, in one background thread (replacing its queue);
        their results appear through `peek`."""
        with self._guard:
            self._queue = list(run_ids)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="ptprof-view-runs", daemon=True)
                self._worker.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the background thread to finish its queue; False if it is still busy."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
        return self._worker is None

    def _work(self) -> None:
        while True:
            with self._guard:
                if not self._queue:
                    self._worker = None
                    return
                run_id = self._queue.pop(0)
            try:
                self.get(run_id)
            except Exception as e:  # noqa: BLE001 -- refused ids show their error through the table's own check
                log.warning("run %s: %s", run_id, e)


def _folder_key(folder: Path) -> tuple:
    # One stat per file (scandir's entries know their type): every callback checks its runs, and a
    # 1,024-rank run is 1,024 files.
    try:
        with os.scandir(folder) as it:
            return tuple(sorted((e.name, (st := e.stat()).st_size, st.st_mtime_ns) for e in it if e.is_file()))
    except OSError:
        return ()


def _load_run(run_id: str, folder: Path, root: Path) -> RunData:
    data = RunData(run_id=run_id, folder=folder)
    try:
        # Links first: a run.json linked out of the root is not read either.
        problem = _links_out(root, folder)
        if not problem:
            data.manifest, problem = read_manifest(folder)
        if problem:
            data.error = problem
            return data
        # With the lanes' activity bins: Compare draws them above 16 ranks (viewer.scale).
        data.traces = load_traces(folder, progress=False, options=MapOptions(activity=True))
        if len(data.traces.runs) > 1:  # the profiler split the folder into its jobs: one row cannot show them
            raise TraceError(folder, f"holds the files of {len(data.traces.runs)} different jobs ({', '.join(data.traces.runs)}); "
                                     "the viewer shows one job per folder: put each job's files in a folder of its own")
        data.analysis = analyze(data.traces)
    # Any failure is shown on the run's row / panel, never a crash; polars' PanicException is a
    # BaseException, so it is named here.
    except (Exception, pl.exceptions.PanicException) as e:  # noqa: BLE001
        log.warning("run %s failed to load: %s", run_id, e)
        data.error = str(e) if isinstance(e, TraceError) else f"{type(e).__name__}: {e}"
        data.traces = data.analysis = None
    return data


def read_manifest(folder: Path) -> tuple[dict | None, str | None]:
    """(run.json, None); (None, None) where there is none; (None, why) where it is unusable:
    not a regular file, over MAX_MANIFEST_BYTES, not JSON, nested too deeply, not an object."""
    path = folder / RUN_MANIFEST
    try:
        if not path.exists():
            return None, None
        if not path.is_file():  # a FIFO or device would block or never end
            return None, f"{RUN_MANIFEST}: not a regular file"
        if path.stat().st_size > MAX_MANIFEST_BYTES:  # the profiler's limit: the same runs load in both
            return None, f"{RUN_MANIFEST}: over {MAX_MANIFEST_BYTES // 2**20} MiB, not a run manifest"
        m = json.loads(path.read_bytes())
    except RecursionError:  # json recurses per nesting level: [[[[...]]]] 100k deep
        return None, f"{RUN_MANIFEST}: nested too deeply"
    except (OSError, ValueError) as e:
        return None, f"{RUN_MANIFEST}: {getattr(e, 'strerror', None) or e}"
    if not isinstance(m, dict):
        return None, f"{RUN_MANIFEST}: expected a JSON object, found {_json_type(m)}"
    for key, want in MANIFEST_TYPES.items():
        if m.get(key) is not None and not isinstance(m[key], want):
            return None, f"{RUN_MANIFEST}: {key!r} should be {_json_type(want())}, found {_json_type(m[key])}"
    problem = manifest_problem(m)
    return (None, f"{RUN_MANIFEST}: {problem}") if problem else (m, None)


def _json_type(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(v), "a number")


# ---------------------------------------------------------------------------------------------
# One row of the Runs table


RUN_COLUMNS = ["run", "paradigm", "ranks", "mesh", "device", "steps", "step_ms", "exposed_comm_pct", "overlap_pct",
               "bubble_pct", "peak_mib", "peak_mib_per_rank", "status"]


def manifest_row(run_id: str, manifest: dict | None, status: str | None) -> dict:
    """The Runs table's row from run.json alone (each fact only where it has the right type):
    what the table shows at once, before the analyses are done."""
    m = manifest or {}
    row = {c: None for c in RUN_COLUMNS}
    mesh = m.get("mesh") or {}
    row.update(
        run=run_id,
        paradigm=_text(m.get("paradigm")) or "(foreign traces)",
        ranks=positive_int(m.get("world_size")),
        mesh=" x ".join(f"{k}={positive_int(v)}" for k, v in mesh.items() if positive_int(v)) or None,
        device=_text(m.get("device_name")) or _text(m.get("device")),
        status=status,
    )
    return row


def pending_row(run_id: str, folder: Path) -> dict:
    """The row of a run not analysed yet: run.json's facts, or why run.json is unusable."""
    manifest, problem = read_manifest(folder)
    return manifest_row(run_id, manifest, problem or PENDING)


def _text(v) -> str | None:
    return v if isinstance(v, str) and v else None


def run_row(data: RunData) -> dict:
    """The Runs table's row for a run: run.json facts plus means over ranks of the analyses."""
    row = manifest_row(data.run_id, data.manifest, None)
    if not data.ok:
        row["status"] = data.error
        return row
    a = data.analysis
    bd = a.breakdown
    peaks = a.memory_peaks.group_by("rank").agg(pl.col("peak_allocated_bytes").max()).sort("rank")
    row.update(
        ranks=row["ranks"] or a.ranks.height,
        device=row["device"] or ("gpu" if a.ranks["has_gpu"].any() else "cpu"),
        steps=int(a.step_stats["n_steps"].max()) if a.step_stats.height else None,
        step_ms=_round(a.step_stats["mean_us"].mean(), 1e-3),
        exposed_comm_pct=_round((bd["exposed_comm_us"] / bd["window_us"]).mean(), 100) if bd.height else None,
        overlap_pct=_round(bd["overlap_pct"].mean(), 1) if bd.height else None,
        bubble_pct=_round(a.pipeline["bubble_pct"].mean(), 1) if a.pipeline is not None else None,
        peak_mib=_round(peaks["peak_allocated_bytes"].max(), 2**-20) if peaks.height else None,
        peak_mib_per_rank=_per_rank_peaks(peaks["peak_allocated_bytes"]),
        status="ok" if not a.problems else f"{len(a.problems)} file(s) skipped: " + "; ".join(a.problems),
    )
    return row


def _per_rank_peaks(peaks: pl.Series) -> str | None:
    """Each rank's peak MiB, "12.0 | 12.5"; above SCALE_RANKS ranks the range and median instead
    (a cell of 1,024 numbers says nothing)."""
    if peaks.is_empty():
        return None
    if not scale.at_scale(peaks.len()):
        return " | ".join(f"{v / 2**20:.1f}" for v in peaks)
    return f"{peaks.min() / 2**20:.1f} – {peaks.max() / 2**20:.1f} (median {peaks.median() / 2**20:.1f}, {peaks.len()} ranks)"


def _round(v, scale: float) -> float | None:
    return None if v is None else round(float(v) * scale, 2)


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

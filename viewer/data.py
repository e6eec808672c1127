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
import json
import logging
import os
import re
import threading
from pathlib import Path

import polars as pl

from profiler import TraceError, Traces, analyze, load_traces, memory_timeline
from profiler.discover import MAX_MANIFEST_BYTES, RUN_MANIFEST, find_sources, is_trace_file, manifest_field, manifest_problem
from profiler.pipeline import positive_int
from profiler.rankmap import MapOptions
from profiler.load import RANK_FROM_FILENAME_HINT
from profiler.report import Analysis

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

    @property
    def skipped(self) -> list[str]:
        """The files the run's load skipped, each with why, named relative to the run's folder."""
        if not self.ok:
            return []
        # The load's advice of a CLI flag the viewer has not (a duplicate rank's --rank-from-filename) left out.
        return self._once("skipped", lambda: [relative_paths(p, self.folder).replace(RANK_FROM_FILENAME_HINT, "")
                                              for p in self.analysis.problems])

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

    def finest_bin_us(self) -> float | None:
        """The shortest of this run's per-rank activity bins (µs; window / activity's bin count),
        below which a zoom of the bands shows no more detail; None without activity."""
        return self._once("finest_bin_us", lambda: self.analysis.activity["bin_us"].min() if self.analysis.activity.height else None)

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


def relative_paths(text: str | None, folder: Path) -> str | None:
    """`text` with the run folder's own path dropped from the paths in it: errors name files by
    their absolute server path, and `/data/traces/run/rank1.json: not valid JSON` reads as
    `rank1.json: not valid JSON` (the file and the problem first). The folder itself, named
    without a file after it, stays as it is."""
    if not text:
        return text
    try:
        folders = {str(folder), str(folder.resolve())}
    except (OSError, RuntimeError):  # a link loop: leave the text as it is
        folders = {str(folder)}
    for f in sorted(folders, key=len, reverse=True):
        # Only where a path starts (the text's start, after a space, quote or bracket): the same
        # characters inside another path (/backup/x/run/a.json) are left alone.
        text = re.sub(r"(?<![^\s'\"(\[])" + re.escape(f.rstrip("/") + "/"), "", text)
    return text


def _load_run(run_id: str, folder: Path, root: Path) -> RunData:
    data = RunData(run_id=run_id, folder=folder)
    try:
        # Links first: a run.json linked out of the root is not read either.
        problem = _links_out(root, folder)
        if not problem:
            data.manifest, problem = read_manifest(folder)
        if problem:
            data.error = relative_paths(problem, folder)
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
        data.error = relative_paths(str(e) if isinstance(e, TraceError) else f"{type(e).__name__}: {e}", folder)
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


# The status beside the run's name: last, it was off-screen at 1,500 px, and a run that skipped a
# file showed its other ranks' numbers with nothing in view to say so.
RUN_COLUMNS = ["run", "status", "paradigm", "ranks", "mesh", "device", "steps", "step_ms", "exposed_comm_pct", "overlap_pct",
               "bubble_pct", "peak_mib", "peak_mib_per_rank"]


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
        status="ok" if not data.skipped else f"{len(data.skipped)} file(s) skipped: " + "; ".join(data.skipped),
    )
    return row


def ranks_loaded(data: RunData) -> str:
    """"2 ranks", or "1 of 2 ranks" where fewer loaded than the job had (run.json's world size,
    else the traces' own: a skipped file, or a folder holding 2 of a 128-rank job's traces)."""
    ranks = data.analysis.ranks
    n = ranks.height
    world = positive_int(manifest_field(data.manifest, "world_size"))
    if world is None and "world_size" in ranks.columns and ranks["world_size"].is_not_null().any():
        world = positive_int(ranks["world_size"].max())
    return f"{n} of {world} ranks" if world and n < world else f"{n} rank{'s' if n != 1 else ''}"


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

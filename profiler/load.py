"""Kineto Chrome traces -> one normalized polars event frame (schema in docs/profiler.md).

    traces = load_traces("traces/ddp-2r-20261122-210000")
    traces.events  # one row per event, all ranks, all runs

The stages, one module each: discover.py finds the files and groups them into runs; parse.py
reads one file into the frame (every format quirk lives there); cache.py keeps each parsed file as
parquet keyed by its content; pool.py parses uncached files in worker processes. This module puts
them together: the rank of each file, duplicate ranks, and the `Traces` handed to analyses.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import polars as pl

from profiler.cache import CACHE_ENV, CacheUnusable, cache_dir, remove_stale_tmp, unstored_note
from profiler.damaged import DAMAGED, MAX_RANK
from profiler.discover import (JobFacts, find_sources, not_a_regular_file, read_manifest, same_files, split_jobs,
                               unread_notes)
from profiler.errors import TraceError, path_text, rebuilt
from profiler.parse import SCHEMA, _as_int
from profiler.pool import LocalEngine, lookup_all, progress_bar
from profiler.rankmap import MapOptions, RankSummary, RankTask, relabel
from profiler.summary_cache import read_summary

# rank3.json.gz (ours), rank3_trace.json.gz (torchtitan), rank-3 / rank_3 (others)
RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RankPart:
    """One loaded trace file: its run and rank, and its parsed events in a parquet file (or in memory)."""

    run: str
    rank: int
    parquet: str | None
    # The parsed events themselves, where they could not be written (a full disk; parquet is None).
    frame: pl.DataFrame | None = dataclasses.field(default=None, repr=False, compare=False)

    # Its per-rank analyses (rankmap.analyze_rank), labelled (run, rank); None where not made.
    frames: dict[str, pl.DataFrame] | None = dataclasses.field(default=None, repr=False, compare=False)
    # The trace file, parsed again on demand where its events were not cached (a full disk: the
    # workers do not send them, or this process would hold every rank's); None for a Dask load.
    source: str | None = None

    def events(self) -> pl.DataFrame:
        """This file's rows of the event frame (SCHEMA). The parquet already has SCHEMA's types."""
        if self.parquet is not None:
            frame = pl.read_parquet(self.parquet)
        elif self.frame is not None:
            frame = self.frame
        elif self.source is not None:
            from profiler.parse import parse_trace_file

            frame = parse_trace_file(self.source)[0]
        else:
            raise TraceError(None, f"run {self.run} rank {self.rank}: its events are not on this machine (loaded by a "
                                   "Dask cluster, whose workers keep them); load without --cluster for event-level views")
        return frame.with_columns(run=pl.lit(self.run, pl.Categorical), rank=pl.lit(self.rank, pl.Int32)).select(list(SCHEMA))


@dataclasses.dataclass(frozen=True)
class Traces:
    """What `load_traces` returns.

    events: the event frame (SCHEMA), every loaded rank of every run; built on first access
        from `parts` (so a load that is only analyzed rank by rank never holds it whole).
    ranks: one row per loaded trace file: run, rank, file, backend, world_size, has_gpu,
        device_kind ("cuda", "rocm", "mtia" or "cpu": profiler.classify.device_kind), device_name,
        pg_config (JSON text of distributedInfo's process groups), n_events, unknown_categories
        (event categories no rule knows, with counts: "hpu_op (12), ..."; null when none), dropped
        (struct: events dropped for impossible values, by why: profiler.damaged.DAMAGED).
    runs: run id -> the parsed run.json of that run, or None where the run has none.
    problems: files that could not be used (one TraceError each); the rest loaded.
    parts: one RankPart per row of `ranks`, in the same order.
    notes: warnings about the load itself (the cache could not be used, a folder split into its
        jobs, a file naming no rank taken as rank 0); every rank still loaded.
    """

    ranks: pl.DataFrame
    runs: dict[str, dict | None]
    problems: list[TraceError]
    parts: tuple[RankPart, ...]
    notes: list[str] = dataclasses.field(default_factory=list)
    options: MapOptions = dataclasses.field(default_factory=MapOptions)  # what the parts' summaries were made with
    _memo: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # load_traces(cache=False): the private folder holding `parts`' parquet, removed with the Traces
    _scratch: object = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def events(self) -> pl.DataFrame:
        if "events" not in self._memo:
            self._memo["events"] = pl.concat([p.events() for p in self.parts], how="vertical")
        return self._memo["events"]

    def rank_events(self, rank: int | None = None):
        """Yield each (run, rank)'s events in turn (only `rank`'s when given), one in memory at a time."""
        for part in self.parts:
            if rank is None or part.rank == rank:
                yield part.events()


# ---------------------------------------------------------------------------------------------
# Finding the files


def rank_from_filename(path: Path) -> int | None:
    """The rank written in a trace's file name (`rank3.json.gz`, `rank3_trace.json.gz`), if any."""
    m = RANK_IN_NAME_RE.search(path.name)
    return int(m.group(1)) if m else None


def _resolve_rank(path: Path, meta: dict, *, prefer_filename: bool, default_rank: int | None, alone: bool) -> tuple[int, str | None]:
    """(rank, note): the rank of one file, and a note when it was assumed.

    alone: the file is its run's only one. Such a file naming no rank is the common one-GPU trace
    (a plain `torch.profiler` run records no distributedInfo): rank 0, with a note. Among several
    files of a run it would collide with the others, so it is an error.
    """
    info = meta.get("distributed_info") or {}
    from_info = _as_int(info.get("rank"))
    from_name = rank_from_filename(path)
    for r in ((from_name, from_info) if prefer_filename else (from_info, from_name)):
        if r is not None:
            return r, None
    if default_rank is not None:
        return default_rank, None
    if alone:
        return 0, f"{path}: no rank in the trace (no distributedInfo) nor in its file name; analysed as rank 0 (--trace-rank R to set it)"
    raise TraceError(
        path,
        "no rank: the trace has no distributedInfo and its file name has none (rank<R>...), and it is not the only "
        "file of its run, so it cannot be taken as rank 0 (the files would collide); rename it (e.g. rank0.json.gz), "
        "or pass it alone (it is then rank 0, or --trace-rank R)",
    )


def load_traces(
    paths: str | Path | list[str | Path],
    *,
    rank_from_filename_first: bool = False,
    default_rank: int | None = None,
    cache: bool = True,
    workers: int | None = None,
    progress: bool | None = None,
    options: MapOptions | None = None,
    engine=None,
) -> Traces:
    """The loader behind `profiler.load_traces` (api.py, which documents the arguments and starts
    the default engine's work before importing this module): here `engine`, if given, may already
    be working on the files (LocalEngine.start_early); this function leaves closing it to its caller."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise TraceError(None, "no trace paths given")
    options = options or MapOptions()
    engine = engine or LocalEngine(workers)
    remote = getattr(engine, "remote", False)  # a Dask cluster: workers parse into their own caches
    found = find_sources(paths)
    sources, notes = same_files(found)
    notes = unread_notes(found) + notes
    cache_path = None
    if cache and not remote:
        try:
            cache_path = cache_dir()
        except CacheUnusable as e:
            notes.append(str(e))
        asked = os.environ.get(CACHE_ENV)
        if cache_path is not None and asked and Path(asked) != cache_path:  # said: the user chose another place
            notes.append(f"${CACHE_ENV} ({path_text(asked)}) is not a folder this user can write: the parse cache is "
                         f"{path_text(cache_path)}")
    # Without the cache, files are parsed into a private folder that lives as long as the Traces,
    # so every load is analyzed one rank at a time from parquet either way.
    scratch = None if cache_path or remote else tempfile.TemporaryDirectory(prefix="ptprof-nocache-")
    cache_path = cache_path or (Path(scratch.name) if scratch else None)
    manifests = _Manifests()
    # Files in a folder that are no regular file (FIFO, device, dangling link) are never opened:
    # each is a problem of its own, so the rank is named as missing.
    results: list[RankSummary | TraceError | None] = [
        TraceError(s.path, why) if (why := not_a_regular_file(s.path)) else None for s in sources]
    tasks = {i: RankTask(str(s.path), s.run, None, options, str(cache_path) if cache_path else None,
                         rank=_name_rank(s.path, rank_from_filename_first), no_cache=remote and not cache)
             for i, s in enumerate(sources) if results[i] is None}
    for i in list(tasks):
        m = manifests.get(sources[i].run_dir)
        if isinstance(m, TraceError):
            results[i] = m
            del tasks[i]
        else:
            tasks[i] = dataclasses.replace(tasks[i], manifest=m)
    made_with = {i: (t.run, _manifest_key(t.manifest)) for i, t in tasks.items()}  # what each summary is labelled with
    if not remote:  # a warm load reads each file's summary here, without starting a worker
        idx = list(tasks)
        for i, (entry, ident) in zip(idx, lookup_all([Path(tasks[i].path) for i in idx], cache_path, engine.workers)):
            tasks[i] = dataclasses.replace(tasks[i], ident=ident)
            # Only beside a verified parquet entry: the events stay readable (drill-downs, --hta).
            hit = read_summary(cache_path, tasks[i], entry.parquet) if entry is not None else None
            if hit is not None:
                results[i] = hit
                del tasks[i]
        if tasks:
            remove_stale_tmp(cache_path)
    _map(engine, tasks, results, progress=progress, total=len(sources))
    unstored = [r.unstored for r in results if isinstance(r, RankSummary) and r.unstored]
    if unstored and cache_path:
        notes.append(unstored_note(cache_path, unstored, len(results)))
    # A folder (or command) holding files of several jobs: one run per job, never one merged run.
    sources, split_notes = split_jobs(sources, [None if isinstance(r, TraceError) else _job_facts(r) for r in results])
    notes += split_notes

    problems: list[TraceError] = []
    files_per_run = Counter(src.run for src in sources)
    kept: list[tuple[int, int]] = []  # (index into sources, rank)
    rows: list[dict] = []
    seen: dict[tuple[str, int], Path] = {}
    runs: dict[str, dict | None] = {}
    for i, (src, res) in enumerate(zip(sources, results)):
        if isinstance(res, TraceError):
            problems.append(_naming_rank(res, src.path))
            continue
        meta = res.meta
        try:
            m = manifests.get(src.run_dir)
            if isinstance(m, TraceError):
                raise m
            runs.setdefault(src.run, m)
            rank, note = _resolve_rank(src.path, meta, prefer_filename=rank_from_filename_first, default_rank=default_rank,
                                       alone=files_per_run[src.run] == 1)
            if not 0 <= rank <= MAX_RANK:  # from a file name or default_rank (distributedInfo's is checked in parse)
                raise TraceError(src.path, f"rank {rank} is not a rank (a whole number from 0 to {MAX_RANK:,})")
        except TraceError as e:
            problems.append(e)
            continue
        if note:
            notes.append(note)
        if (src.run, rank) in seen:
            first = seen[(src.run, rank)]
            # --rank-from-filename helps only where it is not given already and the two names give two ranks.
            by_name = (not rank_from_filename_first and rank_from_filename(src.path) is not None
                       and rank_from_filename(src.path) != rank_from_filename(first))
            problems.append(TraceError(src.path, f"duplicate rank {rank} in run {src.run!r} (kept: {path_text(first)}, read "
                                                 "first); pass the files of one run only"
                                                 + (RANK_FROM_FILENAME_HINT if by_name else "")))
            continue
        seen[(src.run, rank)] = src.path
        info = meta.get("distributed_info") or {}
        rows.append({
            "run": src.run, "rank": rank, "file": path_text(src.path), "backend": info.get("backend"),
            "world_size": _as_int(info.get("world_size")), "has_gpu": meta["has_gpu"], "device_kind": meta["device_kind"],
            "device_name": meta.get("device_name"), "pg_config": json.dumps(info.get("pg_config")) if info.get("pg_config") else None,
            "n_events": meta["n_events"], "dropped": {k: meta["dropped"].get(k, 0) for k in DAMAGED},
            "unknown_categories": ", ".join(f"{c} ({n:,})" for c, n in meta["unknown_categories"].items()) or None,
        })
        kept.append((i, rank))
    problems = _merged(problems)
    if not kept:
        if len(problems) == 1:
            raise problems[0]
        raise _none_usable(problems)
    for i in _redo_mismatched(engine, sources, results, kept, runs, options, cache_path, made_with,
                              no_cache=remote and not cache):
        made_with[i] = (sources[i].run, _manifest_key(runs.get(sources[i].run)))
    parts = []
    for i, rank in kept:
        res, run = results[i], sources[i].run
        if isinstance(res, TraceError):  # its second analysis (under its final run.json or rank) failed
            raise res
        frames = res.frames if (res.rank == rank and made_with[i][0] == run) else relabel(res, run, rank)
        parts.append(RankPart(run, rank, res.parquet, None, frames=frames, source=None if remote else str(sources[i].path)))
    # Runs in the order given on the command line (the first is the baseline every comparison is
    # against: docs/report.md), ranks in order within each run.
    given = {}
    for src in sources:
        given.setdefault(src.run, len(given))
    order = sorted(range(len(rows)), key=lambda i: (given[rows[i]["run"]], rows[i]["rank"]))
    # Every row read for the types (a column null in the first 100 rows, as pg_config of 100 foreign
    # ranks before a ptprof run's, was typed Null and the next row's text refused: a traceback), and
    # the nullable text and counts typed outright (a column null in every row stays usable).
    ranks = pl.DataFrame([rows[i] for i in order], infer_schema_length=None, schema_overrides=RANK_TYPES).with_columns(
        pl.col("run").cast(pl.Categorical))
    runs = {r: m for r, m in runs.items() if r in set(ranks["run"].cast(pl.String))}
    return Traces(ranks=ranks, runs=runs, problems=problems, parts=tuple(parts[i] for i in order), notes=notes,
                  options=options, _scratch=scratch)


RANK_FROM_FILENAME_HINT = ", or --rank-from-filename"  # a CLI flag: the viewer, which has none, leaves it out
RANK_TYPES = {"backend": pl.String, "world_size": pl.Int64, "device_name": pl.String, "pg_config": pl.String,
              "unknown_categories": pl.String}


class _Manifests(dict):
    """run.json per run folder, read once: the dict, None (no run.json) or the TraceError saying why not."""

    def get(self, run_dir):
        if run_dir not in self:
            try:
                self[run_dir] = read_manifest(run_dir)
            except TraceError as e:
                self[run_dir] = e
        return self[run_dir]


NONE_USABLE_SHOWN = 3


def _none_usable(problems: list[TraceError]) -> TraceError:
    """One line for a load where every file failed: the first few problems in full, the rest
    counted by kind (the problem without its file and rank), so 1,024 empty files are not 1,024
    sentences on one line."""
    text = "no usable traces: " + "; ".join(map(str, problems[:NONE_USABLE_SHOWN]))
    rest = problems[NONE_USABLE_SHOWN:]
    if rest:
        kinds = Counter(re.sub(r"^ranks? \d+(, \d+)*: ", "", p.problem) for p in rest)
        said = "; ".join(f"{n:,} x {kind}" for kind, n in kinds.most_common(NONE_USABLE_SHOWN))
        others = sum(n for _, n in kinds.most_common()[NONE_USABLE_SHOWN:])
        text += f"; and {len(rest):,} more files ({said}{f'; {others:,} with other problems' if others else ''})"
    return TraceError(None, text)  # one line (cli prints it so)


def _merged(problems: list[TraceError]) -> list[TraceError]:
    """The problems, one per (file, problem): a run.json every rank of the run reads is said once,
    for all of them (`run.json: ranks 0, 1: unreadable run manifest: ...`), not once a rank."""
    by: dict[tuple, list[str | None]] = {}
    for p in problems:
        m = re.match(r"rank (\d+): (.*)", p.problem, re.S)
        rank, problem = (m.group(1), m.group(2)) if m else (None, p.problem)
        by.setdefault((p.path, problem, rank is None), []).append(rank)  # a rank-less one is never merged away
    out = []
    for (path, problem, _), ranks in by.items():
        named = [r for r in ranks if r is not None]
        lead = f"{'ranks' if len(named) > 1 else 'rank'} {', '.join(named)}: " if named else ""
        for _ in ranks if not named else [None]:  # rank-less duplicates stay as they came
            out.append(rebuilt(path, lead + problem))  # the path as it was kept: already printable
    return out


def _naming_rank(e: TraceError, path: Path) -> TraceError:
    """A file's problem, led by the rank its name gives (`rank 3: ...`), so a missing rank is plain."""
    r = rank_from_filename(path)
    if r is None or e.problem.startswith("rank "):
        return e
    return TraceError(e.path, f"rank {r}: {e.problem}")


def _name_rank(path: Path, prefer_filename: bool) -> int | None:
    """The rank known before parsing: the file name's, when it takes precedence (--rank-from-filename)."""
    r = rank_from_filename(path) if prefer_filename else None
    return r if r is not None and 0 <= r <= MAX_RANK else None  # one out of range is refused after parsing


def _map(engine, tasks: dict[int, RankTask], results: list, *, progress: bool | None, total: int) -> None:
    """Run `tasks` on `engine`, filling results[i]; the bar counts ranks done of `total`."""
    show = progress if progress is not None else (total > 1 and sys.stderr.isatty())
    bar = progress_bar(total, show)
    bar.update(total - len(tasks))
    idx = list(tasks)
    try:
        for k, res in engine.map([tasks[i] for i in idx]):
            results[idx[k]] = res
            bar.update(1)
    except BaseException:  # Ctrl-C, a lost scheduler: the bar goes, so the last line is the reason
        bar.leave = False
        raise
    finally:
        bar.close()


def _redo_mismatched(engine, sources, results, kept, runs, options, cache_path, made_with, *, no_cache: bool) -> list[int]:
    """Analyze again the files whose worker guessed a rank or run.json other than the final ones.

    Workers label a file before the whole set is known; job splitting (another run.json) or a rank
    resolved from --trace-rank can only be decided after. Rare; everything else is relabelled only.
    """
    redo = {}
    for i, rank in kept:
        res, src = results[i], sources[i]
        manifest = runs.get(src.run)
        if res.rank != rank or made_with[i][1] != _manifest_key(manifest):
            redo[i] = RankTask(str(src.path), src.run, manifest, options, str(cache_path) if cache_path else None, rank=rank,
                               no_cache=no_cache)
    if redo:
        _map(engine, redo, results, progress=False, total=len(redo))
    return list(redo)


def _manifest_key(manifest: dict | None) -> str:
    return json.dumps(manifest, sort_keys=True, default=str)


def _job_facts(parsed: RankSummary) -> JobFacts:
    """The facts `split_jobs` needs of one parsed file: distributedInfo's and its clock's span."""
    meta = parsed.meta
    info = meta.get("distributed_info") or {}
    backend = info.get("backend")
    return JobFacts(backend if isinstance(backend, str) else None, _as_int(info.get("world_size")),
                    meta["first_ts_us"], meta["last_end_us"], _as_int(info.get("rank")))

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
import re
import tempfile
from pathlib import Path

import polars as pl

from profiler.cache import cache_dir
from profiler.discover import find_sources, read_manifest
from profiler.errors import TraceError, path_text
from profiler.parse import DAMAGED, MAX_RANK, SCHEMA, _as_int
from profiler.pool import load_all

# rank3.json.gz (ours), rank3_trace.json.gz (torchtitan), rank-3 / rank_3 (others)
RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RankPart:
    """One loaded trace file: its run and rank, and its parsed events in a parquet file."""

    run: str
    rank: int
    parquet: str

    def events(self) -> pl.DataFrame:
        """This file's rows of the event frame (SCHEMA). The parquet already has SCHEMA's types."""
        frame = pl.read_parquet(self.parquet)
        return frame.with_columns(run=pl.lit(self.run, pl.Categorical), rank=pl.lit(self.rank, pl.Int32)).select(list(SCHEMA))


@dataclasses.dataclass(frozen=True)
class Traces:
    """What `load_traces` returns.

    events: the event frame (SCHEMA), every loaded rank of every run; built on first access
        from `parts` (so a load that is only analyzed rank by rank never holds it whole).
    ranks: one row per loaded trace file: run, rank, file, backend, world_size, has_gpu,
        device_name, pg_config (JSON text of distributedInfo's process groups), n_events,
        dropped (struct: events dropped for impossible values, by why: profiler.parse.DAMAGED).
    runs: run id -> the parsed run.json of that run, or None where the run has none.
    problems: files that could not be used (one TraceError each); the rest loaded.
    parts: one RankPart per row of `ranks`, in the same order.
    """

    ranks: pl.DataFrame
    runs: dict[str, dict | None]
    problems: list[TraceError]
    parts: tuple[RankPart, ...]
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


def _resolve_rank(path: Path, meta: dict, *, prefer_filename: bool, default_rank: int | None) -> int:
    info = meta.get("distributed_info") or {}
    from_info = _as_int(info.get("rank"))
    from_name = rank_from_filename(path)
    for r in ((from_name, from_info) if prefer_filename else (from_info, from_name)):
        if r is not None:
            return r
    if default_rank is not None:
        return default_rank
    raise TraceError(
        path,
        "no rank: the trace has no distributedInfo and its file name has none (rank<R>...); "
        "rename it (e.g. rank0.json.gz) or pass --trace-rank R",
    )


def load_traces(
    paths: str | Path | list[str | Path],
    *,
    rank_from_filename_first: bool = False,
    default_rank: int | None = None,
    cache: bool = True,
    workers: int | None = None,
    progress: bool | None = None,
) -> Traces:
    """Load trace files / run folders into one event frame, every rank of every run.

    rank_from_filename_first: take the rank from the file name even where distributedInfo has one.
    default_rank: the rank of a trace that names none (only sensible for a single file).
    Raises TraceError when nothing usable is left; otherwise bad files are listed in `problems`.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise TraceError(None, "no trace paths given")
    sources = find_sources(paths)
    # Without the cache, files are parsed into a private folder that lives as long as the Traces,
    # so every load is analyzed one rank at a time from parquet either way.
    scratch = None if cache else tempfile.TemporaryDirectory(prefix="ptprof-nocache-")
    cache_path = cache_dir() if cache else Path(scratch.name)
    results = load_all([s.path for s in sources], cache_path, workers=workers, progress=progress)

    problems: list[TraceError] = []
    parts: list[RankPart] = []
    rows: list[dict] = []
    seen: dict[tuple[str, int], Path] = {}
    runs: dict[str, dict | None] = {}
    for src, res in zip(sources, results):
        if isinstance(res, TraceError):
            problems.append(res)
            continue
        meta, parquet = res
        try:
            if src.run not in runs:
                runs[src.run] = read_manifest(src.run_dir)
            rank = _resolve_rank(src.path, meta, prefer_filename=rank_from_filename_first, default_rank=default_rank)
            if not 0 <= rank <= MAX_RANK:  # from a file name or default_rank (distributedInfo's is checked in parse)
                raise TraceError(src.path, f"rank {rank} is not a rank (a whole number from 0 to {MAX_RANK:,})")
        except TraceError as e:
            problems.append(e)
            continue
        if (src.run, rank) in seen:
            problems.append(TraceError(src.path, f"duplicate rank {rank} in run {src.run!r} (also {seen[(src.run, rank)]}); "
                                                 "pass the files of one run only, or --rank-from-filename"))
            continue
        seen[(src.run, rank)] = src.path
        info = meta.get("distributed_info") or {}
        rows.append({
            "run": src.run, "rank": rank, "file": path_text(src.path), "backend": info.get("backend"),
            "world_size": _as_int(info.get("world_size")), "has_gpu": meta["has_gpu"],
            "device_name": meta.get("device_name"), "pg_config": json.dumps(info.get("pg_config")) if info.get("pg_config") else None,
            "n_events": meta["n_events"], "dropped": {k: meta["dropped"].get(k, 0) for k in DAMAGED},
        })
        parts.append(RankPart(src.run, rank, parquet))
    if not parts:
        if len(problems) == 1:
            raise problems[0]
        raise TraceError(None, "no usable traces:\n  " + "\n  ".join(str(p) for p in problems))
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["run"], rows[i]["rank"]))
    ranks = pl.DataFrame([rows[i] for i in order]).with_columns(pl.col("run").cast(pl.Categorical))
    runs = {r: m for r, m in runs.items() if r in set(ranks["run"].cast(pl.String))}
    return Traces(ranks=ranks, runs=runs, problems=problems, parts=tuple(parts[i] for i in order), _scratch=scratch)

"""The per-rank map in batches: several small files per worker call, one `analyze_rank` for all.

    for batch in plan_batches(tasks, workers=2): results = summarize_batch([tasks[i] for i in batch])

Most of a small rank's cost is fixed (about 190 small polars queries in `analyze_rank`, ~0.3 ms
each, whatever the rows), and every analysis groups by (run, rank): run once over the
concatenated events of k ranks it costs about what one rank costs. A worker therefore takes a
batch of consecutive files, parses each (cache entries per file, as `summarize`), analyses them
together and splits every frame back per (run, rank) into one `RankSummary` per file, each
cached on its own. The analyses are written so that a rank's rows never depend on the other
ranks in the frame (ties broken by a total key, sums in a fixed per-rank order), so a batched
summary is bit-identical to the file analysed alone (tests/profiler/test_batchmap.py).

Failures stay per file: a file that does not parse is its own TraceError; if the batched
analysis raises, the batch's files are analysed one by one, so the error names its file.

With `background_write`, a file parsed here has its parquet entry written on a background thread
while the analyses run (cache.settle before its summary names the entry); neither function
returns, nor raises, before every entry it queued is written, so a caller never holds a path to
a file not yet there. Only the local engine's in-process path asks for it (pool.LocalEngine.map):
there a core may be idle during the analyses, where a worker process's cores are taken by the
other workers, and the write would hold the file's whole frame beside the analyses' peak.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import polars as pl
from polars.exceptions import PanicException

from profiler.errors import TraceError, path_text
from profiler.gzip_limits import json_bytes
from profiler.rankmap import (RankSummary, RankTask, _events, _frame, _parse_uncached, analysed_columns, analyze_rank,
                              holding_events, rank_row, rank_rows, worker_rank)

MAX_BATCH_FILES = 32  # beyond ~32 ranks the fixed cost per rank is already a few ms
# Bytes of JSON (a parsed frame is about 0.6 times as large): a batch's events stay small.
MAX_BATCH_BYTES = 32 << 20
ALONE_BYTES = 8 << 20  # a file this large is analysed alone: its own rows dwarf the fixed cost


def plan_batches(tasks: list[RankTask], workers: int, per_worker: int = 2) -> list[list[int]]:
    """Indexes of `tasks` in batches of consecutive tasks, a pure function of the tasks (their
    files' sizes), the worker count and `per_worker`.

    Batches are small enough that each of `workers` gets about `per_worker` (a Dask cluster hands
    batches to whichever worker is free, so two each keep a slow worker from holding up the end;
    the local pool deals them out in advance, where one each saves a batch's fixed cost, ~50 ms of
    ~190 small queries), at most MAX_BATCH_FILES files and MAX_BATCH_BYTES bytes of JSON; only tasks of one run, run.json
    and options share a batch (the analyses take one `runs` entry per run). The batches change
    no number: a file's summary is bit-identical in any batch (tests/profiler/test_batchmap.py).
    """
    per_batch = max(1, min(MAX_BATCH_FILES, -(-len(tasks) // (max(1, per_worker) * max(1, workers)))))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    key = None
    for i, t in enumerate(tasks):
        size = _size(t.path)
        k = (t.run, RankTask.to_json(dataclasses.replace(t, path="", rank=None, ident=None)))
        if cur and (k != key or len(cur) >= per_batch or cur_bytes + size > MAX_BATCH_BYTES or size >= ALONE_BYTES):
            batches.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += size
        key = k
        if size >= ALONE_BYTES:
            batches.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        batches.append(cur)
    return batches


def _size(path: str) -> int:
    """The trace's bytes of JSON (gzip_limits.json_bytes); 0 where it does not read (the worker names it)."""
    try:
        return json_bytes(path)
    except OSError:
        return 0


@dataclasses.dataclass
class _Ready:
    """A parsed file waiting for the batch's analysis."""

    task: RankTask
    parsed: object  # cache.Parsed
    rank: int
    cache: Path | None


def summarize_batch(tasks: list[RankTask], *, background_write: bool = False) -> list[RankSummary | TraceError]:
    """`rankmap.summarize` of each task, the files missing from the cache parsed together
    (cache.load_many_safe) and the analyses of the parsed ones run once for all. Never raises."""
    if len(tasks) == 1:
        return [summarize_one(tasks[0], background_write=background_write)]
    if any(t.no_cache and not t.cache for t in tasks):  # --no-cache on a Dask worker: a scratch folder, as summarize
        with tempfile.TemporaryDirectory(prefix="ptprof-nocache-") as scratch:
            return summarize_batch([dataclasses.replace(t, cache=scratch, no_cache=False, ident=None) for t in tasks],
                                   background_write=background_write)
    results: list[RankSummary | TraceError | None] = [None] * len(tasks)
    ready: dict[int, _Ready] = {}
    paths = [Path(t.path) for t in tasks]
    holds = [holding_events(p) for p in paths]

    def done(i: int, res: RankSummary | TraceError) -> None:
        results[i] = res
        holds[i].__exit__(None, None, None)
        holds[i] = None

    try:
        pending: dict[int, _Pending] = {}
        for i, task in enumerate(tasks):
            holds[i].__enter__()
            got = _safely(paths[i], _lookup, task)
            if isinstance(got, _Pending):
                pending[i] = got
            else:
                done(i, got)
        for i, parsed in _parse_all(pending, background_write).items():
            got = _safely(paths[i], _ready, pending[i], parsed)
            if isinstance(got, _Ready):
                ready[i] = got
            else:
                done(i, got)
        for i, res in _analyse(ready).items():
            results[i] = res
    finally:
        _wait_writes()
        for h in holds:
            if h is not None:
                h.__exit__(None, None, None)
    return results


def summarize_one(task: RankTask, *, background_write: bool = False) -> RankSummary | TraceError:
    """`rankmap.summarize`: one file, its cached summary or parsed and analysed alone. Never raises."""
    if task.no_cache and not task.cache:  # --no-cache on a Dask worker: a scratch folder, nothing kept
        with tempfile.TemporaryDirectory(prefix="ptprof-nocache-") as scratch:
            return summarize_one(dataclasses.replace(task, cache=scratch, no_cache=False, ident=None),
                                 background_write=background_write)
    path = Path(task.path)
    with holding_events(path):  # from the parse until the analyses' frames are all that is left
        try:
            got = _safely(path, _prepare, task, background_write)
            return _finish_alone(got) if isinstance(got, _Ready) else got
        finally:
            _wait_writes()


def _wait_writes() -> None:
    from profiler.cache import wait_writes

    wait_writes()


def _safely(path: Path, fn, *args):
    """fn(*args), or the TraceError naming `path` for whatever it raises (the batch goes on)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return TraceError(path, f"could not parse ({type(e).__name__}: {str(e)[:200]})")


@dataclasses.dataclass
class _Pending:
    """A file with no cached summary: to parse (or read from its parquet entry) into `cache`."""

    task: RankTask
    cache: Path | None  # None: the cache folder is unusable here (why), parse into memory
    why: str | None = None


def _lookup(task: RankTask) -> RankSummary | _Pending:
    """The file's cached summary where a Dask worker finds one (a local worker's task was looked up by load.py)."""
    from profiler.cache import cache_dir, lookup
    from profiler.summary_cache import read_summary

    path = Path(task.path)
    try:
        cache = Path(task.cache) if task.cache else cache_dir()
    except Exception as e:  # noqa: BLE001  (CacheUnusable on a worker: parse into memory)
        return _Pending(task, None, str(e))
    if task.ident is None:  # a Dask worker: it hashes the file itself
        entry, ident = lookup(path, cache)
        if ident is not None:
            task = dataclasses.replace(task, ident=ident)
            hit = read_summary(cache, task, entry.parquet) if entry is not None else None
            if hit is not None:
                return hit
    return _Pending(task, cache)


def _parse_all(pending: dict[int, _Pending], background_write: bool) -> dict[int, object]:
    """Each pending file's cache.Parsed or TraceError: those of one cache folder loaded together."""
    from profiler.cache import load_many_safe

    out: dict[int, object] = {}
    by_cache: dict[Path, list[int]] = {}
    for i, p in pending.items():
        if p.cache is None:
            out[i] = _parse_uncached(Path(p.task.path), p.why)
        else:
            by_cache.setdefault(p.cache, []).append(i)
    for cache, ids in by_cache.items():
        got = load_many_safe([Path(pending[i].task.path) for i in ids], cache, [pending[i].task.ident for i in ids],
                             background=background_write)
        out.update(zip(ids, got))
    return dict(sorted(out.items()))


def _ready(p: _Pending, parsed) -> TraceError | _Ready:
    """The parsed file with the rank its frames are labelled with."""
    if isinstance(parsed, TraceError):
        return parsed
    try:
        rank = worker_rank(p.task, parsed.meta)
    except Exception as e:  # noqa: BLE001
        return TraceError(Path(p.task.path), f"could not analyse ({type(e).__name__}: {str(e)[:200]})")
    return _Ready(p.task, parsed, rank, p.cache)


def _prepare(task: RankTask, background_write: bool) -> RankSummary | TraceError | _Ready:
    """A cached summary, the file's TraceError, or the file parsed (as `summarize` does)."""
    got = _lookup(task)
    return _ready(got, _parse_all({0: got}, background_write)[0]) if isinstance(got, _Pending) else got


def _analyse(ready: dict[int, _Ready]) -> dict[int, RankSummary | TraceError]:
    """Each ready file's summary: the files with distinct (run, rank) analysed together, the rest
    (two files a worker labelled alike, e.g. rank-less files: load.py sorts them out) alone."""
    seen: set[tuple[str, int]] = set()
    together, alone = [], []
    for i, r in ready.items():
        key = (r.task.run, r.rank)
        (alone if key in seen else together).append(i)
        seen.add(key)
    out: dict[int, RankSummary | TraceError] = {}
    if len(together) > 1:
        try:
            frames = _analyse_together([ready[i] for i in together])
        except (Exception, PanicException):  # noqa: BLE001  (odd events: one by one, the failing file named)
            alone = together + alone
        else:
            for i in together:
                out[i] = _finish(ready[i], frames[(ready[i].task.run, ready[i].rank)])
    else:
        alone = together + alone
    for i in alone:
        out[i] = _finish_alone(ready[i])
    return out


def _analyse_together(batch: list[_Ready]) -> dict[tuple[str, int], dict[str, pl.DataFrame]]:
    """One `analyze_rank` over the batch's events, its frames split back per (run, rank)."""
    events = _batch_events(batch)
    ranks = rank_rows([(r.parsed.meta, r.task.run, r.rank, path_text(Path(r.task.path))) for r in batch])
    opts = batch[0].task.options
    frames = analyze_rank(events, ranks, {r.task.run: r.task.manifest for r in batch}, step=opts.step, top_n=opts.top_n,
                          with_activity=opts.activity)
    del events
    # One partition_by per frame (rows keep their order), not one filter per frame and rank.
    split = {name: _by_rank(f) for name, f in frames.items()}
    out = {}
    for r in batch:
        key = (r.task.run, r.rank)
        mine = {name: parts.get(key, frames[name].clear()) for name, parts in split.items()}
        if "steps" in mine and mine["steps"].is_empty():  # --step S that this rank lacks (as analyze_rank alone)
            mine = {"all_steps": mine["all_steps"], "empty_steps": mine["empty_steps"]}
        out[key] = mine
    return out


def _batch_events(batch: list[_Ready]) -> pl.DataFrame:
    """The batch's events labelled (run, rank), as `rankmap._events` of each file concatenated:
    each analysed column joined once from the files' (one copy, one chunk), then labelled once
    (not one query per file: a select of each file's columns, then one of the joined frame's,
    which copied every column again to align its chunks, were half of this)."""
    import numpy as np

    # The analysed columns of each (a just-parsed frame has them all, one read back only these).
    frames = [_frame(r.parsed) for r in batch]
    heights = [f.height for f in frames]
    runs = pl.Series("run", [r.task.run for r in batch], dtype=pl.String).cast(pl.Categorical)
    which = pl.Series(np.repeat(np.arange(len(batch), dtype=np.int64), heights))
    labels = {"run": runs.gather(which),
              "rank": pl.Series("rank", np.repeat(np.array([r.rank for r in batch], dtype=np.int32), heights), dtype=pl.Int32)}
    return pl.DataFrame([labels[c] if c in labels else pl.concat([f.get_column(c) for f in frames], rechunk=True)
                         for c in analysed_columns()])


def _by_rank(frame: pl.DataFrame) -> dict[tuple[str, int], pl.DataFrame]:
    """The frame's rows per (run, rank), in their order."""
    if frame.is_empty():
        return {}
    # The analyses leave a rank's rows together (they group by run and rank): then each rank's
    # part is a zero-copy slice, found from the runs of equal keys (one query, where
    # partition_by builds a frame per rank at ~0.1 ms each).
    runs = frame.select(pl.struct(pl.col("run").cast(pl.String), "rank").rle().alias("r")).unnest("r").unnest("value")
    keys = list(zip(runs["run"].to_list(), runs["rank"].to_list()))
    if len(set(keys)) == len(keys) and all(run is not None and rank is not None for run, rank in keys):
        out, at = {}, 0
        for key, n in zip(keys, runs["len"].to_list()):
            out[key] = frame.slice(at, n)
            at += n
        return out
    parts = frame.partition_by("run", "rank", maintain_order=True, as_dict=True)
    return {(str(run), int(rank)): part for (run, rank), part in parts.items()}


def _finish(r: _Ready, frames: dict[str, pl.DataFrame]) -> RankSummary:
    from profiler.cache import settle
    from profiler.summary_cache import store_summary

    p = settle(r.parsed)  # its entry written while the analyses ran (or kept in memory: a full disk)
    # Never the events themselves (uncached on a full disk): a caller that needs them parses again.
    summary = RankSummary(p.meta, r.rank, p.parquet, frames, p.unstored)
    if r.cache is not None and p.parquet is not None and r.task.ident is not None:
        store_summary(r.cache, r.task, summary)
    return summary


def _finish_alone(r: _Ready) -> RankSummary | TraceError:
    path = Path(r.task.path)
    try:
        events = _events(r.parsed, r.task.run, r.rank)
        # The file's other columns freed before the analyses (nothing after them reads the frame).
        r.parsed = dataclasses.replace(r.parsed, frame=None, fresh=None)
        opts = r.task.options
        frames = analyze_rank(events, rank_row(r.parsed.meta, r.task.run, r.rank, path_text(path)),
                              {r.task.run: r.task.manifest}, step=opts.step, top_n=opts.top_n, with_activity=opts.activity)
        del events
    except TraceError as e:
        return e if e.path else TraceError(path, e.problem)
    except MemoryError:
        return TraceError(path, "out of memory while analysing")
    except Exception as e:  # noqa: BLE001
        return TraceError(path, f"could not analyse ({type(e).__name__}: {str(e)[:200]})")
    return _finish(r, frames)

"""The per-rank map: one trace file in, one small summary out (issue 16: scale).

    summary = summarize(RankTask(path="traces/x/rank3.json.gz", run="x", manifest=..., options=MapOptions()))

Everything that needs a rank's events happens here, in a worker (a local process of pool.py or
a Dask worker: dask_pool.py): the file is parsed (or its parquet entry read), its per-rank
analyses run, and only their results travel back (`RankSummary.frames`: a few hundred rows per
rank, not millions of events). The cross-rank work (skew, stragglers, pipeline groups, theory,
findings, comparisons) is report.analyze's reduce over these summaries, so memory holds at most
one batch's events per worker (batchmap.py: up to 32 small files, or one large one), whatever the
rank count.

The same function serves both engines, so a Dask load and a local one give identical numbers.
Each summary is cached beside the parquet entry (summary_cache.py), keyed by the trace's bytes,
the code that made it and everything the analyses read (run.json, --step, --top), so a warm load
is a read of small files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import struct
from pathlib import Path

import polars as pl

from profiler.activity import activity
from profiler.breakdown import gloo_worker_threads, multi_gpu_ranks, temporal_breakdowns
from profiler.collectives import collectives
from profiler.errors import TraceError, path_text
from profiler.exposed import exposed_comm
from profiler.memory import memory_curve, memory_peaks, memory_timeline
from profiler.pipeline import pipeline_actions
from profiler.recompute import recompute_time
from profiler.steps import assign_steps, step_tails, steps_and_empty
from profiler.top_ops import top_kernels, top_operators


@dataclasses.dataclass(frozen=True)
class MapOptions:
    """What the per-rank analyses depend on besides the events and run.json (part of the cache key)."""

    step: int | None = None  # --step S: only ProfilerStep#S
    top_n: int = 15  # rows of the operator / kernel tables
    # The lanes' busy share in time bins (profiler/activity.py): only the viewer draws them, and
    # they add up to ~40 % to a rank's analyses, so the CLI does without.
    activity: bool = False

    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class RankTask:
    """One file to summarize, with everything the worker needs (plain values: it is pickled for
    Dask and written as JSON for local workers).

    run: the run label the frames carry (load.py relabels them where job splitting renames the run).
    rank: the rank load.py resolved for the file where it could before parsing (from the file
        name, --trace-rank), else None: the worker takes distributedInfo's (else the name's, else 0).
    manifest: the run's run.json (None without one).
    cache: the parquet cache folder; None: the worker's own (`cache.cache_dir()`, Dask workers).
    ident: the file's identity from `cache.lookup` (so a miss is not hashed twice), or None.
    """

    path: str
    run: str
    manifest: dict | None
    options: MapOptions
    cache: str | None = None
    rank: int | None = None
    ident: tuple[str, str | None] | None = None
    no_cache: bool = False  # --no-cache on a Dask worker: parse into a scratch folder, serve no summary

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps(d)

    @staticmethod
    def from_json(text: str) -> "RankTask":
        d = json.loads(text)
        d["options"] = MapOptions(**d["options"])
        d["ident"] = tuple(d["ident"]) if d["ident"] else None
        return RankTask(**d)


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """What one trace file leaves after the map.

    meta: parse_trace_file's header (distributedInfo, device, counts of dropped events, ...).
    rank: the rank the frames are labelled with (see RankTask.rank).
    parquet: the parquet entry of the file's events (None: not written, or not on this machine).
    frames: the per-rank analyses (`analyze_rank`), labelled (task.run, rank).
    unstored: why the events could not be cached (a full disk), else None.
    """

    meta: dict
    rank: int
    parquet: str | None
    frames: dict[str, pl.DataFrame]
    unstored: str | None = None


# The columns of parse.SCHEMA the per-rank analyses read: the rest (a thread's name, the category,
# external ids, a group's description, copy sizes, memory addresses) only the parquet entry and
# in-process callers keep. A worker's frame holds these alone (`_events`; a frame read back from
# its entry reads no other), ~11 of ~59 MB on a 100 MB rank left free for the analyses'
# intermediates; `analyze_rank` hands its analyses no other, so one that starts reading another
# column fails in the tests instead of only in-process (tests/profiler/test_rankmap.py).
UNREAD_COLUMNS = ("thread", "cat", "external_id", "group_desc", "copy_bytes", "mem_addr")


def analysed_columns() -> list[str]:
    """parse.SCHEMA's columns but UNREAD_COLUMNS, in SCHEMA's order."""
    from profiler.parse import SCHEMA

    return [c for c in SCHEMA if c not in UNREAD_COLUMNS]


def rank_row(meta: dict, run: str, rank: int, file: str) -> pl.DataFrame:
    """The one-row `Traces.ranks` frame the per-rank analyses read (world size, process groups)."""
    return rank_rows([(meta, run, rank, file)])


def rank_rows(files: list[tuple[dict, str, int, str]]) -> pl.DataFrame:
    """`rank_row` of each (meta, run, rank, file), one row each, built at once (a batch's)."""
    from profiler.parse import _as_int

    rows = []
    for meta, run, rank, file in files:
        info = meta.get("distributed_info") or {}
        rows.append({
            "run": run, "rank": rank, "file": file, "backend": info.get("backend"),
            "world_size": _as_int(info.get("world_size")), "has_gpu": meta["has_gpu"],
            "pg_config": json.dumps(info.get("pg_config")) if info.get("pg_config") else None,
        })
    return pl.DataFrame(rows, schema_overrides={"pg_config": pl.String, "backend": pl.String, "world_size": pl.Int64},
                        infer_schema_length=None).with_columns(pl.col("run").cast(pl.Categorical), pl.col("rank").cast(pl.Int32))


def analyze_rank(events: pl.DataFrame, ranks: pl.DataFrame, runs: dict[str, dict | None], *, step: int | None,
                 top_n: int, with_activity: bool = True) -> dict[str, pl.DataFrame]:
    """The per-rank analyses of one (run, rank)'s events (or of several ranks' at once: every
    analysis here groups by run and rank, and a rank's rows are bit-identical either way, which
    tests/profiler/test_batchmap.py checks)."""
    # One chunk per column: a frame read from a parquet of several row groups, beside columns of
    # one chunk (run, rank, step), is re-aligned in full by every eager operation on it (about
    # 8 ms each on a 100 MB rank); aligned once here, those cost nothing (`_events` hands over
    # columns of one chunk already: rechunking here, beside the caller's frame, would copy them).
    events = events.select(analysed_columns()).rechunk()
    all_steps, empty = steps_and_empty(events)  # the empty last steps: left out, said in the report
    steps = all_steps if step is None else all_steps.filter(pl.col("step") == step)
    if steps.is_empty():  # --step S and this rank has no step S: nothing to analyze
        return {"all_steps": all_steps.select("run", "rank", "step"), "empty_steps": empty}
    tails = step_tails(events, steps, empty)  # before --step's filter: the rank's last event, wherever it is
    # Which step each event is in, once for every analysis below (they reuse the column).
    events = assign_steps(events, steps)
    if step is not None:
        events = events.filter(pl.col("step").is_not_null() | (pl.col("kind") == "memory_event"))
    # The largest transient first (the self-time sweep, ~15 MB on a 100 MB rank), before the
    # pages the other analyses free pile up: the allocator hands freed pages back ~50 ms late
    # (pool._WORKER_ENV), and the worker's peak is this sweep on top of whatever it still holds.
    top_ops = top_operators(events, n=top_n)
    colls = collectives(events, ranks)
    # Read by the breakdowns and exposed_comm alike: found once.
    multi, gloo = multi_gpu_ranks(events), gloo_worker_threads(events)
    breakdown, breakdown_steps = temporal_breakdowns(events, steps=steps, multi=multi, gloo_threads=gloo)
    return {
        "all_steps": all_steps.select("run", "rank", "step"),
        "steps": steps,
        "step_tails": tails,
        "empty_steps": empty,
        "multi_gpu": multi,
        "breakdown": breakdown,
        "breakdown_steps": breakdown_steps,
        "collectives": colls,
        "exposed": exposed_comm(events, colls, multi=multi, gloo_threads=gloo),
        "actions": pipeline_actions(events, steps=steps, runs=runs),
        "memory_peaks": memory_peaks(timeline := memory_timeline(events)),
        "memory_curve": memory_curve(timeline),
        "top_operators": top_ops,
        "top_kernels": top_kernels(events, n=top_n),
        "recompute": recompute_time(events),
        **({"activity": activity(events)} if with_activity else {}),  # the viewer's lanes at scale
    }


def worker_rank(task: RankTask, meta: dict) -> int:
    """The rank a worker labels the file with: load.py's where it resolved one, else
    distributedInfo's, else the one in the file name, else 0 (load.py re-runs the file's analyses
    where its final answer differs, e.g. two rank-less files that turn out to be separate jobs)."""
    from profiler.damaged import MAX_RANK
    from profiler.load import rank_from_filename
    from profiler.parse import _as_int

    if task.rank is not None:
        return task.rank
    r = _as_int((meta.get("distributed_info") or {}).get("rank"))
    if r is None:
        r = rank_from_filename(Path(task.path))
    # Out of range (a file name's rank past int32): load.py refuses the file; label it 0 meanwhile.
    return r if r is not None and 0 <= r <= MAX_RANK else 0


def summarize(task: RankTask) -> RankSummary | TraceError:
    """Parse (or read from the cache) one trace file and run its per-rank analyses.

    Never raises: a file that cannot be used comes back as the TraceError naming it, so one bad
    file never stops a load (and a Dask worker never retries it). The steps live in batchmap.py,
    which also runs them for several files at once.
    """
    from profiler.batchmap import summarize_one

    return summarize_one(task)


# Set to a file name, every summarize appends "+ PID PATH" to it when it starts holding a rank's
# events (parsing) and "- PID PATH" once they are released, with O_APPEND so the lines of all
# processes (local workers, Dask workers on this machine) interleave in the order they happened:
# the running count is how many ranks' events are in memory at once across the whole load
# (tests/profiler/test_engine.py bounds it by one batch per worker). One getenv per file when unset.
HOLD_LOG_ENV = "PTPROF_HOLD_LOG"


@contextlib.contextmanager
def holding_events(path: Path):
    """Mark the span in which this process holds `path`'s events in $PTPROF_HOLD_LOG (when set)."""
    log = os.environ.get(HOLD_LOG_ENV)
    if log:
        _hold_mark(log, "+", path)
    try:
        yield
    finally:
        if log:
            _hold_mark(log, "-", path)


def _hold_mark(log: str, sign: str, path: Path) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{sign} {os.getpid()} {path_text(path)}\n".encode())  # one write: never interleaved
    finally:
        os.close(fd)


def _parse_uncached(path: Path, why: str):
    """The file parsed into memory (no usable cache): a Parsed, or the TraceError naming it. Never
    raises: whatever the parse trips (deep nesting, no memory, a polars panic) is worded as
    cache.load_one_safe words it, so one file never costs its batch."""
    from profiler.cache import Parsed, _safely
    from profiler.parse import parse_trace_file

    got = _safely(path, parse_trace_file, path)
    if isinstance(got, TraceError):
        return got
    frame, meta = got
    return Parsed(meta, None, frame, why)


READ_WHOLE_BYTES = 4 << 20  # entries under this (a ~70 MB trace) are read in one call: the doubling is small


def _frame(parsed) -> pl.DataFrame:
    """A cache.Parsed's events: in memory (unstored, or just parsed), else read from its entry
    (the analysed columns only, each in one chunk)."""
    if parsed.parquet is None:
        return parsed.frame
    if parsed.fresh is not None:
        return parsed.fresh
    # Read column by column, each made one chunk (a chunk per row group otherwise) before the
    # next is read: the next column's chunks reuse the pages the last one's freed, where reading
    # the whole frame then rechunking it needs room for it twice (~100 MB over ~50 on a 100 MB
    # rank: freed pages go back to the system ~50 ms late, pool._WORKER_ENV).
    # A small entry is read in one call: each read costs ~1 ms whatever its size (25 reads were
    # ~23 ms a 1 MB rank, where summaries are remade from entries after every ptprof change).
    columns = [c for c in analysed_columns() if c not in ("run", "rank")]
    if os.path.getsize(parsed.parquet) < READ_WHOLE_BYTES:
        return pl.read_parquet(parsed.parquet, columns=columns).rechunk()
    return pl.DataFrame([pl.read_parquet(parsed.parquet, columns=[c]).to_series().rechunk() for c in columns])


def _events(parsed, run: str, rank: int) -> pl.DataFrame:
    """The file's analysed columns labelled (run, rank), those without a value as constants."""
    frame = _frame(parsed)
    # A column null on every row (a trace without collective arguments, or without [memory]
    # events: up to ~17 of ~48 MB on a 100 MB rank) held as one null broadcast, not a buffer of
    # a value per row: the same values to every analysis (an operation that needs the column
    # whole makes it, for the rows it keeps). Null counts are known without a pass.
    empty = [pl.lit(None, dtype).alias(c) for c, dtype in frame.schema.items()
             if frame.height and frame.get_column(c).null_count() == frame.height]
    return frame.with_columns(*empty, run=pl.lit(run, pl.Categorical), rank=pl.lit(rank, pl.Int32)).select(analysed_columns())


# ---------------------------------------------------------------------------------------------
# Summaries as bytes (worker -> parent, Dask worker -> client, the summary cache)

# Each frame in polars' own binary form (`DataFrame.serialize`): about 20 µs a frame where an
# Arrow IPC write costs ~0.3 ms and a read ~0.6 ms (polars' per-call overhead, not bytes), which at
# 14 frames a summary, encoded twice (cache, pipe) and decoded once, was most of a small rank's
# fixed cost. The form is polars' own and may change between its versions: summaries only travel
# between processes of one install (a Dask cluster already shares its polars: results are
# pickled) and the summary cache's key holds polars' version (summary_cache.code_version).
_MAGIC = b"PTPS2\n"


def encode(summary: RankSummary) -> bytes:
    """One blob: magic, a length-prefixed JSON header, then each frame serialized."""
    blobs = [frame.serialize() for frame in summary.frames.values()]
    head = json.dumps({"meta": summary.meta, "rank": summary.rank, "parquet": summary.parquet,
                       "unstored": summary.unstored, "frames": list(summary.frames), "sizes": [len(b) for b in blobs]}).encode()
    return b"".join([_MAGIC, struct.pack("<Q", len(head)), head, *blobs])


def decode(blob: bytes) -> RankSummary:
    """`encode`'s inverse; ValueError on a blob that is not whole."""
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 8:
        raise ValueError("not a ptprof rank summary")
    at = len(_MAGIC)
    (n,) = struct.unpack_from("<Q", blob, at)
    at += 8
    head = json.loads(blob[at:at + n])
    at += n
    if at + sum(head["sizes"]) != len(blob):
        raise ValueError("truncated rank summary")
    frames = {}
    view = memoryview(blob)
    for name, size in zip(head["frames"], head["sizes"]):
        frames[name] = pl.DataFrame.deserialize(io.BytesIO(view[at:at + size]))
        at += size
    return RankSummary(head["meta"], head["rank"], head["parquet"], frames, head["unstored"])


def relabel(summary: RankSummary, run: str, rank: int) -> dict[str, pl.DataFrame]:
    """The summary's frames labelled (run, rank), each keeping its own dtypes for the two columns."""
    out = {}
    for name, f in summary.frames.items():
        cols = []
        if "run" in f.columns and f.schema["run"] != pl.Null:
            cols.append(pl.lit(run).cast(f.schema["run"]).alias("run"))
        if "rank" in f.columns and f.schema["rank"] != pl.Null:
            cols.append(pl.lit(rank).cast(f.schema["rank"]).alias("rank"))
        out[name] = f.with_columns(cols) if cols else f
    return out

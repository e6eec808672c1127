"""Kineto Chrome traces -> one normalized polars event frame (schema in docs/profiler.md).

Every format quirk is handled here and nowhere else: gzip or plain JSON, the JSON-array form of a
Chrome trace, Kineto's string pseudo-processes (`"Spans"`, `"Traces"`), `ph` kinds (complete
`X`, instant `i`/`I`, metadata `M` for thread names, flows `s`/`f`/`t` dropped because kernels
and runtime calls already carry `correlation`), missing `dur`/`args`, integer or fractional
microsecond timestamps, the rank (from `distributedInfo`, else the file name), and our `run.json`.

    traces = load_traces("traces/ddp-2r-20261122-210000")
    traces.events  # one row per event, all ranks, all runs

A file is parsed once; the result is cached as parquet keyed by (path, size, mtime), so the
second load of an unchanged trace only reads the parquet. Uncached files are parsed in parallel
worker processes, each holding one file at a time. Parsing is done by the C module `_kineto`
(JSON straight into column buffers) where it is built, and by msgspec where it is not or where it
declines a file; both give the same frame (the rules that make them agree are in _kineto.c).
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import zlib
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl

from profiler.classify import classify
from profiler.errors import TraceError

try:  # the C parser, built by `pip install` where a C compiler exists (pyproject.toml)
    from profiler import _kineto
except ImportError:
    _kineto = None

LOADER_VERSION = 6  # bump when the frame's schema or parsing changes: invalidates every cache entry
CACHE_ENV = "PTPROF_CACHE_DIR"
PURE_PARSER_ENV = "PTPROF_PURE_PARSER"  # set (to anything) to parse with msgspec only
RUN_MANIFEST = "run.json"
TRACE_SUFFIXES = (".json", ".json.gz")
# rank3.json.gz (ours), rank3_trace.json.gz (torchtitan), rank-3 / rank_3 (others)
RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

# The event frame. Order here is the column order of `Traces.events`.
SCHEMA: dict[str, pl.DataType] = {
    "run": pl.Categorical(),
    "rank": pl.Int32(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "thread": pl.Categorical(),
    "stream": pl.Int64(),
    "ph": pl.Categorical(),
    "cat": pl.Categorical(),
    "name": pl.Categorical(),
    "device": pl.Categorical(),
    "kind": pl.Categorical(),
    "ts_us": pl.Float64(),
    "dur_us": pl.Float64(),
    "end_us": pl.Float64(),
    "correlation": pl.Int64(),
    "external_id": pl.Int64(),
    "collective": pl.Categorical(),
    "in_nelems": pl.Int64(),
    "out_nelems": pl.Int64(),
    "dtype": pl.Categorical(),
    "group_name": pl.Categorical(),
    "group_desc": pl.Categorical(),
    "group_ranks": pl.Categorical(),
    "group_size": pl.Int32(),
    "arg_nelems": pl.List(pl.Int64()),
    "arg_types": pl.List(pl.String()),
    "copy_bytes": pl.Int64(),
    "mem_bytes": pl.Int64(),
    "mem_total_allocated_bytes": pl.Int64(),
    "mem_total_reserved_bytes": pl.Int64(),
    "mem_addr": pl.Int64(),
    "mem_device_type": pl.Int32(),
    "mem_device_id": pl.Int32(),
}


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
        device_name, pg_config (JSON text of distributedInfo's process groups), n_events.
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


@dataclasses.dataclass(frozen=True)
class _Source:
    run: str
    path: Path
    run_dir: Path | None  # the folder whose run.json (if any) describes this file


def is_trace_file(p: Path) -> bool:
    return p.is_file() and not p.name.startswith(".") and p.name != RUN_MANIFEST and p.name.endswith(TRACE_SUFFIXES)


def _trace_files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if is_trace_file(p))


def _run_name(folder: Path) -> str:
    manifest = folder / RUN_MANIFEST
    if manifest.is_file():
        try:
            run_id = json.loads(manifest.read_text()).get("run_id")
            if isinstance(run_id, str) and run_id:
                return run_id
        except (OSError, ValueError):
            pass  # an unreadable manifest is reported by _read_manifest
    return folder.resolve().name


def find_sources(paths: list[str | Path]) -> list[_Source]:
    """Expand files and folders into trace files grouped by run.

    A file belongs to the run of its folder; a folder holding traces is one run; a folder holding
    only sub-folders of traces (our `traces/` output folder) is one run per sub-folder.
    """
    sources: list[_Source] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise TraceError(p, "no such file or folder")
        if p.is_file():
            sources.append(_Source(_run_name(p.parent), p, p.parent))
            continue
        files = _trace_files_in(p)
        if files:
            sources += [_Source(_run_name(p), f, p) for f in files]
            continue
        subdirs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
        nested = [(d, _trace_files_in(d)) for d in subdirs]
        nested = [(d, fs) for d, fs in nested if fs]
        if not nested:
            raise TraceError(p, "no trace files here (expected *.json or *.json.gz, or run folders holding them)")
        for d, fs in nested:
            sources += [_Source(_run_name(d), f, d) for f in fs]
    return sources


# ---------------------------------------------------------------------------------------------
# Parsing one file


class _Args(msgspec.Struct, gc=False):
    """The `args` an analysis needs; every other key is skipped by the decoder, unparsed.

    Values are typed loosely (`Any`) because traces disagree (ROCm's stream "0x0", string or int
    process-group names); the frame's dtypes are enforced afterwards, column by column. The
    operator shapes stay raw JSON until we know the event is a collective (their nesting varies).
    """

    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_name: Any = msgspec.field(default=None, name="Process Group Name")
    group_desc: Any = msgspec.field(default=None, name="Process Group Description")
    group_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_size: Any = msgspec.field(default=None, name="Group size")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    copy_bytes: Any = msgspec.field(default=None, name="bytes")
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    mem_total_allocated_bytes: Any = msgspec.field(default=None, name="Total Allocated")
    mem_total_reserved_bytes: Any = msgspec.field(default=None, name="Total Reserved")
    mem_addr: Any = msgspec.field(default=None, name="Addr")
    mem_device_type: Any = msgspec.field(default=None, name="Device Type")
    mem_device_id: Any = msgspec.field(default=None, name="Device Id")
    name: Any = None  # thread_name metadata


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _Doc(msgspec.Struct, gc=False):
    # First pass: each event kept as its raw JSON text, decoded in batches (bounded memory).
    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 (the trace's own key)
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815


# args columns copied straight from _Args (the rest need work: see parse_trace_file)
_ARG_FIELDS = ["correlation", "external_id", "collective", "in_nelems", "out_nelems", "dtype", "group_name", "group_desc",
               "group_size", "copy_bytes", "mem_bytes", "mem_total_allocated_bytes", "mem_total_reserved_bytes", "mem_addr",
               "mem_device_type", "mem_device_id"]
_NO_ARGS = _Args()
# Both parsers hand `_finish` their columns in this order.
_COLUMN_ORDER = ["pid", "tid", "ph", "cat", "name", "ts_us", "dur_us", "stream", *_ARG_FIELDS,
                 "group_ranks", "arg_nelems", "arg_types"]
_DOC_DECODER = msgspec.json.Decoder(_Doc | list[msgspec.Raw])
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
BATCH_EVENTS = 20_000  # events decoded at once: bounds a worker's memory to the bytes plus one batch


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if not raw:
        raise TraceError(path, "empty file")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(path, f"truncated or corrupt gzip ({e})") from None
        if not raw:
            raise TraceError(path, "empty file (inside the gzip)")
    return raw


def _decode(raw: bytes, path: Path) -> _Doc:
    """Chrome traces are either {"traceEvents": [...], ...} or a bare array of events."""
    try:
        doc = _DOC_DECODER.decode(raw)
    except msgspec.ValidationError as e:
        raise TraceError(path, f"not a Kineto/Chrome trace: {_what_json(raw)} ({e})") from None
    except msgspec.DecodeError as e:
        hint = " (truncated?)" if "truncated" in str(e) else ""
        raise TraceError(path, f"not valid JSON{hint}: {e}") from None
    if isinstance(doc, list):
        return _Doc(traceEvents=doc)
    if doc.traceEvents is None:
        raise TraceError(path, f"not a Kineto/Chrome trace: {_what_json(raw)}")
    return doc


def _decode_batch(events: list[msgspec.Raw], first: int, path: Path) -> list[_Event]:
    try:
        return _EVENTS_DECODER.decode(b"[" + b",".join(events) + b"]")
    except msgspec.ValidationError as e:
        where = re.sub(r"^\$\[(\d+)\]", lambda m: f"$.traceEvents[{first + int(m.group(1))}]", str(e).split(" - at `")[-1].rstrip("`"))
        raise TraceError(path, f"not a Kineto/Chrome trace: malformed event at `{where}` ({str(e).split(' - at ')[0]})") from None
    except UnicodeDecodeError as e:
        raise TraceError(path, f"not UTF-8 text: {e.reason} at byte {e.start} of events {first}..{first + len(events) - 1}") from None


def _what_json(raw: bytes) -> str:
    # Only on the error path: what the JSON is instead, for the message.
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:  # the type check stopped before a later syntax error
        return f"not valid JSON either ({e})"
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return "its traceEvents are not all event objects"
    if isinstance(doc, dict):
        return "a JSON dict without a traceEvents list (keys: " + ", ".join(list(doc)[:6]) + ")"
    if isinstance(doc, list):
        return "a JSON list whose items are not event objects"
    return f"a JSON {type(doc).__name__}"


_NOT_TENSOR_TYPES = {"", "Scalar", "ScalarList", "GenericList", "None", None}


def _nelems(dims, typ) -> int | None:
    """Elements of one operator argument from its `Input Dims` / `Input type` entries."""
    if not isinstance(dims, list):
        return None
    if typ == "TensorList" or (dims and isinstance(dims[0], list)):
        shapes = [d for d in dims if isinstance(d, list)]
        return sum(math.prod(d) for d in shapes) if all(_all_ints(d) for d in shapes) else None
    if typ in _NOT_TENSOR_TYPES or not _all_ints(dims):
        return None
    return math.prod(dims)  # a 0-dim tensor ([]) has one element


def _all_ints(dims: list) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in dims)


def _as_int(v) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v if -2**63 <= v < 2**63 else None
    if isinstance(v, float) and -2.0**63 <= v < 2.0**63:  # also False for NaN and inf
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


_COMM_NAME_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")
_KEPT_PH = {"X": "X", "i": "i", "I": "i"}
_FLOW_PH = ("s", "f", "t")


def parse_trace_file(path: str | Path, *, fast: bool | None = None) -> tuple[pl.DataFrame, dict]:
    """Parse one trace file into (event frame without run/rank, header).

    header: distributedInfo, deviceProperties names, counts of what was dropped. Raises TraceError.

    fast: use the C parser (profiler/_kineto.c) when it is built; None = unless $PTPROF_PURE_PARSER
    is set. It reads the JSON straight into column buffers; for input it does not handle (every
    malformed file among them) it declines and the msgspec parser below runs, which also words
    the errors. Both give the same frame (tests/profiler/test_fast_parser.py).
    """
    path = Path(path)
    raw = _read_bytes(path)
    if fast is None:
        fast = not os.environ.get(PURE_PARSER_ENV)
    parsed = _fast_parse(raw) if fast and _kineto is not None else None
    if parsed is not None:
        slices = _raw_slices(parsed, raw)  # the few raw JSON values still needed, so the bytes can go
        del raw
        frame, thread_names, dropped = _fast_columns(parsed, slices)
        info, devices = (msgspec.json.decode(parsed[k]) if parsed[k] is not None else None for k in ("distributedInfo", "deviceProperties"))
        del parsed
    else:
        frame, thread_names, dropped, info, devices = _python_columns(raw, path)
        del raw
    # Thread names from metadata, looked up on the two key columns only (a join of the whole
    # frame would copy every column).
    threads = pl.DataFrame(
        {"pid": [k[0] for k in thread_names], "tid": [k[1] for k in thread_names], "thread": list(thread_names.values())},
        schema={"pid": pl.Int64, "tid": pl.Int64, "thread": pl.String},
    )
    thread = frame.select("pid", "tid").join(threads, on=["pid", "tid"], how="left", maintain_order="left")["thread"]
    frame = frame.with_columns(thread.cast(pl.Categorical), end_us=pl.col("ts_us") + pl.col("dur_us"))
    frame = classify(frame)
    # GPU activity's stream is its tid when args carry none (ROCm, annotations).
    frame = frame.with_columns(
        stream=pl.when(pl.col("device") == "gpu").then(pl.coalesce("stream", "tid")).otherwise(pl.col("stream"))
    )
    meta = {
        "distributed_info": info if isinstance(info, dict) else None,
        "device_name": ", ".join(sorted({str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name") is not None}))
        if isinstance(devices, list) else None,
        "dropped": dropped,
        "n_events": frame.height,
        "has_gpu": bool((frame["device"] == "gpu").any()),
    }
    return frame.select([c for c in SCHEMA if c in frame.columns]), meta


def _fast_parse(raw: bytes) -> dict | None:
    """The C parser's buffers, or None where it declines the input (msgspec then parses it)."""
    try:
        parsed = _kineto.parse(raw)
        # Strings with escapes come as their raw JSON text (escapes already checked), decoded here.
        parsed["strings"] = [msgspec.json.decode(s) if isinstance(s, bytes) else s for s in parsed["strings"]]
    except (_kineto.Fallback, UnicodeDecodeError, msgspec.DecodeError):
        return None
    return parsed


def _python_columns(raw: bytes, path: Path):
    """The msgspec parser: (frame, thread names, dropped counts, distributedInfo, deviceProperties).

    msgspec decodes only the fields the frame needs into slotted structs (no dict per event, the
    rest of `args` skipped unparsed); columns are then taken attribute by attribute and typed by
    polars, whose lenient casts handle the quirks (numeric-string pids, ROCm's string streams).
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()  # hundreds of thousands of small objects: the cyclic GC would rescan them for nothing
    try:
        doc = _decode(raw, path)
        del raw  # the raw events below still view it; it goes with them
        info, devices, events = doc.distributedInfo, doc.deviceProperties, doc.traceEvents
        del doc
        frames, thread_names, dropped = [], {}, dict.fromkeys(["flow", "string_pid", "no_ts", "other_ph"], 0)
        for first in range(0, len(events), BATCH_EVENTS):
            batch = _decode_batch(events[first:first + BATCH_EVENTS], first, path)
            f, names, counts = _columns(batch)
            del batch
            frames.append(f)
            thread_names.update(names)
            dropped = {k: dropped[k] + counts[k] for k in dropped}
        del events  # the file's bytes are freed here, before the frame is finished
    finally:
        if gc_was_enabled:
            gc.enable()
    frame = pl.concat(frames, rechunk=False) if frames else _columns([])[0]
    return frame, thread_names, dropped, info, devices


def _columns(events: list[_Event]) -> tuple[pl.DataFrame, dict[tuple[int, int], str], dict[str, int]]:
    """The parsed columns of the kept events, thread names from metadata, and what was dropped."""
    ph_all = [e.ph for e in events]
    n_flow = sum(ph_all.count(f) for f in _FLOW_PH)
    thread_names = {
        (_as_int(e.pid), _as_int(e.tid)): e.args.name
        for e in events
        if e.ph == "M" and e.name == "thread_name" and e.args is not None and isinstance(e.args.name, str)
    }
    kept = [e for e, ph in zip(events, ph_all) if isinstance(ph, str) and ph in _KEPT_PH]  # a list ph is not hashable
    other_ph = len(events) - len(kept) - n_flow - ph_all.count("M")
    del ph_all
    args = [e.args or _NO_ARGS for e in kept]

    def column(rows: list, field: str, dtype: pl.DataType) -> pl.Series:
        # map + attrgetter: the per-event loop stays in C; polars' lenient cast does the typing
        return pl.Series(list(map(attrgetter(field), rows)), dtype=pl.String if dtype == pl.Categorical() else dtype, strict=False)

    cols = {
        "pid": column(kept, "pid", pl.Int64()),
        "tid": column(kept, "tid", pl.Int64()),
        "ph": column(kept, "ph", pl.String()).replace_strict(_KEPT_PH),
        "cat": column(kept, "cat", pl.String()),
        "name": column(kept, "name", pl.String()),
        "ts_us": column(kept, "ts", pl.Float64()),
        "dur_us": column(kept, "dur", pl.Float64()).fill_null(0.0),
        "stream": column(args, "stream", pl.Int64()),  # ROCm "0x0" -> null
    }
    for f in _ARG_FIELDS:
        cols[f] = column(args, f, SCHEMA[f])
    # Process-group ranks: a list or its text. Per-argument element counts: collectives only.
    cols["group_ranks"] = pl.Series([_group_ranks_text(a.group_ranks) for a in args], dtype=pl.String)
    comm = [i for i, e in enumerate(kept) if isinstance(e.name, str) and e.name.startswith(_COMM_NAME_PREFIXES)]
    cols["arg_nelems"], cols["arg_types"] = _arg_shapes(len(kept), [(i, args[i].input_dims, args[i].input_type) for i in comm])
    frame, dropped = _finish(cols)
    return frame, thread_names, {"flow": n_flow, **dropped, "other_ph": other_ph}


def _group_ranks_text(r) -> str | None:
    return r if r is None or isinstance(r, str) else str(r)


def _arg_shapes(n: int, comm: list[tuple[int, bytes, bytes]]) -> tuple[pl.Series, pl.Series]:
    """arg_nelems and arg_types for n rows from (row, raw Input Dims, raw Input type) of collectives."""
    nelems, types = [None] * n, [None] * n
    for i, raw_dims, raw_types in comm:
        try:
            dims = msgspec.json.decode(raw_dims) if raw_dims else None
            typs = msgspec.json.decode(raw_types) if raw_types else None
        except (UnicodeDecodeError, msgspec.DecodeError):  # kept raw, so never checked: shapes unknown
            dims = typs = None
        if isinstance(dims, list) and isinstance(typs, list):
            nelems[i] = [_nelems(d, t) for d, t in zip(dims, typs)]
            types[i] = [t if isinstance(t, str) else None for t in typs]
    return pl.Series(nelems, dtype=pl.List(pl.Int64)), pl.Series(types, dtype=pl.List(pl.String))


def _finish(cols: dict[str, pl.Series]) -> tuple[pl.DataFrame, dict[str, int]]:
    """Both parsers' last step: drop rows the frame cannot place, count them, type the text."""
    frame = pl.DataFrame(cols)
    # One filter (one copy): dropped are events without a numeric pid/tid (Kineto's own "Spans"
    # pseudo-process), then, of the rest, those without a timestamp.
    has_ids = pl.col("pid").is_not_null() & pl.col("tid").is_not_null()
    no_ts = pl.col("ts_us").is_null()
    string_pid, n_no_ts = frame.select(a=(~has_ids).sum(), b=(has_ids & no_ts).sum()).row(0)
    frame = frame.filter(has_ids & ~no_ts)
    cast = {c: SCHEMA[c] for c in frame.columns if SCHEMA[c] == pl.Categorical()}
    return frame.with_columns([pl.col(c).cast(t) for c, t in cast.items()]), {"string_pid": string_pid, "no_ts": n_no_ts}


def _raw_slices(parsed: dict, raw: bytes) -> dict[str, tuple[list[int], list[bytes]]]:
    """The C parser's sparse raw values (row, byte range) -> (rows, JSON bytes) per field."""
    out = {}
    for name, bufs in parsed["raws"].items():
        rows, starts, ends = (np.frombuffer(b, np.int64).tolist() for b in bufs)
        out[name] = (rows, [raw[s:e] for s, e in zip(starts, ends)])
    return out


def _fast_columns(parsed: dict, slices: dict) -> tuple[pl.DataFrame, dict[tuple[int, int], str], dict[str, int]]:
    """The C parser's buffers -> the same frame, thread names and counts as `_columns`."""
    n = parsed["n"]
    strings = parsed["strings"]  # interned text: code k -> strings[k], 0 -> null
    table = pl.Series(strings, dtype=pl.String)

    def masked(name: str, values: np.ndarray, ok: bytes, dtype: pl.DataType) -> pl.Series:
        s = pl.Series(name, values)
        valid = np.frombuffer(ok, np.bool_)
        if not valid.all():
            s = pl.select(pl.when(pl.Series(valid)).then(s).alias(name)).to_series()
        return s.cast(dtype, strict=False)  # Int32 columns: outside int32 -> null, as polars' lenient cast

    cols: dict[str, pl.Series] = {}
    for name, (vals, ok) in parsed["ints"].items():
        cols[name] = masked(name, np.frombuffer(vals, np.int64), ok, SCHEMA[name])
    for name, (vals, ok) in parsed["floats"].items():
        cols[name] = masked(name, np.frombuffer(vals, np.float64), ok, pl.Float64)
    cols["dur_us"] = cols["dur_us"].fill_null(0.0)
    cols["ph"] = pl.Series("ph", np.frombuffer(parsed["ph"], np.uint8)).replace_strict({0: "X", 1: "i"}, return_dtype=pl.String)
    texts = {name: pl.Series(name, np.frombuffer(codes, np.int32)) for name, codes in parsed["strs"].items()}
    for name, codes in texts.items():
        cols[name] = table.gather(codes).alias(name)

    rows, values = slices["group_ranks"]
    ranks = [None] * n
    for i, v in zip(rows, values):
        ranks[i] = _group_ranks_text(msgspec.json.decode(v))
    cols["group_ranks"] = pl.Series(ranks, dtype=pl.String)
    # Shapes were kept for events whose name looks like communication; the exact test is here.
    names = cols["name"]
    dims, typs = (dict(zip(*slices[k])) for k in ("input_dims", "input_type"))
    comm = [(i, dims.get(i), typs.get(i)) for i in sorted(set(dims) | set(typs))
            if (nm := names[i]) is not None and nm.startswith(_COMM_NAME_PREFIXES)]
    cols["arg_nelems"], cols["arg_types"] = _arg_shapes(n, comm)
    frame, dropped = _finish({c: cols[c] for c in _COLUMN_ORDER})

    pid, pid_ok, tid, tid_ok, name_codes = parsed["threads"]
    keys = zip(np.frombuffer(pid, np.int64).tolist(), np.frombuffer(pid_ok, np.bool_).tolist(),
               np.frombuffer(tid, np.int64).tolist(), np.frombuffer(tid_ok, np.bool_).tolist())
    thread_names = {(p if po else None, t if to else None): strings[c]
                    for (p, po, t, to), c in zip(keys, np.frombuffer(name_codes, np.int32).tolist())}
    counts = parsed["counts"]
    return frame, thread_names, {"flow": counts["flow"], **dropped, "other_ph": counts["other"]}


# ---------------------------------------------------------------------------------------------
# Cache


def cache_dir() -> Path:
    """Where parsed traces are cached: $PTPROF_CACHE_DIR, else ~/.cache/ptprof (else a temp dir)."""
    env = os.environ.get(CACHE_ENV)
    base = Path(env) if env else Path.home() / ".cache" / "ptprof"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / "ptprof-cache"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _cache_key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{LOADER_VERSION}"
    return hashlib.sha1(ident.encode()).hexdigest()[:20]


def _load_one(path: Path, cache: Path) -> tuple[dict, str]:
    """(meta, parquet path) for one file, parsed into `cache` unless an entry is already there."""
    key = _cache_key(path)
    pq, mj = cache / f"{key}.parquet", cache / f"{key}.json"
    if pq.is_file() and mj.is_file():
        try:
            return json.loads(mj.read_text()), str(pq)
        except (OSError, ValueError):
            pass  # an entry left half-written by a killed process: parse again
    frame, meta = parse_trace_file(path)
    # Both files through a temp name and a rename: a reader never sees half of either.
    for final, write in ((pq, lambda t: frame.write_parquet(t, compression="lz4", statistics=False)),
                         (mj, lambda t: t.write_text(json.dumps(meta)))):
        tmp = final.with_suffix(f".{os.getpid()}.tmp")
        write(tmp)
        os.replace(tmp, final)
    return meta, str(pq)


def _load_one_safe(path: Path, cache: Path):
    # Runs in worker processes too: errors travel back as values so one bad file never kills a
    # load, and whatever a malformed trace trips in the parser still names the file.
    try:
        return _load_one(path, cache)
    except TraceError as e:
        return e
    except MemoryError:
        return TraceError(path, "out of memory while parsing")
    except Exception as e:  # noqa: BLE001
        return TraceError(path, f"could not parse ({type(e).__name__}: {e})")


# ---------------------------------------------------------------------------------------------
# Ranks and runs


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


def _read_manifest(run_dir: Path | None) -> dict | None:
    if run_dir is None or not (run_dir / RUN_MANIFEST).is_file():
        return None
    try:
        manifest = json.loads((run_dir / RUN_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise TraceError(run_dir / RUN_MANIFEST, f"unreadable run manifest: {e}") from None
    return manifest if isinstance(manifest, dict) else None


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
    results = _load_all([s.path for s in sources], cache_path, workers=workers, progress=progress)

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
                runs[src.run] = _read_manifest(src.run_dir)
            rank = _resolve_rank(src.path, meta, prefer_filename=rank_from_filename_first, default_rank=default_rank)
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
            "run": src.run, "rank": rank, "file": str(src.path), "backend": info.get("backend"),
            "world_size": _as_int(info.get("world_size")), "has_gpu": meta["has_gpu"],
            "device_name": meta.get("device_name"), "pg_config": json.dumps(info.get("pg_config")) if info.get("pg_config") else None,
            "n_events": meta["n_events"],
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


def _load_all(paths: list[Path], cache: Path, *, workers: int | None, progress: bool | None):
    """Parse every file, several at once in worker processes; results in input order.

    Workers are plain `python -m profiler._worker` processes (not multiprocessing), so callers
    need no `if __name__ == "__main__"` guard; they hand frames back through parquet files.
    """
    n_workers = max(1, min(len(paths), workers or os.cpu_count() or 1))
    pending = [p for p in paths if not _cached(p, cache)]
    show = progress if progress is not None else (len(paths) > 1 and sys.stderr.isatty())
    bar = _progress_bar(len(paths), show)
    results: dict[Path, object] = {}
    if len(pending) <= 1 or n_workers == 1:
        for p in paths:
            results[p] = _load_one_safe(p, cache)
            bar.update(1)
    else:
        for p in paths:
            if p not in pending:
                results[p] = _load_one_safe(p, cache)
                bar.update(1)
        for p, res in _run_workers(pending, cache, min(n_workers, len(pending))):
            results[p] = res
            bar.update(1)
    bar.close()
    return [results[p] for p in paths]


def _run_workers(paths: list[Path], out_dir: Path, n: int):
    """Yield (path, result) as `n` worker processes finish files (results as from _load_one_safe)."""
    import queue
    import subprocess
    import threading

    done: queue.Queue = queue.Queue()
    chunks = [paths[i::n] for i in range(n)]

    # polars' allocator (jemalloc) keeps freed pages for a while; a worker going through several
    # files would then hold the last file's garbage while parsing the next one.
    env = {**os.environ, "_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}

    def run(chunk: list[Path]) -> None:
        cmd = [sys.executable, "-m", "profiler._worker", str(out_dir), *map(str, chunk)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        reported = set()
        for line in proc.stdout:
            msg = json.loads(line)
            p = Path(msg["path"])
            reported.add(p)
            if "error" in msg:
                done.put((p, TraceError(p, msg["error"])))
            else:
                done.put((p, (msg["meta"], msg["parquet"])))
        err = proc.stderr.read()
        proc.wait()
        for p in chunk:
            if p not in reported:  # the worker died (killed for memory?) before finishing this file
                tail = err.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
                done.put((p, TraceError(p, f"parser process failed: {tail[0]}")))

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in chunks]
    for t in threads:
        t.start()
    for _ in paths:
        yield done.get()
    for t in threads:
        t.join()


def _cached(path: Path, cache: Path) -> bool:
    try:
        key = _cache_key(path)
    except OSError:
        return False
    return (cache / f"{key}.parquet").is_file() and (cache / f"{key}.json").is_file()


def _progress_bar(total: int, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="loading traces", unit="file", disable=not show, file=sys.stderr)

"""Parsing one Kineto trace file into the event frame (SCHEMA; docs/profiler.md).

Every format quirk is handled here and nowhere else: gzip or plain JSON, the JSON-array form of a
Chrome trace, Kineto's string pseudo-processes (`"Spans"`, `"Traces"`), `ph` kinds (complete
`X`, instant `i`/`I`, metadata `M` for thread names, flows `s`/`f`/`t` dropped because kernels
and runtime calls already carry `correlation`), missing `dur`/`args`, integer or fractional
microsecond timestamps. Parsing is done by the C module `_kineto` (JSON straight into column
buffers) where it is built, and by msgspec where it is not or where it declines a file; both give
the same frame (the rules that make them agree are in _kineto.c; its buffers become columns in
parse_fast.py). parse_batch.py parses several small files as one frame with these same steps. What
damaged or hostile input is refused or dropped, and the limits, are in damaged.py.
"""

from __future__ import annotations

import gc
import math
import os
import re
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl

from profiler.classify import classify, device_kind, unknown_categories
from profiler.damaged import (DAMAGED, MAX_DUR_US, MAX_TEXT_BYTES, MAX_TS_US, bad_step_names, check_text_sizes,
                              checked_distributed_info, json_hint, nothing_usable, read_bytes, what_json)
from profiler.errors import TraceError
from profiler.parse_stream import PURE_PARSER_ENV, _kineto, decode_strings, scan_file  # the C parser (None where it is not built)


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


def _decode(raw: bytes, path: Path) -> _Doc:
    """Chrome traces are either {"traceEvents": [...], ...} or a bare array of events."""
    try:
        doc = _DOC_DECODER.decode(raw)
    except msgspec.ValidationError as e:
        raise TraceError(path, f"not a Kineto/Chrome trace: {what_json(raw)} ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON{json_hint(raw, str(e))}: {e}") from None
    if isinstance(doc, list):
        return _Doc(traceEvents=doc)
    if doc.traceEvents is None:
        raise TraceError(path, f"not a Kineto/Chrome trace: {what_json(raw)}")
    return doc


def _decode_batch(events: list[msgspec.Raw], first: int, path: Path, *, bare: bool = False) -> list[_Event]:
    """Events first.. of the file; bare: the file is a top-level list of events (no traceEvents key to name)."""
    try:
        return _EVENTS_DECODER.decode(b"[" + b",".join(events) + b"]")
    except msgspec.ValidationError as e:
        why, _, at = str(e).partition(" - at `")
        m = re.match(r"\$\[(\d+)\](.*)", at.rstrip("`"))
        item, rest = first + int(m.group(1)), m.group(2)
        if bare:
            where = f"item {item} of the top-level list " + (f"is a malformed event (at `{rest}`)" if rest else "is not an event object")
            if not rest and why.endswith("got `array`"):  # [[ts, action, bytes, category], ...]
                why += ("; a list of lists, as torch's export_memory_timeline writes (.raw.gz)? ptprof reads Kineto traces: "
                        "prof.export_chrome_trace or tensorboard_trace_handler")
            raise TraceError(path, f"not a Kineto/Chrome trace: {where} ({why})") from None
        raise TraceError(path, f"not a Kineto/Chrome trace: malformed event at `$.traceEvents[{item}]{rest}` ({why})") from None
    except UnicodeDecodeError as e:
        raise TraceError(path, f"not UTF-8 text: {e.reason} at byte {e.start} of events {first}..{first + len(events) - 1}") from None


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


# torch < 1.10 (Kineto of 2021) writes a GPU event's tid as the text "stream 7" (and a CPU thread's
# as "5555", which the lenient cast reads): the stream number is the tid, as in later traces.
STREAM_TID_RE = r"^stream ([0-9]+)$"


def _tid_column(tids: list) -> pl.Series:
    """The tid column: integers, numeric strings, and "stream <N>" (torch 1.8/1.9) as N."""
    tid = pl.Series(tids, dtype=pl.Int64, strict=False)
    if not tid.null_count():
        return tid
    text = pl.Series([t if isinstance(t, str) else None for t in tids], dtype=pl.String)
    return pl.select(pl.coalesce(tid, text.str.extract(STREAM_TID_RE, 1).cast(pl.Int64, strict=False))).to_series()


_STREAM_TID = re.compile(STREAM_TID_RE)


def _as_tid(v) -> int | None:
    """A thread-name metadata tid, as `_as_int` but also "stream <N>" (the rows' own tids read so)."""
    m = _STREAM_TID.fullmatch(v) if isinstance(v, str) else None
    return _as_int(int(m.group(1))) if m else _as_int(v)


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
    if fast is None:
        fast = not os.environ.get(PURE_PARSER_ENV)
    fast = fast and _kineto is not None
    if fast:
        parsed, raw = scan_file(path), None  # read as it is inflated: the JSON is never whole in memory
    if not fast or parsed is None:  # anything odd: the whole file read, its problems worded below
        raw = read_bytes(path)
        parsed = _fast_parse(raw) if fast else None
    try:
        if parsed is not None:
            from profiler.parse_fast import _fast_columns, _raw_slices

            del raw
            slices = _raw_slices(parsed)
            frame, thread_names, dropped = _fast_columns(parsed, slices)
            info, devices = (_decode_header(parsed[k]) for k in ("distributedInfo", "deviceProperties"))
            del parsed
        else:
            frame, thread_names, dropped, info, devices = _python_columns(raw, path)
            del raw
    except TraceError as e:  # from the steps shared by both parsers, which do not know the file
        raise e if e.path else TraceError(path, e.problem) from None
    n_meta = dropped.pop("meta", 0)  # said only when nothing else is there; not a drop
    if frame.is_empty():
        raise TraceError(path, nothing_usable(dropped, n_meta))
    if any(len(t) > MAX_TEXT_BYTES for t in thread_names.values()):
        raise TraceError(path, f"a thread name over the {MAX_TEXT_BYTES:,}-byte limit on one text value (a damaged file?)")
    info = checked_distributed_info(info, path)
    threads = pl.DataFrame(
        {"pid": [k[0] for k in thread_names], "tid": [k[1] for k in thread_names], "thread": list(thread_names.values())},
        schema={"pid": pl.Int64, "tid": pl.Int64, "thread": pl.String},
    )
    frame = _labelled(frame, threads, ["pid", "tid"])
    meta = {
        "distributed_info": info,
        "device_name": device_name(devices),
        "dropped": dropped,
        "n_events": frame.height,
        "has_gpu": bool((frame["device"] == "gpu").any()),
        "device_kind": device_kind(frame),
        "unknown_categories": unknown_categories(frame),
        # The clock's span, for telling jobs apart (discover.split_jobs) without reading the frame again.
        **dict(zip(("first_ts_us", "last_end_us"), frame.select(pl.col("ts_us").min(), pl.col("end_us").max()).row(0))),
    }
    return frame.select([c for c in SCHEMA if c in frame.columns]), meta


def device_name(devices) -> str | None:
    """deviceProperties' names, sorted and joined (None where the trace has no such list)."""
    if not isinstance(devices, list):
        return None
    return ", ".join(sorted({str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name") is not None}))


def _labelled(frame: pl.DataFrame, threads: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The kept rows with thread names (`threads`: keys + thread), end_us, device, kind and the
    GPU stream: each row's from its own values (parse_batch.py runs it over several files' rows)."""
    # Thread names from metadata, looked up on the key columns only (a join of the whole
    # frame would copy every column).
    thread = frame.select(keys).join(threads, on=keys, how="left", maintain_order="left")["thread"]
    frame = frame.with_columns(thread.cast(pl.Categorical), end_us=pl.col("ts_us") + pl.col("dur_us"))
    frame = classify(frame)
    # GPU activity's stream is its tid when args carry none (ROCm, annotations).
    return frame.with_columns(
        stream=pl.when(pl.col("device") == "gpu").then(pl.coalesce("stream", "tid")).otherwise(pl.col("stream"))
    )


def _decode_header(raw: bytes | None):
    return None if raw is None else msgspec.json.decode(raw)


def _fast_parse(raw: bytes) -> dict | None:
    """The C parser's buffers, or None where it declines the input (msgspec then parses it)."""
    try:
        return decode_strings(_kineto.parse(raw))
    except (_kineto.Fallback, UnicodeDecodeError, msgspec.DecodeError):
        return None


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
        bare = raw.lstrip()[:1] == b"["  # the JSON-array form: errors name items, not $.traceEvents
        del raw  # the raw events below still view it; it goes with them
        info, devices, events = doc.distributedInfo, doc.deviceProperties, doc.traceEvents
        del doc
        frames, thread_names, dropped = [], {}, dict.fromkeys(["flow", "string_pid", *DAMAGED, "other_ph", "meta"], 0)
        for first in range(0, len(events), BATCH_EVENTS):
            batch = _decode_batch(events[first:first + BATCH_EVENTS], first, path, bare=bare)
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
        (_as_int(e.pid), _as_tid(e.tid)): e.args.name
        for e in events
        if e.ph == "M" and e.name == "thread_name" and e.args is not None and isinstance(e.args.name, str)
    }
    kept = [e for e, ph in zip(events, ph_all) if isinstance(ph, str) and ph in _KEPT_PH]  # a list ph is not hashable
    ph_all_meta = ph_all.count("M")
    other_ph = len(events) - len(kept) - n_flow - ph_all_meta
    del ph_all
    args = [e.args or _NO_ARGS for e in kept]

    def column(rows: list, field: str, dtype: pl.DataType) -> pl.Series:
        # map + attrgetter: the per-event loop stays in C; polars' lenient cast does the typing
        return pl.Series(list(map(attrgetter(field), rows)), dtype=pl.String if dtype == pl.Categorical() else dtype, strict=False)

    cols = {
        "pid": column(kept, "pid", pl.Int64()),
        "tid": _tid_column(list(map(attrgetter("tid"), kept))),
        "ph": column(kept, "ph", pl.String()).replace_strict(_KEPT_PH),
        "cat": column(kept, "cat", pl.String()),
        "name": column(kept, "name", pl.String()),
        "ts_us": _times(kept, "ts"),
        "dur_us": _times(kept, "dur"),
        "stream": column(args, "stream", pl.Int64()),  # ROCm "0x0" -> null
    }
    for f in _ARG_FIELDS:
        cols[f] = column(args, f, SCHEMA[f])
    # Process-group ranks: a list or its text. Per-argument element counts: collectives only.
    cols["group_ranks"] = pl.Series([_group_ranks_text(a.group_ranks) for a in args], dtype=pl.String)
    comm = [i for i, e in enumerate(kept) if isinstance(e.name, str) and e.name.startswith(_COMM_NAME_PREFIXES)]
    cols["arg_nelems"], cols["arg_types"] = _arg_shapes(len(kept), [(i, args[i].input_dims, args[i].input_type) for i in comm])
    frame, dropped = _finish(cols)
    return frame, thread_names, {"flow": n_flow, **dropped, "other_ph": other_ph, "meta": ph_all_meta}


def _times(events: list[_Event], field: str) -> pl.Series:
    """A time column: numbers (and numeric strings) as Float64; a boolean is no time (null), not 1 or 0."""
    values = list(map(attrgetter(field), events))
    if bool in set(map(type, values)):  # rare: only then a Python pass over the values
        values = [None if type(v) is bool else v for v in values]
    return pl.Series(values, dtype=pl.Float64, strict=False)


def _group_ranks_text(r) -> str | None:
    return r if r is None or isinstance(r, str) else str(r)


def _arg_shapes(n: int, comm: list[tuple[int, bytes, bytes]]) -> tuple[pl.Series, pl.Series]:
    """arg_nelems and arg_types for n rows from (row, raw Input Dims, raw Input type) of collectives."""
    rows, nelems, types = [], [], []
    for i, raw_dims, raw_types in comm:
        try:
            dims = msgspec.json.decode(raw_dims) if raw_dims else None
            typs = msgspec.json.decode(raw_types) if raw_types else None
        except (UnicodeDecodeError, msgspec.DecodeError):  # kept raw, so never checked: shapes unknown
            dims = typs = None
        if isinstance(dims, list) and isinstance(typs, list):
            rows.append(i)
            nelems.append([_nelems(d, t) for d, t in zip(dims, typs)])
            types.append([t if isinstance(t, str) else None for t in typs])
    return _sparse(n, rows, nelems, pl.List(pl.Int64)), _sparse(n, rows, types, pl.List(pl.String))


def _sparse(n: int, rows: list[int], values: list, dtype: pl.DataType) -> pl.Series:
    """n rows of null but values[k] at rows[k] (the last one where a row repeats).

    Built by a gather from the few values, not from a list of n Python objects: most columns
    built so (shapes, process-group ranks) hold a value on a few hundred rows of 300,000.
    """
    if not rows:
        return pl.repeat(None, n, dtype=dtype, eager=True)
    where = np.zeros(n, np.int64)
    where[rows] = np.arange(1, len(rows) + 1)
    return pl.Series([None, *values], dtype=dtype).gather(where)


def _finish(cols: dict[str, pl.Series]) -> tuple[pl.DataFrame, dict[str, int]]:
    """Both parsers' last step: drop rows the frame cannot place or whose values are impossible,
    count them by why (DAMAGED), type the text. Raises TraceError (no path) for text over MAX_TEXT_BYTES.

    The rules, in the order an event is counted: a numeric pid and tid (else Kineto's own "Spans"
    pseudo-process: string_pid); a timestamp (no_ts) that is finite and in [0, 2**53] µs (bad_ts);
    for complete (X) events a dur (no_dur) that is finite, ≥ 0 and at most a week (bad_dur); a
    ProfilerStep#N whose N fits the step column (bad_step). Instants take dur 0.
    """
    frame = pl.DataFrame(cols)
    check_text_sizes(frame)
    passed = _passed(frame)
    n_passed = frame.select([p.sum().alias(str(i)) for i, p in enumerate(passed)]).row(0)
    return _kept(frame, passed[-1], n_passed[-1]), dict(zip(DROPPED, _dropped_counts(frame.height, n_passed)))


DROPPED = ["string_pid", *DAMAGED]  # `_finish`'s counts, in the order an event is counted


def _passed(frame: pl.DataFrame) -> list[pl.Expr]:
    """`_finish`'s rules, cumulative: passed[i] holds where the row passes rules 0..i (row by row,
    but for bad_step_names, which is decided per name)."""
    ts, dur, instant = pl.col("ts_us"), pl.col("dur_us"), pl.col("ph") == "i"
    ok = [
        pl.col("pid").is_not_null() & pl.col("tid").is_not_null(),
        ts.is_not_null(),
        (ts.is_finite() & (ts >= 0) & (ts <= MAX_TS_US)).fill_null(False),
        instant | dur.is_not_null(),
        instant | (dur.is_finite() & (dur >= 0) & (dur <= MAX_DUR_US)).fill_null(False),
        ~pl.col("name").is_in(bad_step_names(frame)).fill_null(False),  # a nameless event is no step: kept
    ]
    passed = [ok[0]]
    for rule in ok[1:]:
        passed.append(passed[-1] & rule)
    return passed


def _dropped_counts(height: int, n_passed) -> list[int]:
    """Rows dropped by each rule of `_passed`, from the rows that passed each cumulative one."""
    return [height - n_passed[0]] + [a - b for a, b in zip(n_passed, n_passed[1:])]


def _kept(frame: pl.DataFrame, passed: pl.Expr, n_passed: int) -> pl.DataFrame:
    """The rows that pass (n_passed of them), instants with dur 0, text columns categorical."""
    instant = pl.col("ph") == "i"
    if n_passed < frame.height:  # most files drop nothing: no copy of every column then
        frame = frame.filter(passed)
    frame = frame.with_columns(dur_us=pl.when(instant).then(0.0).otherwise(pl.col("dur_us")))
    cast = {c: SCHEMA[c] for c in frame.columns if c in SCHEMA and SCHEMA[c] == pl.Categorical()}
    return frame.with_columns([pl.col(c).cast(t) for c, t in cast.items()])

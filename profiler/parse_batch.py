"""Several small trace files parsed as one frame: `parse_trace_file` of each, its fixed cost paid once.

    for path, got in zip(paths, parse_trace_files(paths)): frame, meta = got or parse_trace_file(path)

A 1 MB rank is parsed by the C scan in ~2 ms, but then costs ~20 ms of polars calls whatever its
rows (building 30 columns, the drop rules, the thread-name join, classify, the header's counts:
about 90 small queries at ~0.2 ms each). Here each file is scanned on its own (`parse_stream.scan_file`),
then the batch's buffers are joined into one frame with a `file` column (each file's interned
strings shifted into one table), and every step that decides a row from its own values runs once
over all of them: the single-file parser's own functions (`parse_fast._fast_cols`, `_passed`, `_kept`,
`_labelled`), thread names joined on (file, pid, tid). What is per file (the dropped counts, the
header's event count, GPU presence, device kind, clock span) comes from group-bys on `file`, and
the frame is cut back into each file's rows (zero-copy slices: the rows stay in file order).
Each file's frame and header are equal to `parse_trace_file`'s alone (tests/profiler/test_parse_batch.py).

Anything odd is left to `parse_trace_file` alone (None in the answer), so its wording of the
problem and the file's name stay exactly as they are: a file the C parser declines (msgspec parses
it), one that does not read, one with no usable event, text near the size limit, a
distributedInfo it refuses, a header it cannot decode; and every file where the joined work
raises at all. A bad file therefore never spoils its batch's other files.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import polars as pl
from polars.exceptions import PanicException

from profiler.classify import unknown_categories
from profiler.damaged import MAX_TEXT_BYTES, check_text_sizes, checked_distributed_info
from profiler.parse import (DROPPED, PURE_PARSER_ENV, SCHEMA, _decode_header, _dropped_counts,
                            _group_ranks_text, _kept, _kineto, _labelled, _passed, device_name)
from profiler.parse_fast import _fast_cols, _raw_slices
from profiler.parse_stream import scan_file

# A text value this long (in characters: up to 4 bytes each in UTF-8) may be over MAX_TEXT_BYTES:
# such a file is parsed alone, which checks it exactly and words the refusal.
_SAFE_CHARS = MAX_TEXT_BYTES // 4


@dataclasses.dataclass
class _Scan:
    """One file's C scan and the header values taken from it in Python."""

    parsed: dict
    slices: dict
    info: dict | None
    device_name: str | None


def parse_trace_files(paths: list[Path]) -> list[tuple[pl.DataFrame, dict] | None]:
    """`parse_trace_file(path)` of each path, for the files that parse plainly; None for a file
    to parse alone (see the module docstring). Never raises."""
    out: list[tuple[pl.DataFrame, dict] | None] = [None] * len(paths)
    if len(paths) < 2 or _kineto is None or os.environ.get(PURE_PARSER_ENV):
        return out
    scans: dict[int, _Scan] = {}
    for i, path in enumerate(paths):
        try:
            scan = _scan(Path(path))
        except (Exception, PanicException):  # noqa: BLE001  (alone, parse_trace_file words it)
            scan = None
        if scan is not None:
            scans[i] = scan
    if len(scans) < 2:  # nothing to share
        return out
    try:
        got = _together(list(scans.values()))
    except (Exception, PanicException):  # noqa: BLE001  (each file alone, its problem named)
        return out
    for i, g in zip(scans, got):
        out[i] = g
    return out


def _scan(path: Path) -> _Scan | None:
    parsed = scan_file(path)
    if parsed is None or parsed["n"] == 0:  # read whole, msgspec's parse, or no events: alone
        return None
    slices = _raw_slices(parsed)
    strings = parsed["strings"]
    ranks = [_group_ranks_text(_decode_header(v)) for v in slices["group_ranks"][1]]
    if strings[:1] != [None] or any(len(s) > _SAFE_CHARS for s in strings[1:]) or any(
            r is not None and len(r) > _SAFE_CHARS for r in ranks):
        return None
    info = checked_distributed_info(_decode_header(parsed["distributedInfo"]), path)  # raises: alone
    return _Scan(parsed, slices, info, device_name(_decode_header(parsed["deviceProperties"])))


def _together(scans: list[_Scan]) -> list[tuple[pl.DataFrame, dict] | None]:
    """The scanned files' frames and headers, built as one frame; None for a file with no usable event."""
    cols, thread_names = _fast_cols([(s.parsed, s.slices) for s in scans])
    for s in scans:  # the C parser's buffers are columns now: only the counts are still read
        s.parsed, s.slices = {"n": s.parsed["n"], "counts": s.parsed["counts"]}, {}
    frame = pl.DataFrame(cols)
    del cols  # the frame's now: freed as the steps below replace its columns
    check_text_sizes(frame)  # never raises here (_scan's limit): were it to, every file goes alone
    passed = _passed(frame)
    sums = frame.group_by("file").agg([p.sum().alias(str(i)) for i, p in enumerate(passed)])
    n_passed = {row[0]: row[1:] for row in sums.iter_rows()}
    frame = _kept(frame, passed[-1], sum(row[-1] for row in n_passed.values()))
    threads = pl.DataFrame(
        {"file": [f for f, names in enumerate(thread_names) for _ in names],
         "pid": [k[0] for names in thread_names for k in names], "tid": [k[1] for names in thread_names for k in names],
         "thread": [t for names in thread_names for t in names.values()]},
        schema={"file": pl.Int32, "pid": pl.Int64, "tid": pl.Int64, "thread": pl.String},
    )
    frame = _labelled(frame, threads, ["file", "pid", "tid"])
    per_file = _per_file(frame)
    frame = frame.select([c for c in SCHEMA if c in frame.columns])
    out: list[tuple[pl.DataFrame, dict] | None] = []
    at = 0
    for f, scan in enumerate(scans):
        stats = per_file.get(f)
        if stats is None:  # no usable event: parse_trace_file refuses it, in its words
            out.append(None)
            continue
        mine = frame.slice(at, stats["n_events"])
        at += stats["n_events"]
        counts = scan.parsed["counts"]
        dropped = {"flow": counts["flow"], **dict(zip(DROPPED, _dropped_counts(scan.parsed["n"], n_passed[f]))),
                   "other_ph": counts["other"]}
        meta = {
            "distributed_info": scan.info,
            "device_name": scan.device_name,
            "dropped": dropped,
            "n_events": stats["n_events"],
            "has_gpu": stats["has_gpu"],
            "device_kind": stats["device_kind"],
            # Rare (a category no rule knows): counted exactly as alone, on the file's rows.
            "unknown_categories": unknown_categories(mine) if stats["unknown"] else {},
            "first_ts_us": stats["first_ts_us"],
            "last_end_us": stats["last_end_us"],
        }
        out.append((mine, meta))
    if at != frame.height:
        raise AssertionError("a file's rows out of place")  # never: every step keeps the rows' order
    return out


def _per_file(frame: pl.DataFrame) -> dict[int, dict]:
    """Each file's event count, GPU presence, device kind (classify.device_kind), whether it has a
    category no rule knows (classify.unknown_categories), and clock span; files with no row absent."""
    from profiler.classify import HIP_RUNTIME_PREFIX, MTIA_CAT_PREFIX, kind_of_device, known_category

    gpu = pl.col("device") == "gpu"
    stats = frame.group_by("file").agg(
        n_events=pl.len(), has_gpu=gpu.any(), first_ts_us=pl.col("ts_us").min(), last_end_us=pl.col("end_us").max())
    # device_kind and unknown_categories decide on distinct text, not on every row.
    cats = frame.select("file", "cat", gpu.alias("gpu")).unique().with_columns(low=pl.col("cat").cast(pl.String).str.to_lowercase())
    mtia = set(cats.filter(pl.col("gpu") & pl.col("low").str.starts_with(MTIA_CAT_PREFIX))["file"].to_list())
    unknown = set(cats.filter(pl.col("cat").is_not_null() & ~known_category(pl.col("low")))["file"].to_list())
    runtime = frame.filter(pl.col("kind") == "runtime").select("file", "name").unique()
    hip = set(runtime.filter(pl.col("name").cast(pl.String).str.starts_with(HIP_RUNTIME_PREFIX))["file"].to_list())
    out = {}
    for f, n, has_gpu, first, last in stats.select("file", "n_events", "has_gpu", "first_ts_us", "last_end_us").iter_rows():
        kind = kind_of_device(bool(has_gpu), f in mtia, f in hip)
        out[f] = {"n_events": n, "has_gpu": bool(has_gpu), "device_kind": kind, "unknown": f in unknown,
                  "first_ts_us": first, "last_end_us": last}
    return out

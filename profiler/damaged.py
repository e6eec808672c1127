"""Damaged and hostile input, refused or counted before it reaches a number (docs/profiler.md, "Odd input").

What parse.py must not trust in a trace file: its bytes (not a regular file, a gzip bomb, a cut or
corrupt gzip), its JSON (what it is instead of a trace, NaN literals), its values (the limits,
the impossible-value rules counted in DAMAGED, step numbers past 64 bits, text over MAX_TEXT_BYTES)
and its distributedInfo (ranks, world size, backend and process groups). Each function either
returns what is safe to use or raises TraceError naming the file and the problem.
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from pathlib import Path

import msgspec
import polars as pl

from profiler.errors import TraceError
from profiler.gzip_limits import INFLATE_FLOOR_BYTES, MAX_INFLATE_RATIO, _isal_zlib
from profiler.steps import PROFILER_STEP_RE, names_matching

# Limits on damaged or hostile input (docs/profiler.md, "Odd input"). Real Kineto JSON gzips 10-30x.
# MAX_INFLATE_RATIO and INFLATE_FLOOR_BYTES (the gzip bomb limit): gzip_limits.py.
MAX_TEXT_BYTES = 1 << 20  # one name, category or other text value: 1 MiB (kernel names run to ~10 KB)
MAX_TS_US = 2.0**53  # past this float64 no longer holds whole µs; Kineto's clock is epoch µs (~1.7e15 in 2023), 2**53 µs is ~year 2255
MAX_DUR_US = 7 * 24 * 3600 * 1e6  # one week: no profiled span lasts longer
MAX_RANK = 2**31 - 1  # ranks are Int32 in the frame
# Events dropped because a value is impossible (counted per file, reported as a warning), by why.
DAMAGED = {
    "no_ts": "without a timestamp (ts missing, null, boolean or not a number)",
    "bad_ts": "with a timestamp that is NaN, infinite, negative or past 2**53 µs",
    "no_dur": "complete (X) events without dur (missing, null, boolean or not a number)",
    "bad_dur": "with a dur that is negative, NaN, infinite or over a week",
    "bad_step": "ProfilerStep#N spans whose N does not fit 64 bits",
}

_ONLY_WHITESPACE = re.compile(rb"[ \t\n\r]*")  # JSON's whitespace


def read_bytes(path: Path) -> bytes:
    """The file's bytes (gunzipped where gzip); TraceError for what is not a readable, non-empty regular file."""
    try:
        # Non-blocking open: a FIFO named like a trace must not wait for a writer. Only a regular
        # file is read (a link to /dev/zero would never end).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before open(fd), which raises on a directory
        os.close(fd)
        raise TraceError(path, "not a regular file (a directory, device, FIFO or socket); give a trace file")
    with open(fd, "rb") as f:
        try:
            raw = f.read()
        except OSError as e:
            raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if not raw:
        raise TraceError(path, "empty file")
    inside = ""
    if raw[:2] == b"\x1f\x8b":
        raw, inside = gunzip(raw, path), " inside the gzip"
        if not raw:
            raise TraceError(path, "empty file (inside the gzip)")
    if _ONLY_WHITESPACE.fullmatch(raw):  # stops at the first other byte; else msgspec says "truncated"
        raise TraceError(path, f"holds no JSON, only whitespace ({len(raw):,} bytes{inside})")
    return raw


def gunzip(raw: bytes, path: Path) -> bytes:
    """The gzip's content (every member), refused past MAX_INFLATE_RATIO x its size: a 1 MB bomb
    holding 1 GiB is stopped after inflating the limit, not after filling memory."""
    limit = max(INFLATE_FLOOR_BYTES, MAX_INFLATE_RATIO * len(raw))
    fast = _gunzip_isal(raw, limit) if _isal_zlib is not None else None
    return fast if fast is not None else _gunzip_zlib(raw, path, limit)


def _gunzip_isal(raw: bytes, limit: int) -> bytes | None:
    """The content of a whole, well-formed gzip under the limit, inflated by ISA-L (about 1.7x
    zlib's speed; both check every member's CRC and length); None for anything else (a bomb, a cut
    or corrupt gzip, junk after it), which zlib then reads again to word the refusal exactly as before."""
    parts, size, data = [], 0, raw
    try:
        while data:
            # Reserved header flag bits (0xE0): zlib refuses such a member, ISA-L ignores the bits.
            if data[:2] != b"\x1f\x8b" or len(data) < 4 or data[3] & 0xE0:
                return None
            d = _isal_zlib.decompressobj(wbits=31)
            part = d.decompress(data, limit - size + 1)
            size += len(part)
            if size > limit or not d.eof:  # ISA-L stops without an error on some bad headers: not eof
                return None
            parts.append(part)
            data = d.unused_data.lstrip(b"\0")
    except Exception:  # noqa: BLE001 (isal's own error type; zlib words it)
        return None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _gunzip_zlib(raw: bytes, path: Path, limit: int) -> bytes:
    parts, size, data = [], 0, raw
    try:
        while data:
            if data[:2] != b"\x1f\x8b":
                raise TraceError(path, "truncated or corrupt gzip (bytes after the gzip data that are not gzip)")
            d = zlib.decompressobj(wbits=31)
            part = d.decompress(data, limit - size + 1)  # one buffer, grown as needed, never past the limit
            size += len(part)
            if size > limit:
                raise TraceError(path, f"gzip bomb: it inflates past {limit:,} bytes, over {MAX_INFLATE_RATIO}x its "
                                       f"{len(raw):,} bytes (the limit for a gzipped trace; gunzip it to read it anyway)")
            if not d.eof:
                raise TraceError(path, "truncated or corrupt gzip (Compressed file ended before the end-of-stream marker was reached)")
            parts.append(part)
            data = d.unused_data.lstrip(b"\0")  # zero padding after a member is read as gzip -dc and CPython do
    except zlib.error as e:
        raise TraceError(path, f"truncated or corrupt gzip ({e})") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)

def json_hint(raw: bytes, error: str) -> str:
    """A hint for a JSON syntax error: truncation, or a NaN/Infinity literal at the failing byte."""
    if raw.startswith(b"\x1f\x8b"):  # what one gunzip left is gzip again
        return " (the file is gzip'ed twice: gunzip it once, and name what that leaves *.json.gz)"
    if raw.startswith(b"\xef\xbb\xbf"):  # JSON (RFC 8259) has no byte-order mark
        return " (it starts with a UTF-8 byte-order mark, which JSON does not allow: save it without one)"
    if "truncated" in error:
        return " (truncated?)"
    at = re.search(r"\(byte (\d+)\)", error)
    token = re.match(rb"-?[A-Za-z]+", raw[int(at.group(1)):int(at.group(1)) + 12]) if at else None
    if token and token.group().lstrip(b"-").lower().startswith((b"nan", b"inf")):  # as Python's json.dumps writes
        return f" ({token.group().decode()} is not a JSON number)"
    return ""

def what_json(raw: bytes) -> str:
    """What a JSON document that is no trace is instead, for the refusal."""
    # Only on the error path.
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:  # the type check stopped before a later syntax error
        return f"not valid JSON either ({e})"
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return "its traceEvents are not all event objects"
    if isinstance(doc, dict) and isinstance(doc.get("schema"), str) and doc["schema"].startswith("ptprof."):
        return f"ptprof's own output ({doc['schema'][:40]}: a report, projection, plan or saved cluster), not a trace"
    if isinstance(doc, dict):
        return "a JSON dict without a traceEvents list (keys: " + ", ".join(list(doc)[:6]) + ")"
    if isinstance(doc, list):
        return "a JSON list whose items are not event objects"
    return f"a JSON {type(doc).__name__}"

def nothing_usable(dropped: dict[str, int], n_meta: int = 0) -> str:
    """The refusal of a file with no usable event, with the counts of what was dropped and why."""
    why = [f"{n:,} {DAMAGED[k]}" for k, n in dropped.items() if n and k in DAMAGED]
    why += [f"{dropped[k]:,} {what}" for k, what in (("string_pid", "without a numeric pid/tid"), ("flow", "flow events"),
                                                     ("other_ph", "of other ph kinds")) if dropped.get(k)]
    return ("no usable events: none is a complete (X) or instant (i) event with a numeric pid, tid and timestamp"
            + (f" (dropped: {', '.join(why)})" if why
               else f" (the trace has only metadata: {n_meta:,} ph M events)" if n_meta
               else " (the trace has no events at all)"))


def whole(v) -> int | None:
    """A whole number from JSON: an int, an integral float or a string of ASCII digits; else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():  # not "²" (int() fails) or "٣" (int() reads 3)
        return int(v)
    return None


def checked_distributed_info(info, path: Path) -> dict | None:
    """distributedInfo with `rank` and `world_size` as ints; TraceError where either is impossible
    (negative, fractional, not a number, past Int32, a rank not below world_size, world_size 0)."""
    if not isinstance(info, dict):
        return None
    info = dict(info)
    for key, low, high in (("rank", 0, MAX_RANK), ("world_size", 1, MAX_RANK + 1)):
        v = info.get(key)
        if v is None:
            continue
        n = whole(v)
        if n is None or not low <= n <= high:
            shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "..."
            raise TraceError(path, f"distributedInfo.{key} is {shown}: not a {key.replace('_', ' ')} "
                                   f"(a whole number from {low} to {high:,}); the file is damaged")
        info[key] = n
    if info.get("rank") is not None and info.get("world_size") is not None and info["rank"] >= info["world_size"]:
        raise TraceError(path, f"distributedInfo.rank {info['rank']} is not below its world_size {info['world_size']}; "
                               "the file is damaged")
    if info.get("backend") is not None and not isinstance(info["backend"], str):
        raise TraceError(path, f"distributedInfo.backend is a JSON {type(info['backend']).__name__}, not a string; the file is damaged")
    if info.get("pg_config") is not None and not is_pg_config(info["pg_config"]):
        raise TraceError(path, "distributedInfo.pg_config is not a list of process groups ({pg_size, ...}); "
                               "the file is damaged")
    if info.get("pg_config") is not None:
        info["pg_config"] = [{**g, "pg_size": whole(g.get("pg_size"))} for g in info["pg_config"]]
    return info


def is_pg_config(groups) -> bool:
    """Whether distributedInfo.pg_config is a list of process groups whose pg_size is a whole number."""
    # What collectives.py reads: a list of objects whose pg_size is a whole number (or absent).
    return isinstance(groups, list) and all(
        isinstance(g, dict) and (g.get("pg_size") is None or 1 <= (whole(g["pg_size"]) or 0) <= MAX_RANK + 1) for g in groups
    )

def bad_step_names(events: pl.DataFrame) -> list[str]:
    """`ProfilerStep#N` names whose N does not fit the Int64 step column (steps.profiler_steps)."""
    steps = pl.Series(names_matching(events, PROFILER_STEP_RE), dtype=pl.String)
    return steps.filter(steps.str.extract(PROFILER_STEP_RE, 1).cast(pl.Int64, strict=False).is_null()).to_list()


def check_text_sizes(frame: pl.DataFrame) -> None:
    """TraceError (no path) where a text column holds a value over MAX_TEXT_BYTES."""
    longest = frame.select(pl.col(pl.String).str.len_bytes().max()).row(0, named=True)
    for column, size in longest.items():
        if size is not None and size > MAX_TEXT_BYTES:
            raise TraceError(None, f"an event's {column} is {size:,} bytes long, over the {MAX_TEXT_BYTES:,}-byte limit "
                                   "on one text value (a damaged file?)")

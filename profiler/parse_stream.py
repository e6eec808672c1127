"""A trace file read by the C parser as it is inflated: the file's JSON is never whole in memory.

    parsed = scan_file(path)  # _kineto.parse's dict, or None: read the file whole (parse.py)

A 100 MB trace used to be inflated into one 100 MB bytes object, then scanned into column
buffers (~60 MB) beside it: the bytes were the biggest part of a worker's peak memory. Here the
gzip is inflated 512 KB at a time into `_kineto.Stream`, which reads the whole events each chunk
holds and keeps only a cut one for the next; the interned strings and the few raw JSON values the
frame needs are copied out as they are read.

Only the plain cases are streamed: gzip members one after the other with nothing after them, or
plain JSON, from a regular file. Everything else gives None and parse.py's whole-file path runs as
before, which words every problem (a cut or corrupt gzip, a bomb, an empty file, zero padding, a FIFO) and
parses what the C parser declines with msgspec. So a file gives the same frame either way
(tests/profiler/test_parse_stream.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import zlib
from pathlib import Path

import msgspec

from profiler.gzip_limits import INFLATE_FLOOR_BYTES, MAX_INFLATE_RATIO, _isal_zlib

try:  # the C parser, built by `pip install` where a C compiler exists (pyproject.toml)
    from profiler import _kineto
except ImportError:
    _kineto = None

PURE_PARSER_ENV = "PTPROF_PURE_PARSER"  # set (to anything) to parse with msgspec only (parse.py)

_ISAL_ERRORS = (_isal_zlib.error,) if _isal_zlib is not None else ()  # not a zlib.error

# JSON handed to the parser per call: small beside 60 MB of columns, ~200 calls per 100 MB; under
# glibc's mmap threshold (pool._WORKER_ENV), so each chunk reuses the heap's pages the last one freed.
CHUNK_BYTES = 1 << 19
MAX_HINT_RATIO = 32
READ_BYTES = 1 << 18  # gzip read per inflate call: the inflater's unconsumed input is copied per call, so keep it short


def scan_file(path: str | Path, *, chunk_bytes: int | None = None, prescanned: bool = True) -> dict | None:
    """The C parser's dict for the file (as `parse._fast_parse` gives it), or None where the
    whole-file path must run (see the module docstring). Never raises for the file's content.
    prescanned: take prescan.py's scan of the file where its child made one."""
    if _kineto is None:
        return None
    if prescanned:
        from profiler import prescan

        found, parsed = prescan.take(path)
        if found:
            return parsed
    return _scan(path, chunk_bytes or CHUNK_BYTES, None)[0]


def scan_file_hashed(path: str | Path) -> tuple[dict | None, str | None]:
    """scan_file(path, prescanned=False), and the SHA-256 of the bytes that scan read (None
    unless it read the whole file, in order): what prescan.py's child hands its parent."""
    if _kineto is None:
        return None, None
    return _scan(path, CHUNK_BYTES, hashlib.sha256())


def _scan(path, chunk_bytes: int, hasher) -> tuple[dict | None, str | None]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not wait for a writer
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:  # before open(fd): it raises on a directory
            os.close(fd)
            return None, None
        size = st.st_size
        with open(fd, "rb") as raw:
            f = raw if hasher is None else _Hashed(raw, hasher)
            head = f.read(4)
            f.seek(0)
            if head[:2] == b"\x1f\x8b":
                stream = _gunzipped(f, size, head, chunk_bytes)
            else:
                stream = _plain(f, size, chunk_bytes)
            if stream is None:
                return None, None
            parsed = decode_strings(stream.finish())
            whole = hasher is not None and f.hashed == size and not raw.read(1)
    except (_kineto.Fallback, UnicodeDecodeError, msgspec.DecodeError, OSError, MemoryError, zlib.error, *_ISAL_ERRORS):
        return None, None  # MemoryError: the whole-file path words it as it always has
    return parsed, hasher.hexdigest() if whole else None


class _Hashed:
    """A file whose bytes go through `hasher` as they are first read, in order from the start
    (read again after a seek back, or read ahead of that order after a seek forward: not twice,
    and the ones skipped not at all; `hashed` says how far the hash goes)."""

    def __init__(self, f, hasher):
        self.f, self.hasher, self.hashed = f, hasher, 0

    def read(self, n: int = -1) -> bytes:
        at = self.f.tell()
        data = self.f.read(n)
        if at <= self.hashed < at + len(data):
            self.hasher.update(memoryview(data)[self.hashed - at:])
            self.hashed = at + len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.f.seek(offset, whence)


def _plain(f, size: int, chunk_bytes: int):
    stream = _kineto.Stream(size)
    while chunk := f.read(chunk_bytes):
        stream.feed(chunk)
    return stream


def size_hint(isize: int, size: int) -> int:
    """The JSON size the parser's buffers are first sized for: the gzip trailer's ISIZE, believed up
    to MAX_HINT_RATIO x the file (traces inflate ~10x). A cut or damaged trailer is any 4 bytes: at
    0xFFFFFFFF the buffers would reserve ~6 GB of address space, which a memory limit (the viewer's
    upload child runs under one) refuses before the gzip's own error is found."""
    return min(isize, MAX_HINT_RATIO * size)


def _gunzipped(f, size: int, head: bytes, chunk_bytes: int):
    """The stream fed the gzip's content, member after member (bench_profiler writes its files as
    two); None for what the whole-file path must word or read: reserved header flags (zlib refuses
    them, ISA-L ignores them), zero padding or junk after a member, a cut member, content past the
    bomb limit."""
    limit = max(INFLATE_FLOOR_BYTES, MAX_INFLATE_RATIO * size)
    f.seek(-4, os.SEEK_END)
    isize = struct.unpack("<I", f.read(4))[0]  # the last member's size mod 2^32: a hint for the buffers only
    f.seek(0)
    stream = _kineto.Stream(size_hint(isize, size))
    total, data, inflater = 0, b"", None
    while True:
        if not data:
            data = f.read(READ_BYTES)
        if inflater is None:  # a member starts here, or the file ends
            if not data:
                break
            if len(data) < 4:
                data += f.read(4)  # a header cut by the read
            if data[:2] != b"\x1f\x8b" or len(data) < 4 or data[3] & 0xE0:
                return None
            inflater = (_isal_zlib or zlib).decompressobj(wbits=31)
        # With no input left the inflater may still hold output (a copy cut by max_length): b"" drains it.
        out = inflater.decompress(data, chunk_bytes)
        total += len(out)
        if total > limit:
            return None
        if out:
            stream.feed(out)
        if inflater.eof:
            data, inflater = inflater.unused_data, None
        else:
            data = inflater.unconsumed_tail
            if not data and not out and not (data := f.read(READ_BYTES)):
                return None  # cut inside a member
    if total == 0:
        return None
    return stream


def decode_strings(parsed: dict) -> dict:
    """The C parser's dict with its escaped strings decoded: they come as their raw JSON text
    (escapes already checked). Raises msgspec.DecodeError as msgspec does."""
    parsed["strings"] = [msgspec.json.decode(s) if isinstance(s, bytes) else s for s in parsed["strings"]]
    return parsed

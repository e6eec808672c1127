"""The parquet cache of parsed trace files: one entry (parquet + header JSON) per file version.

A file is parsed once; the second load of an unchanged trace only reads the parquet. An entry is
found by (absolute path, size, mtime, LOADER_VERSION) and served only when the trace's bytes still
have the SHA-256 the entry recorded (a rewrite can keep size and mtime) and the parquet's bytes
still have theirs (a damaged entry can give a traceback or other numbers); otherwise the trace is
parsed again. Entries are written through a temporary name and a rename, header last, so a reader
never sees half of one; where the write fails (a full disk) the frame stays in memory instead.

A caller that analyses the frame it just parsed in a process with a core to spare (batchmap.py's
`background_write`) has the entry written in the background meanwhile (`background=True`, then
`settle` before it hands the parquet path on): the write (~40 ms of a 54 MB trace's 0.5 s load)
overlaps the analyses instead of preceding them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import stat
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.errors import TraceError

if TYPE_CHECKING:
    import polars as pl

# polars and the parser are imported on first use: `ptprof analyze` looks at the cache (which files
# are missing, so how many workers to start early) before its own imports (cli.py).

LOADER_VERSION = 12  # bump when the frame's schema, parsing or the entry format changes: invalidates every entry
CACHE_ENV = "PTPROF_CACHE_DIR"


class CacheUnusable(Exception):
    """The cache folder is not safely this user's: load without it (the message says why, for the user)."""


@dataclasses.dataclass(frozen=True)
class Parsed:
    """One parsed trace file: its header (parse_trace_file's meta) and where its frame is."""

    meta: dict
    parquet: str | None  # the entry holding the frame; None where it could not be written
    # The frame itself where it could not be written, and why not (e.g. "No space left on device").
    frame: pl.DataFrame | None = dataclasses.field(default=None, repr=False, compare=False)
    unstored: str | None = None
    # The frame just parsed and written, for a caller in the same process (rankmap.summarize
    # analyses it without reading the parquet back); never sent between processes.
    fresh: pl.DataFrame | None = dataclasses.field(default=None, repr=False, compare=False)
    # The entry's write still under way (`_stored(background=True)`): `settle` waits for it and
    # says whether `parquet` is there; until then nothing may read or hand on the path.
    writing: Future | None = dataclasses.field(default=None, repr=False, compare=False)


def _my_uid() -> int:
    return os.getuid()


def cache_dir() -> Path:
    """Where parsed traces are cached: $PTPROF_CACHE_DIR, else ~/.cache/ptprof, else a private temp folder.

    The temp folder is per user (`ptprof-cache-<uid>`, mode 0700); one that another user owns or
    that others can write is refused (CacheUnusable): they could plant entries or read traces.
    """
    try:
        env = os.environ.get(CACHE_ENV)
        base = Path(env) if env else Path.home() / ".cache" / "ptprof"
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except (OSError, RuntimeError):  # RuntimeError: no home folder to be found
        pass
    fallback = Path(tempfile.gettempdir()) / f"ptprof-cache-{_my_uid()}"
    try:
        fallback.mkdir(mode=0o700, exist_ok=True)
        st = fallback.stat()  # through a link: what matters is the folder written into
    except OSError as e:
        raise CacheUnusable(f"cannot make the cache folder {fallback} ({e.strerror}); {_UNCACHED}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheUnusable(f"the cache folder {fallback} is not a folder; {_UNCACHED}")
    if st.st_uid != _my_uid():
        raise CacheUnusable(f"the cache folder {fallback} belongs to another user (uid {st.st_uid}); {_UNCACHED}")
    if st.st_mode & 0o022:
        raise CacheUnusable(f"the cache folder {fallback} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                            f"{_UNCACHED}")
    return fallback


_UNCACHED = f"parsed traces are not cached (set ${CACHE_ENV} to a folder of yours)"


def unstored_note(folder: Path, reasons: list[str], total: int) -> str:
    """The one warning for files whose frames could not be written to `folder` (a full disk)."""
    return (f"{len(reasons):,} of {total:,} parsed trace files could not be written to {folder} ({reasons[0]}); "
            "they were analysed from memory, without caching")


def entry_key(path: Path, st: os.stat_result | None = None) -> str:
    """The name of `path`'s cache entry: its absolute path, size, mtime and the loader version."""
    st = st or path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{LOADER_VERSION}"
    # surrogateescape: a name that is not UTF-8 is hashed as the bytes it has on disk.
    return hashlib.sha1(ident.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def _identify(path: Path) -> tuple[str, str | None]:
    """(entry key, SHA-256 of the file's bytes); the digest is None for what is not a regular file."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer; a FIFO or a device is not hashed
    # (it may never end) and is never served from the cache.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return entry_key(path, st), None
        # SHA-256 runs at ~1.8 GB/s where the CPU has SHA instructions (OpenSSL uses them).
        return entry_key(path, st), hashlib.file_digest(f, "sha256").hexdigest()


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_entry(cache: Path, key: str, source_sha256: str) -> Parsed | None:
    """The entry `key` if it is whole and still the trace's (see the module docstring), else None."""
    pq, header = cache / f"{key}.parquet", cache / f"{key}.json"
    try:
        # The header's first line is the SHA-256 of the rest: a damaged header is a miss, never a
        # wrong rank or event count.
        check, _, body = header.read_bytes().partition(b"\n")
        if check.decode("ascii", "replace") != hashlib.sha256(body).hexdigest():
            return None
        entry = json.loads(body)
        if entry["source_sha256"] != source_sha256 or entry["parquet_sha256"] != _file_sha256(pq):
            return None
        return Parsed(entry["meta"], str(pq))
    except (OSError, ValueError, KeyError, TypeError):  # missing, half-written (older writers), foreign
        return None


def _write_entry(cache: Path, key: str, source_sha256: str, frame: pl.DataFrame, meta: dict) -> str:
    """Write `frame` and `meta` as the entry `key`; its parquet path. Raises where the disk does."""
    pq, header = cache / f"{key}.parquet", cache / f"{key}.json"
    tmp_pq, tmp_header = (cache / f"{p.name}.{os.getpid()}.tmp" for p in (pq, header))
    try:
        # Built in memory, then written at once and hashed there: polars writing the file itself
        # costs more system time (many small writes), and the digest would read it back.
        buf = io.BytesIO()
        frame.write_parquet(buf, compression="lz4", statistics=False)
        data = buf.getbuffer()
        _write_file(tmp_pq, data)
        body = json.dumps({"source_sha256": source_sha256, "parquet_sha256": hashlib.sha256(data).hexdigest(),
                           "meta": meta}).encode()
        del data
        _write_file(tmp_header, hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        # Parquet first: between the renames the old header names another parquet digest, a miss.
        os.replace(tmp_pq, pq)
        os.replace(tmp_header, header)
    finally:
        tmp_pq.unlink(missing_ok=True)
        tmp_header.unlink(missing_ok=True)
    return str(pq)


def _write_file(path: Path, data) -> None:
    with open(path, "wb") as f:
        f.write(data)


def remove_stale_tmp(cache: Path, *, older_than_s: float = 3600) -> None:
    """Remove temporary files that writers killed mid-write (or older ptprofs on a full disk) left in `cache`."""
    # Only old ones: a fresh .tmp may be another process's entry being written right now.
    cutoff = time.time() - older_than_s
    for tmp in cache.glob("*.tmp"):
        try:
            if tmp.lstat().st_mtime < cutoff:
                tmp.unlink()
        except OSError:
            pass  # gone already, or not ours to remove


Identity = tuple[str, "str | None"]  # (entry key, SHA-256 of the file's bytes; None for what is not a regular file)


def lookup(path: Path, cache: Path) -> tuple[Parsed | None, Identity | None]:
    """`path`'s entry in `cache` when it is whole and still the file's (else None: parse it), and
    the file's identity, which `load_one_safe` takes so that a miss does not hash the file twice."""
    try:
        ident = _identify(path)
    except OSError:
        return None, None
    key, digest = ident
    return (_read_entry(cache, key, digest) if digest is not None else None), ident


def _load_one(path: Path, cache: Path, ident: Identity | None, background: bool = False) -> Parsed:
    """`path` from its entry in `cache`, or parsed and written there (kept in memory where it cannot be).

    ident: the file's identity as `lookup` found it, else None. Its entry is looked up again either
    way: the caller may have wanted more than the entry (rankmap: a summary that was missing).
    """
    if ident is None:
        try:
            # Hashed before parsing: were the file rewritten in between, the entry would record
            # the old bytes beside the new frame, and the next load would miss rather than serve it.
            ident = _identify(path)
        except OSError:
            ident = None, None  # parse_trace_file says what is wrong with the file
    if ident[1] is not None:
        hit = _read_entry(cache, *ident)
        if hit is not None:
            return hit
    return _stored(cache, ident, *parse_trace_file(path), background)


def _stored(cache: Path, ident: Identity, frame: pl.DataFrame, meta: dict, background: bool = False) -> Parsed:
    """A frame just parsed, written as its entry (kept in memory where it cannot be); with
    `background`, the write is under way on the writer thread when this returns (see `settle`)."""
    key, digest = ident
    if digest is None:
        return Parsed(meta, None, frame)  # not a regular file (a FIFO, a device): no entry could be trusted
    if background:
        return Parsed(meta, str(cache / f"{key}.parquet"), fresh=frame,
                      writing=_writer().submit(_write_entry, cache, key, digest, frame, meta))
    try:
        return Parsed(meta, _write_entry(cache, key, digest, frame, meta), fresh=frame)
    except (OSError, _polars_error()) as e:  # polars words a full disk as a ComputeError
        return Parsed(meta, None, frame, _reason(e))


def _polars_error() -> type:
    from polars.exceptions import PolarsError

    return PolarsError


def _reason(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__


_WRITER: ThreadPoolExecutor | None = None
_WRITER_LOCK = threading.Lock()


def _writer() -> ThreadPoolExecutor:
    """The one thread that writes entries in the background: a batch's entries one after another
    (their buffers never all at once), in order, so `wait_writes` is a marker queued behind them.
    Its queue is worked off before the interpreter exits (concurrent.futures joins it), so an
    entry is whole or, where the process is killed, only a .tmp file (`remove_stale_tmp`)."""
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None:
            _WRITER = ThreadPoolExecutor(1, thread_name_prefix="ptprof-entry-writer")
        return _WRITER


def settle(parsed):
    """`parsed` (a Parsed or a TraceError) once its background write is over: the same entry,
    or, where the write failed (a full disk), its frame kept in memory with the reason."""
    if not isinstance(parsed, Parsed) or parsed.writing is None:
        return parsed
    failed = parsed.writing.exception()  # waits; an interrupt of this wait is raised here
    if failed is None:
        return Parsed(parsed.meta, parsed.parquet, fresh=parsed.fresh)
    return Parsed(parsed.meta, None, parsed.fresh, _reason(failed))


def wait_writes() -> None:
    """Return once every entry this process queued for the background is written (or failed)."""
    if _WRITER is None:
        return
    try:
        _WRITER.submit(int).result()
    except RuntimeError:  # the interpreter is shutting down: its exit joins the writer
        pass


def parse_trace_file(path: Path):
    """profiler.parse.parse_trace_file, imported on first use (the note above LOADER_VERSION)."""
    from profiler.parse import parse_trace_file as parse

    return parse(path)


def load_one_safe(path: Path, cache: Path, ident: Identity | None = None, background: bool = False):
    # Runs in worker processes too: errors travel back as values so one bad file never kills a
    # load, and whatever a malformed trace trips in the parser still names the file.
    return _safely(path, _load_one, path, cache, ident, background)


def _safely(path: Path, fn, *args):
    from polars.exceptions import PanicException

    try:
        return fn(*args)
    except TraceError as e:
        return e
    except MemoryError:
        return TraceError(path, "out of memory while parsing")
    except RecursionError:
        return TraceError(path, "could not parse: JSON nested too deeply")
    except (Exception, PanicException) as e:  # noqa: BLE001 (a polars panic is a BaseException)
        return TraceError(path, f"could not parse ({type(e).__name__}: {str(e)[:200]})")


def load_many_safe(paths: list[Path], cache: Path, idents: list[Identity | None], background: bool = False) -> list:
    """`load_one_safe` of each file, the files missing from the cache parsed together
    (parse_batch.parse_trace_files: one frame's worth of polars calls for all of them, each file's
    frame and header as parsed alone); a file it leaves alone is `load_one_safe`'s as ever.
    background: the entries are written in the background (`settle` each result before use)."""
    from profiler.parse_batch import parse_trace_files

    out: list = [None] * len(paths)
    misses: dict[int, Identity] = {}
    for i, (path, ident) in enumerate(zip(paths, idents)):
        if ident is None:
            try:
                ident = _identify(path)  # hashed before parsing, as _load_one
            except OSError:
                continue  # load_one_safe below: parse_trace_file says what is wrong with the file
        hit = _read_entry(cache, *ident) if ident[1] is not None else None
        if hit is not None:
            out[i] = hit
        else:
            misses[i] = ident
    if len(misses) > 1:
        for i, got in zip(misses, parse_trace_files([paths[i] for i in misses])):
            if got is not None:
                out[i] = _safely(paths[i], _stored, cache, misses[i], *got, background)
    return [got if got is not None else load_one_safe(path, cache, misses.get(i, ident), background)
            for i, (got, path, ident) in enumerate(zip(out, paths, idents))]

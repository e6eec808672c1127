"""The parquet cache of parsed trace files: one entry (parquet + header JSON) per file version.

A file is parsed once; the second load of an unchanged trace only reads the parquet. Entries are
written through a temporary name and a rename, so a reader never sees half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from polars.exceptions import PanicException

from profiler.errors import TraceError
from profiler.parse import parse_trace_file

LOADER_VERSION = 7  # bump when the frame's schema or parsing changes: invalidates every cache entry
CACHE_ENV = "PTPROF_CACHE_DIR"


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
    return hashlib.sha1(ident.encode("utf-8", "surrogateescape")).hexdigest()[:20]  # non-UTF-8 names too


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


def load_one_safe(path: Path, cache: Path):
    # Runs in worker processes too: errors travel back as values so one bad file never kills a
    # load, and whatever a malformed trace trips in the parser still names the file.
    try:
        return _load_one(path, cache)
    except TraceError as e:
        return e
    except MemoryError:
        return TraceError(path, "out of memory while parsing")
    except RecursionError:
        return TraceError(path, "could not parse: JSON nested too deeply")
    except (Exception, PanicException) as e:  # noqa: BLE001 (a polars panic is a BaseException)
        return TraceError(path, f"could not parse ({type(e).__name__}: {str(e)[:200]})")


def is_cached(path: Path, cache: Path) -> bool:
    try:
        key = _cache_key(path)
    except OSError:
        return False
    return (cache / f"{key}.parquet").is_file() and (cache / f"{key}.json").is_file()

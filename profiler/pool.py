"""Parsing many files at once: worker processes, each holding one file at a time, and progress."""

from __future__ import annotations

import io
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from profiler.cache import Parsed, load_one_safe, lookup, remove_stale_tmp
from profiler.errors import TraceError


def load_all(paths: list[Path], cache: Path, *, workers: int | None, progress: bool | None) -> list[Parsed | TraceError]:
    """Parse every file not in the cache, several at once in worker processes; results in input order.

    Workers are plain `python -m profiler._worker` processes (not multiprocessing), so callers
    need no `if __name__ == "__main__"` guard; they hand frames back through parquet files (or
    through their stdout, where a file could not be written).
    """
    n_workers = max(1, min(len(paths), workers or os.cpu_count() or 1))
    show = progress if progress is not None else (len(paths) > 1 and sys.stderr.isatty())
    bar = _progress_bar(len(paths), show)
    results: dict[Path, object] = dict(zip(paths, _lookup_all(paths, cache, n_workers)))
    pending = [p for p in paths if results[p] is None]
    bar.update(len(paths) - len(pending))
    if pending:
        remove_stale_tmp(cache)
    if len(pending) <= 1 or n_workers == 1:
        for p in pending:
            results[p] = load_one_safe(p, cache)
            bar.update(1)
    else:
        for p, res in _run_workers(pending, cache, min(n_workers, len(pending))):
            results[p] = res
            bar.update(1)
    bar.close()
    return [results[p] for p in paths]


def _lookup_all(paths: list[Path], cache: Path, n: int) -> list[Parsed | None]:
    """Each file's verified cache entry, or None. Hashing releases the GIL, so threads share the work."""
    if len(paths) <= 1 or n == 1:
        return [lookup(p, cache) for p in paths]
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda p: lookup(p, cache), paths))


def _run_workers(paths: list[Path], out_dir: Path, n: int):
    """Yield (path, result) as `n` worker processes finish files (results as from load_one_safe)."""
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
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        reported = set()
        for line in proc.stdout:  # one JSON line per file, then the frame's Arrow IPC bytes where it has one
            if not line.endswith(b"\n"):
                break  # the worker died mid-line: its files are reported below as failed
            msg = json.loads(line)
            p = Path(msg["path"])
            if "error" in msg:
                done.put((p, TraceError(p, msg["error"])))
            else:
                payload = proc.stdout.read(msg["frame_bytes"]) if msg.get("frame_bytes") is not None else None
                if payload is not None and len(payload) < msg["frame_bytes"]:
                    break  # died mid-frame, as above
                frame = pl.read_ipc(io.BytesIO(payload)) if payload is not None else None
                done.put((p, Parsed(msg["meta"], msg["parquet"], frame, msg["unstored"])))
            reported.add(p)
        err = proc.stderr.read().decode(errors="replace")
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


def _progress_bar(total: int, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="loading traces", unit="file", disable=not show, file=sys.stderr)

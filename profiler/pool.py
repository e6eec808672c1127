"""Parsing many files at once: worker processes, each holding one file at a time, and progress."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from profiler.cache import is_cached, load_one_safe
from profiler.errors import TraceError


def load_all(paths: list[Path], cache: Path, *, workers: int | None, progress: bool | None):
    """Parse every file, several at once in worker processes; results in input order.

    Workers are plain `python -m profiler._worker` processes (not multiprocessing), so callers
    need no `if __name__ == "__main__"` guard; they hand frames back through parquet files.
    """
    n_workers = max(1, min(len(paths), workers or os.cpu_count() or 1))
    pending = [p for p in paths if not is_cached(p, cache)]
    show = progress if progress is not None else (len(paths) > 1 and sys.stderr.isatty())
    bar = _progress_bar(len(paths), show)
    results: dict[Path, object] = {}
    if len(pending) <= 1 or n_workers == 1:
        for p in paths:
            results[p] = load_one_safe(p, cache)
            bar.update(1)
    else:
        for p in paths:
            if p not in pending:
                results[p] = load_one_safe(p, cache)
                bar.update(1)
        for p, res in _run_workers(pending, cache, min(n_workers, len(pending))):
            results[p] = res
            bar.update(1)
    bar.close()
    return [results[p] for p in paths]


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


def _progress_bar(total: int, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="loading traces", unit="file", disable=not show, file=sys.stderr)

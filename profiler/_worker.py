"""Worker process of the local engine (pool.py): summarize the tasks on stdin.

    python -m profiler._worker < TASKS        # one JSON line per task: [index, batch, RankTask.to_json()]

The consecutive tasks of one batch number are summarized together (batchmap.summarize_batch).
Writes to stdout, as each batch finishes, for each of its files one JSON line {"index", "path", "error"} or {"index",
"path", "summary_bytes": N} followed by the N bytes of the encoded summary (rankmap.encode).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

from profiler.errors import TraceError
from profiler.startup import collector_paused

with collector_paused():  # profiler.startup: ~20 ms
    from profiler.batchmap import summarize_batch
    from profiler.rankmap import RankTask, encode
    from profiler.summary_cache import stored_blob


def main(argv: list[str]) -> None:
    out = sys.stdout.buffer
    with collector_paused():
        _prepare()
    # What is alive now (modules) lives until exit: out of the collector's walks from here on.
    gc.freeze()
    # All of stdin first: the parent writes every task, then reads our answers. Empty (the parent
    # had no task for a worker it started early, or died): nothing to do.
    lines = sys.stdin.read().splitlines()
    batches: list[list[tuple[int, RankTask]]] = []
    last = None
    for line in lines:
        index, batch, text = json.loads(line)
        if batch != last:
            batches.append([])
            last = batch
        batches[-1].append((index, RankTask.from_json(text)))
    for batch in batches:
        for (index, task), res in zip(batch, summarize_batch([t for _, t in batch])):
            _write(out, index, task, res)


def _prepare() -> None:
    """Import what the first batch would otherwise import on its way (~30 ms), before the tasks
    come: a worker started early (pool.LocalEngine.start_early) does it while the parent is still
    importing, so its first batch is no slower than the next."""
    import numpy.ma  # noqa: F401  (polars reads a numpy array's mask through it: the parser's columns)

    import profiler.load  # noqa: F401  (rankmap.worker_rank's file-name rank)
    import profiler.parse_batch  # noqa: F401
    import profiler.parse_fast  # noqa: F401
    from profiler.summary_cache import code_version

    code_version()  # a hash of the profiler's source, once per process


def _write(out, index: int, task: RankTask, res) -> None:
    payloads = []
    if isinstance(res, TraceError):
        msg = {"index": index, "path": task.path, "error": res.problem}
    else:
        # The summary batchmap has just cached, as stored (the same key, so the same bytes: the
        # trace's digest, the code, run.json, options, run and rank), else encoded here. Only
        # beside an entry written now: a file whose entry could not be written has no summary
        # of this load on disk, and an older one would name that missing entry.
        stored = stored_blob(Path(task.cache), task) if task.cache and res.parquet and not res.unstored else None
        payloads.append(stored if stored is not None else encode(res))
        # Never the events (a full disk left them uncached): the parent would hold every
        # rank's; it parses the file again if a view needs them (load.RankPart.events).
        msg = {"index": index, "path": task.path, "summary_bytes": len(payloads[0])}
    out.write(json.dumps(msg).encode() + b"\n" + b"".join(payloads))
    out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
    gc.freeze()  # skip the exit's walk over every module object (~50 ms; see profiler/__main__.py)

"""Cached rank summaries (rankmap.py): a warm load reads one small file per rank.

An entry `<parquet key>.<digest>.summary` lives beside the file's parquet entry (cache.py). The
digest covers everything a summary depends on:
- the trace's bytes (its SHA-256, as the parquet entry's),
- the code that made it: a hash of every profiler/*.py and the C parser, so an upgrade (or a
  local edit) never serves numbers an older analysis computed — no version to forget to bump,
- the run.json the analyses read, the options (--step, --top), and the run label and rank.
The blob ends with the SHA-256 of what precedes it, so a damaged entry is a miss, never a wrong
number; it is written under a temporary name and renamed when whole.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from pathlib import Path

from polars.exceptions import PanicException

from profiler.rankmap import RankSummary, RankTask, decode, encode

_DIGEST = 32  # bytes of SHA-256 at the end of each entry


@functools.cache
def code_version() -> str:
    """A hash of the profiler's source (Python and the C parser's source): any change invalidates
    every summary. The source, not the built module: two machines building the same _kineto.c
    with other compilers run the same code (and the pure parser gives the same frame)."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    c_parser = (sorted(here.glob("_kineto.c")) + sorted(here.glob("_kineto_*.h"))
                or sorted(here.glob("_kineto*.so")) + sorted(here.glob("_kineto*.pyd")))
    for p in sorted(here.glob("*.py")) + c_parser:  # the built module only where its source was not installed
        h.update(p.name.encode())
        h.update(p.read_bytes())
    # polars' and numpy's versions too: float sums and tie orders are theirs (a summary made by
    # another polars could differ in its last digits from what this one computes).
    import numpy
    import polars

    h.update(f"polars {polars.__version__} numpy {numpy.__version__}".encode())
    return h.hexdigest()[:16]


def summary_path(cache: Path, task: RankTask) -> Path | None:
    """Where `task`'s summary is (or would be) cached; None when the file's identity is unknown."""
    if task.ident is None or task.ident[1] is None:
        return None
    key, source_sha = task.ident
    what = json.dumps([source_sha, code_version(), task.manifest, task.options.key(), task.run, task.rank],
                      sort_keys=True, default=str)
    return cache / f"{key}.{hashlib.sha256(what.encode()).hexdigest()[:24]}.summary"


def read_summary(cache: Path, task: RankTask, parquet: str) -> RankSummary | None:
    """The cached summary of `task` when it is whole and was made beside the (verified) parquet entry `parquet`."""
    body = stored_blob(cache, task)
    if body is None:
        return None
    try:
        summary = decode(body)
    except (Exception, PanicException):  # noqa: BLE001  (a foreign or older blob: a miss)
        return None
    return summary if summary.parquet == parquet else None


def stored_blob(cache: Path, task: RankTask) -> bytes | None:
    """The bytes of `task`'s cached summary (rankmap.encode's) when the entry is whole, else None.
    A local worker sends the summary it has just stored this way (_worker.py): a read of ~30 KB
    instead of encoding it a second time (~0.5 ms a rank)."""
    path = summary_path(cache, task)
    if path is None:
        return None
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    body, check = blob[:-_DIGEST], blob[-_DIGEST:]
    if len(blob) <= _DIGEST or hashlib.sha256(body).digest() != check:
        return None
    return body


def store_summary(cache: Path, task: RankTask, summary: RankSummary) -> None:
    """Write `summary` as `task`'s entry; silently nothing where the disk refuses (it is only a cache)."""
    path = summary_path(cache, task)
    if path is None:
        return
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # a Dask worker's threads too
    try:
        body = encode(summary)
        tmp.write_bytes(body + hashlib.sha256(body).digest())
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)

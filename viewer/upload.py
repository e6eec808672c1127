"""Uploads: trace files sent through the Open page become a run folder under the traces root, or
are refused with every reason, leaving nothing behind.

The server's memory is bounded before anything is parsed: the sizes of every file are checked on
the base64 text (before decoding), files are decoded and written one at a time, a .gz is
stream-decompressed with a cap (MAX_UNPACKED_BYTES, gzip bombs) and the traces are parsed in a
child process (this module, `python -m viewer.upload FOLDER`) with a memory limit. The child parses
with no worker processes of its own (the limit bounds one process, so it bounds the whole parse)
and runs in its own process group, killed whole on a timeout or any failure. The server then
loads the parsed frames from the profiler's cache and never holds the raw JSON; where the cache
cannot hold them (no usable cache folder, a full disk) the upload is refused rather than parsed
again in the server without a bound.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import resource
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from profiler.discover import RUN_MANIFEST, TRACE_SUFFIXES

from viewer.data import PathRefused, RunStore, read_manifest, resolve_under

MAX_UPLOAD_BYTES = 64 * 2**20  # per uploaded file, as sent (compressed if .gz); stated on the Open page
MAX_UPLOAD_FILES = 64  # files in one upload (one run's ranks and its run.json)
# A .gz may expand to this much, no more. Parsing costs ~5x the JSON in memory (a 1 GiB JSON took
# 5.4 GB): bigger traces belong in a folder under the root, opened by path.
MAX_UNPACKED_BYTES = 256 * 2**20
PARSE_MEMORY_BYTES = 4 * 2**30  # address space of the parsing child process
PARSE_TIMEOUT_S = 600
SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
UPLOAD_PREFIX = "upload-"


def decode_upload(contents, names) -> list[tuple[str, str]]:
    """(name, base64 payload) per file, once every name, type and size is checked (nothing is
    decoded yet); PathRefused listing every problem otherwise. `contents` and `names` are what
    dcc.Upload sends: lists of "data:<mime>;base64,<payload>" and of file names."""
    if isinstance(contents, str) and isinstance(names, str):  # dcc.Upload without multiple=True
        contents, names = [contents], [names]
    if not isinstance(contents, list) or not isinstance(names, list):
        raise PathRefused("malformed upload (expected lists of files and names)")
    problems = []
    if len(contents) != len(names):
        problems.append(f"{len(contents)} files but {len(names)} names")
    if len(contents) > MAX_UPLOAD_FILES:
        problems.append(f"{len(contents)} files: at most {MAX_UPLOAD_FILES} in one upload")
    if not contents:
        problems.append("no files")
    files, seen = [], set()
    for name, blob in zip(names, contents):
        shown = repr(name)[:80] if not isinstance(name, str) else name[:80]
        if not isinstance(name, str) or not SAFE_NAME_RE.match(name) or not (name == RUN_MANIFEST or name.endswith(TRACE_SUFFIXES)):
            problems.append(f"{shown}: expected a plain file name ending in .json or .json.gz")
            continue
        if name in seen:
            problems.append(f"{name}: sent twice (one file per name)")
            continue
        seen.add(name)
        head, sep, payload = blob.partition(",") if isinstance(blob, str) else ("", "", "")
        if not sep or not head.endswith(";base64"):
            problems.append(f"{name}: malformed upload")
        elif (size := len(payload) * 3 // 4 - payload[-2:].count("=")) > MAX_UPLOAD_BYTES:  # base64: 3 bytes per 4 characters
            problems.append(f"{name}: {size / 2**20:.1f} MiB is over the {MAX_UPLOAD_BYTES // 2**20} MiB limit")
        else:
            files.append((name, payload))
    if problems:
        raise PathRefused("; ".join(problems))
    return files


def save_upload(store: RunStore, files: list[tuple[str, str]]) -> str:
    """Write checked files (decode_upload) into a new run folder `upload-<random>/` under the root,
    parse them in a child process, load the run, and return its id.

    All or nothing: refused (PathRefused naming each problem; the folder removed) if a file is not
    base64, a .gz is corrupt or unpacks to over MAX_UNPACKED_BYTES, run.json is unusable, any file
    fails to parse, or the run fails to load.
    """
    try:
        # mkdtemp: a new folder of this call's own, whatever else is uploading (two uploads in the
        # same microsecond once shared a name, and the loser removed the winner's folder).
        folder = Path(tempfile.mkdtemp(prefix=UPLOAD_PREFIX, dir=store.root))
    except OSError as e:
        raise PathRefused(f"could not save the upload: {e.strerror or e}") from None
    run_id = folder.relative_to(store.root).as_posix()
    store.uploading.add(run_id)  # the Runs page must not list (and analyse) it half-written
    try:
        for name, payload in files:  # one decoded file in memory at a time
            try:
                blob = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise PathRefused(f"{name}: malformed upload (bad base64)") from None
            if blob[:2] == b"\x1f\x8b":
                check_unpacked_size(name, blob)
            resolve_under(folder, name).write_bytes(blob)  # belt and braces: the name was validated
            del blob
        _, problem = read_manifest(folder)
        if problem:
            raise PathRefused(problem)
        problems = parse_in_child(folder)
        if problems:
            raise PathRefused("; ".join(problems))
        data = store.get(run_id)
        if not data.ok:
            raise PathRefused(data.error)
        return run_id
    except OSError as e:  # disk full, read-only root, ...
        _remove(store, folder, run_id)
        raise PathRefused(f"could not save the upload: {e.strerror or e}") from None
    except PathRefused as e:
        _remove(store, folder, run_id)
        raise PathRefused(str(e).replace(f"{folder}/", "")) from None  # the file names, not the server's paths
    except BaseException:
        _remove(store, folder, run_id)  # anything unforeseen: leave no half a run behind
        raise
    finally:
        store.uploading.discard(run_id)


def _remove(store: RunStore, folder: Path, run_id: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    store.forget(run_id)


def check_unpacked_size(name: str, blob: bytes) -> None:
    """PathRefused unless the gzip `blob` unpacks to at most MAX_UNPACKED_BYTES, counting every
    member (a gzip file may be several concatenated members, and gzip.open reads them all).
    Streams 1 MiB at a time: the bomb is never held unpacked."""
    total = 0
    rest = blob
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            chunk = d.decompress(rest, 2**20)
            while chunk:
                total += len(chunk)
                if total > MAX_UNPACKED_BYTES:
                    raise PathRefused(f"{name}: unpacks to more than {MAX_UNPACKED_BYTES // 2**20} MiB "
                                      "(copy big traces under the traces root and open the folder instead)")
                chunk = d.decompress(d.unconsumed_tail, 2**20)
            if not d.eof:
                raise PathRefused(f"{name}: truncated gzip")
            rest = d.unused_data.lstrip(b"\0")  # gzip.open skips zero padding between members too
    except zlib.error as e:
        raise PathRefused(f"{name}: not a valid gzip file ({e})") from None


def parse_in_child(folder: Path) -> list[str]:
    """Parse a folder's traces into the profiler's cache in a child process with a memory limit;
    returns the problems the loader reported (files it left out). PathRefused when nothing parsed,
    the cache could not hold the frames, the child ran out of memory or time, or died."""
    # A session of its own: on a timeout or any failure the whole group goes, never an orphan.
    proc = subprocess.Popen([sys.executable, "-m", "viewer.upload", str(folder), str(PARSE_MEMORY_BYTES)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=PARSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PathRefused(f"parsing took over {PARSE_TIMEOUT_S} s") from None
    finally:
        _kill_group(proc)
    lines = stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise PathRefused(f"the parser failed: {tail}") from None
    if out.get("error"):
        raise PathRefused(out["error"])
    return out["problems"]


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's process group (the child and anything it started) and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group id is the child's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already: the child exited and left nothing running
    proc.kill()
    proc.communicate()


def _child(folder: str, memory_bytes: int) -> None:
    """The child: load the folder's traces (which fills the parse cache) within `memory_bytes` of
    address space and print one JSON line, {"problems": [...]} or {"error": "..."}."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from profiler import TraceError, load_traces
    from profiler.cache import CacheUnusable, cache_dir

    try:
        cache = cache_dir()
        # workers=1: parse here, not in one worker per core, each with memory_bytes of its own.
        traces = load_traces(folder, progress=False, workers=1)
        out = {"problems": [str(p) for p in traces.problems]}
        # The server loads from the cache; a frame the cache could not keep (a full disk: the rank's
        # part holds it in memory, no parquet) would be parsed again there, with no memory bound:
        # refused instead. (cache_dir() above refused an unusable cache, so a parquet is an entry.)
        if not out["problems"] and any(part.parquet is None for part in traces.parts):
            out = {"error": f"the parsed traces could not be cached in {cache} ({'; '.join(traces.notes) or 'not written'}); "
                            "uploads need the profiler's cache: free space there or set $PTPROF_CACHE_DIR"}
    except CacheUnusable as e:
        out = {"error": f"uploads need the profiler's cache, and it is unusable: {e}"}
    except TraceError as e:
        out = {"error": str(e)}
    except MemoryError:
        out = {"error": f"out of memory parsing (over {memory_bytes / 2**30:.1f} GiB)"}
    except BaseException as e:  # noqa: BLE001 -- polars' PanicException is a BaseException
        out = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))

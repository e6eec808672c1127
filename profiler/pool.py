"""Running the per-rank map (rankmap.summarize) over many files: local worker processes, and progress.

    for i, result in LocalEngine(workers=2).map(tasks): ...

An engine maps `summarize` over RankTasks and yields (index, RankSummary | TraceError) as files
finish, in any order. Both engines run batches of small files (batchmap.plan_batches: one
`analyze_rank` for a batch, split back per file, bit-identical to each file alone), so the fixed
cost of a small rank is paid once per batch: one batch per local worker, two per Dask worker.
`LocalEngine` runs plain `python -m profiler._worker` processes (not multiprocessing, so callers
need no `if __name__ == "__main__"` guard); `dask_pool.DaskEngine` runs the same function on a
Dask cluster. Every task gets exactly one result, whatever happens to
its worker (it cannot start, dies, or prints something unexpected), so a load never waits forever.

A worker's imports (polars, numpy, the analyses: ~0.25 s) would follow the parent's own (~0.2 s)
if it were started at the map. `ptprof analyze` therefore counts the files the cache lacks
(`uncached_files`) and starts that many workers (up to `workers`) before importing anything
heavy itself (`LocalEngine.start_early`): the processes import side by side, and a worker waits
for its tasks on stdin. Workers that no map takes are stopped by `close` (or, should the parent
die, end when their stdin does). A map too small to pay for workers is done in this process
(`in_process_is_quicker`), its files scanned meanwhile by a forked child (prescan.py). This
module imports neither polars nor the analyses itself.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from profiler import prescan
from profiler.cache import Identity, lookup
from profiler.errors import TraceError
from profiler.gzip_limits import json_bytes
from profiler.startup import blas_threads_env, ctrl_c_held

if TYPE_CHECKING:
    from profiler.rankmap import RankSummary, RankTask

# The workers' two allocators, tuned on 8 ranks x 100 MB (README, Benchmarks): polars' jemalloc
# keeps freed pages 10 s by default, so a worker holds its last file's garbage while parsing the
# next (+100 MB per worker); returning them at once (decay 0) costs a page fault per 4 KB on every
# later allocation, ~1 GB of fresh pages per 100 MB file, +30 % CPU. 50 ms keeps the pages a
# file's steps hand to each other and returns the rest between files. glibc (the C parser's
# columns, numpy) moves its mmap threshold up to 32 MB as big blocks are freed, then serves them
# from a heap it cannot shrink: fixed at 1 MB, big blocks go back when freed. Under it, the
# inflated chunks (parse_stream: 512 KB, ~200 per 100 MB file) come from the heap's top, which
# glibc would hand back above 128 KB free, to fault it in again for the next chunk: kept up to
# 4 MB, a 100 MB file faults ~56k pages instead of ~82k (system CPU 2.1-2.6 -> 1.3-1.4 s on
# 8 x 100 MB, README Benchmarks; the tree's peak the same). A user's own value of any of them
# wins (_worker_env), as for POLARS_MAX_THREADS: this process already runs with it.
_WORKER_ENV = {"_RJEM_MALLOC_CONF": "dirty_decay_ms:50,muzzy_decay_ms:0", "MALLOC_MMAP_THRESHOLD_": "1048576",
               "MALLOC_TRIM_THRESHOLD_": "4194304"}
# What `import polars` writes into _RJEM_MALLOC_CONF before a user's own value (polars/__init__.py:
# its defaults, then ",thp:always,metadata_thp:always" under POLARS_THP=1, then "," + the value it
# found). Once this process has imported polars (the Python API, the viewer), that is no user's
# setting: the workers get ours, then whatever the user's was (jemalloc takes the last of a key).
_POLARS_JEMALLOC = ("dirty_decay_ms:500,muzzy_decay_ms:1000", ",thp:always,metadata_thp:always")


def cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's share),
    which the default worker count, the workers' polars threads and --workers' cap go by."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


WORKERS_PER_CORE = 2  # more workers than this many a core: capped, with a note (a slow filesystem may use a second)


def capped_workers_note(asked: str) -> str:
    """What capping the workers `asked` ("--workers 1000", "workers=1000") at WORKERS_PER_CORE a
    core says (the CLI's note, the API's warning)."""
    return (f"{asked}: this process may use {cores()} cores; using {WORKERS_PER_CORE * cores()} workers "
            f"(two per core; more would only share the cores, each with its own ~0.1 GB)")


class LocalEngine:
    """`summarize` in up to `workers` local processes (default: one per core); in this process for
    one task, and, where `workers` is not given, for a map too small to pay for them."""

    def __init__(self, workers: int | None = None):
        most = WORKERS_PER_CORE * cores()
        if workers and workers > most:  # each holds its own imports (~0.1 GB): 1,000 of them would not fit
            # The CLI caps --workers before, with a note of its own; this says it to the API's callers.
            warnings.warn(capped_workers_note(f"workers={workers}"), stacklevel=3)
            workers = most
        self.workers = max(1, workers or cores())
        self.auto = not workers  # a small map is then done in this process (in_process_is_quicker)
        self._early: list[_Worker] = []  # started by start_early, taken by the next map

    def start_early(self, files: list) -> None:
        """Start what a map of `files` (the files the cache lacks: uncached_files) will use, so
        that it works while this process imports: the worker processes, which import side by
        side with it; or, for files analysed in this process (one file, one worker), a child
        that scans them meanwhile (prescan.py)."""
        # One a file up to `workers`: the batches of that many files are as many, but for a few
        # counts (5 files on 4 workers: batches of 2, 2 and 1) where `map` stops the one left over.
        n = min(self.workers, len(files))
        # Past the files looked at (a set of more than PROBE_FILES), the map takes the pool.
        more = getattr(files, "more", False)
        if not more and (n < 2 or (self.auto and in_process_is_quicker(files, self.workers))):
            prescan.start(files)
            return
        if n < 2:  # a set whose first files are cached: taken as warm
            return
        env = _worker_env(n)
        # A KeyboardInterrupt inside Popen, while it waits for the child's exec, would lose a
        # started worker no one stops: held, it comes once every worker is in `_early` (`close`).
        with ctrl_c_held():
            try:
                for _ in range(n - len(self._early)):
                    self._early.append(_start_worker(env))
            except Exception:  # noqa: BLE001  (a process limit, no memory: the map starts them, or says why)
                pass

    def close(self) -> None:
        """Stop what start_early started and no map took (a warm load, an error, Ctrl-C)."""
        self._stop_early()
        prescan.stop()

    def _stop_early(self) -> None:
        early, self._early = self._early, []
        for w in early:
            w.stop()

    def map(self, tasks: list[RankTask]) -> Iterator[tuple[int, RankSummary | TraceError]]:
        from profiler.batchmap import plan_batches, summarize_batch

        # One batch per worker: each worker takes its share of the batches in advance (below), so
        # more batches would balance nothing and cost each its fixed ~50 ms (plan_batches).
        workers = 1 if self.auto and in_process_is_quicker([t.path for t in tasks], self.workers) else self.workers
        batches = plan_batches(tasks, workers, per_worker=1)
        n = min(workers, len(batches))
        early, self._early = (self._early[:n], self._early[n:]) if n > 1 else ([], self._early)
        self._stop_early()  # more than this map has batches for
        if n <= 1 and prescan.crashed():  # the same crash here would end ptprof with no word of the file
            batches = plan_batches(tasks, self.workers, per_worker=1)
            yield from _run_workers(tasks, batches, min(self.workers, len(batches)), [])
            return
        if n <= 1:  # in this process: its parquet entries written while the analyses run (batchmap)
            for batch in batches:
                yield from zip(batch, summarize_batch([tasks[i] for i in batch], background_write=True))
            return
        yield from _run_workers(tasks, batches, n, early)


# A map whose work in this process would take less than worker processes save is done here (with
# prescan.py's child scanning the files while this process imports). Workers start side by side
# with this process's imports, each importing polars and the analyses (~0.25 s of CPU), and then
# share the work: on w workers, W seconds of work done here cost W, on the pool about
# WORKER_START_S + W / w, so the pool pays below W = WORKER_START_S * w / (w - 1) (0.7 s on two
# cores). W is estimated as ~1.5 ms a file and ~9 ms a MB of JSON: the cold in-process work over
# the start-up, fitted to bench_scale's sets of 8 to 64 x 1 MB, 2 to 8 x 10 MB and 2 x 27 MB run
# both ways on this 2-core machine (README, Benchmarks: in-process was quicker up to 64 MB of JSON,
# the pool from 80 MB).
WORKER_START_S = 0.35
IN_PROCESS_FILE_S = 0.0015
IN_PROCESS_JSON_MB_S = 0.009


def in_process_is_quicker(paths: list, workers: int) -> bool:
    """Whether these files (a map's, all uncached) are done sooner in this process than on
    `workers` worker processes (see above). A gzip's JSON size is read from its trailer; any doubt
    (more files than PROBE_FILES, a file that does not stat): False, the pool as before."""
    workers = min(workers, len(paths))
    if workers < 2:
        return True
    if len(paths) > PROBE_FILES:
        return False
    worth = WORKER_START_S * workers / (workers - 1)
    seconds = IN_PROCESS_FILE_S * len(paths)
    for p in paths:
        if seconds > worth:
            return False
        try:
            seconds += IN_PROCESS_JSON_MB_S * json_bytes(p) / 1e6
        except OSError:
            return False
    return seconds <= worth


PROBE_FILES = 64  # uncached_files looks at no more files than this: a warm 1,024-rank load would pay ~40 ms


class Uncached(list):
    """uncached_files' answer: the files, and whether the set holds more than were looked at."""

    more = False


def uncached_files(paths: list, *, cache: bool = True, most: int | None = None) -> Uncached:
    """The trace files under `paths` that have no parquet entry in the cache (all of them without
    the cache): the files a load will parse, give or take a stale entry. Up to `most` of them,
    from the first PROBE_FILES files only (a set whose first files are cached is taken as warm:
    its workers, if any are needed, start with the map as they would anyway; `.more`: the set has
    files past those). Cheap (a stat per file looked at, after the folder's listing: plain .json
    files are read 64 bytes each to leave out ptprof's own reports, discover.own_output, once per
    process) and never raises: none where the paths are bad (the load itself says why)."""
    from profiler.cache import cache_dir, entry_key
    from profiler.discover import find_sources, not_a_regular_file

    most = most or 1 << 62
    found = Uncached()
    try:
        sources = find_sources(list(paths))
        found.more = len(sources) > PROBE_FILES
        files = [s.path for s in sources[:PROBE_FILES] if not not_a_regular_file(s.path)]
        if not cache:
            found.extend(files[:most])
            return found
        folder = cache_dir()
        for f in files:
            if not (folder / f"{entry_key(f)}.json").exists():
                found.append(f)
                if len(found) >= most:
                    break
        return found
    except Exception:  # noqa: BLE001  (TraceError, CacheUnusable, OSError: the load reports them)
        return Uncached()


def lookup_all(paths: list[Path], cache: Path, workers: int) -> list[tuple[object, Identity | None]]:
    """Each file's verified parquet entry (or None) and identity. Hashing releases the GIL, so threads share the work."""
    if len(paths) <= 1 or workers == 1:
        return [lookup(p, cache) for p in paths]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda p: lookup(p, cache), paths))


def _worker_env(n: int) -> dict:
    env = {**_WORKER_ENV, **blas_threads_env(os.environ), **os.environ}  # and numpy's BLAS on one thread (startup.py)
    user = _user_jemalloc_conf(os.environ.get("_RJEM_MALLOC_CONF"))
    env["_RJEM_MALLOC_CONF"] = _WORKER_ENV["_RJEM_MALLOC_CONF"] + ("," + user if user else "")
    # n workers already fill the cores: polars' own thread pool in each would oversubscribe them
    # (measured ~15 % slower per rank with one worker per core). A user's setting wins.
    env.setdefault("POLARS_MAX_THREADS", str(max(1, cores() // n)))
    return env


def _user_jemalloc_conf(value: str | None) -> str:
    """The user's part of a _RJEM_MALLOC_CONF value: without what `import polars` put before it."""
    if not value:
        return ""
    default, thp = _POLARS_JEMALLOC
    if value == default or value.startswith(default + ","):
        value = value[len(default):]
        value = value[len(thp):] if value.startswith(thp) else value
        value = value[1:] if value.startswith(",") else value
    return value


class _Worker:
    """A started `python -m profiler._worker` process and the file its stderr goes to."""

    def __init__(self, proc: subprocess.Popen, err):
        self.proc, self.err = proc, err

    def stop(self) -> None:
        """Kill it (if still running) and reap it."""
        with self.err:
            if self.proc.poll() is None:
                self.proc.kill()
            with self.proc:  # closes its pipes, waits for it
                pass


def _start_worker(env: dict) -> _Worker:
    # stderr goes to a file: a worker writing more than a pipe holds (a panic's backtrace) while
    # we read its stdout would otherwise block both.
    err = tempfile.TemporaryFile()
    try:
        # A session (and process group) of its own: a terminal's Ctrl-C goes to ptprof alone, which stops every
        # worker (below); a worker signalled while still importing would print a traceback.
        proc = subprocess.Popen([sys.executable, "-m", "profiler._worker"], stdin=subprocess.PIPE, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=err, env=env)
    except BaseException:
        err.close()
        raise
    return _Worker(proc, err)


def _run_workers(tasks: list[RankTask], batches: list[list[int]], n: int,
                 early: list[_Worker] = ()) -> Iterator[tuple[int, RankSummary | TraceError]]:
    """Yield (index, result) as `n` worker processes finish tasks; each worker takes every n-th
    batch, the k-th starting in early[k] where that was started before the map."""
    done: queue.Queue = queue.Queue()
    chunks = [batches[k::n] for k in range(n)]
    env = _worker_env(n)

    procs: list[subprocess.Popen] = [w.proc for w in early]  # every worker started, so an interrupted load can stop them
    stop = threading.Event()

    def run(chunk: list[list[int]], first: _Worker | None) -> None:
        left = chunk
        deaths: dict[int, int] = {}  # file -> the workers that died with it unfinished
        try:
            while left and not stop.is_set():
                reported: set[int] = set()
                started, why = _run_worker(tasks, left, env, done, reported, procs, first)
                first = None
                left = [b for b in ([i for i in batch if i not in reported] for batch in left) if b]
                if not left or stop.is_set():
                    return
                if not started:  # no process at all (a process limit, no memory): none of these will run
                    break
                # A worker takes its batches in order, so it died in the first one it did not finish
                # (killed for memory? a crash in the parser? a kill from outside?). Of a batch of
                # several files, a fresh worker takes each alone; a file is named once a second
                # worker has died with it (a lone file is tried again once: a kill that was not the
                # file's doing costs no rank). So one deadly file costs one rank, not its batch nor
                # every n-th batch of the load.
                for i in left[0]:
                    deaths[i] = deaths.get(i, 0) + 1
                if len(left[0]) > 1:
                    left = [[i] for i in left[0]] + left[1:]
                    continue
                i = left[0][0]
                if deaths[i] < 2:
                    continue
                done.put((i, died(tasks[i], f"its worker process died ({why or 'stopped'}; twice with this file)")))
                left = left[1:]
        except BaseException as e:  # noqa: BLE001  (whatever happens here, every file gets its answer)
            why = f"{type(e).__name__}: {e}"
        finally:
            if first is not None:  # stopped before it was given its tasks
                first.stop()
        for i in (i for batch in left for i in batch):
            done.put((i, died(tasks[i], f"its worker process failed: {why}")))

    threads = [threading.Thread(target=run, args=(c, early[k] if k < len(early) else None), daemon=True)
               for k, c in enumerate(chunks)]
    try:
        for t in threads:
            t.start()
        for _ in tasks:
            yield _next(done)
    finally:
        # Interrupted (Ctrl-C, a signal turned exception) or abandoned: no worker outlives the load.
        stop.set()
        for proc in list(procs):
            if proc.poll() is None:
                proc.kill()
    for t in threads:
        t.join()


def _next(done: queue.Queue):
    """The next result. Polled: a Ctrl-C or `kill -INT` may be delivered to one of the reader
    threads, and then a main thread blocked in get() without a timeout would sleep through it,
    its KeyboardInterrupt pending, until a worker happened to finish (never, were one hung)."""
    while True:
        try:
            return done.get(timeout=0.2)
        except queue.Empty:
            pass


def _run_worker(tasks: list[RankTask], chunk: list[list[int]], env: dict, done: queue.Queue, reported: set[int],
                procs: list, worker: _Worker | None = None) -> tuple[bool, str | None]:
    """One worker process over `chunk` (`worker` where one was started early, else a new one),
    its results put on `done` (their indexes in `reported`): (whether it started, why it stopped
    where it stopped before the end)."""
    # Tasks go on the worker's stdin, which it reads whole before answering (a run.json per task
    # would overflow a command line; no file to leave behind).
    payload = "".join(json.dumps([i, b, tasks[i].to_json()]) + "\n" for b, batch in enumerate(chunk) for i in batch).encode()
    try:
        if worker is None:
            worker = _start_worker(env)
            procs.append(worker.proc)
    except Exception as e:  # noqa: BLE001  (cannot start: a process limit, no memory)
        return False, f"{type(e).__name__}: {e}"
    proc, err = worker.proc, worker.err
    with err:
        try:
            with proc:
                try:
                    proc.stdin.write(payload)
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # it died at once: said below, from its exit status and stderr
                _read_worker(proc.stdout, done, reported)
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-1:]
            code = proc.returncode
            status = f"killed by {_signal_name(-code)}" if code < 0 else f"exit status {code}"
            return True, f"{status}: {tail[0]}" if tail else status
        except Exception as e:  # noqa: BLE001  (bad output)
            return True, f"{type(e).__name__}: {e}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name  # SIGKILL: most often the kernel's out-of-memory killer
    except ValueError:
        return f"signal {number}"


def died(task: RankTask, why: str) -> TraceError:
    """The error of a file whose worker never answered, naming the rank where the file name tells it."""
    from profiler.load import rank_from_filename

    path = Path(task.path)
    rank = task.rank if task.rank is not None else rank_from_filename(path)
    return TraceError(path, f"{'rank ' + str(rank) + ': ' if rank is not None else ''}not analysed: {why}")


def _read_worker(stdout, done, reported: set[int]) -> None:
    """Put each result a worker writes (profiler/_worker.py) on `done`; stop where its output breaks off."""
    for line in stdout:  # one JSON line per task, then its summary's bytes
        if not line.endswith(b"\n"):
            return  # the worker died mid-line: its files are reported as failed
        msg = json.loads(line)
        i = msg["index"]
        if "error" in msg:
            res: RankSummary | TraceError = TraceError(Path(msg["path"]), msg["error"])
        else:
            blob = stdout.read(msg["summary_bytes"])
            if len(blob) < msg["summary_bytes"]:
                return  # died mid-summary, as above
            res = _decode(blob)
        done.put((i, res))
        reported.add(i)


def _decode(blob: bytes):
    from profiler.rankmap import decode

    return decode(blob)


def progress_bar(total: int, show: bool, desc: str = "analysing ranks"):
    """ranks done / total on stderr (shown on a terminal, for more than one file)."""
    if not show:  # tqdm's import (~10-40 ms, multiprocessing and importlib.metadata with it) for no bar
        return _NoBar()
    from tqdm import tqdm

    # A terminal that reports 0 columns or rows (some CI and `docker exec -t` ones) would get no bar
    # at all: tqdm hides a bar on 0 rows as on 0 columns.
    size = shutil.get_terminal_size((80, 24))
    return tqdm(total=total, desc=desc, unit="rank", file=sys.stderr, ncols=min(size.columns or 80, 100),
                nrows=size.lines or 24)


class _NoBar:
    """A hidden progress bar: what load._map calls on one, doing nothing."""

    leave = True

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

"""The per-rank map on a Dask distributed cluster: `ptprof analyze PATH --cluster tcp://scheduler:8786`.

    engine = DaskEngine("tcp://scheduler:8786")     # or DaskEngine(client=Client(LocalCluster(...)))
    traces = load_traces(paths, engine=engine)

Each task is `batchmap.summarize_batch` of one batch of files (batchmap.plan_batches: about two
per worker, taken as workers free up; the local engine makes one per worker), and a file's
summary is the same in any batch, so results are identical.
The traces must be on a filesystem the workers share with this machine (same paths). Workers
parse into their own parquet cache ($PTPROF_CACHE_DIR on the worker, else ~/.cache/ptprof), so
only the small summaries travel to the client; event-level views (the viewer's drill-down,
`--hta`) need a local load. A worker that dies (Dask gives its task up after the scheduler's
`allowed-failures` retries: KilledWorker) or a task that raises: each file of its batch runs
again as a task of its own, and one failing alone is that file's problem, named with its rank;
every other rank still loads. Summaries are cached only once whole (summary_cache.py). Workers
that all leave mid-map (none for WORKERS_GONE_S) end the map with one error, as a lost scheduler does.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import CancelledError
from typing import Iterator

from profiler.errors import TraceError
from profiler.pool import died
from profiler.batchmap import plan_batches, summarize_batch
from profiler.rankmap import RankSummary, RankTask

NEEDS_DASK = "--cluster needs dask's distributed package on this machine and the workers: pip install 'dask[distributed]'"
# A scheduler answers within a second on any network a cluster runs on; a wrong address should
# not keep the user waiting (distributed's own default is 30 s).
CONNECT_TIMEOUT_S = 10.0
# Workers that all leave or die mid-map (killed, out of memory, `dask worker` stopped) leave the
# tasks waiting on the scheduler for good: with none for this long, the map stops and says so. A
# nanny restarts a killed worker in seconds; a cluster manager may take longer to replace one.
WORKERS_GONE_S = 30.0


class DaskEngine:
    """`summarize_batch` as one Dask task per batch of files; `address` of a running scheduler, or an existing `client`."""

    remote = True  # workers cache into their own folders; the client holds summaries only

    def __init__(self, address: str | None = None, *, client=None, timeout_s: float = CONNECT_TIMEOUT_S):
        try:
            from distributed import Client
        except ImportError:
            raise TraceError(None, NEEDS_DASK) from None
        if client is None:
            reach = (f"--cluster {address}: cannot reach the Dask scheduler ({{}}); start one with `dask scheduler` and "
                     "workers with `dask worker ADDRESS`, or leave out --cluster")
            try:
                _probe(address, timeout_s)
            except ValueError as e:
                raise TraceError(None, f"--cluster {address}: not a scheduler address ({e}); e.g. tcp://host:8786") from None
            except OSError as e:  # refused, no such host, unreachable, timed out
                raise TraceError(None, reach.format(e)) from None
            try:
                client = _connect(Client, address, timeout_s)
            except (OSError, TimeoutError) as e:
                raise TraceError(None, reach.format(e)) from None
            except Exception as e:  # noqa: BLE001  (something listens there, but speaks no Dask: garbage frames)
                raise TraceError(None, f"--cluster {address}: what answers there is not a Dask scheduler "
                                       f"({type(e).__name__}: {str(e)[:200]})") from None
        self.client = client
        try:
            _has_workers(client, address, timeout_s)
            _same_code(client)
        except BaseException:
            if address is not None:  # ours to close (a client handed in is the caller's)
                client.close()
            raise
        self._loud: list = []  # (logger, level) to restore at close() when a lost scheduler kept them quiet
        self.workers_gone_s = WORKERS_GONE_S
        self.workers = max(1, len(client.nthreads()))  # scheduler_info() lists only a few workers in some releases

    def map(self, tasks: list[RankTask]) -> Iterator[tuple[int, RankSummary | TraceError]]:
        from distributed import as_completed

        if not tasks:
            return
        # Keys unique to this load (a uuid each): on a shared scheduler another client's task of the
        # same name would otherwise be handed to us, its summary taken for ours.
        load = uuid.uuid4().hex
        futures, index = [], {}

        lock = threading.Lock()  # a task is submitted and listed, or the watch cancels what is listed: not both at once

        def submit(batch: list[int]):
            with lock:
                if watch is not None and watch.gone:  # cancelled for want of workers: no new task to wait on
                    raise _gone(done, len(tasks), self.workers_gone_s)
                # pure=False: two loads of one file are two tasks (the file may have changed in between).
                fut = self.client.submit(summarize_batch, [tasks[i] for i in batch], pure=False,
                                         key=f"ptprof-batch-{batch[0]}-{len(batch)}-{load}")
                futures.append(fut)
            index[fut.key] = batch
            return fut

        watch, done = None, 0
        pending = as_completed([submit(b) for b in plan_batches(tasks, self.workers)])
        # distributed logs a lost connection as tracebacks on stderr; we say it in one line instead.
        quiet = [logging.getLogger(n) for n in ("distributed", "distributed.client", "distributed.core")]
        levels = [q.level for q in quiet]
        for q in quiet:
            q.setLevel(logging.CRITICAL)
        lost = False
        watch = _Watch(self.client, futures, lock, self.workers_gone_s)
        try:
            for fut in pending:
                batch = index[fut.key]
                try:
                    results = fut.result()
                except (Exception, CancelledError) as e:  # noqa: BLE001  (KilledWorker, a task that raised, a lost connection)
                    if watch.gone:
                        raise _gone(done, len(tasks), self.workers_gone_s) from None
                    if self.client.status not in ("running", "connecting") or "connection-lost" in str(e):
                        # The scheduler is gone: every rank not done is lost, not each its own problem.
                        lost = True
                        raise TraceError(None, f"--cluster: lost the Dask scheduler after {done} of {len(tasks)} ranks "
                                               f"({type(e).__name__}); nothing was reported: run again when it is back, "
                                               "or without --cluster") from None
                    if len(batch) > 1:  # each file again on its own: only a failing one is named
                        for i in batch:
                            pending.add(submit([i]))
                        continue
                    why = f"its Dask task failed ({_task_failure(e)})"
                    results = [died(tasks[batch[0]], why)]
                for i, res in zip(batch, results):
                    done += 1
                    if isinstance(res, TraceError) and "No such file" in res.problem:
                        # Read on a worker: the client may well see the file; say where it was looked for.
                        res = TraceError(res.path, f"{res.problem} on a Dask worker (the workers must see the traces at "
                                                   "the same absolute path, e.g. a shared filesystem)")
                    if isinstance(res, RankSummary):
                        # Events parsed on a worker stay there (its own cache): never a path the client
                        # would read, nor a frame worth shipping.
                        res = RankSummary(res.meta, res.rank, None, res.frames, res.unstored)
                    yield i, res
        finally:
            watch.stop()
            # With the scheduler gone, the client's reconnect task logs its traceback when the
            # client closes: stay quiet until close() (our one line says it all).
            self._loud = list(zip(quiet, levels))
            if not lost:
                self._restore_logs()
            for f in futures:
                f.release()

    def _restore_logs(self) -> None:
        for q, level in self._loud:
            q.setLevel(level)
        self._loud = []

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self._restore_logs()


def _task_failure(e: BaseException) -> str:
    """What failed a Dask task, in one short line: KilledWorker's own text (a paragraph ending in a
    worker's address and a link) cut at 200 characters stopped mid-word and never said why."""
    name = type(e).__name__
    if name == "KilledWorker":
        return ("KilledWorker: each worker that ran it died, the usual causes being its memory limit or the out-of-memory "
                "killer; the workers' logs say which")
    from profiler.textfmt import truncate

    return truncate(f"{name}: {' '.join(str(e).split())}", 200)


def _gone(done: int, total: int, gone_s: float) -> TraceError:
    return TraceError(None, f"--cluster: no Dask worker for {gone_s:g} s after {done} of {total} ranks: every worker "
                            "left or died (out of memory? stopped?); nothing was reported: start workers and run again, "
                            "or run without --cluster")


class _Watch:
    """Counts the scheduler's workers once a second while a map runs; after `gone_s` with none
    while some task is unfinished, sets `gone` and cancels the unfinished ones, so that the map's
    wait ends (each then raises CancelledError, which the map words as the workers' loss; a task
    done before is read as usual, and the map submits none after)."""

    def __init__(self, client, futures: list, lock: threading.Lock, gone_s: float):
        self.gone, self._stop = False, threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, futures, lock, gone_s), daemon=True,
                                        name="ptprof-dask-watch")
        self._thread.start()

    def _run(self, client, futures: list, lock: threading.Lock, gone_s: float) -> None:
        since = None
        while not self._stop.wait(min(1.0, gone_s / 4)):
            try:
                n = len(client.nthreads())
            except Exception:  # noqa: BLE001  (the scheduler lost: the map says that itself)
                return
            waiting = [f for f in list(futures) if not f.done()]
            if n or not waiting:  # workers, or nothing left for them (an adaptive cluster scaled down): fine
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= gone_s:
                with lock:  # every task listed by now is cancelled, and none is submitted after
                    self.gone = True
                    try:
                        client.cancel([f for f in futures if not f.done()])
                    except Exception:  # noqa: BLE001
                        pass
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)  # a daemon: one stuck in a call to a dead scheduler is left behind


def _connect(Client, address: str, timeout_s: float):
    """Client(address) within a wall-clock limit: distributed's own timeout does not cover the first
    exchange, so a port that accepts and never answers (the dashboard's 8787, another service)
    would hang the load for good. The connecting thread is left behind (a daemon) when it is late."""
    import threading

    got: dict = {}

    def connect() -> None:
        try:
            got["client"] = Client(address, timeout=timeout_s)
        except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
            got["error"] = e

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    late = timeout_s + min(5.0, timeout_s)  # distributed's own timeout first, then a grace
    t.join(late)
    if "error" in got:
        raise got["error"]
    if "client" not in got:
        raise TimeoutError(f"no Dask answer within {late:g} s: is it the scheduler's port (8786 by default; "
                           "8787 is its dashboard)?")
    return got["client"]


def _has_workers(client, address: str | None, timeout_s: float) -> None:
    """A scheduler without workers would take the tasks and never run them: wait a little, then say so."""
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except TimeoutError:
        raise TraceError(None, f"--cluster {address or client.scheduler.address}: the scheduler has no workers after "
                               f"{timeout_s:g} s; start some with `dask worker {address or 'ADDRESS'}`") from None


def _same_code(client) -> None:
    """Refuse workers running another ptprof: their summaries would be another analysis's numbers
    (and the summary cache's key, the code's hash, would not say so)."""
    from profiler.summary_cache import code_version

    ours = code_version()
    try:
        theirs = client.run(code_version)  # {worker address: its hash}; workers joining later are not asked
    except Exception as e:  # noqa: BLE001  (a worker without ptprof: ModuleNotFoundError there)
        raise TraceError(None, f"--cluster: could not ask the Dask workers which ptprof they run ({type(e).__name__}: "
                               f"{str(e)[:200]}); install the same ptprof on the workers") from None
    other = {w: v for w, v in theirs.items() if v != ours}
    if other:
        w, v = sorted(other.items())[0]
        raise TraceError(None, f"--cluster: {len(other)} of {len(theirs)} Dask workers run another version of ptprof's "
                               f"profiler (code {v} on {w}, {ours} here); install the same ptprof on the workers")


def _probe(address: str | None, timeout_s: float) -> None:
    """Fail at once where nothing listens at a tcp:// or tls:// address: distributed's Client
    retries a refused connection until its timeout, so a typo would cost the whole wait."""
    import socket

    from distributed.comm import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    scheme, loc = parse_address(address or "")  # ValueError on a malformed one
    get_backend(scheme)  # ValueError: unknown address scheme 'http'
    if scheme not in ("tcp", "tls"):
        return  # inproc://, ucx://, ws://: Client tells
    if "/" in loc:  # tcp://host:8786/ : a URL's path has no place in a scheduler address
        raise ValueError(f"{loc!r} has a '/' after the host and port (no path: tcp://host:port)")
    try:
        host, port = parse_host_port(loc)
    except ValueError as e:  # a port that is no number: distributed passes on int()'s "invalid literal ..."
        if "invalid literal" not in str(e):
            raise
        raise ValueError(f"{loc!r}: the port is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not a port number")
    with socket.create_connection((host, port), timeout=timeout_s):
        pass

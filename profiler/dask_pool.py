"""The per-rank map on a Dask distributed cluster: `ptprof analyze PATH --cluster tcp://scheduler:8786`.

    engine = DaskEngine("tcp://scheduler:8786")     # or DaskEngine(client=Client(LocalCluster(...)))
    traces = load_traces(paths, engine=engine)

Each task is `rankmap.summarize` of one file, as in the local engine, so results are identical.
The traces must be on a filesystem the workers share with this machine (same paths). Workers
parse into their own parquet cache ($PTPROF_CACHE_DIR on the worker, else ~/.cache/ptprof), so
only the small summaries travel to the client; event-level views (the viewer's drill-down,
`--hta`) need a local load. A worker that dies (Dask gives its task up after the scheduler's
`allowed-failures` retries: KilledWorker) or a task that raises is that file's problem, named
with its rank; every other rank still loads. Summaries are cached only once whole (summary_cache.py).
"""

from __future__ import annotations

from typing import Iterator

from profiler.errors import TraceError
from profiler.pool import died
from profiler.rankmap import RankSummary, RankTask, summarize

NEEDS_DASK = "--cluster needs dask's distributed package on this machine and the workers: pip install 'dask[distributed]'"


class DaskEngine:
    """`summarize` as one Dask task per file; `address` of a running scheduler, or an existing `client`."""

    name = "dask"
    remote = True  # workers cache into their own folders; the client holds summaries only

    def __init__(self, address: str | None = None, *, client=None, timeout_s: float = 30):
        try:
            from distributed import Client
        except ImportError:
            raise TraceError(None, NEEDS_DASK) from None
        if client is None:
            try:
                client = Client(address, timeout=timeout_s)
            except (OSError, TimeoutError) as e:
                raise TraceError(None, f"--cluster {address}: cannot reach the Dask scheduler ({e}); start one with "
                                       "`dask scheduler` and workers with `dask worker ADDRESS`, or leave out --cluster") from None
            except ValueError as e:  # a malformed address
                raise TraceError(None, f"--cluster {address}: not a scheduler address ({e}); e.g. tcp://host:8786") from None
        self.client = client
        self.workers = max(1, len(client.scheduler_info().get("workers", {})) or 1)

    def map(self, tasks: list[RankTask]) -> Iterator[tuple[int, RankSummary | TraceError]]:
        from distributed import as_completed

        if not tasks:
            return
        # pure=False: two loads of one file are two tasks (the file may have changed in between).
        futures = self.client.map(summarize, tasks, pure=False, key=[f"ptprof-rank-{i}-{id(t)}" for i, t in enumerate(tasks)])
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in as_completed(futures):
                i = index[fut.key]
                try:
                    res = fut.result()
                except Exception as e:  # noqa: BLE001  (KilledWorker, a task that raised, a lost connection)
                    res = died(tasks[i], f"its Dask task failed ({type(e).__name__}: {str(e)[:200]})")
                if isinstance(res, RankSummary):
                    # Events parsed on a worker stay there (its own cache): never a path the client
                    # would read, nor a frame worth shipping.
                    res = RankSummary(res.meta, res.rank, None, res.frames, res.unstored, None)
                yield i, res
        finally:
            for f in futures:
                f.release()

    def close(self) -> None:
        self.client.close()

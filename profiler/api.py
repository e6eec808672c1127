"""`profiler.load_traces` and `profiler.analyze`: the API's two calls, imported without polars.

    from profiler import load_traces, analyze     # neither polars nor numpy yet
    a = analyze(load_traces("traces/ddp-2r"))

A script's first `load_traces` pays the profiler's imports (polars, numpy, the analyses: ~0.2 s
on one core) and then the map: parsing the files the cache lacks. `ptprof analyze` starts that
work before its imports (cli.py): the worker processes, which import side by side with it, or
for a map done in this process, a child that scans the files meanwhile (prescan.py). These two
names do the same for the API: they stay polars-free until called (`from profiler import
load_traces, analyze` would otherwise import polars at the `from`, before any path is known),
and `load_traces` starts the map's work before importing the loader. On the 54 MB bench trace,
a cold script's `analyze(load_traces(path))` went 0.74 -> 0.69 s (README, Benchmarks).

Where polars is already imported (a notebook), or a thread other than this one runs (prescan
does not fork then), only the workers start early; with an `engine` given, nothing does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from profiler.load import Traces
    from profiler.rankmap import MapOptions
    from profiler.report import Analysis


def load_traces(
    paths: str | Path | list[str | Path],
    *,
    rank_from_filename_first: bool = False,
    default_rank: int | None = None,
    cache: bool = True,
    workers: int | None = None,
    progress: bool | None = None,
    options: MapOptions | None = None,
    engine=None,
) -> Traces:
    """Load trace files / run folders, every rank of every run, each file summarized where it is parsed.

    rank_from_filename_first: take the rank from the file name even where distributedInfo has one.
    default_rank: the rank of a trace that names none (only sensible for a single file). Without
    it, a run's only file naming no rank is rank 0 (said in `notes`); several such files are errors.
    cache: read and write the parse cache ($PTPROF_CACHE_DIR, else ~/.cache/ptprof).
    workers: local worker processes for the per-rank map (default: one per core; a small set is
        done in this process; more than two per core are capped there, with a warning).
    progress: a bar of ranks done (default: when stderr is a terminal).
    options: what the per-rank analyses run with (--step, --top); `analyze` with other options
        analyzes the ranks again, in this process.
    engine: runs the per-rank map (pool.LocalEngine(workers) by default; dask_pool.DaskEngine).
    Raises TraceError when nothing usable is left; otherwise bad files are listed in `problems`.
    """
    from profiler.startup import collector_paused, ctrl_c_held

    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)  # once: a generator is read here only
    early = None
    if engine is None:
        from profiler.pool import LocalEngine, uncached_files  # neither imports polars

        early = engine = LocalEngine(workers)
    try:
        with ctrl_c_held():  # as cli.py: a Ctrl-C inside Popen or an import would be lost or half-done
            if early is not None:
                early.start_early(uncached_files(paths, cache=cache))
            with collector_paused():  # profiler.startup: ~20 ms of a cold import
                from profiler.load import load_traces as load
        return load(paths, rank_from_filename_first=rank_from_filename_first, default_rank=default_rank, cache=cache,
                    workers=workers, progress=progress, options=options, engine=engine)
    finally:
        if early is not None:  # the workers it started and no map took; the scan's child
            early.close()


def analyze(traces: Traces, *, rank: int | None = None, step: int | None = None, top_n: int = 15) -> Analysis:
    """Run every analysis; `rank` / `step` restrict them to one rank / one ProfilerStep. Returns an
    `Analysis` (profiler/report.py: one frame per analysis, the findings, the theory beside the
    measurements); `build_report` makes it the JSON report, `format_tables` the text one."""
    from profiler.report import analyze as run

    return run(traces, rank=rank, step=step, top_n=top_n)

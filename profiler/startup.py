"""Process start-up: numpy's BLAS on one thread, and heavy imports with the cyclic garbage
collector paused.

    one_blas_thread()          # first, before anything imports numpy
    with collector_paused():
        import polars  # and the analyses

Importing polars, numpy and the analyses allocates ~300,000 objects that live until exit; the
collector, triggered every 700 allocations, walks them ~100 times on the way and finds no
garbage: ~20 ms of a cold `ptprof analyze` (and of each worker process) before any work.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading

# numpy's OpenBLAS starts a thread for each further core when numpy is imported, and they spin
# waiting for work before they sleep: ~50 ms of CPU per process on this 2-core machine, taken from
# the prescan child and the worker processes. ptprof calls no BLAS routine that a thread could
# speed up (one least-squares fit of a few points, project_measure). Measured (README, Benchmarks,
# a sixth session): a cold `ptprof analyze` of 8 x 1 MB, CPU 0.67 -> 0.54 s; of 8 x 100 MB,
# 6.35 -> 6.22 s. Set by `python -m profiler` (what `ptprof analyze|project|plan` run) and given to
# the pool's workers (pool._worker_env); not by `import profiler`: a library leaves its caller's
# environment alone.
# OpenBLAS takes its thread count from the first of these that is set.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def blas_threads_env(environ) -> dict[str, str]:
    """{"OPENBLAS_NUM_THREADS": "1"}, or {} where the user set any variable OpenBLAS reads (theirs wins)."""
    return {} if any(environ.get(k) for k in BLAS_THREAD_VARS) else {"OPENBLAS_NUM_THREADS": "1"}


def one_blas_thread() -> None:
    """numpy's BLAS on one thread in this process and the ones it starts, unless the user said
    otherwise. Effective only before numpy's first import (OpenBLAS reads it once, when loaded)."""
    os.environ.update(blas_threads_env(os.environ))


@contextlib.contextmanager
def collector_paused(freeze: bool = False):
    """Pause the cyclic collector for the block; as it was afterwards (re-entrant). `freeze`: then
    move every object alive into the permanent generation, for a process whose imports live until
    it exits (the CLI's): paused imports leave ~200k objects in the youngest generation, and the
    next collections would walk them all (~20-30 ms of an 8 x 1 MB run, gen0 and gen1 each).
    Not for the API: freezing its caller's objects would keep their cycles from being collected."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was:
            gc.enable()


@contextlib.contextmanager
def ctrl_c_held():
    """Ctrl-C (SIGINT) held until the block ends, then raised as KeyboardInterrupt. For blocks a
    KeyboardInterrupt must not land in the middle of: Popen waiting for a child's exec (the child
    would be lost, pool.py), or imports, where Python runs callbacks of its own (a module lock's
    weakref) in which it prints a KeyboardInterrupt as "Exception ignored" and goes on as if no
    Ctrl-C came. Only where Python's own handler is installed (the main thread, no handler of the
    caller's: nested, the outer block holds it)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if got:
        raise KeyboardInterrupt

"""Process start-up: heavy imports with the cyclic garbage collector paused.

    with collector_paused():
        import polars  # and the analyses

Importing polars, numpy and the analyses allocates ~300,000 objects that live until exit; the
collector, triggered every 700 allocations, walks them ~100 times on the way and finds no
garbage: ~20 ms of a cold `ptprof analyze` (and of each worker process) before any work.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import threading


@contextlib.contextmanager
def collector_paused():
    """Pause the cyclic collector for the block; as it was afterwards (re-entrant)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
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

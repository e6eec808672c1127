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

"""`python -m profiler analyze ...`: what the `ptprof analyze` console command runs."""

import gc
import os
import sys

from profiler.startup import one_blas_thread

one_blas_thread()  # before anything imports numpy (startup.py)
try:
    from profiler.cli import main

    status = main()
except KeyboardInterrupt:
    # A Ctrl-C before the command's own handling began (this import, its arguments): one line, as
    # any later one gives. One during Python's own start, before this file runs, still shows
    # CPython's traceback.
    command = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in ("analyze", "project", "plan") else ""
    print(f"ptprof{' ' + command if command else ''}: interrupted", file=sys.stderr)
    status = 130
except BrokenPipeError:
    # The reader closed the pipe (`ptprof analyze RUN | head`): stop quietly, as Unix tools do,
    # with stdout pointed at /dev/null so the interpreter's final flush cannot raise again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 141  # 128 + SIGPIPE
# The interpreter's exit walks every object the collector tracks, most of them polars' and
# numpy's module objects: ~50-100 ms. Frozen, they are left to the OS; nothing of ours needs a
# collection to be finalized (files are closed, the cache's writes joined, temp folders removed
# by their atexit finalizers, which still run).
gc.freeze()
sys.exit(status)

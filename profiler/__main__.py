"""`python -m profiler analyze ...`: what the `ptprof analyze` console command runs."""

import gc
import os
import sys

from profiler.cli import main

try:
    status = main()
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

"""`python -m profiler analyze ...`: what the `ptprof analyze` console command runs."""

import os
import sys

from profiler.cli import main

try:
    sys.exit(main())
except BrokenPipeError:
    # The reader closed the pipe (`ptprof analyze RUN | head`): stop quietly, as Unix tools do,
    # with stdout pointed at /dev/null so the interpreter's final flush cannot raise again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(141)  # 128 + SIGPIPE

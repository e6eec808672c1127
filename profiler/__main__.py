"""`python -m profiler analyze ...`: what the `ptprof analyze` console command runs."""

import sys

from profiler.cli import main

sys.exit(main())

"""Worker process of `load_traces`: parse the files named on the command line into `out_dir`.

    python -m profiler._worker OUT_DIR FILE...

Prints one JSON line per file as it finishes: {"path", "parquet", "meta"} or {"path", "error"}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from profiler.errors import TraceError
from profiler.cache import load_one_safe


def main(argv: list[str]) -> None:
    out_dir, files = Path(argv[0]), argv[1:]
    for f in files:
        res = load_one_safe(Path(f), out_dir)
        msg = {"path": f, "error": res.problem} if isinstance(res, TraceError) else {"path": f, "meta": res[0], "parquet": res[1]}
        print(json.dumps(msg), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

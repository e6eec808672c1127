"""The `ptprof` command's entry point: `analyze`, `project`, `plan` and `view` are handed to
`python -m profiler` / `python -m viewer` before anything else is imported; `run` and `list` load
runners/cli.py.

Why a module of its own: runners/cli.py imports the runners' modules (psutil, the paradigms'
flags) at its top, which `ptprof analyze` does not need. Imported by the console script, they cost
`analyze` their time, and a Ctrl-C in them (the first ~0.15 s) printed a traceback where any later
one prints one line.
"""

from __future__ import annotations

import os
import sys

EXIT_USAGE = 2  # bad arguments or an impossible request: nothing was started
HANDED_OVER = {"analyze": "profiler", "project": "profiler", "plan": "profiler", "view": "viewer"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in HANDED_OVER:  # they keep their own flags: handed over untouched
            return exec_module(HANDED_OVER[argv[0]], argv)
        from runners.cli import main as cli_main
    except KeyboardInterrupt:
        print("ptprof: interrupted", file=sys.stderr)
        return 130
    return cli_main(argv)


def exec_module(module: str, args: list[str]) -> int:
    """Replace this process with `python -m <module> ARGS` (exit status and signals pass through)."""
    import importlib.util

    if importlib.util.find_spec(module) is None or importlib.util.find_spec(f"{module}.__main__") is None:
        print(f"ptprof: `{args[0] if args else module}` is not yet available in this version", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])
    return 0  # not reached

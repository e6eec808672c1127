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
# Run as `python -m profiler` would, in this process: a second interpreter's start (~35 ms with an
# editable install's import hook) saved, and with it a second window in which a Ctrl-C could only
# give CPython's traceback. The viewer is exec'd: Dash's reloader restarts from sys.argv.
IN_PROCESS = {"analyze", "project", "plan"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in HANDED_OVER:  # they keep their own flags: handed over untouched
            return hand_over(argv)
        from runners.cli import main as cli_main
    except KeyboardInterrupt:  # `ptprof analyze: interrupted`, as the command itself says it
        print(f"ptprof{' ' + argv[0] if argv and argv[0] in HANDED_OVER else ''}: interrupted", file=sys.stderr)
        return 130
    return cli_main(argv)


def hand_over(argv: list[str]) -> int:
    """Run `ptprof analyze|project|plan|view ARGS` as `python -m profiler|viewer` would."""
    module = HANDED_OVER[argv[0]]
    return run_module(module, argv) if argv[0] in IN_PROCESS else exec_module(module, argv)


def run_module(module: str, args: list[str]) -> int:
    """`python -m <module> ARGS` in this process (its __main__ ends with sys.exit: SystemExit carries the status)."""
    import runpy

    sys.argv = [sys.argv[0], *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0  # a __main__ that returns without sys.exit


def exec_module(module: str, args: list[str]) -> int:
    """Replace this process with `python -m <module> ARGS` (exit status and signals pass through)."""
    import importlib.util

    if importlib.util.find_spec(module) is None or importlib.util.find_spec(f"{module}.__main__") is None:
        print(f"ptprof: `{args[0] if args else module}` is not yet available in this version", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])
    return 0  # not reached

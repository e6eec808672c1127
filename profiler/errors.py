"""The one exception the profiler raises for bad input, and the warnings it attaches to results."""

from __future__ import annotations

from pathlib import Path


class TraceError(Exception):
    """A trace (or a set of traces) the profiler cannot use: which file, and what is wrong with it.

    `str(err)` is the message the CLI prints as is (exit status 2, no traceback), so `problem`
    should say what is wrong *and* what to do about it where there is something to do.
    """

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

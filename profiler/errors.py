"""The one exception the profiler raises for bad input, and how names from the outside are printed."""

from __future__ import annotations

import os
import re
from pathlib import Path

# C0/C1 control characters (newlines, ANSI escapes) and the bidirectional overrides that make
# text display other than it reads: in a file, run or event name they are escaped when printed.
_CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                               *range(0x2066, 0x206A))]
CONTROL_ESCAPES = {c: c.encode("unicode_escape").decode("ascii") for c in _CONTROLS}
_TRANSLATE = str.maketrans(CONTROL_ESCAPES)


def path_text(path: str | Path) -> str:
    """A path as valid UTF-8 text: bytes of a non-UTF-8 file name become `\\xNN` (polars and
    terminals take only valid text)."""
    text = os.fspath(path)
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the file system's undecodable bytes, back as bytes
    except UnicodeEncodeError:  # other lone surrogates (from an escaped JSON string)
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


def printable(text: str) -> str:
    """`text` safe to print on one terminal line: control characters (newline, ESC) and the bytes
    of non-UTF-8 names as escapes (`\\n`, `\\x1b`, `\\xff`)."""
    return path_text(text).translate(_TRANSLATE)


def _shortened(text: str, limit: int = 300) -> str:
    # A 5,000-character path would make the one-line message a screenful: its head and tail name it.
    return text if len(text) <= limit else f"{text[:150]}...({len(text) - 250:,} characters)...{text[-100:]}"


class TraceError(Exception):
    """A trace (or a set of traces) the profiler cannot use: which file, and what is wrong with it.

    `str(err)` is the message the CLI prints as is (exit status 2, no traceback), so `problem`
    should say what is wrong *and* what to do about it where there is something to do. The path
    is kept printable (its odd characters escaped), so the message never garbles a terminal.
    """

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else _shortened(printable(str(path)))
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

    def __reduce__(self):
        # Pickled as it is (a Dask worker's result travels so): the default would call
        # TraceError(message), and the path is already escaped and shortened.
        return rebuilt, (self.path, self.problem)


def rebuilt(path: str | None, problem: str) -> TraceError:
    """A TraceError of a path already made printable and shortened (a pickled one, a merged one)."""
    err = TraceError(None, problem)
    err.path = path
    err.args = (f"{path}: {problem}" if path else problem,)
    return err


SKIPPED_SHOWN = 3  # files named per kind of problem before the rest is counted


def collapsed_problems(problems: list) -> list[str]:
    """The problems of a load as lines: each kind of problem (its text past a leading "rank N: ")
    names its first SKIPPED_SHOWN files whole, then one line counts the rest. 63 copies of one rank
    made 63 skipped lines (189 of a 305-line report); at 1,024 ranks thousands. The JSON report's
    `problems` keeps every one."""
    groups: dict[str, list] = {}
    for p in problems:
        text = getattr(p, "problem", None) or str(p)
        # The kind: the text with its numbers as '#' ("duplicate rank 7 ... (kept: old_rank7.json.gz"),
        # so two copies of a 1,024-rank run make one kind, not 1,024.
        groups.setdefault(re.sub(r"\d+", "#", re.sub(r"^rank \d+: ", "", text)), []).append(p)
    lines = []
    for members in groups.values():
        lines += [str(p) for p in members[:SKIPPED_SHOWN]]
        if len(members) > SKIPPED_SHOWN:
            rest = len(members) - SKIPPED_SHOWN
            kind = re.sub(r"^rank \d+: ", "", getattr(members[-1], "problem", None) or str(members[-1]))
            short = kind if len(kind) <= 100 else kind[:100].rsplit(" ", 1)[0] + " …"
            lines.append(f"{rest:,} more file{'s' if rest > 1 else ''} with a problem of the same kind (the last: {short}); "
                         f"every one in --json's problems")
    return lines

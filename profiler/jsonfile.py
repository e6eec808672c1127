"""Reports as JSON files: indented for people, written at C speed.

json.dumps(indent=...) runs Python's pure-Python encoder (its C encoder serves only compact
output): 2.1 s for the 26 MB report of 1,024 ranks against 0.6 s compact. msgspec encodes in C
and indents in C. Reports hold only JSON values (report.py nulls NaN and inf first).
"""

from __future__ import annotations

import msgspec


def dumps(obj) -> bytes:
    """`obj` as indented JSON (one space per level, as `json.dumps(obj, indent=1)`; UTF-8, not \\u-escaped)."""
    return msgspec.json.format(msgspec.json.encode(obj), indent=1) + b"\n"


def write_stdout(obj) -> None:
    """`obj` as `dumps` gives it, alone on standard output (`--json -`): text printed before it is
    flushed first, so nothing interleaves."""
    import sys

    sys.stdout.flush()
    sys.stdout.buffer.write(dumps(obj))
    sys.stdout.flush()


def unwritable(path: str, example: str = "report.json") -> str | None:
    """Why `--json path` cannot be written, checked before the work (not after a long analysis):
    its folder is missing, it is a folder, or opening it for writing fails (a read-only place,
    /proc, no permission); None where it can. A file made by the check is removed again, so a run
    that fails later leaves none behind; an existing file is left as it was (opened to append)."""
    import os
    import stat
    from pathlib import Path

    out = Path(path)
    if not out.resolve().parent.is_dir():
        # A link whose target's folder is missing: that folder is the one to name, not the link's.
        return f"it links to {out.resolve().parent}/, which does not exist" if out.is_symlink() else "its folder does not exist"
    if out.is_dir():
        return f"this is a folder; name the report file (e.g. {example})"
    try:
        mode = out.lstat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        return f"cannot write the report ({e.strerror or e})"
    if mode is not None and not stat.S_ISREG(mode):
        # A FIFO (a reader waits on it: opening and closing it would end the reader's input), a
        # device, a link (a dangling one would be created and left): asked, not opened.
        target = out if out.exists() else out.resolve().parent
        return None if os.access(target, os.W_OK) else "cannot write the report (Permission denied)"
    try:
        with open(out, "ab"):  # appending changes nothing of an existing file
            pass
    except OSError as e:
        return f"cannot write the report ({e.strerror or e})"
    if mode is None:  # made by the check: removed, so a run that fails later leaves none behind
        try:
            out.unlink()
        except OSError:
            pass
    return None

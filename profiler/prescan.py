"""A cold load's files scanned by a forked child while this process imports polars and the analyses.

    prescan.start(paths)    # first thing, before any heavy import; no-op where it cannot help
    ...                     # import polars, numpy, the analyses (~0.3 s on one core)
    parse_stream.scan_file(path)   # takes the child's scan of `path` where there is one
    prescan.stop()          # the child killed and reaped if still running, its file closed

Where a load analyses its files in this process (one file; pool.LocalEngine.map), a cold
`ptprof analyze` did its work in series on one core: ~0.3 s of imports, then the C scan (~0.2 s
for a 54 MB trace), then the analyses; the other core idled. The scan needs only the C parser and
zlib, so a child forked before the imports scans the files on the other core meanwhile and leaves
each `_kineto` dict, pickled, in an unnamed temporary file (not a pipe: a pipe would stall the
child until this process, busy importing, read it).

A scan is taken only where it is surely of the file as it is now: the child records each file's
stat (device, inode, size, mtime, ctime) before and after scanning it, and `take` compares both
with the file's stat when it is asked for; anything else (the file changed, the child failed, was
killed, ran out of memory, or never got that far) gives None and the caller scans the file
itself, which then words any problem exactly as it always has.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
from pathlib import Path

# The child's scans are held in one temporary file (~0.6 of the JSON) and read back whole: only
# sets this small are scanned ahead. Past it the scan outlasts the imports anyway (~0.5 s).
MAX_FILE_BYTES = 16 << 20

_active: _Prescan | None = None


def _signature(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Prescan:
    def __init__(self, pid: int, out):
        self.pid, self.out = pid, out
        self.scans: dict[tuple, dict | None] | None = None  # by signature, once read back

    def take(self, path) -> tuple[bool, dict | None]:
        """(found, the scan) of `path` as the file is now."""
        if self.scans is None:
            self.scans = self._read_back()
        try:
            sig = _signature(os.stat(path))
        except OSError:
            return False, None
        if sig not in self.scans:
            return False, None
        return True, self.scans.pop(sig)

    def _read_back(self) -> dict:
        """The child's scans once it has exited cleanly; none if it did not (killed, failed)."""
        status = _reap(self.pid, wait=True)
        self.pid = None
        scans: dict = {}
        if status != 0:
            return scans
        try:
            self.out.seek(0)
            while True:
                try:
                    before, after, parsed = pickle.load(self.out)
                except EOFError:
                    break
                if before == after:  # unchanged while it was scanned
                    scans[before] = parsed
        except Exception:  # noqa: BLE001  (a damaged temporary file: scan the files here instead)
            scans.clear()
        finally:
            self.out.close()
        return scans

    def stop(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass
            _reap(self.pid, wait=True)
            self.pid = None
        self.out.close()
        self.scans = None


def _reap(pid: int, *, wait: bool) -> int | None:
    """The child's exit status (negative: killed by that signal); None while it runs (wait=False)."""
    while True:
        try:
            got, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            return -1  # reaped elsewhere: its scans are not to be trusted
        except InterruptedError:
            continue
        if got == 0:
            return None
        return os.waitstatus_to_exitcode(status)


def start(paths: list) -> bool:
    """Fork a child that scans `paths` (regular files, at most MAX_FILE_BYTES in all, in this
    order); whether it started. Not where another thread runs (fork copies only this one, and a
    lock another held stays held), nor without os.fork, nor for nothing to scan."""
    global _active
    stop()
    if not paths or not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    try:
        if sum(os.stat(p).st_size for p in paths) > MAX_FILE_BYTES:
            return False
        out = tempfile.TemporaryFile()
    except OSError:
        return False
    try:
        pid = os.fork()
    except OSError:
        out.close()
        return False
    if pid == 0:  # the child: never back into the caller's code, nor its atexit handlers or buffers
        code = 1
        try:
            _scan_all([str(p) for p in paths], out)
            code = 0
        finally:
            os._exit(code)
    _active = _Prescan(pid, out)
    return True


def _scan_all(paths: list[str], out) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the parent stops us (stop())
    from profiler.parse_stream import scan_file

    for path in paths:
        try:
            before = _signature(os.stat(path))
        except OSError:
            continue
        parsed = scan_file(path, prescanned=False)
        try:
            after = _signature(os.stat(path))
        except OSError:
            continue
        pickle.dump((before, after, parsed), out, protocol=pickle.HIGHEST_PROTOCOL)
        del parsed
    out.flush()


def take(path) -> tuple[bool, dict | None]:
    """(True, the child's scan of `path`) where it scanned the file as it is now, else (False, None).
    The first call waits for the child to finish."""
    if _active is None:
        return False, None
    try:
        return _active.take(Path(path))
    except Exception:  # noqa: BLE001  (never the reason a file fails: it is scanned here instead)
        return False, None


def stop() -> None:
    """Stop the child (if still running), drop what it left. Safe to call at any time."""
    global _active
    active, _active = _active, None
    if active is not None:
        active.stop()

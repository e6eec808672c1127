"""A cold load's files scanned by a forked child while this process imports polars and the analyses.

    prescan.start(paths)    # first thing, before any heavy import; no-op where it cannot help
    ...                     # import polars, numpy, the analyses (~0.3 s on one core)
    parse_stream.scan_file(path)   # takes the child's scan of `path` where there is one
    prescan.stop()          # the child killed and reaped if still running, its file closed

Where a load analyses its files in this process (one file, or a set too small to pay for worker
processes: pool.LocalEngine), a cold `ptprof analyze` did its work in series on one core: ~0.3 s of imports, then the C scan (~0.2 s
for a 54 MB trace), then the analyses; the other core idled. The scan needs only the C parser and
zlib, so a child forked before the imports scans the files on the other core meanwhile and leaves
each `_kineto` dict, pickled, in an unnamed temporary file (not a pipe: a pipe would stall the
child until this process, busy importing, read it).

A scan is taken only where it is surely of the file as it is now: the child records each file's
stat (device, inode, size, mtime, ctime) before and after scanning it and the SHA-256 of the bytes
it scanned, and `take` compares both stats with the file's stat when it is asked for and the hash
with the file's bytes then (a same-size rewrite can keep the stat on a filesystem with coarse
timestamps); anything else (the file changed, the child failed, was
killed, ran out of memory, or never got that far) gives None and the caller scans the file
itself, which then words any problem exactly as it always has.
"""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
import threading
from pathlib import Path

# The child's scans wait in one temporary file (~0.6 of their JSON) and are read back one at a
# time, as each is taken: only sets this small are scanned ahead (the in-process path takes up to
# ~77 MB of JSON on two cores: pool.in_process_is_quicker). Past it the scan outlasts the imports.
MAX_JSON_BYTES = 128 << 20

_active: _Prescan | None = None


def _signature(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Prescan:
    def __init__(self, pid: int, out):
        self.pid, self.out, self.exit = pid, out, -1
        self.index: dict[tuple, tuple] | None = None  # signature -> (offset of the scan, digest), once read back

    def take(self, path) -> tuple[bool, dict | None]:
        """(found, the scan) of `path` as the file is now."""
        if self.index is None:
            self.index = self._read_index()
        try:
            sig = _signature(os.stat(path))
        except OSError:
            return False, None
        if sig not in self.index:
            return False, None
        at, digest = self.index.pop(sig)
        # The stat could miss a rewrite of the same size within the filesystem's timestamp
        # granularity: the bytes the child read must be the file's bytes now (~1 ms a MB).
        if digest is None or digest != _sha256(path):
            return False, None
        self.out.seek(at)
        return True, pickle.load(self.out)

    def status(self) -> int:
        """The child's exit status once it has ended (negative: killed by that signal); waits for it."""
        if self.pid is not None:
            self.exit, self.pid = _reap(self.pid, wait=True), None
        return self.exit

    def _read_index(self) -> dict:
        """Where each file's scan lies in the temporary file, once the child has exited cleanly
        (none if it did not: killed, failed). Scans the child could not make (the whole-file path
        must read the file) are left out: this process scans those files itself."""
        if self.status() != 0:
            return {}
        try:
            self.out.seek(-8, os.SEEK_END)
            self.out.seek(int.from_bytes(self.out.read(8), "little"))
            entries = pickle.load(self.out)
        except Exception:  # noqa: BLE001  (a damaged temporary file: scan the files here instead)
            return {}
        return {before: (at, digest) for before, after, at, digest in entries if before == after and at is not None}

    def stop(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            _reap(self.pid, wait=True)
            self.pid = None
        self.out.close()
        self.index = None


def _sha256(path: Path) -> str | None:
    from profiler.cache import _file_sha256  # the cache's own hash of a trace's bytes

    try:
        return _file_sha256(path)
    except OSError:
        return None


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
    """Fork a child that scans `paths` (regular files, at most MAX_JSON_BYTES of JSON in all, in
    this order); whether it started. Not with the C parser off ($PTPROF_PURE_PARSER). Not where another thread runs (fork copies only this one, and a
    lock another held stays held), nor without os.fork, nor for nothing to scan."""
    global _active
    stop()
    from profiler.gzip_limits import json_bytes
    from profiler.parse_stream import PURE_PARSER_ENV

    if not paths or not hasattr(os, "fork") or _threads() > 1 or os.environ.get(PURE_PARSER_ENV):
        return False
    try:
        if sum(json_bytes(p) for p in paths) > MAX_JSON_BYTES:
            return False
        out = tempfile.TemporaryFile()
    except OSError:
        return False
    parent = os.getpid()
    # SIGINT held from before the fork until the child is recorded: a Ctrl-C in between would
    # raise here with the child running and nobody to stop it. Delivered once unblocked (in the
    # finally: a SIGINT pending as it is blocked raises on the block's return, inside the try).
    held = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    try:
        if held:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pid = os.fork()
        except OSError:
            out.close()
            return False
        if pid == 0:  # the child: never back into the caller's code, nor its atexit handlers or buffers
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the parent stops us (stop())
                if held:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                _detach_stdio()
                _die_with_parent(parent)
                _scan_all([str(p) for p in paths], out, parent)
                code = 0
            finally:
                os._exit(code)
        _active = _Prescan(pid, out)
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return True


def _threads() -> int:
    """This process's threads: native ones too where /proc tells (numpy's BLAS and polars start
    theirs at import; a lock one of them holds would stay held in the child)."""
    try:
        return max(len(os.listdir("/proc/self/task")), threading.active_count())
    except OSError:
        return threading.active_count()


def _detach_stdio() -> None:
    """Not the parent's stdin, stdout or stderr: a caller reading them to their end (a pipe)
    would otherwise wait for this child too. It prints nothing."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _scan_all(paths: list[str], out, parent: int) -> None:
    """Each file's scan pickled into `out`, then the index of them (signature before and after,
    offset or None, digest), then the index's offset in the last 8 bytes."""
    from profiler.parse_stream import scan_file_hashed

    entries = []
    for path in paths:
        if os.getppid() != parent:  # the parent died (SIGKILL, SIGTERM): nobody to scan for
            return
        try:
            before = _signature(os.stat(path))
        except OSError:
            continue
        parsed, digest = scan_file_hashed(path)
        try:
            after = _signature(os.stat(path))
        except OSError:
            continue
        at = None
        if parsed is not None:
            at = out.tell()
            pickle.dump(parsed, out, protocol=pickle.HIGHEST_PROTOCOL)
        entries.append((before, after, at, digest))
        del parsed
    index_at = out.tell()
    pickle.dump(entries, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(index_at.to_bytes(8, "little"))
    out.flush()


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this child when the parent dies (PR_SET_PDEATHSIG), so a killed
    `ptprof analyze` leaves no scan running. Elsewhere _scan_all checks between files."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001  (no prctl: the check between files)
        pass
    if os.getppid() != parent:  # it died before the kernel was told: nobody to scan for
        os._exit(0)


def take(path) -> tuple[bool, dict | None]:
    """(True, the child's scan of `path`) where it scanned the file as it is now, else (False, None).
    The first call waits for the child to finish."""
    if _active is None:
        return False, None
    try:
        return _active.take(Path(path))
    except Exception:  # noqa: BLE001  (never the reason a file fails: it is scanned here instead)
        return False, None


def crashed() -> bool:
    """Whether the child was killed by a signal (a crash in the C parser, the out-of-memory
    killer) scanning the files: then this process would meet the same end, with no word of which
    file; worker processes name it (pool.LocalEngine.map). Waits for the child to end."""
    try:
        return _active is not None and _active.status() < 0
    except Exception:  # noqa: BLE001
        return False


def stop() -> None:
    """Stop the child (if still running), drop what it left. Safe to call at any time."""
    global _active
    active, _active = _active, None
    if active is not None:
        active.stop()

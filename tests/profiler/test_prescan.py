"""prescan.py: a cold load's files scanned by a forked child while the parent imports.

Each check runs in a fresh `python -c` process: prescan refuses to fork where another thread
runs, and pytest-xdist's workers run one (tested below too). What is checked: the child's scan
of a file is exactly the parent's own; it is not taken for a file changed since, nor from a child
that was killed; nothing outlives `stop` (no process, no zombie); and a cold `ptprof analyze`
takes it and writes the same report as without it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from profiler import prescan
from profiler.parse import _kineto
from profiler.rankmap import HOLD_LOG_ENV
from tests.conftest import REPO

pytestmark = [pytest.mark.skipif(_kineto is None, reason="the C parser is not built"),
              pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="fork, /proc")]

SAMPLE = REPO / "traces" / "sample-ddp-2r"

PRELUDE = """
import os, signal, sys, time
from pathlib import Path
from profiler import prescan
from profiler.parse_stream import scan_file

def gone(pid):  # reaped: no process, not even a zombie
    return not Path(f"/proc/{pid}").exists()

def exited(pid):  # ended, not yet reaped
    for _ in range(500):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError("the child did not end")
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _run(code: str, *args) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PRELUDE + code, *map(str, args)], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_the_childs_scan_is_the_parents_own_and_taken_once(tmp_path):
    plain = tmp_path / "rank1.json"
    plain.write_bytes(gzip.decompress((SAMPLE / "rank1.json.gz").read_bytes()))
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    got = _run("""
a, b, empty = sys.argv[1:4]
assert prescan.start([a, b, empty])
pid = prescan._active.pid
found, parsed = prescan.take(b)  # waits for the child; a plain JSON file, taken before the gzip
print(found, gone(pid), parsed == scan_file(b, prescanned=False), parsed["n"] > 1000)
# Read back one at a time, as taken: the gzip's scan is still only an offset into the file.
print([type(v[0]).__name__ for v in prescan._active.index.values()])
found, parsed = prescan.take(a)
print(found, parsed == scan_file(a, prescanned=False))
print(prescan.take(a)[0])  # taken once: a second load of the file scans it again
print(prescan.take(empty))  # the child could not scan it: this process reads it (and words the problem)
print(prescan.take(a + ".other")[0])  # never asked of the child
prescan.stop()
""", SAMPLE / "rank0.json.gz", plain, empty)
    assert got == ["True", "True", "True", "True", "['int']", "True", "True", "False", "(False,", "None)", "False"]


def test_a_file_changed_since_its_scan_or_a_killed_child_gives_nothing(tmp_path):
    trace = tmp_path / "rank0.json.gz"
    shutil.copy(SAMPLE / "rank0.json.gz", trace)
    got = _run("""
path = sys.argv[1]
assert prescan.start([path])
exited(prescan._active.pid)
st = os.stat(path)
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # rewritten after the child read it
print(prescan.take(path))
assert prescan.start([path])
pid = prescan._active.pid
os.kill(pid, signal.SIGKILL)  # the out-of-memory killer, say
print(prescan.take(path), gone(pid))
""", trace)
    assert got == ["(False,", "None)", "(False,", "None)", "True"]


def test_a_same_size_rewrite_the_stat_misses_is_caught_by_the_hash(tmp_path):
    trace, other = tmp_path / "rank0.json.gz", tmp_path / "rank1.json.gz"
    shutil.copy(SAMPLE / "rank0.json.gz", trace)
    shutil.copy(SAMPLE / "rank1.json.gz", other)
    got = _run("""
path, other = sys.argv[1:3]
assert prescan.start([path, other])
prescan.take(path + ".none")  # reads the child's index back
before = prescan._signature(os.stat(path))
raw = bytearray(Path(path).read_bytes())
raw[-8] ^= 1  # the gzip's CRC: same size, other bytes
Path(path).write_bytes(bytes(raw))
# A filesystem with coarse timestamps: the stat the child saw is the stat now.
index = prescan._active.index
index[prescan._signature(os.stat(path))] = index.pop(before)
print(prescan.take(path), prescan.take(other)[0])
""", trace, other)
    assert got == ["(False,", "None)", "True"]


def test_the_hash_is_of_the_bytes_the_scan_read(tmp_path):
    from hashlib import sha256

    from profiler.parse_stream import scan_file, scan_file_hashed

    plain = tmp_path / "rank0.json"
    plain.write_bytes(gzip.decompress((SAMPLE / "rank0.json.gz").read_bytes()))
    for path in (SAMPLE / "rank0.json.gz", plain):
        parsed, digest = scan_file_hashed(path)
        assert digest == sha256(path.read_bytes()).hexdigest()
        assert parsed == scan_file(path, prescanned=False)
    junk = tmp_path / "junk.json.gz"
    junk.write_bytes((SAMPLE / "rank0.json.gz").read_bytes() + b"junk")  # the whole-file path's to word
    assert scan_file_hashed(junk) == (None, None)


def test_stop_leaves_no_process_and_start_refuses_what_it_cannot_help(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(prescan.MAX_JSON_BYTES + 1)  # sparse: only its size is read
    got = _run("""
import threading
path, big = sys.argv[1:3]
assert prescan.start([path])
pid = prescan._active.pid
prescan.stop()  # a warm load, an error, Ctrl-C: never taken
print(gone(pid), prescan._active is None, prescan.take(path))
print(prescan.start([]), prescan.start([big]), prescan.start([path + ".missing"]))
t = threading.Thread(target=time.sleep, args=(1,))
t.start()
print(prescan.start([path]))  # fork copies only this thread: not with another running
""", SAMPLE / "rank0.json.gz", big)
    assert got == ["True", "True", "(False,", "None)", "False", "False", "False", "False"]


def test_a_ctrl_c_at_the_fork_leaves_the_child_recorded_for_stop():
    got = _run("""
real_fork = os.fork
def fork():  # Ctrl-C just after the fork, before the child is recorded
    pid = real_fork()
    if pid:
        os.kill(os.getpid(), signal.SIGINT)
    return pid
os.fork = fork
try:
    prescan.start([sys.argv[1]])
    print("not-interrupted")
except KeyboardInterrupt:
    pid = prescan._active.pid
    prescan.stop()
    print("interrupted", gone(pid))
""", SAMPLE / "rank0.json.gz")
    assert got == ["interrupted", "True"]


def test_no_scan_ahead_with_the_c_parser_off(monkeypatch):
    monkeypatch.setenv("PTPROF_PURE_PARSER", "1")
    monkeypatch.setattr(prescan, "_threads", lambda: 1)
    assert prescan.start([SAMPLE / "rank0.json.gz"]) is False and prescan._active is None


def test_a_ctrl_c_as_sigint_is_blocked_leaves_it_unblocked():
    got = _run("""
real = signal.pthread_sigmask
def mask(how, sigs):  # a SIGINT pending as it is blocked: raised as the call returns
    old = real(how, sigs)
    if how == signal.SIG_BLOCK and signal.SIGINT in set(sigs):
        raise KeyboardInterrupt
    return old
signal.pthread_sigmask = mask
try:
    prescan.start([sys.argv[1]])
except KeyboardInterrupt:
    print("interrupted", signal.SIGINT in real(signal.SIG_BLOCK, []), prescan._active is None)
""", SAMPLE / "rank0.json.gz")
    assert got == ["interrupted", "False", "True"]


def test_no_fork_where_another_thread_runs(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert prescan.start([SAMPLE / "rank0.json.gz"]) is False and prescan._active is None
    got = _run("""
import _thread, threading
# A thread threading does not count, as numpy's BLAS and polars start theirs at import.
_thread.start_new_thread(time.sleep, (5,))
time.sleep(0.1)
print(prescan.start([sys.argv[1]]), threading.active_count() == 1 and prescan._threads() > 1)
""", SAMPLE / "rank0.json.gz")
    assert got == ["False", "True"]


def test_the_child_keeps_no_pipe_of_the_caller_open():
    """A caller reading ptprof's output to its end must not wait for the child: here the parent
    ends at once and its child would scan for 30 s."""
    code = PRELUDE + """
prescan._scan_all = lambda *args: time.sleep(30)
assert prescan.start([sys.argv[1]])
print(prescan._active.pid, flush=True)
os._exit(0)
"""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, str(SAMPLE / "rank0.json.gz")], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    took = time.monotonic() - start
    assert out.returncode == 0 and took < 20
    # And the kernel ends the child with its parent (PR_SET_PDEATHSIG): no scan left running.
    for _ in range(500):
        if not _alive(int(out.stdout)):  # gone, or a zombie left for init to reap
            break
        time.sleep(0.01)
    else:
        os.kill(int(out.stdout), signal.SIGKILL)
        pytest.fail("the child outlived its parent")


def test_a_cold_analyze_of_one_file_takes_the_scan_and_reports_the_same(tmp_path):
    cli = """
import json
from profiler import cli
taken = []
if sys.argv[3] == "off":
    prescan.start = lambda paths: False
real = prescan._Prescan.take
prescan._Prescan.take = lambda self, p: (lambda got: taken.append(got[0]) or got)(real(self, p))
code = cli.main(["analyze", sys.argv[1], "--json", sys.argv[2], "--quiet"])
print(code, taken)
"""
    reports = {}
    for mode in ("on", "off"):
        os.environ["PTPROF_CACHE_DIR"] = str(tmp_path / f"cache-{mode}")
        try:
            out = _run(cli, SAMPLE / "rank0.json.gz", tmp_path / f"{mode}.json", mode)
        finally:
            del os.environ["PTPROF_CACHE_DIR"]
        reports[mode] = json.loads((tmp_path / f"{mode}.json").read_text())
        assert out == (["0", "[True]"] if mode == "on" else ["0", "[]"])
    assert reports["on"] == reports["off"]


def test_a_child_that_crashes_sends_the_files_to_worker_processes(tmp_path):
    """Where the prescan child dies of a signal (a crash in the C parser, say), the same file
    would kill `ptprof analyze` itself, with no word of which; worker processes name it."""
    held = tmp_path / "held.log"
    code = """
import json
from profiler import cli
os.environ[sys.argv[4]] = sys.argv[3]  # rankmap.HOLD_LOG_ENV (rankmap itself would import polars: threads)
prescan._scan_all = lambda *args: os.kill(os.getpid(), signal.SIGSEGV)
print(cli.main(["analyze", sys.argv[1], "--json", sys.argv[2], "--quiet"]))
pids = {int(line.split()[1]) for line in Path(sys.argv[3]).read_text().splitlines()}
print(len(pids), os.getpid() in pids, sorted(r["rank"] for r in json.loads(Path(sys.argv[2]).read_text())["runs"][0]["ranks"]))
"""
    for target, ranks in ((SAMPLE, "[0, 1]"), (SAMPLE / "rank1.json.gz", "[1]")):
        held.unlink(missing_ok=True)
        os.environ["PTPROF_CACHE_DIR"] = str(tmp_path / f"cache-{ranks}")
        try:
            got = _run(code, target, tmp_path / "r.json", held, HOLD_LOG_ENV)
        finally:
            del os.environ["PTPROF_CACHE_DIR"]
        # Analysed, all of it, and not in ptprof's own process (a 2-rank sample and one file alike).
        assert got[0] == "0" and got[2] == "False" and " ".join(got[3:]) == ranks, got


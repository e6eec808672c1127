"""`ptprof analyze`'s progress bar on a terminal (profiler/pool.py `progress_bar`, load.py `_map`),
run under a pseudo-terminal as a user's shell runs it (stdout and stderr on the terminal):
- a terminal that reports 0 rows and 0 columns (some CI and `docker exec -t` ones) still gets
  the bar: tqdm hides a bar on 0 rows, so ptprof gives it the terminal's rows or 24;
- Ctrl-C mid-load clears the bar, so the reason is the last line on the screen (without it, the
  bar stayed above the reason, or was drawn again after it when the bar was collected).

The load runs in ptprof's own process (`--workers 1`: one batch, no worker process to start); for
the interrupt, a sitecustomize makes that process's parse announce itself and sleep, so the signal
lands while the map runs, without a timing guess (as tests/profiler/test_midway.py does in workers).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminal window sizes (termios)")

# In ptprof's own process, when PTPROF_TEST_HANG names a folder: announce, then hang in the parse.
HANG_IN_PARSE = """
import os, time
if os.environ.get("PTPROF_TEST_HANG"):
    import profiler.parse as _parse
    import profiler.parse_batch as _batch
    def _hang(path, **kw):
        open(os.path.join(os.environ["PTPROF_TEST_HANG"], str(os.getpid())), "w").close()
        time.sleep(60)
    _parse.parse_trace_file = _hang
    _batch.parse_trace_files = lambda paths: _hang(paths[0])
"""


def _job(folder) -> None:
    folder.mkdir()
    for r in range(4):
        events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 900},
                  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1010, "dur": 500}]
        (folder / f"rank{r}.json").write_text(json.dumps(
            {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 4}, "traceEvents": events}))


def _analyze_on_a_terminal(tmp_path, rows: int, cols: int, *, extra_env: dict | None = None, interrupt_when=None):
    """(exit status, what the terminal received) of `ptprof analyze` on 4 tiny ranks, its stdout and
    stderr a pseudo-terminal of rows x cols; `interrupt_when()` true: SIGINT to ptprof."""
    import fcntl
    import termios

    folder = tmp_path / "job"
    _job(folder)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # these would win over the terminal's size
    env.update({"PYTHONPATH": str(REPO), "PTPROF_CACHE_DIR": str(tmp_path / "cache"), **(extra_env or {})})
    proc = subprocess.Popen([sys.executable, "-m", "profiler", "analyze", str(folder), "--json", str(tmp_path / "r.json"),
                             "--quiet", "--no-cache", "--workers", "1"],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=REPO, start_new_session=True)
    os.close(slave)
    try:
        if interrupt_when is not None:
            deadline = time.monotonic() + 30
            while not interrupt_when():
                assert proc.poll() is None, "ptprof ended before the parse"
                assert time.monotonic() < deadline, "the parse never started"
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGINT)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not chunk:
                break
            out += chunk
        proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out.decode()


def _screen(received: str) -> list[str]:
    """The lines a terminal shows for `received`: a carriage return goes back to the line's start,
    and what follows overwrites it (as tqdm redraws and clears its bar); trailing blanks dropped."""
    lines = []
    for raw in received.replace("\r\n", "\n").split("\n"):
        line: list[str] = []
        col = 0
        for ch in raw:
            if ch == "\r":
                col = 0
                continue
            line[col:col + 1] = [ch]
            col += 1
        lines.append("".join(line).rstrip())
    return [line for line in lines if line]


def test_the_bar_shows_on_a_terminal_of_zero_rows_and_columns(tmp_path):
    status, received = _analyze_on_a_terminal(tmp_path, 0, 0)
    assert status == 0, received
    # (tqdm alone draws nothing on 0 rows: the received text was "\r\n")
    assert "analysing ranks: 100%" in received and "| 4/4 [" in received, repr(received)
    assert _screen(received)[-1].startswith("analysing ranks: 100%")


def test_an_interrupt_clears_the_bar_and_the_reason_is_the_last_line(tmp_path):
    hang, site = tmp_path / "hang", tmp_path / "site"
    hang.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(HANG_IN_PARSE)
    status, received = _analyze_on_a_terminal(
        tmp_path, 24, 80, extra_env={"PTPROF_TEST_HANG": str(hang), "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])},
        interrupt_when=lambda: any(hang.iterdir()))
    assert status == 130, received
    assert "analysing ranks:   0%" in received, repr(received)  # the bar was drawn
    assert _screen(received) == ["ptprof analyze: interrupted"], repr(received)

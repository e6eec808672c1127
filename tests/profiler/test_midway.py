"""A load stopped midway through `ptprof analyze`'s per-rank map:
- Ctrl-C (profiler/pool.py, cli.py): one line, exit 130, no worker left running, no report and
  nothing half-written in the cache, whether the signal reaches only ptprof (`kill -INT`) or the
  whole process group (a terminal's Ctrl-C);
- the Dask scheduler lost (profiler/dask_pool.py): one line naming it, exit 2, no report.

The workers are made to stop inside the parse (sitecustomize in local worker processes only, as
tests/profiler/test_engine.py does; `client.run` on Dask workers): each writes its pid to a file
and sleeps, so the signal or the loss is sure to land while the map runs, without a timing guess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

# In worker processes only (`python -m profiler._worker`): announce, then hang in the parse.
HANG_IN_PARSE = """
import os, sys, time
if sys.orig_argv[-2:] == ["-m", "profiler._worker"]:
    import profiler.parse as _parse
    def _hang(path, **kw):
        with open(os.path.join(os.environ["HANG_DIR"], str(os.getpid())), "w") as f:
            f.write(str(path))
        time.sleep(120)
    _parse.parse_trace_file = _hang
    import profiler.parse_batch as _batch  # a batch of several files is parsed there (cache.load_many_safe)
    _batch.parse_trace_files = lambda paths: _hang(paths[0])
"""


def _rank(rank: int) -> dict:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 900},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1010, "dur": 500}]
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 4}, "traceEvents": events}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead (its parent, ptprof, has exited; init reaps it): read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("whole_group", [False, True], ids=["kill-INT-ptprof", "ctrl-c-group"])
def test_interrupt_stops_every_worker_and_leaves_nothing(tmp_path, whole_group):
    if sys.platform != "linux":
        pytest.skip("reads /proc")
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(4):
        (folder / f"rank{r}.json").write_text(json.dumps(_rank(r)))
    site, hang, cache = tmp_path / "site", tmp_path / "hang", tmp_path / "cache"
    site.mkdir()
    hang.mkdir()
    (site / "sitecustomize.py").write_text(HANG_IN_PARSE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "HANG_DIR": str(hang),
           "PTPROF_CACHE_DIR": str(cache)}
    out = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "profiler", "analyze", str(folder), "--json", str(out), "--quiet",
                             "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(hang.iterdir())) < 2:  # both workers are inside a parse
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the workers never started parsing"
            time.sleep(0.05)
        workers = [int(p.name) for p in hang.iterdir()]
        # Workers live in a process group of their own: a terminal's Ctrl-C reaches ptprof alone
        # (a worker still importing would print a KeyboardInterrupt traceback), which stops them.
        assert all(os.getpgid(pid) != os.getpgid(proc.pid) for pid in workers)
        if whole_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert stderr == "ptprof analyze: interrupted\n" and stdout == ""
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if _alive(pid)], "a worker outlived the interrupted load"
    assert not out.exists()
    leftovers = [p.name for p in cache.iterdir()] if cache.exists() else []
    assert not [n for n in leftovers if n.endswith((".tmp", ".parquet", ".summary"))], leftovers


# A one-worker LocalCluster in a process (and session) of its own, so the test can kill the
# scheduler with its workers; its worker hangs in the parse as above. Prints the address.
# On a Dask worker (`client.run(exec, DASK_HANG % folder, {})`): announce in `folder`, then hang in
# the parse (tests/profiler/test_engine.py uses it too).
DASK_HANG = (
    "import os, time\n"
    "import profiler.parse as _parse\n"
    "def _hang(path, **kw):\n"
    "    with open(os.path.join(%r, str(os.getpid())), 'w') as f:\n"
    "        f.write(str(path))\n"
    "    time.sleep(120)\n"
    "_parse.parse_trace_file = _hang\n"
    "import profiler.parse_batch as _batch\n"  # a batch of several files is parsed there
    "_batch.parse_trace_files = lambda paths: _hang(paths[0])\n"
)
CLUSTER = """
import sys
from distributed import Client, LocalCluster
HANG = """ + repr(DASK_HANG) + """
if __name__ == "__main__":
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0")
    Client(cluster).run(exec, HANG % sys.argv[1], {})
    print(cluster.scheduler_address, flush=True)
    sys.stdin.read()
"""


def test_a_lost_scheduler_is_one_line_and_no_report(tmp_path):
    pytest.importorskip("distributed")
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(4):
        (folder / f"rank{r}.json").write_text(json.dumps(_rank(r)))
    hang = tmp_path / "hang"
    hang.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PTPROF_CACHE_DIR": str(tmp_path / "cache")}
    cluster = subprocess.Popen([sys.executable, "-c", CLUSTER, str(hang)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env, cwd=REPO, start_new_session=True)
    analyze = None
    out = tmp_path / "report.json"
    try:
        address = cluster.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        analyze = subprocess.Popen([sys.executable, "-m", "profiler", "analyze", str(folder), "--cluster", address,
                                    "--json", str(out), "--quiet"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        deadline = time.monotonic() + 60
        while not list(hang.iterdir()):  # the worker is inside a parse: the map is under way
            assert analyze.poll() is None, analyze.communicate()
            assert time.monotonic() < deadline, "the Dask worker never started parsing"
            time.sleep(0.05)
        os.killpg(cluster.pid, signal.SIGKILL)  # the scheduler, its nanny and worker, all at once
        stdout, stderr = analyze.communicate(timeout=90)
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
        if analyze is not None and analyze.poll() is None:
            analyze.kill()
    assert analyze.returncode == 2
    assert stdout == ""
    assert stderr.startswith("ptprof analyze: error: --cluster: lost the Dask scheduler after 0 of 4 ranks")
    assert stderr.endswith("nothing was reported: run again when it is back, or without --cluster\n")
    assert stderr.count("\n") == 1  # one line: no traceback from distributed's reconnect
    assert not out.exists()

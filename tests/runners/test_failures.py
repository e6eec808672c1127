"""A failing rank stops the whole run: non-zero exit naming the rank, no orphans, no run folder.

Faults are injected through the harness's PTPROF_FAULT hook (raise, hang) or by killing a rank's
process from outside, as the OOM killer or a crashed node would.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, ptprof

pytestmark = pytest.mark.multirank


def run_processes(run_id: str) -> list[psutil.Process]:
    """Live processes started for this run (the launcher exports PTPROF_RUN_ID to every rank)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PTPROF_RUN_ID") == run_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def assert_nothing_left(out: Path, run_id: str) -> None:
    assert not (out / run_id).exists(), "a failed run must not leave a run folder"
    assert not (out / f".{run_id}.tmp").exists(), "the temporary folder must be cleaned up"
    assert (out / ".failed" / run_id).is_dir(), "the rank logs of a failed run are kept"
    assert not list((out / ".failed" / run_id).rglob("*.json.gz")), "partial traces are deleted"
    assert not run_processes(run_id), "orphan rank processes left behind"


def test_raising_rank_is_named(tmp_path):
    res = ptprof(
        "run", "ddp", "--gpus", "2", "--steps", "3", "--warmup", "1", "--active", "2",
        "--out", str(tmp_path), "--name", "boom", env={"PTPROF_FAULT": "raise@1:1"},
    )
    assert res.returncode == 1
    assert "rank 1 failed" in res.stderr and "injected fault" in res.stderr
    assert "rank 0 failed" not in res.stderr  # rank 0 only lost its peer: a symptom, not a cause
    assert_nothing_left(tmp_path, "boom")


def test_hung_rank_times_out_and_is_named(tmp_path):
    t0 = time.monotonic()
    res = ptprof(
        "run", "ddp", "--gpus", "2", "--steps", "3", "--warmup", "1", "--active", "2", "--timeout", "5",
        "--out", str(tmp_path), "--name", "hang", env={"PTPROF_FAULT": "hang@1:1"}, timeout=120,
    )
    assert res.returncode == 1
    assert "rank 1 stopped responding" in res.stderr
    assert "rank 0 gave up waiting" in res.stderr
    assert time.monotonic() - t0 < 90  # bounded by --timeout, not by the test's own limit
    assert_nothing_left(tmp_path, "hang")


def test_killed_rank_stops_the_run(tmp_path):
    run_id = "killed"
    cmd = [sys.executable, "-m", "runners.cli", "run", "ddp", "--gpus", "2", "--steps", "500", "--warmup", "1",
           "--active", "2", "--out", str(tmp_path), "--name", run_id]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until training runs (rank 0 printed a step), then SIGKILL rank 1.
        for line in proc.stdout:
            if line.startswith("step 1 "):
                break
        victims = [p for p in run_processes(run_id) if p.environ().get("RANK") == "1"]
        assert len(victims) == 1
        victims[0].kill()
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "rank 1 failed (killed by signal 9)" in stderr
    assert_nothing_left(tmp_path, run_id)


def test_stopped_rank_is_reported_as_not_responding(tmp_path):
    """A rank frozen by SIGSTOP hangs the run like a deadlock: report it so, not as killed by signal 9."""
    import signal

    run_id = "stopped"
    cmd = [sys.executable, "-m", "runners.cli", "run", "ddp", "--gpus", "2", "--steps", "500", "--timeout", "5",
           "--out", str(tmp_path), "--name", run_id]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("step 1 "):
                break
        victims = [p for p in run_processes(run_id) if p.environ().get("RANK") == "1"]
        assert len(victims) == 1
        victims[0].send_signal(signal.SIGSTOP)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "rank 1 stopped responding (rank 1's process was stopped: SIGSTOP" in stderr, stderr
    assert "killed by signal" not in stderr
    assert "rank 0 gave up waiting" in stderr
    assert_nothing_left(tmp_path, run_id)


# Runs `ptprof run` with torch's process creation failing after two ranks were started, as fork
# fails (EAGAIN) at a user process limit. Each started rank first leaves a child in a session of
# its own (setsid), out of reach of its process group: only the process tree finds it.
SPAWN_FAILS_AFTER_TWO = """
import errno, sys
from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as sh
real, started = sh.SubprocessHandler._popen, []
def popen(self, args, env):
    if len(started) == 2:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    started.append(args)
    return real(self, ("sh", "-c", 'setsid sleep 300 & exec "$0" "$@"', *args), env)
sh.SubprocessHandler._popen = popen
from runners.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_failed_process_creation_leaves_no_process(tmp_path):
    run_id = "spawn-fails"
    try:
        res = subprocess.run(
            [sys.executable, "-c", SPAWN_FAILS_AFTER_TWO, "run", "ddp", "--gpus", "4", "--steps", "2", "--warmup", "1",
             "--active", "1", "--out", str(tmp_path), "--name", run_id],
            cwd=REPO, capture_output=True, text=True, timeout=90,  # orphans holding stdout would block it
        )
    finally:
        leftovers = [(proc, proc.cmdline()[:3]) for proc in run_processes(run_id)]
        for proc, _ in leftovers:  # never leave them running, even when the test fails
            proc.kill()
    assert not leftovers, f"orphans: {[cmd for _, cmd in leftovers]}"
    assert res.returncode == 1, res.stderr
    assert "could not start the rank processes: Resource temporarily unavailable (EAGAIN)" in res.stderr
    assert "Traceback" not in res.stderr
    assert_nothing_left(tmp_path, run_id)


def test_two_nodes_on_one_machine_make_one_run(tmp_path):
    """--nnodes/--node-rank/--rdzv-endpoint: two launchers (nodes) sharing --out publish one run."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["run", "ddp", "--gpus", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--name", "two-nodes", "--out", str(tmp_path), "--steps", "3", "--warmup", "1", "--active", "2"]
    node1 = subprocess.Popen([sys.executable, "-m", "runners.cli", *common, "--node-rank", "1"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        node0 = ptprof(*common, "--node-rank", "0", timeout=180)
        out1, err1 = node1.communicate(timeout=60)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert node0.returncode == 0, node0.stderr
    assert node1.returncode == 0, err1
    assert "node 0 publishes the run" in out1
    run = tmp_path / "two-nodes"
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["world_size"] == 2 and manifest["nnodes"] == 2
    assert sorted(p.name for p in run.glob("rank*.json.gz")) == ["rank0.json.gz", "rank1.json.gz"]
    from tests.runners.reference import single_process_losses

    for got, want in zip(manifest["losses"], single_process_losses(steps=3), strict=True):
        assert abs(got - want) / want < 1e-4


def test_multi_node_needs_a_shared_name(tmp_path):
    res = ptprof("run", "ddp", "--gpus", "1", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500",
                 "--out", str(tmp_path))
    assert res.returncode == 2 and "needs --name" in res.stderr

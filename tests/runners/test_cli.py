"""`ptprof` argument handling: one-line errors with exit status 2, and helpful --help."""

from __future__ import annotations

import pytest

from runners.cli import describe_failures
from tests.conftest import ptprof


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "nosuch", "--gpus", "2"], "unknown paradigm 'nosuch'"),
        (["run", "ddp", "--gpus", "0"], "--gpus must be at least 1"),
        (["run", "ddp", "--gpus", "2", "--device", "cuda"], "needs 2 GPUs on this node but 0 are visible"),
        (["run", "ddp", "--gpus", "2", "--steps", "2", "--warmup", "1", "--active", "3"], "exceeds --steps 2"),
        (["run", "ddp", "--gpus", "3"], "not divisible by the 3 data-parallel ranks"),
        (["run", "ddp", "--gpus", "2", "--nnodes", "2"], "needs --rdzv-endpoint"),
        (["run", "ddp", "--gpus", "two"], "invalid int value"),
        (["run", "ddp"], "required: --gpus"),
        # flags another paradigm reads would be silently ignored: refused instead
        (["run", "1f1b", "--gpus", "2", "--schedule", "zbv"], "--schedule does not apply to 1f1b: it is for hybrid"),
        (["run", "fsdp", "--gpus", "2", "--pp", "2"], "--pp does not apply to fsdp: it is for hybrid"),
        (["run", "ddp", "--gpus", "2", "--microbatches", "4"], "--microbatches does not apply to ddp"),
        (["run", "ddp", "--gpus", "2", "--experts", "8"], "--experts does not apply to ddp: it is for ep"),
    ],
)
def test_bad_requests_are_one_line_exit_2(tmp_path, args, needle):
    res = ptprof(*args, "--out", str(tmp_path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("ptprof run: error:") and needle in lines[0], lines[0]
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected request"


def test_existing_run_folder_is_not_overwritten(tmp_path):
    (tmp_path / "taken").mkdir()
    res = ptprof("run", "ddp", "--gpus", "2", "--out", str(tmp_path), "--name", "taken")
    assert res.returncode == 2 and "already exists" in res.stderr


def test_help_explains_every_flag():
    res = ptprof("run", "--help")
    assert res.returncode == 0
    for flag in ["--gpus", "--nnodes", "--node-rank", "--rdzv-endpoint", "--steps", "--model", "--batch-size",
                 "--seq-len", "--seed", "--out", "--name", "--warmup", "--active", "--profile-memory",
                 "--with-stack", "--timeout", "--device"]:
        assert flag in res.stdout, flag
    for paradigm in ["ddp", "zero1", "zero2", "fsdp"]:
        assert f"  {paradigm} " in res.stdout
    top = ptprof("--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ["run", "list", "analyze", "view"])


def test_describe_failures_tells_causes_from_symptoms():
    peer_lost = (-15, {"message": "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1"})
    # A rank that raised is the cause; the peer that lost its connection is not blamed.
    line = describe_failures({0: peer_lost, 1: (1, {"message": "ValueError: bad shape"})}, 2)
    assert line == "rank 1 failed (exit 1): ValueError: bad shape"
    # Killed by SIGKILL (no error file): the cause.
    assert describe_failures({3: (-9, "Signal 9 (SIGKILL) received by PID 7")}, 4).startswith(
        "rank 3 failed (killed by signal 9)"
    )
    # Only a timeout and a rank the launcher had to stop: the stopped one hung.
    timeout = (1, {"message": "RuntimeError: Timed out waiting 5000ms for send operation to complete"})
    line = describe_failures({0: timeout, 1: (-15, "Signal 15 (SIGTERM) received by PID 9")}, 2)
    assert line.startswith("rank 1 stopped responding") and "rank 0 gave up waiting" in line
    # Ranks absent from the failures (never failed, stopped silently) are the suspects too.
    line = describe_failures({0: timeout}, 3)
    assert line.startswith("rank 1, 2 stopped responding")


def test_list_shows_runs_and_skips_hidden(tmp_path):
    import json

    (tmp_path / ".x.tmp").mkdir()
    (tmp_path / ".x.tmp" / "run.json").write_text("{}")
    run = tmp_path / "r1"
    run.mkdir()
    run.joinpath("run.json").write_text(json.dumps({
        "run_id": "r1", "paradigm": "fsdp", "world_size": 4, "backend": "gloo", "losses": [5.0, 4.5],
        "created_at": "2026-01-01T00:00:00+00:00",
    }))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")
    res = ptprof("list", "--traces", str(tmp_path))
    assert res.returncode == 0
    assert "r1" in res.stdout and "fsdp" in res.stdout and "4.5000" in res.stdout
    assert ".x" not in res.stdout
    assert "broken" in res.stdout and "unreadable run.json" in res.stdout


def test_view_is_a_clear_placeholder_until_the_viewer_lands():
    import importlib.util

    if importlib.util.find_spec("viewer.__main__") is not None:
        pytest.skip("the viewer exists now; its own tests cover `ptprof view`")
    res = ptprof("view")
    assert res.returncode == 2
    assert res.stderr.strip() == "ptprof: `view` is not yet available in this version"

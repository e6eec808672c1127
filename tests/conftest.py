"""Shared test helpers: running `ptprof` as a user would, and runs made once per session.

`runs(paradigm, ranks)` returns the folder of a real `ptprof run` at that many gloo ranks (3 steps,
warmup 1, active 2), made on first use and shared by every test package (runners and profiler).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The suite's runs are gloo ranks on the CPU, also on a GPU machine: what the tests assert are their
# numbers, and `--gpus 2` on a one-GPU machine would be refused. GPUs stay hidden from every test and
# every rank it launches unless PTPROF_TEST_GPU=1 asks for the GPU tests (tests/runners/test_gpu_only.py).
# Set before anything imports torch, which reads the variable once.
GPU_TESTS = os.environ.get("PTPROF_TEST_GPU") == "1"
if not GPU_TESTS:
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["HIP_VISIBLE_DEVICES"] = ""

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


def ptprof(*args: str, env: dict | None = None, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the `ptprof` command (as `python -m runners.cli`, the console script's target)."""
    full_env = {k: v for k, v in os.environ.items() if k != "PTPROF_FAULT"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "runners.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd or REPO,
    )


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Parsed-trace cache in a temp folder, never the user's ~/.cache (every test package)."""
    old = os.environ.get("PTPROF_CACHE_DIR")
    os.environ["PTPROF_CACHE_DIR"] = str(tmp_path_factory.mktemp("ptprof-cache"))
    yield
    if old is None:
        os.environ.pop("PTPROF_CACHE_DIR", None)
    else:
        os.environ["PTPROF_CACHE_DIR"] = old


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark must be there when it looks
def pytest_collection_modifyitems(items):
    """Every test using `runs` is a multirank test, marked or not. README's command runs the other
    tests on 2 xdist workers and these in one serial session: each worker would launch its own
    copy of every run it needs, and runs shared by several tests are made once only in one session."""
    v_pipelines = _v_pipelines_on_gloo()
    for item in items:
        if v_pipelines and ("zbv" in item.nodeid or "dualpipev" in item.nodeid):
            item.add_marker(pytest.mark.skip(reason=v_pipelines))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "runs" in callspec.params:
            continue  # a parametrize argument that happens to be called `runs`, not the fixture
        if "runs" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("multirank"):
            item.add_marker(pytest.mark.multirank)


def _v_pipelines_on_gloo() -> str | None:
    """Why tests that launch zbv or dualpipev ranks cannot run here (torch before 2.13: `ptprof run`
    refuses them on gloo, runners/cli.py v_schedule_problem), else None. The version from the
    installed package's metadata: collection does not import torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        return None
    from runners.cli import v_pipelines_on_gloo

    if v_pipelines_on_gloo(torch_version):
        return None
    return f"torch {torch_version} cannot run V-shaped pipelines on gloo ranks"


STEPS = 3  # enough for loss parity to mean something; warmup 1 + active 2


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """(paradigm, ranks, *extra flags) -> run folder, made on first use."""
    out = tmp_path_factory.mktemp("runs")
    made: dict[tuple, Path] = {}

    def get(paradigm: str, ranks: int, *extra: str) -> Path:
        key = (paradigm, ranks, *extra)
        if key not in made:
            name = "-".join([paradigm, str(ranks), *(e.strip("-") for e in extra)])
            res = ptprof(
                "run", paradigm, "--gpus", str(ranks), "--steps", str(STEPS), "--warmup", "1", "--active", "2",
                "--out", str(out), "--name", name, "--timeout", "120", *extra,
            )
            assert res.returncode == 0, f"ptprof run {paradigm} {extra} failed:\n{res.stdout}\n{res.stderr}"
            made[key] = out / name
        return made[key]

    return get

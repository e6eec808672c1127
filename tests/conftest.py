"""Shared test helpers: running `ptprof` as a user would, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def ptprof_run():
    return ptprof

"""Imports go one way: viewer -> profiler; runners never import profiler/viewer; profiler never
imports torch, dash or plotly. The contracts live in pyproject.toml ([tool.importlinter])."""

from __future__ import annotations

import shutil
import subprocess

from tests.conftest import REPO


def test_import_contracts_hold():
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is a dev dependency: pip install -e .[dev]"
    res = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 3 kept, 0 broken" in res.stdout, res.stdout

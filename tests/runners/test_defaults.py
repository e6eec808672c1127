"""`ptprof run PARADIGM --gpus N` alone: the default model fits, and one step numbering throughout.

Steps are numbered from 0, as torch names them in the traces (ProfilerStep#<k>) and as
`ptprof analyze --step` and run.json's `profiler.profiled_steps` count them; the run's progress
lines and summary must use the same numbers.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest

from tests.conftest import ptprof

pytestmark = pytest.mark.multirank


def trace_steps(path) -> list[int]:
    """ProfilerStep#<k> numbers in a rank's trace, read straight from the JSON (no ptprof code)."""
    with gzip.open(path, "rt") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    return sorted(int(n.removeprefix("ProfilerStep#")) for n in names if re.fullmatch(r"ProfilerStep#\d+", n))


def test_zbv_runs_with_only_gpus_and_numbers_steps_as_the_traces(tmp_path):
    # No --model (tiny, the old default, has 2 layers for zbv's 4 stages), --steps 3 with the
    # default warmup and active (the old 1 + 3 did not fit).
    res = ptprof("run", "zbv", "--gpus", "2", "--steps", "3", "--out", str(tmp_path), "--name", "zbv", "--timeout", "120")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "zbv"
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["model"]["preset"] == "tiny8" and manifest["model"]["n_layers"] == 8
    assert "Model tiny8 (8 layers, batch 8), the smallest preset that fits zbv on 2 ranks" in res.stdout
    assert re.search(r"model +tiny8: 8 layers, [\d,]+ parameters \(smallest that fits; --model\)", res.stdout)

    profiled = manifest["profiler"]["profiled_steps"]
    assert profiled == [1, 2] and manifest["profiler"]["warmup"] == 1 and manifest["profiler"]["active"] == 2
    for rank in range(2):
        assert trace_steps(run / f"rank{rank}.json.gz") == profiled
    printed = [int(m.group(1)) for m in re.finditer(r"^step (\d+) .*\[profiled\]$", res.stdout, re.M)]
    assert printed == profiled, res.stdout
    assert [int(m.group(1)) for m in re.finditer(r"^step (\d+) ", res.stdout, re.M)] == [0, 1, 2]
    assert "3 steps, numbered 0-2 as ProfilerStep#k in the traces: steps 1-2 profiled after 1 warmup step" in res.stdout
    assert "mean over profiled steps 1-2" in res.stdout

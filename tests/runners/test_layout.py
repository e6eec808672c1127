"""The run layout is a contract (docs/run-layout.md): check a real run against the document.

The expected keys are read from the document's own run.json example, so the page and the runners
cannot drift apart silently.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.multirank

DOC = (REPO / "docs" / "run-layout.md").read_text()


def documented_keys(block_start: str, block_end: str) -> set[str]:
    """Keys ("key":) in the jsonc example between two markers of the doc."""
    example = DOC[DOC.index("```jsonc") :]
    example = example[example.index(block_start) : example.index(block_end)]
    return set(re.findall(r'"(\w+)":', example))


def test_run_json_matches_the_documented_schema(runs):
    run_dir = runs("fsdp", 2)
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["schema"] == "ptprof.run/1" and "`ptprof.run/1`" in DOC
    top = documented_keys('"schema"', '"ranks": [') | {"ranks", "pipeline"}
    # Nested example keys (versions, model, profiler, phases) sit in the same span; check the
    # top level against the top-level ones the document lists.
    nested = {"python", "torch", "ptprof", "preset", "n_params", "vocab_size", "d_model", "n_layers", "n_heads",
              "seq_len", "wait", "warmup", "active", "profiled_steps", "profile_memory", "with_stack",
              "record_shapes", "forward", "backward", "optimizer", "dp", "mlp_ratio", "param_dtypes", "float32"}
    assert set(manifest) == top - nested
    assert set(manifest["phases"]) == {"forward", "backward", "optimizer"}
    assert manifest["world_size"] == 2 and manifest["mesh"] == {"dp": 2}
    assert manifest["options"]["paradigm"] == "fsdp" and manifest["options"]["gpus"] == 2
    assert manifest["tokens_per_step"] == manifest["global_batch_size"] * manifest["model"]["seq_len"]
    params_keys = {"tensors", "count", "bytes", "by_dtype"}
    rank_keys = documented_keys('"ranks": [', '"memory": {') - params_keys - {"float32"} | {"memory"}
    memory_keys = documented_keys('"memory": {', '"pipeline"') - {"memory"}
    for rank, entry in enumerate(manifest["ranks"]):
        assert set(entry) == rank_keys - {"ranks"}
        assert set(entry["memory"]) == memory_keys
        assert set(entry["params"]) == params_keys and entry["params"]["by_dtype"] == {"float32": entry["params"]["count"]}
        assert entry["rank"] == rank and entry["trace"] == f"rank{rank}.json.gz"
        assert len(entry["losses"]) == len(entry["step_time_s"]) == manifest["options"]["steps"]


def test_folder_holds_exactly_the_documented_files(runs):
    run_dir = runs("fsdp", 2)
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["logs", "rank0.json.gz", "rank1.json.gz", "run.json"]
    assert not list(run_dir.parent.glob(".*.tmp")), "temporary folders are renamed away on success"
    for rank in range(2):
        with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as f:
            trace = json.load(f)
        assert trace["distributedInfo"]["backend"] == "gloo"
        assert trace["record_shapes"] is True or trace["record_shapes"] == 1

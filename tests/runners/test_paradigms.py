"""Every data-parallel runner at 2 (and 4) gloo ranks: loss parity with a single process, the
ZeRO memory table, and traces that contain the phases and the collectives.

One `ptprof run` per (paradigm, ranks), shared through the session fixture `runs` (tests/conftest.py).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import STEPS
from tests.runners.reference import param_bytes, single_process_losses

pytestmark = pytest.mark.multirank

PARADIGMS = ["ddp", "zero1", "zero2", "fsdp"]


@pytest.fixture(scope="session")
def reference_losses():
    return single_process_losses(steps=STEPS)


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


@pytest.mark.parametrize("paradigm", PARADIGMS)
def test_losses_match_single_process(runs, reference_losses, paradigm):
    losses = manifest(runs(paradigm, 2))["losses"]
    assert len(losses) == STEPS
    for got, want in zip(losses, reference_losses):
        assert abs(got - want) / abs(want) < 1e-4, (losses, reference_losses)
    # The model actually trains (guards against a reference that trivially agrees).
    assert reference_losses[-1] < reference_losses[0]


# The ZeRO table: which model states each stage shards across N ranks.
SHARDED = {
    "ddp": set(),
    "zero1": {"optimizer_bytes"},
    "zero2": {"optimizer_bytes", "grads_bytes"},
    "fsdp": {"optimizer_bytes", "grads_bytes", "params_bytes"},
}


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("paradigm", ["zero1", "zero2", "fsdp"])
def test_persistent_memory_reproduces_zero_table(runs, paradigm, ranks):
    ddp = manifest(runs("ddp", ranks))["ranks"]
    this = manifest(runs(paradigm, ranks))["ranks"]
    # DDP holds the full model states; sanity-check it against the model's own size.
    full_params = param_bytes()
    assert ddp[0]["memory"]["params_bytes"] == full_params
    assert ddp[0]["memory"]["grads_bytes"] == full_params
    assert abs(ddp[0]["memory"]["optimizer_bytes"] - 2 * full_params) / (2 * full_params) < 0.01  # exp_avg + exp_avg_sq
    for rank in range(ranks):
        for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            ratio = this[rank]["memory"][key] / ddp[rank]["memory"][key]
            if key in SHARDED[paradigm]:
                assert abs(ratio - 1 / ranks) <= 0.1 / ranks, (paradigm, rank, key, ratio)
            else:
                assert ratio >= 0.99, (paradigm, rank, key, ratio)


def test_zero2_keeps_full_parameters_through_the_step_but_not_at_rest(runs):
    mem = manifest(runs("zero2", 2))["ranks"][0]["memory"]
    full = param_bytes()
    # Unsharded copy kept from forward to backward, plus the rank's own shard.
    assert mem["params_bytes"] == full + full // 2
    assert mem["params_at_rest_bytes"] == full // 2


def _trace_names(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    return trace, [e.get("name", "") for e in trace["traceEvents"]]


# Collective enqueues each paradigm must show on the main thread (gloo's c10d op names).
COLLECTIVES = {
    "ddp": {"c10d::allreduce_"},
    "zero1": {"c10d::allreduce_", "c10d::broadcast_"},
    "zero2": {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"},
    "fsdp": {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"},
}


@pytest.mark.parametrize("paradigm", PARADIGMS)
def test_traces_have_every_rank_phases_and_collectives(runs, paradigm):
    run_dir = runs(paradigm, 2)
    m = manifest(run_dir)
    for rank in range(2):
        trace, names = _trace_names(run_dir / f"rank{rank}.json.gz")
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
        for phase in m["phases"].values():
            assert names.count(phase) == 2, (phase, names.count(phase))  # one per active step
        assert sum(n.startswith("ProfilerStep#") for n in names) == 2
        for op in COLLECTIVES[paradigm]:
            assert op in names, f"{op} missing from {paradigm} rank {rank}"
        assert any(n.startswith("gloo:") for n in names)

"""Real CUDA runs of `ptprof run` (tests/data/h100, made on an H100): the runner-to-profiler contract
for GPU runs, kept tested on machines without one. Before these were recorded, `ptprof analyze`
refused every CUDA run (run.json's per-GPU peak list failed the manifest check) and counted
cuBLAS's 64 MiB workspace as activations; both were found the first time a GPU was lent.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.profiler.test_cli import analyze

H100 = Path(__file__).resolve().parents[1] / "data" / "h100"
MiB = 1 << 20

# Measured on the same machine by torch itself, not by ptprof (tests/data/h100/README.md): the
# tiny GPT under DDP, world 1, NCCL; memory_allocated() before a step, max_memory_allocated() during it.
TORCH_BEFORE_STEP_BYTES = 69_261_312
TORCH_PEAK_BYTES = 72_295_424


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """`ptprof analyze --json` of each run, once: run name -> its report."""
    out = {}
    for run in ("ddp-1", "fsdp-offload-1"):
        path = tmp_path_factory.mktemp("reports") / f"{run}.json"
        res = analyze(H100 / run, "--json", path, "--quiet")
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr
        (out[run],) = json.loads(path.read_text())["runs"]
    return out


def test_a_cuda_run_is_read_with_its_per_gpu_peaks(reports):
    from profiler.discover import manifest_problem

    manifest = json.loads((H100 / "ddp-1" / "run.json").read_text())
    assert manifest["ranks"][0]["memory"]["max_memory_allocated_by_gpu_bytes"] == [72_295_936]
    assert manifest_problem(manifest) is None
    r = reports["ddp-1"]
    assert (r["backend"], r["world_size"]) == ("nccl", 1)
    (mem,) = r["memory"]["persistent"]
    # run.json's max_memory_allocated_bytes (a list per GPU beside it was what failed the check).
    assert mem["max_memory_allocated_bytes"] == 72_295_936
    # Kernels on the GPU: the breakdown is over the device's timeline, two profiled steps.
    assert [s["step"] for s in r["steps"] if s["device"] == "gpu"] == [1, 2]
    assert all(s["compute_us"] > 0 and s["idle_us"] > 0 for s in r["steps"])


def test_the_floor_and_the_activations_agree_with_torchs_own_counter(reports):
    r = reports["ddp-1"]
    (peak,) = [p for p in r["memory"]["peaks"] if p["mem_device"] == "cuda:0"]
    # The level every step comes back down to is torch's memory_allocated() before a step.
    assert peak["floor_allocated_bytes"] == TORCH_BEFORE_STEP_BYTES
    # Its peak is torch's max_memory_allocated(), within one 512 B block (two processes' runs).
    assert abs(peak["peak_allocated_bytes"] - TORCH_PEAK_BYTES) <= 512
    (act,) = r["theory"]["activation"]
    # Activations: torch's peak − before = 3,034,112 B (2.89 MiB), not the 66.9 MiB said before
    # (64 MiB of it cuBLAS's workspaces).
    assert act["activation_bytes"] == pytest.approx(TORCH_PEAK_BYTES - TORCH_BEFORE_STEP_BYTES, abs=512)
    assert 64 * MiB <= act["other_bytes"] < 64 * MiB + 64 * 1024  # 2 x 32 MiB workspaces + the batch
    assert act["activation_pct"] < 5
    # So no finding tells this run to recompute its activations.
    assert "activation-memory" not in {f["rule"] for f in r["findings"]}


def test_offloaded_state_leaves_the_gpu_its_workspaces_and_activations(reports):
    r = reports["fsdp-offload-1"]
    (act,) = r["theory"]["activation"]
    (peak,) = [p for p in r["memory"]["peaks"] if p["mem_device"] == "cuda:0"]
    # Nothing persistent on the GPU between uses: its floor is ddp's less the model's state
    # (params, grads and AdamW's two moments: 4 x 535,040 B, within 8 KiB of small buffers) ...
    params_bytes = 535_040
    assert TORCH_BEFORE_STEP_BYTES - peak["floor_allocated_bytes"] == pytest.approx(4 * params_bytes, abs=8192)
    assert act["persistent_bytes"] == 0 and act["other_bytes"] > 64 * MiB
    # ... and what it holds above the floor is the same step's activations, plus at most the units
    # it gathered onto the GPU at that moment (one full copy of the parameters and gradients).
    golden = TORCH_PEAK_BYTES - TORCH_BEFORE_STEP_BYTES
    assert golden - 512 <= act["activation_bytes"] <= golden + 2 * params_bytes
    assert "host memory" in act["basis"]


def test_hta_failing_on_a_trace_is_said_with_its_own_check():
    # HTA 0.5 asserts non_compute_time >= 0 on this trace: the report names HTA's line, not ptprof.
    res = analyze(H100 / "ddp-1", "--hta")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "HTA could not analyze this run" in text
    assert "AssertionError at hta/analyzers/breakdown_analysis.py:" in text and "(assert non_compute_time >= 0)" in text


def test_the_text_report_says_what_the_gpu_holds_all_step():
    res = analyze(H100 / "ddp-1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("== Activations at the peak")))
    section = " ".join(" ".join(lines[at:at + 9]).split())
    assert "cuda:0 activations 2.89 MiB" in section and "cuda:0 other, held all step 64.0 MiB" in section
    assert max(map(len, lines)) <= 100
    # The host's peak (192 KiB on the offload run, whose state is MiBs of host memory) says what it counts.
    at = lines.index(next(x for x in lines if x.startswith("== Memory peaks")))
    assert lines[at + 1] == "  (cpu: only allocations made while profiling ran, not host memory held from before)"


def test_a_group_of_one_rank_sends_nothing():
    # World 1 (one H100): DDP still calls its all-reduce and broadcasts, but a ring of one moves
    # no bytes; two ranks of the same model move 2(n-1)/n = 1x the buffer, DDP's textbook 2Φ.
    from profiler.theory import predict_comm

    manifest = json.loads((H100 / "ddp-1" / "run.json").read_text())
    one = predict_comm({"r": manifest})
    assert set(one["group_size"]) == {1} and one["bytes"].sum() > 0
    assert one["traffic_bytes"].to_list() == [0.0] * one.height and one["phi"].to_list() == [0.0] * one.height
    two = dict(manifest, world_size=2, ranks=[dict(manifest["ranks"][0], rank=r) for r in (0, 1)], mesh={"dp": 2})
    ar = predict_comm({"r": two}).filter((pl.col("rank") == 0) & (pl.col("collective") == "all_reduce")
                                         & (pl.col("phase") == "backward"))
    assert ar["traffic_bytes"].to_list() == [float(ar["bytes"][0])] and ar["phi"].to_list() == [pytest.approx(2.0)]


def test_a_world_1_run_says_why_its_collectives_have_no_measurement(reports):
    # NCCL launches no kernel for a group of one: DDP's all-reduce and broadcasts leave CPU spans only.
    check = {r["quantity"]: r for r in reports["ddp-1"]["theory"]["check"]}
    for kind in ("all_reduce", "broadcast"):
        row = check[f"{kind} bytes/step"]
        assert row["verdict"] == "no measurement" and row["note"] == "a group of one rank: no collective kernel ran, nothing moved"

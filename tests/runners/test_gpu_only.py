"""The GPU-only runners: `dp` (torch.nn.DataParallel) and `fsdp --offload` (FSDP2 CPUOffloadPolicy).

On a machine without CUDA they are refused in one line before any process starts (tested here on
every machine). On a GPU machine the tests below the line run them for real (the suite hides GPUs
without PTPROF_TEST_GPU=1, tests/conftest.py):

    PTPROF_TEST_GPU=1 python -m pytest tests/runners/test_gpu_only.py

dp at 2 GPUs (skipped with fewer): loss parity with a single process, one process and one trace
with kernels on both GPUs, the run.json fields that say so. fsdp --offload (2 ranks, or 1 on a
one-GPU machine): loss parity, pinned host<->device copies in the trace (shards copied in before
each all-gather, gradient shards copied out after each reduce-scatter), and a lower GPU peak
than the same fsdp run without offload.
"""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
import torch

from tests.conftest import STEPS, ptprof
from tests.runners.reference import single_process_losses

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
DP_REASON = "dp (torch.nn.DataParallel) drives several GPUs from one process and needs CUDA"
OFFLOAD_REASON = "fsdp --offload (FSDP2 CPUOffloadPolicy) moves sharded state between GPU and CPU memory and needs CUDA"


def refused(tmp_path, *args: str) -> str:
    """The one error line of a request refused before any process starts (exit 2, nothing written)."""
    res = ptprof("run", *args, "--out", str(tmp_path))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ptprof run: error: "), res.stderr
    assert not list(tmp_path.iterdir()), "nothing may be written for a refused request"
    return lines[0].removeprefix("ptprof run: error: ")


@pytest.mark.parametrize("args, reason", [(("dp", "--gpus", "2"), DP_REASON),
                                          (("fsdp", "--gpus", "2", "--offload"), OFFLOAD_REASON),
                                          # refused for needing CUDA before any batch or model check
                                          (("dp", "--gpus", "3"), DP_REASON),
                                          (("fsdp", "--gpus", "3", "--offload"), OFFLOAD_REASON),
                                          (("dp", "--gpus", "2", "--nnodes", "2", "--rdzv-endpoint", "h:1",
                                            "--name", "r"), DP_REASON)])
def test_gpu_only_refused_on_cpu(tmp_path, args, reason):
    # --device cpu asks for gloo CPU ranks on any machine; without CUDA that is also the default.
    assert refused(tmp_path, *args, "--device", "cpu").startswith(reason)
    if not GPUS:
        assert refused(tmp_path, *args).startswith(reason)


@pytest.mark.parametrize(
    "args, line",
    [
        (("ddp", "--gpus", "2", "--offload"), "--offload does not apply to ddp: it is for fsdp"),
        (("zero2", "--gpus", "2", "--offload"), "--offload does not apply to zero2: it is for fsdp"),
        (("ddp", "--gpus", "2", "--loss-parallel"), "--loss-parallel does not apply to ddp: it is for tp"),
    ],
)
def test_flags_of_other_paradigms_refused(tmp_path, args, line):
    assert refused(tmp_path, *args) == line


@pytest.mark.parametrize("gpus, line", [
    (2, "dp is one process on one node (torch.nn.DataParallel); --nnodes 2 needs ddp"),
    (3, "--batch-size 8 is not divisible by the 3 GPUs (an equal chunk of the batch on each); use a multiple of 3"),
])
def test_dp_checks_where_cuda_is_there(gpus, line):
    # What a GPU machine says after the CUDA check passes (on CPU the CUDA refusal comes first).
    from runners.options import RunOptions
    from runners.paradigms import problem_with

    assert problem_with(RunOptions(paradigm="dp", gpus=gpus, nnodes=1 if gpus == 3 else 2)) == line


@pytest.mark.skipif(GPUS > 0, reason="this machine has CUDA: --device cuda would find GPUs")
@pytest.mark.parametrize("args, line", [
    (("dp", "--gpus", "2"), "dp (one process driving every GPU) needs 2 CUDA GPUs on this node, but none is visible"),
    (("dp", "--gpus", "3"), "dp (one process driving every GPU) needs 3 CUDA GPUs on this node, but none is visible"),
    (("fsdp", "--gpus", "2", "--offload"),
     "fsdp --offload (one rank per GPU) needs 2 CUDA GPUs on this node, but none is visible"),
])
def test_gpu_only_asking_for_cuda_without_gpus_says_what_it_needs(tmp_path, args, line):
    # For gloo paradigms the error suggests --device cpu or fewer --gpus; a GPU-only one can take neither.
    # Where CUDA_VISIBLE_DEVICES is set (the suite sets it empty: tests/conftest.py) the line says so.
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert refused(tmp_path, *args, "--device", "cuda") == line + (f" (CUDA_VISIBLE_DEVICES={hidden})" if hidden is not None else "")


# ---------------------------------------------------------------------------------------------
# On a GPU machine (each test skips without enough GPUs)


def gpu_run(tmp_path, name: str, *args: str) -> tuple[dict, object]:
    """A real `ptprof run` on CUDA: (run.json, its folder)."""
    res = ptprof("run", *args, "--steps", str(STEPS), "--warmup", "1", "--active", "2", "--profile-memory",
                 "--out", str(tmp_path), "--name", name, "--timeout", "120", timeout=600)
    assert res.returncode == 0, f"ptprof run {args} failed:\n{res.stdout}\n{res.stderr}"
    return json.loads((tmp_path / name / "run.json").read_text()), tmp_path / name


def assert_single_process_losses(losses: list[float]) -> None:
    # The reference runs on the CPU; CUDA kernels sum in other orders: relative 1e-4, as elsewhere.
    for got, ref in zip(losses, single_process_losses(steps=STEPS), strict=True):
        assert abs(got - ref) / abs(ref) < 1e-4, (losses, ref)


def gpu_copies(run_dir, rank: int) -> dict[str, int]:
    """Counts of this rank's GPU copies by Kineto name, e.g. 'Memcpy HtoD (Pinned -> Device)'
    (profiler.classify: device "gpu", kind "memory", as HTA counts Memcpy/Memset)."""
    from profiler import load_traces

    ev = load_traces(run_dir).events.filter((pl.col("rank") == rank) & (pl.col("device") == "gpu")
                                            & (pl.col("kind") == "memory"))
    return dict(ev.group_by(pl.col("name").cast(pl.String)).len().iter_rows())


@pytest.mark.multirank
@pytest.mark.skipif(GPUS < 2, reason="dp needs 2 CUDA GPUs")
def test_dp_on_two_gpus(tmp_path):
    m, run_dir = gpu_run(tmp_path, "dp", "dp", "--gpus", "2")
    assert_single_process_losses(m["losses"])
    # One process, two GPUs: recorded as such, one trace holding both GPUs' kernels (pid = device).
    assert (m["world_size"], m["mesh"], m["gpus_per_process"], m["backend"]) == (1, {"dp": 2}, 2, "nccl")
    assert sorted(p.name for p in run_dir.glob("rank*.json.gz")) == ["rank0.json.gz"]
    assert m["ranks"][0]["loss_tokens"] == m["tokens_per_step"]  # the whole global batch
    from profiler import load_traces

    traces = load_traces(run_dir)
    kernels = traces.events.filter((pl.col("device") == "gpu") & (pl.col("kind") == "compute"))
    assert kernels["pid"].n_unique() == 2, kernels["pid"].unique().to_list()
    # ptprof analyze: no breakdown merging both GPUs' timelines into one, and a warning saying why.
    from profiler import analyze

    a = analyze(traces)
    assert a.breakdown.is_empty() and a.exposed.is_empty()
    assert any("one process driving 2 GPUs" in w and "not supported yet" in w for w in a.warnings), a.warnings
    # Every GPU's training peak; cuda:0 also holds the optimizer state, the reduced gradients and
    # the gathered logits: DataParallel's imbalance.
    mem = m["ranks"][0]["memory"]
    peaks = mem["max_memory_allocated_by_gpu_bytes"]
    assert len(peaks) == 2 and peaks[1] > 0 and peaks[0] == mem["max_memory_allocated_bytes"]
    assert peaks[0] > peaks[1], peaks


@pytest.mark.multirank
@pytest.mark.skipif(GPUS < 1, reason="fsdp --offload needs CUDA")
def test_fsdp_offload(tmp_path):
    ranks = str(min(GPUS, 2))
    off, off_dir = gpu_run(tmp_path, "off", "fsdp", "--gpus", ranks, "--offload")
    plain, plain_dir = gpu_run(tmp_path, "plain", "fsdp", "--gpus", ranks)
    assert_single_process_losses(off["losses"])
    assert off["offload"] == {"policy": "CPUOffloadPolicy", "state_device": "cpu", "pin_memory": True}
    assert plain["offload"] is None
    units = 4  # tiny: embeddings, 2 blocks, norm + head (runners/fsdp.py apply_fsdp_units)
    for rank in range(int(ranks)):
        copies, base = gpu_copies(off_dir, rank), gpu_copies(plain_dir, rank)
        h2d, base_h2d = (sum(n for name, n in c.items() if "HtoD" in name) for c in (copies, base))
        d2h, base_d2h = (sum(n for name, n in c.items() if "DtoH" in name) for c in (copies, base))
        # Per profiled step: every unit's shards in (one copy per parameter, pinned -> device) before
        # its forward and its backward all-gather, its gradient shards out after its reduce-scatter.
        # Plain fsdp copies only the batch in and the loss out (the same in both runs).
        assert h2d - base_h2d >= 2 * units * 2, (copies, base)
        assert d2h - base_d2h >= units * 2, (copies, base)
        # The sharded state (parameters, gradients, AdamW moments) is off the GPU: a lower peak.
        off_peak = off["ranks"][rank]["memory"]["max_memory_allocated_bytes"]
        plain_peak = plain["ranks"][rank]["memory"]["max_memory_allocated_bytes"]
        assert off_peak < plain_peak, (off_peak, plain_peak)


@pytest.mark.multirank
@pytest.mark.skipif(GPUS < 1, reason="ep on CUDA needs a GPU")
def test_ep_trains_on_cuda(tmp_path):
    # On the first GPU lent (an H100, torch 2.11) ep failed in its first step: its routing counts
    # concatenated a CPU tensor with CUDA ones. Written after that fix was seen to run there by hand
    # (`ptprof run ep --gpus 1 ...`: exit 0); not yet run as this test on a GPU.
    m, run_dir = gpu_run(tmp_path, "ep", "ep", "--gpus", "1")
    assert (m["backend"], m["world_size"]) == ("nccl", 1)
    routing = m["moe"]["routing"]
    assert len(routing) == STEPS and all(layer["tokens_per_expert"] for step in routing for layer in step)
    assert (run_dir / "rank0.json.gz").is_file()

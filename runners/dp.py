"""Single-process data parallelism with torch.nn.DataParallel: the baseline DDP is measured against.

    ptprof run dp --gpus 2       # one process drives 2 GPUs (CUDA only; on CPU: an error, exit 2)

One Python process holds the model and the optimizer on cuda:0. Every forward, DataParallel
copies the parameters to each GPU (a broadcast from cuda:0), cuts the global batch into one chunk
per GPU, runs the replicas in one thread each, and gathers their outputs (here the logits) back on
cuda:0, where the loss is computed over the whole batch. In backward the replicas' gradients are
summed onto cuda:0. Compared with DDP: the replication every step, the serialised gather and
reduce through GPU 0, and one GIL for N GPUs, which is why DDP (one process per GPU) replaced it.

torchrun starts this one process as a world of 1 (the harness's process group, NCCL, unused by
DataParallel: its copies are torch.cuda.comm, not c10d collectives), so run.json has
world_size 1, one trace (rank0.json.gz, kernels of every GPU in it, pid = the GPU's index),
mesh {"dp": N} and gpus_per_process N.
"""

from __future__ import annotations

import torch
from torch import nn

from runners import harness


def apply_dp(model: nn.Module, ctx: harness.Context) -> harness.Parallel:
    gpus = ctx.opts.gpus  # GPUs driven by this one process (runners.paradigms: 1 process per node)
    if ctx.device.type != "cuda" or ctx.world_size != 1 or torch.cuda.device_count() < gpus:
        # `ptprof run` refuses all of these before starting; a direct `python -m runners.dp` may not.
        raise RuntimeError(f"dp drives {gpus} GPUs from one process: needs CUDA, {gpus} visible GPUs, a world of 1")
    # The model is already on cuda:0 (harness: local rank 0); DataParallel's home device must be it.
    dp = nn.DataParallel(model, device_ids=list(range(gpus)), output_device=0)
    optimizer = harness.make_optimizer(dp.parameters(), ctx.opts)  # the cuda:0 parameters only

    extra = {"gpus_per_process": gpus}

    def record_every_gpu_peak() -> None:
        # The harness records cuda:0's peak; the replicas' GPUs hold activations and copies too.
        extra["max_memory_allocated_by_gpu_bytes"] = [torch.cuda.max_memory_allocated(i) for i in range(gpus)]

    # The one process takes the whole global batch on cuda:0 (dp_size 1): DataParallel scatters it.
    return harness.Parallel(dp, optimizer, mesh={"dp": gpus}, dp_rank=0, dp_size=1, extra=extra,
                            after_training=record_every_gpu_peak)


if __name__ == "__main__":
    harness.main(apply_dp)

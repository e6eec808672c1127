"""Memory per GPU of a transformer layout: parameters, gradients and optimizer state under ZeRO
stages (issue 8's table), plus activations (Korthikanti et al. 2022: sbh(34 + 5as/h) per layer,
divided by tensor/sequence parallelism, cut by selective or full recomputation; pipelines keep
microbatches in flight). docs/whatif.md, "Memory".
"""

from __future__ import annotations

from profiler.layout import Layout, ModelSpec


def memory_per_gpu(spec: ModelSpec, layout: Layout) -> dict[str, int]:
    """Bytes on the most loaded GPU: params, grads, optimizer, activations, total."""
    raise NotImplementedError("issue 15: plan memory")

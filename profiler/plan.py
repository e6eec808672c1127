"""`ptprof plan`: enumerate the parallel layouts of a model on G GPUs of a cluster, keep those
that divide and fit memory, rank them by predicted step time, and say why the best win and where
the rule-of-thumb layout ranks. docs/whatif.md, "Plan".
"""

from __future__ import annotations

from dataclasses import dataclass

from profiler.cluster import Cluster
from profiler.layout import Estimate, Layout, ModelSpec


@dataclass
class PlanResult:
    ranked: list[Estimate]  # fitting layouts, fastest first
    considered: int  # layouts enumerated
    refused: dict[str, int]  # why the others were dropped ("does not fit HBM": n, ...)
    rule_of_thumb: Estimate | None
    rule_of_thumb_rank: int | None  # 1-based rank among `ranked`, None if it does not fit
    assumptions: list[str]


def rule_of_thumb(spec: ModelSpec, gpus: int, cluster: Cluster) -> Layout:
    """The teaching rule: one GPU fits -> DDP (or ZeRO-1); one node fits -> FSDP; otherwise TP
    inside a node, then PP across nodes, then DP outermost."""
    raise NotImplementedError("issue 15: plan")


def plan(spec: ModelSpec, gpus: int, cluster: Cluster) -> PlanResult:
    """Every layout of `spec` on `gpus` GPUs of `cluster`, ranked (see the module docstring)."""
    raise NotImplementedError("issue 15: plan")

"""The analytical step-time model of a transformer layout on a cluster (`ptprof plan`, and
`ptprof project` with the compute a trace measured): compute from FLOPs at a size-dependent
efficiency (roofline), communication from profiler.commcost, overlap as each paradigm schedules it,
the pipeline bubble, and memory per GPU (profiler.plan_memory). docs/whatif.md.
"""

from __future__ import annotations

from profiler.cluster import Cluster
from profiler.layout import Estimate, Layout, ModelSpec


def estimate(spec: ModelSpec, layout: Layout, cluster: Cluster, *, compute_scale: float | None = None) -> Estimate:
    """Predicted step of `layout` for `spec` on `cluster`. compute_scale: a measured correction of
    the analytical compute time (project: measured/predicted on the source); None: assumed
    efficiencies only (said in the assumptions)."""
    raise NotImplementedError("issue 15: cost model")

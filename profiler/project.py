"""`ptprof project RUN --cluster C [--nodes N] [--layout ...]`: the step a profiled run would take
on a target cluster, in its own layout or another: compute from the run's measured per-op work
(FLOPs from recorded shapes; kernel times on GPU traces), communication from issue 8's volumes
under the target's α–β, overlap as the paradigm schedules it, pipelines by replaying the schedule
(profiler.pipeline.simulate_order). docs/whatif.md, "Project".
"""

from __future__ import annotations

from profiler.cluster import Cluster
from profiler.layout import Estimate, Layout


def project_run(run_dir: str, cluster: Cluster, *, nodes: int | None = None, layout: Layout | None = None) -> Estimate:
    """Predicted step of the run in `run_dir` on `cluster` (its own layout unless `layout`)."""
    raise NotImplementedError("issue 15: project")


def calibrate_cluster(run_dir: str) -> Cluster:
    """The "cluster" a run was measured on, from its own traces: op throughput from its ops, α–β
    of each link from its collectives (a CPU/gloo run: one node of `world_size` ranks)."""
    raise NotImplementedError("issue 15: project")

"""Communication under the α–β model on a target cluster: which link a group's traffic crosses
(NVLink inside a node, the NIC between nodes, by rank layout) and how long a collective of n
bytes takes on it, with ring and tree algorithm factors (docs/whatif.md, "Communication").

time = steps·α + traffic/(β·link_efficiency), where traffic is the bytes one GPU sends (nccl-tests'
busbw factors: 2(n−1)/n of the buffer for a ring all-reduce, (n−1)/n for all-gather,
reduce-scatter and all-to-all) and steps the algorithm's latency terms.
"""

from __future__ import annotations

from profiler.cluster import Cluster, Link


def group_link(cluster: Cluster, group_size: int, stride: int) -> Link:
    """The slowest link a group of `group_size` ranks `stride` apart crosses: intra-node when
    the group fits inside one node (group_size·stride <= gpus_per_node), else inter-node."""
    raise NotImplementedError("issue 15: communication cost")


def collective_s(kind: str, nbytes: float, group_size: int, link: Link, *, efficiency: float = 1.0,
                 algorithm: str = "ring") -> float:
    """Seconds for one `kind` (all_reduce, all_gather, reduce_scatter, all_to_all, send/recv,
    broadcast) of `nbytes` (nccl-tests size convention, profiler.collectives) over `group_size`
    ranks on `link`. 0 for a group of 1."""
    raise NotImplementedError("issue 15: communication cost")

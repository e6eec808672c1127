"""Communication under the α–β model on a target cluster: which link a group's traffic crosses
(NVLink inside a node, the NIC between nodes, by rank layout) and how long a collective of n
bytes takes on it, with ring and tree algorithm factors (docs/whatif.md, "Communication").

time = steps·α + traffic / (β·efficiency), where traffic is the bytes one GPU sends (nccl-tests'
busbw factors: 2(n−1)/n of the buffer for a ring all-reduce, (n−1)/n for all-gather,
reduce-scatter and all-to-all, the whole message for send/recv and broadcast) and steps the
algorithm's latency terms: 2(n−1) for a ring all-reduce, n−1 for the other ring collectives,
2·⌈log2 n⌉ for a (double binary) tree all-reduce, whose bandwidth term NCCL brings to the ring's.
"""

from __future__ import annotations

import math
import numbers
from functools import lru_cache

from profiler.cluster import Cluster, Link

# Share of the buffer one rank sends, by kind (n = group size): nccl-tests' busbw factors.
TRAFFIC_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send": lambda n: 1.0, "recv": lambda n: 1.0, "send_recv": lambda n: 1.0, "broadcast": lambda n: 1.0,
}
ALGORITHMS = ("ring", "tree", "auto")


def group_link(cluster: Cluster, group_size: int, stride: int, *, world_size: int | None = None,
               p2p: bool = False) -> Link:
    """The slowest link a group of `group_size` ranks `stride` apart crosses, under the rank order
    of profiler.layout.group_stride (nodes hold consecutive ranks).

    The groups of one dimension tile the ranks in aligned blocks of span = group_size·stride
    consecutive ranks. Every block stays inside a node when the span divides the GPUs per node
    (tp=8 stride 1 on 8-GPU nodes: intra; dp=2 stride 8: inter); a span that does not divide it
    puts some block across a node boundary, and a collective runs at its slowest group, so that is
    inter too. `world_size`, when given, places the whole job on one node when it fits there (6
    GPUs of an 8-GPU node: every group is intra).

    A group across nodes with k members in each node drives k NICs at once: NCCL runs one channel
    per NIC and its tuning model prices the inter-node ring at nChannels·bwInter (src/graph/
    tuning.cc), capped by what the node's members can feed it over the intra-node link. So the
    returned link has bandwidth min(intra, k·inter) and the NIC's latency, with k = min(n,
    gpus_per_node // stride) when the blocks cover whole nodes (span a multiple of gpus_per_node,
    stride dividing it), else k = 1 (some node holds a single member of a straddling group).

    Inside a node on a point-to-point mesh (the intra link has `peer_gbps`, MI300X's xGMI): a
    group of n has n-1 peer links to spread its rings over, min(bw_gbps, (n-1)·peer_gbps); a
    send/recv (`p2p`: pipeline sends, ring attention) uses one peer link."""
    if group_size <= 1:
        return cluster.intra
    if not crosses_nodes(cluster, group_size, stride, world_size=world_size):
        return cluster.intra if cluster.intra.peer_gbps is None else _mesh_link(cluster.intra, group_size, p2p)
    span, gpn = group_size * stride, cluster.gpus_per_node
    k = min(group_size, gpn // stride) if (span % gpn == 0 and stride < gpn and gpn % stride == 0) else 1
    if k <= 1:
        return cluster.inter
    return _nic_link(cluster.inter, cluster.intra, k)


def crosses_nodes(cluster: Cluster, group_size: int, stride: int, *, world_size: int | None = None) -> bool:
    """Whether some group of this dimension spans nodes (group_link's placement rule)."""
    span, gpn = group_size * stride, cluster.gpus_per_node
    if group_size <= 1 or (world_size is not None and world_size <= gpn):
        return False
    return not (span <= gpn and gpn % span == 0)


@lru_cache(maxsize=1024)
def _mesh_link(intra: Link, n: int, p2p: bool) -> Link:
    """The intra link as a group of n uses it: all of it on a switch, (n-1) peer links (one for p2p) on a mesh."""
    if intra.peer_gbps is None:
        return intra
    bw = intra.peer_gbps if p2p else min(intra.bw_gbps, (n - 1) * intra.peer_gbps)
    return Link(f"{intra.name} ({1 if p2p else n - 1} peer link{'s' if not p2p and n > 2 else ''})", bw,
                intra.latency_us, intra.peer_gbps)


@lru_cache(maxsize=1024)
def _nic_link(inter: Link, intra: Link, k: int) -> Link:
    """k NICs of a node carrying one group's ring: k·inter bandwidth, at most the intra link's."""
    return Link(f"{inter.name} x{k}", min(intra.bw_gbps, k * inter.bw_gbps), inter.latency_us)


def latency_steps(kind: str, group_size: int, algorithm: str = "ring") -> int:
    """α terms of one collective: ring all-reduce 2(n−1), tree 2⌈log2 n⌉, other rings n−1, p2p 1."""
    n = group_size
    if kind in ("send", "recv", "send_recv"):
        return 1
    if kind == "all_reduce":
        ring, tree = 2 * (n - 1), 2 * math.ceil(math.log2(n))
        return {"ring": ring, "tree": tree, "auto": min(ring, tree)}[algorithm]
    return n - 1


def collective_s(kind: str, nbytes: float, group_size: int, link: Link, *, efficiency: float = 1.0,
                 algorithm: str = "ring") -> float:
    """Seconds for one `kind` of `nbytes` (nccl-tests size convention, profiler.collectives) over
    `group_size` ranks on `link`, whose bandwidth reaches `efficiency` of its peak. 0 for a group
    of 1 (nothing leaves the GPU). ValueError for a kind or algorithm it does not know, a group
    size below 1, a negative or non-finite size, an efficiency outside (0, 1] or a link without
    bandwidth -- each would otherwise be a wrong time, not an error."""
    if kind not in TRAFFIC_FACTOR:
        raise ValueError(f"collective {kind!r}: one of {', '.join(TRAFFIC_FACTOR)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r}: one of {', '.join(ALGORITHMS)}")
    # A number is right or refused: these would give a negative, infinite or NaN time.
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 1:
        raise ValueError(f"group size {group_size!r}: a whole number >= 1")
    if not (math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"message size {nbytes!r} bytes: a finite number >= 0")
    if not (0 < efficiency <= 1):
        raise ValueError(f"link efficiency {efficiency!r}: in (0, 1]")
    if not (math.isfinite(link.bw_gbps) and link.bw_gbps > 0 and math.isfinite(link.latency_us) and link.latency_us >= 0):
        raise ValueError(f"link {link.name!r}: bandwidth must be > 0 and latency >= 0")
    if group_size <= 1 and kind not in ("send", "recv", "send_recv"):
        return 0.0
    n = max(group_size, 2)
    traffic = TRAFFIC_FACTOR[kind](n) * nbytes
    return latency_steps(kind, n, algorithm) * link.latency_us * 1e-6 + traffic / (link.bw_gbps * 1e9 * efficiency)

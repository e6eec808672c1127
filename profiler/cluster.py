"""Target clusters for `ptprof project` / `ptprof plan`: the presets shipped as data in
profiler/clusters/*.toml (each number with its source in a comment) and the user's own TOML or
JSON file of the same fields (docs/whatif.md, "Clusters").

A cluster is what the cost model needs of the hardware: peak dense FLOP/s, HBM size and
bandwidth, and two links -- inside a node (NVLink / xGMI) and between nodes (the NIC per GPU) --
each with a bandwidth and a latency (the α and β of profiler.commcost).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PRESET_DIR = Path(__file__).with_name("clusters")


class ClusterError(ValueError):
    """A cluster that cannot be used: the message names the file or preset and the field."""


@dataclass(frozen=True)
class Link:
    """One kind of link: `bw_gbps` GB/s (1e9 B/s) one way per GPU, `latency_us` per message."""

    name: str
    bw_gbps: float
    latency_us: float


@dataclass(frozen=True)
class Cluster:
    """One GPU kind and its network. `peak_tflops`: dense bf16/fp16 tensor-core peak per GPU
    (no sparsity). Efficiencies (0-1] are the share of a peak that large, well-shaped work
    reaches (docs/whatif.md says where each default comes from)."""

    name: str
    peak_tflops: float
    hbm_gib: float
    hbm_gbps: float
    gpus_per_node: int
    intra: Link
    inter: Link
    gemm_efficiency: float = 0.8  # large-GEMM share of peak (cuBLAS-class)
    hbm_efficiency: float = 0.8  # share of HBM bandwidth a streaming kernel reaches
    link_efficiency: float = 0.8  # share of a link's bandwidth a large collective reaches (busbw / link)
    source: str = ""  # the preset file or user file it came from
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * 2**30)


def preset_names() -> list[str]:
    """The shipped presets' names (file stems), sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_cluster(spec: str) -> Cluster:
    """A preset name (`h100`), or a path to a .toml / .json file of the same fields.
    ClusterError naming the file and the field otherwise."""
    raise NotImplementedError("issue 15: cluster presets")


def cluster_from_dict(data: dict, *, source: str) -> Cluster:
    """Validate one cluster's fields (units as the preset files: TFLOP/s, GiB, GB/s, µs)."""
    raise NotImplementedError("issue 15: cluster presets")


def cluster_to_dict(cluster: Cluster) -> dict:
    """The fields a cluster file holds (load_cluster reads back an equal Cluster)."""
    raise NotImplementedError("issue 15: cluster presets")

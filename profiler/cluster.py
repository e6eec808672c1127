"""Target clusters for `ptprof project` / `ptprof plan`: the presets shipped as data in
profiler/clusters/*.toml (each number with its source in a comment) and the user's own TOML or
JSON file of the same fields (docs/whatif.md, "Clusters").

A cluster is what the cost model needs of the hardware: peak dense FLOP/s, HBM size and
bandwidth, and two links -- inside a node (NVLink / xGMI) and between nodes (the NIC per GPU) --
each with a bandwidth and a latency (the α and β of profiler.commcost).

A file that cannot be used is refused with one ClusterError line naming the file (or preset) and
the field: a missing or unknown field (with the nearest valid name), a wrong type, a number that
is not finite and positive, an efficiency outside (0, 1], a syntax error and where it is.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pyproject installs tomli on 3.10
    import tomli as tomllib

PRESET_DIR = Path(__file__).with_name("clusters")
SUFFIXES = (".toml", ".json")
MAX_FILE_BYTES = 1 << 20  # a cluster file is a few hundred bytes; anything this big is not one

# Other spellings users type for the presets: key = the spelling with case, spaces, '-' and '_'
# removed; value = the preset's file stem.
ALIASES = {
    "a10080gb": "a100", "a100sxm": "a100", "a100sxm4": "a100", "a100sxm480gb": "a100", "dgxa100": "a100",
    "h100sxm": "h100", "h100sxm5": "h100", "h10080gb": "h100", "dgxh100": "h100", "hgxh100": "h100",
    "h200sxm": "h200", "h200141gb": "h200", "dgxh200": "h200", "hgxh200": "h200",
    "b200hgx": "b200", "hgxb200": "b200", "dgxb200": "b200",
    "mi300": "mi300x", "mi300x192gb": "mi300x", "instinctmi300x": "mi300x", "amdmi300x": "mi300x",
}


# GPUs close in spelling to a preset but different hardware (other HBM, PCIe instead of SXM, another
# generation): "did you mean a100?" for them would silently swap the numbers. Squashed as ALIASES.
OTHER_GPUS = frozenset({
    "a10", "a30", "a40", "a800", "b100", "gb200", "gh200", "h20", "h800", "h100nvl", "l4", "l40", "l40s", "mi210",
    "mi250", "mi250x", "mi300a", "mi325x", "mi355x", "p100", "t4", "v100", "v10032gb", "rtx4090", "rtx6000",
})


class ClusterError(ValueError):
    """A cluster that cannot be used: the message names the file or preset and the field."""


HBM_RESERVE_GIB = 2.0  # default reserve per GPU, GiB (Cluster.hbm_reserve_gib says what it holds)


@dataclass(frozen=True)
class Link:
    """One kind of link: `bw_gbps` GB/s (1e9 B/s) one way per GPU, `latency_us` per message.
    `peer_gbps` (optional, the intra link of a point-to-point mesh such as MI300X's xGMI): one
    peer link's bandwidth, so a group of n in a node gets min(bw_gbps, (n-1)·peer_gbps) and a
    send/recv one peer link (commcost.group_link). None: a switch (NVSwitch), any group gets bw_gbps."""

    name: str
    bw_gbps: float
    latency_us: float
    peer_gbps: float | None = None


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
    # HBM the training state cannot use (docs/whatif.md, "Clusters"): the CUDA context and kernel
    # images (~0.8 GB at process start, pytorch/pytorch#34323), NCCL's buffers, which the PyTorch
    # allocator does not see (PyTorch docs, "Understanding CUDA Memory Usage"), and the caching
    # allocator's fragmentation (reserved above allocated). `fits` compares with HBM minus this.
    hbm_reserve_gib: float = HBM_RESERVE_GIB
    # streaming multiprocessors (compute units) per GPU, for wave quantization; None: by preset name
    # (profiler.costmodel_ops.sm_count), or none at all for an unknown GPU
    sms: int | None = None
    # Where it came from (the preset or user file). Not part of equality: the same cluster
    # written to another file and read back is the same cluster.
    source: str = field(default="", compare=False)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        # a list of notes (a hand-built Cluster) would make it unhashable for the cost model's caches
        if not isinstance(self.notes, tuple):
            object.__setattr__(self, "notes", tuple(self.notes) if isinstance(self.notes, (list, set)) else (str(self.notes),))

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * 2**30)

    @property
    def usable_hbm_bytes(self) -> int:
        """HBM less the reserve: what parameters, gradients, optimizer state and activations may fill."""
        return max(0, self.hbm_bytes - int(self.hbm_reserve_gib * 2**30))


# The fields of a file: name -> (kind, required). Kinds: "str", "pos" (finite > 0), "nonneg"
# (finite >= 0), "eff" (in (0, 1]), "count" (whole number >= 1), "link", "notes".
CLUSTER_FIELDS = {
    "name": ("str", False),  # default: the file's stem
    "peak_tflops": ("pos", True),
    "hbm_gib": ("pos", True),
    "hbm_gbps": ("pos", True),
    "gpus_per_node": ("count", True),
    "intra": ("link", True),
    "inter": ("link", True),
    "gemm_efficiency": ("eff", False),
    "hbm_efficiency": ("eff", False),
    "link_efficiency": ("eff", False),
    "hbm_reserve_gib": ("nonneg", False),
    "sms": ("count", False),
    "notes": ("notes", False),
}
LINK_FIELDS = {"name": ("str", True), "bw_gbps": ("pos", True), "latency_us": ("nonneg", True),
               "peer_gbps": ("pos", False)}
# Plausible ranges (inclusive) of the numbers, by field name: a value outside is a typo or a unit
# mistake, and an extreme one overflows (hbm_gib 1e300 -> int) or makes a step of inf / NaN / 0
# (a 1e-320 GB/s link, a 1e300 TFLOP/s peak). Wide on purpose: from a toy accelerator to 10^4x
# today's GPUs (H100: 989 TFLOP/s, 80 GiB, 3350 GB/s, 450 GB/s NVLink, 8 per node).
BOUNDS = {
    "peak_tflops": (1e-6, 1e7), "hbm_gib": (1e-6, 1e6), "hbm_gbps": (1e-6, 1e7), "gpus_per_node": (1, 4096),
    "bw_gbps": (1e-6, 1e6), "latency_us": (0.0, 1e6), "hbm_reserve_gib": (0.0, 1e6),
    "peer_gbps": (1e-6, 1e6), "sms": (1, 100_000),
}


def preset_names() -> list[str]:
    """The shipped presets' names (file stems), sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def _preset_key(spec: str) -> str | None:
    """The preset stem `spec` names (any case, aliases such as "H100 SXM"), or None."""
    names = preset_names()
    low = spec.strip().lower()
    if low in names:
        return low
    squashed = "".join(c for c in low if c not in " -_")
    stem = squashed if squashed in names else ALIASES.get(squashed)
    return stem if stem in names else None


def load_cluster(spec: str | os.PathLike) -> Cluster:
    """A preset name (`h100`), or a path to a .toml / .json file of the same fields.
    ClusterError naming the file and the field otherwise."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ClusterError(f"cluster: give a preset ({', '.join(preset_names())}) or a .toml/.json file")
    stem = _preset_key(spec)
    path = Path(spec)
    if stem is not None and path.suffix.lower() not in SUFFIXES:
        rel = f"profiler/clusters/{stem}.toml"
        return _load_file(PRESET_DIR / f"{stem}.toml", label=f"cluster preset {stem} ({rel})", source=rel)
    presets = ", ".join(preset_names())
    if path.suffix.lower() not in SUFFIXES:
        if path.exists():
            raise ClusterError(f"cluster file {spec}: not a .toml or .json file (presets: {presets})")
        squashed = "".join(c for c in spec.strip().lower() if c not in " -_")
        # a variant of a preset's GPU (a100-40gb, h100-pcie: a preset's name then a word) or another
        # GPU (b100): real hardware with other numbers, not a misspelt preset (h1000, a10O)
        variant = any(squashed.startswith(n) and any(c.isalpha() for c in squashed[len(n):]) for n in preset_names())
        if squashed in OTHER_GPUS or variant:
            raise ClusterError(f"cluster {spec}: no such preset, and a different GPU from the presets ({presets}): "
                               "write its numbers in a .toml file (README, 'Clusters')")
        close = difflib.get_close_matches(spec.strip().lower(), preset_names() + list(ALIASES), n=1, cutoff=0.6)
        hint = f" (did you mean {_preset_key(close[0])}?)" if close else ""
        raise ClusterError(f"cluster {spec}: no such preset{hint}; presets: {presets}, or a .toml/.json file")
    if not path.exists():
        raise ClusterError(f"cluster file {spec}: no such file (presets: {presets})")
    if not path.is_file():
        raise ClusterError(f"cluster file {spec}: not a regular file")
    return _load_file(path, label=f"cluster file {spec}", source=spec)


def _load_file(path: Path, *, label: str, source: str) -> Cluster:
    """Parse one .toml/.json file and validate it; `label` starts every error message."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ClusterError(f"{label}: cannot read ({e.strerror or e})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ClusterError(f"{label}: over {MAX_FILE_BYTES} bytes, not a cluster file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClusterError(f"{label}: not UTF-8 text (byte {e.start})") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ClusterError(f"{label}: JSON syntax error at line {e.lineno}, column {e.colno}: {e.msg}") from None
        except RecursionError:
            raise ClusterError(f"{label}: JSON nested too deeply") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ClusterError(f"{label}: TOML syntax error: {e}") from None
        except RecursionError:
            raise ClusterError(f"{label}: TOML nested too deeply") from None
    if not isinstance(data, dict):
        raise ClusterError(f"{label}: the top level must be a table of fields, not {_kind(data)}")
    return _from_dict(data, label=label, source=source, default_name=path.stem)


def cluster_from_dict(data: dict, *, source: str) -> Cluster:
    """Validate one cluster's fields (units as the preset files: TFLOP/s, GiB, GB/s, µs)."""
    if not isinstance(data, dict):
        raise ClusterError(f"cluster {source}: the top level must be a table of fields, not {_kind(data)}")
    return _from_dict(data, label=f"cluster {source}", source=source, default_name=Path(source).stem or "cluster")


CLUSTER_SCHEMA = "ptprof.cluster/1"  # the first key of a file --save-cluster writes (discover.own_output leaves it out of a run)


def _from_dict(data: dict, *, label: str, source: str, default_name: str) -> Cluster:
    if isinstance(data.get("schema"), str) and data["schema"].startswith("ptprof.cluster/"):
        data = {k: v for k, v in data.items() if k != "schema"}  # --save-cluster's mark, no field
    values = _fields(data, CLUSTER_FIELDS, label=label, where="")
    values.setdefault("name", default_name)
    for key in ("intra", "inter"):
        values[key] = Link(**_fields(values[key], LINK_FIELDS, label=label, where=f"{key}."))
    reserve = values.get("hbm_reserve_gib", HBM_RESERVE_GIB)
    if reserve >= values["hbm_gib"]:
        raise ClusterError(f"{label}: field hbm_reserve_gib = {reserve:g} leaves nothing of hbm_gib = "
                           f"{values['hbm_gib']:g} (it must be smaller)")
    return Cluster(**values, source=source)


def _fields(data: dict, spec: dict, *, label: str, where: str) -> dict:
    """Check `data` against `spec` (name -> (kind, required)); the values, converted."""
    out = {}
    for key in data:
        if key not in spec:
            close = difflib.get_close_matches(str(key), list(spec), n=1, cutoff=0.6)
            hint = f" (did you mean {where}{close[0]}?)" if close else f" (fields: {', '.join(spec)})"
            raise ClusterError(f"{label}: unknown field {where}{key}{hint}")
    for key, (kind, required) in spec.items():
        if key not in data:
            if required:
                raise ClusterError(f"{label}: missing field {where}{key}")
            continue
        out[key] = _value(data[key], kind, label=label, name=f"{where}{key}")
    return out


def _value(v, kind: str, *, label: str, name: str):
    """One field's value checked and converted for its kind."""
    if kind == "str":
        if not isinstance(v, str) or not v.strip():
            raise ClusterError(f"{label}: field {name} must be a non-empty string, not {_kind(v)}")
        return v
    if kind == "notes":
        if isinstance(v, str):
            return (v,)
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            return tuple(v)
        raise ClusterError(f"{label}: field {name} must be a string or a list of strings, not {_kind(v)}")
    if kind == "link":
        if not isinstance(v, dict):
            raise ClusterError(f"{label}: field {name} must be a table (name, bw_gbps, latency_us), not {_kind(v)}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ClusterError(f"{label}: field {name} must be a number, not {_kind(v)}")
    try:
        x = float(v)
    except OverflowError:
        raise ClusterError(f"{label}: field {name} is too large") from None
    if not math.isfinite(x):
        raise ClusterError(f"{label}: field {name} must be a finite number, not {v}")
    if kind == "count":
        if x != int(x) or x < 1:
            raise ClusterError(f"{label}: field {name} must be a whole number >= 1, not {v}")
    elif kind == "nonneg":
        if x < 0:
            raise ClusterError(f"{label}: field {name} must be >= 0, not {v}")
    elif x <= 0:
        raise ClusterError(f"{label}: field {name} must be > 0, not {v}")
    elif kind == "eff" and x > 1:
        raise ClusterError(f"{label}: field {name} is a share of peak in (0, 1], not {v}")
    lo, hi = BOUNDS.get(name.rpartition(".")[2], (-math.inf, math.inf))
    if not lo <= x <= hi:
        raise ClusterError(f"{label}: field {name} = {v} is outside the plausible range [{lo:g}, {hi:g}] "
                           "(docs/whatif.md, Clusters)")
    return int(x) if kind == "count" else x


def _kind(v) -> str:
    """How a wrong value is named in a message."""
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}"
    return {dict: "a table", list: "a list", type(None): "null"}.get(type(v), type(v).__name__)


# Unit mistakes a cluster file can make that stay inside BOUNDS (so load_cluster accepts them):
# warned, not refused, as a CPU calibration legitimately yields a few GB/s and ms latencies.
MIN_LATENCY_US = 0.1  # under 0.1 µs (100 ns) per message: no NIC or NVLink hop is that fast
MAX_HBM_GIB = 1024  # 1 TiB per GPU: 5x today's largest (MI325X, 256 GB)
MIN_GPU_HBM_GBPS = 10.0  # a GPU-like peak with under 10 GB/s of memory: TB/s written for GB/s
GPU_LIKE_TFLOPS = 10.0


def cluster_warnings(cluster: Cluster) -> list[str]:
    """Plausibility warnings of a loaded cluster: numbers that load but are most likely a unit
    mistake (Gb/s for GB/s, seconds for µs, MiB for GiB, TB/s for GB/s). Empty for the presets."""
    out = []
    intra, inter = cluster.intra, cluster.inter
    if inter.bw_gbps > intra.bw_gbps:
        out.append(f"inter.bw_gbps = {inter.bw_gbps:g} GB/s is above intra.bw_gbps = {intra.bw_gbps:g} GB/s: "
                   "between nodes faster than inside one (Gb/s written for GB/s? 100 GbE is 12.5 GB/s)")
    for key, link in (("intra", intra), ("inter", inter)):
        if 0 < link.latency_us < MIN_LATENCY_US:
            out.append(f"{key}.latency_us = {link.latency_us:g} µs is under {MIN_LATENCY_US:g} µs per message "
                       "(seconds written for µs? 14e-6 s is 14 µs)")
    if cluster.hbm_gib > MAX_HBM_GIB:
        out.append(f"hbm_gib = {cluster.hbm_gib:g} GiB per GPU is over {MAX_HBM_GIB} GiB (MiB written for GiB? "
                   f"48000 MiB is {48000 / 1024:g} GiB)")
    if cluster.peak_tflops > GPU_LIKE_TFLOPS and cluster.hbm_gbps < MIN_GPU_HBM_GBPS:
        out.append(f"hbm_gbps = {cluster.hbm_gbps:g} GB/s for a {cluster.peak_tflops:g} TFLOP/s peak is under "
                   f"{MIN_GPU_HBM_GBPS:g} GB/s (TB/s written for GB/s? 0.864 TB/s is 864 GB/s)")
    from profiler.costmodel_ops import sm_count  # (costmodel_ops imports this module)

    # (not a cluster calibrated from a run, `measured:<run>`: its peak already has the waves in it)
    if cluster.peak_tflops > GPU_LIKE_TFLOPS and sm_count(cluster) is None and not cluster.name.startswith("measured:"):
        # A trial's L40S file projected a small model's compute 3x faster than the H100 preset's.
        out.append("no sms (SMs per GPU) and not a preset's GPU: GEMMs are timed without wave quantization, "
                   "so small ones project faster than any GPU runs them; add sms = <SMs per GPU> (an L40S has 142)")
    return out


def cluster_to_dict(cluster: Cluster) -> dict:
    """The fields a cluster file holds (load_cluster reads back an equal Cluster)."""
    def link(l: Link) -> dict:
        out = {"name": l.name, "bw_gbps": l.bw_gbps, "latency_us": l.latency_us}
        if l.peer_gbps is not None:
            out["peer_gbps"] = l.peer_gbps
        return out

    out = {
        "name": cluster.name, "peak_tflops": cluster.peak_tflops, "hbm_gib": cluster.hbm_gib,
        "hbm_gbps": cluster.hbm_gbps, "gpus_per_node": cluster.gpus_per_node,
        "intra": link(cluster.intra), "inter": link(cluster.inter),
        "gemm_efficiency": cluster.gemm_efficiency, "hbm_efficiency": cluster.hbm_efficiency,
        "link_efficiency": cluster.link_efficiency, "hbm_reserve_gib": cluster.hbm_reserve_gib,
    }
    if cluster.sms is not None:
        out["sms"] = cluster.sms
    if cluster.notes:
        out["notes"] = list(cluster.notes)
    return out

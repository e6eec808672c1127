"""What each event is: the `device` and `kind` columns of the event frame (docs/profiler.md).

Device activity (`device` "gpu": CUDA and ROCm GPUs, Meta's MTIA) follows HolisticTraceAnalysis's
kernel rules so our temporal breakdown agrees with its numbers: a kernel whose name starts with
`nccl` and contains `Kernel` is communication (RCCL keeps NCCL's kernel names), `Memcpy*` /
`Memset*` / `dma*` activity is memory, any other kernel is compute except the few HTA leaves
unclassified (`...Memcpy...` inside a name, `...Sync...`), which are `other` and count as
non-compute.

CPU events: gloo runs each collective on its own worker threads as a `gloo:<op>` span (`comm`);
the main thread records the enqueue as `c10d::<op>_` (NCCL jobs record `nccl:<op>` annotations and
`record_param_comms` ops), which is `enqueue`, not compute.
"""

from __future__ import annotations

import polars as pl

# Kineto `cat` values of device activity, compared lowercased (torch < 1.10 capitalises them):
# CUDA and ROCm (`kernel`, `gpu_mem*`), Meta's MTIA (`mtia_ccp_events`: its kernels and DMA), and
# the stream synchronisations of recent torch (`cuda_sync`), all of which HTA counts as GPU time.
GPU_CATS = ["kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "memcpy", "memset", "mtia_ccp_events", "cuda_sync"]
# Host calls into a device's runtime or driver: `cuda_runtime`, `mtia_runtime`, `xpu_runtime`,
# `privateuse1_driver`, ... and torch 1.8's `Runtime`.
RUNTIME_CAT_RE = r"(^|_)(runtime|driver)$"
# Every other category Kineto writes for host events. Anything outside these and the two lists
# above is counted per file (`unknown_categories`) and reported: it may be a device's activity
# that would otherwise pass silently as CPU operators.
CPU_CATS = ["cpu_op", "operator", "user_annotation", "python_function", "cpu_instant_event", "overhead",
            "external_correlation", "cuda_profiler_range", "trace"]

NCCL_KERNEL_RE = r"^nccl.*Kernel"
MEMORY_KERNEL_RE = r"^(Memcpy|Memset|dma)"
NOT_COMPUTE_RE = r"^nccl.*Kernel|Memcpy|^Memset|Sync"  # HTA's "neither compute nor memory"
GLOO_SPAN_PREFIX = "gloo:"
ENQUEUE_RE = r"^(c10d::|nccl:|record_param_comms$)"
MEMORY_EVENT = "[memory]"

KINDS = ["compute", "comm", "memory", "other", "annotation", "op", "runtime", "enqueue", "memory_event", "instant"]


def classify(events: pl.DataFrame) -> pl.DataFrame:
    """Add `device` ("gpu" / "cpu") and `kind` (one of KINDS) to a raw event frame.

    The rules are decided once per distinct (cat, name, ph), a few thousand in a trace of
    hundreds of thousands of events, and joined back on those three columns only.
    """
    keys = ["cat", "name", "ph"]
    table = _classify_distinct(events.select(keys).unique())
    labels = events.select(keys).join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")
    return events.with_columns(labels["device"], labels["kind"])


def _classify_distinct(events: pl.DataFrame) -> pl.DataFrame:
    cat = pl.col("cat").cast(pl.String).str.to_lowercase()
    name = pl.col("name").cast(pl.String)
    is_gpu = cat.is_in(GPU_CATS)
    gpu_kind = (
        pl.when(cat == "gpu_user_annotation").then(pl.lit("annotation"))
        .when(name.str.contains(NCCL_KERNEL_RE)).then(pl.lit("comm"))
        .when(cat.is_in(["gpu_memcpy", "gpu_memset", "memcpy", "memset"]) | name.str.contains(MEMORY_KERNEL_RE))
        .then(pl.lit("memory"))
        .when(name.str.contains(NOT_COMPUTE_RE)).then(pl.lit("other"))
        .otherwise(pl.lit("compute"))
    )
    cpu_kind = (
        pl.when(name == MEMORY_EVENT).then(pl.lit("memory_event"))
        # gloo records these on its worker threads only. Not keyed on thread names: Kineto may
        # capture a worker's name before gloo renames it ("python" instead of "pt_gloo_runloop").
        .when(name.str.starts_with(GLOO_SPAN_PREFIX)).then(pl.lit("comm"))
        .when(name.str.contains(ENQUEUE_RE)).then(pl.lit("enqueue"))
        .when(cat.str.contains(RUNTIME_CAT_RE)).then(pl.lit("runtime"))
        .when(pl.col("ph") == "i").then(pl.lit("instant"))
        .when(cat == "user_annotation").then(pl.lit("annotation"))
        .otherwise(pl.lit("op"))
    )
    return events.with_columns(
        device=pl.when(is_gpu).then(pl.lit("gpu")).otherwise(pl.lit("cpu")).cast(pl.Categorical),
        kind=pl.when(is_gpu).then(gpu_kind).otherwise(cpu_kind).cast(pl.Categorical),
    )


def device_kind(events: pl.DataFrame) -> str:
    """What recorded a file's device activity: "cuda", "rocm", "mtia", or "cpu" (no device activity).

    MTIA by its own categories; ROCm by its HIP runtime calls (Kineto files them under
    `cuda_runtime`); any other device activity is CUDA's.
    """
    device = events.lazy().filter(pl.col("device") == "gpu").select(pl.col("cat").cast(pl.String).str.to_lowercase().unique()).collect()
    if device.is_empty():
        return "cpu"
    if device["cat"].str.starts_with("mtia").any():
        return "mtia"
    runtime = events.lazy().filter(pl.col("kind") == "runtime").select(pl.col("name").cast(pl.String).unique()).collect()["name"]
    return "rocm" if runtime.str.starts_with("hip").any() else "cuda"


def unknown_categories(events: pl.DataFrame) -> dict[str, int]:
    """Events per `cat` that no rule above knows (counted as CPU operators): {cat: n}."""
    cat = pl.col("cat").cast(pl.String)
    known = cat.str.to_lowercase().is_in(GPU_CATS + CPU_CATS) | cat.str.to_lowercase().str.contains(RUNTIME_CAT_RE)
    # Counted first (eagerly: a lazy query would push the filter below the count), then the
    # rules run on the few distinct categories, not on every event.
    counts = events.group_by("cat").len().filter(cat.is_not_null() & ~known)
    return {str(c): int(n) for c, n in counts.sort("cat").iter_rows()}

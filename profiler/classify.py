"""What each event is: the `device` and `kind` columns of the event frame (docs/profiler.md).

Device activity (`device` "gpu": CUDA and ROCm GPUs, Meta's MTIA) follows HolisticTraceAnalysis's
kernel rules so our temporal breakdown agrees with its numbers: a kernel whose name starts with
`nccl` and contains `Kernel` is communication (RCCL keeps NCCL's kernel names), `Memcpy*` /
`Memset*` / `dma*` activity is memory, any other kernel is compute except the few HTA leaves
unclassified (`...Memcpy...` inside a name, `...Sync...`), which are `other` and count as
non-compute.

CPU events: a `ProfilerStep#<k>` span is the step's annotation whatever its category (torch 1.8
files it under `Operator`, where it counted as an operator with the step's self time). gloo runs each collective on its own worker threads as a `gloo:<op>` span (`comm`);
the main thread records the enqueue as `c10d::<op>_` (NCCL jobs record `nccl:<op>` annotations and
`record_param_comms` ops), which is `enqueue`, not compute; so is the functional collectives' wait
(`_c10d_functional::wait_tensor`), where the thread only waits for the collective.
"""

from __future__ import annotations

import functools

import numpy as np
import polars as pl

from profiler.steps import PROFILER_STEP_RE

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
# The host's side of a collective, not compute: its enqueue (`c10d::<op>_`, `nccl:<op>`,
# `record_param_comms`) and the functional collectives' blocking wait (`_c10d_functional::wait_tensor`,
# `c10d_functional::` before torch 2.3: DTensor, tensor and sequence parallelism), in which a gloo
# rank's main thread only waits for the collective's worker threads (a trial: 180 ms of a tp+sp
# rank's waits counted as compute, so its communication read 73 % hidden).
ENQUEUE_RE = r"^(c10d::|nccl:|record_param_comms$|_?c10d_functional::wait_tensor$)"
MEMORY_EVENT = "[memory]"

KINDS = ["compute", "comm", "memory", "other", "annotation", "op", "runtime", "enqueue", "memory_event", "instant"]


# Below this many events the distinct (cat, name, ph) triples are classified and joined back
# (fewer steps: a small file's fixed cost); above, the flags (fewer passes over the events).
# Both give the same frame (tests/profiler/test_classify.py).
FLAGS_FROM = 30_000


def classify(events: pl.DataFrame) -> pl.DataFrame:
    """Add `device` ("gpu" / "cpu") and `kind` (one of KINDS) to a raw event frame.

    The rules' tests are run once per distinct value, a few thousand in a trace of hundreds of
    thousands of events. Small frames: per distinct (cat, name, ph), joined back on those three
    columns. Large ones: once per distinct `cat` and per distinct `name`, as bit flags looked up
    by each event's category code; an event's flags and `ph` then index a table of every flag
    combination's device and kind (_LABELS): nothing joined on the events, no text per event.
    """
    if events.height < FLAGS_FROM:
        return _classify_joined(events)
    cat, name = _flags(events.get_column("cat"), "cat"), _flags(events.get_column("name"), "name")
    instant = (events.get_column("ph") == "i").fill_null(False).to_numpy()
    combo = cat.astype(np.uint16) | (name.astype(np.uint16) << _CAT_BITS) | (instant.astype(np.uint16) << (_CAT_BITS + _NAME_BITS))
    device, kind = _LABELS
    return events.with_columns(pl.Series("device", ["cpu", "gpu"], pl.Categorical).gather(device[combo]),
                               pl.Series("kind", KINDS, pl.Categorical).gather(kind[combo]))


def _classify_joined(events: pl.DataFrame) -> pl.DataFrame:
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
        .when((cat == "user_annotation") | name.str.contains(PROFILER_STEP_RE)).then(pl.lit("annotation"))
        .otherwise(pl.lit("op"))
    )
    return events.with_columns(
        device=pl.when(is_gpu).then(pl.lit("gpu")).otherwise(pl.lit("cpu")).cast(pl.Categorical),
        kind=pl.when(is_gpu).then(gpu_kind).otherwise(cpu_kind).cast(pl.Categorical),
    )


# Bits of the per-category (cat) and per-name flags.
_GPU, _GPU_ANNOTATION, _MEMORY_CAT, _RUNTIME, _USER_ANNOTATION = 1, 2, 4, 8, 16
_NCCL, _MEMORY_KERNEL, _NOT_COMPUTE, _MEMORY_EVENT, _GLOO, _ENQUEUE, _PROFILER_STEP = 1, 2, 4, 8, 16, 32, 64
_CAT_BITS, _NAME_BITS = 5, 7


def _rules(combo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The module docstring's rules over flag combinations: (device 0 cpu / 1 gpu, index in KINDS)."""
    cat, name = combo & (2**_CAT_BITS - 1), (combo >> _CAT_BITS) & (2**_NAME_BITS - 1)
    instant = (combo >> (_CAT_BITS + _NAME_BITS)) & 1 > 0
    kind = {k: i for i, k in enumerate(KINDS)}
    gpu = cat & _GPU > 0
    gpu_kind = np.select(
        [cat & _GPU_ANNOTATION > 0, name & _NCCL > 0, (cat & _MEMORY_CAT > 0) | (name & _MEMORY_KERNEL > 0), name & _NOT_COMPUTE > 0],
        [kind["annotation"], kind["comm"], kind["memory"], kind["other"]], kind["compute"])
    cpu_kind = np.select(
        [name & _MEMORY_EVENT > 0, name & _GLOO > 0, name & _ENQUEUE > 0, cat & _RUNTIME > 0, instant,
         (cat & _USER_ANNOTATION > 0) | (name & _PROFILER_STEP > 0)],
        [kind["memory_event"], kind["comm"], kind["enqueue"], kind["runtime"], kind["instant"], kind["annotation"]], kind["op"])
    return gpu.astype(np.uint32), np.where(gpu, gpu_kind, cpu_kind).astype(np.uint32)


_LABELS = _rules(np.arange(2 ** (_CAT_BITS + _NAME_BITS + 1)))


@functools.cache
def _tests() -> dict[str, list[tuple[int, pl.Expr]]]:
    """The rules' tests of a category (`cat`) and of a name, each with its bit (built once)."""
    v = pl.col("v")
    low = v.str.to_lowercase()
    return {
        "cat": [(_GPU, low.is_in(GPU_CATS)), (_GPU_ANNOTATION, low == "gpu_user_annotation"),
                (_MEMORY_CAT, low.is_in(["gpu_memcpy", "gpu_memset", "memcpy", "memset"])),
                (_RUNTIME, low.str.contains(RUNTIME_CAT_RE)), (_USER_ANNOTATION, low == "user_annotation")],
        "name": [(_NCCL, v.str.contains(NCCL_KERNEL_RE)), (_MEMORY_KERNEL, v.str.contains(MEMORY_KERNEL_RE)),
                 (_NOT_COMPUTE, v.str.contains(NOT_COMPUTE_RE)), (_MEMORY_EVENT, v == MEMORY_EVENT),
                 (_GLOO, v.str.starts_with(GLOO_SPAN_PREFIX)), (_ENQUEUE, v.str.contains(ENQUEUE_RE)),
                 (_PROFILER_STEP, v.str.contains(PROFILER_STEP_RE))],
    }


def _flags(column: pl.Series, which: str) -> np.ndarray:
    """Per event, the OR of the bits of `which` tests its value passes (a null value: none),
    the tests run once per distinct value and looked up by the events' category codes."""
    if column.dtype != pl.Categorical:  # a frame built by hand: its text as categories
        column = column.cast(pl.Categorical)
    distinct = column.unique().drop_nulls()
    tests = _tests()[which]
    passed = pl.DataFrame({"v": distinct.cast(pl.String)}).select(
        [t.fill_null(False).alias(str(i)) for i, (_, t) in enumerate(tests)]).to_numpy()
    codes = distinct.to_physical().to_numpy().astype(np.int64)
    table = np.zeros(int(codes.max(initial=-1)) + 2, np.uint8)  # the last slot: null
    table[codes] = passed.astype(np.uint8) @ np.array([bit for bit, _ in tests], np.uint8) if len(codes) else 0
    return table[column.to_physical().fill_null(len(table) - 1).to_numpy()]


MTIA_CAT_PREFIX = "mtia"  # a device category (lowercased) of MTIA's
HIP_RUNTIME_PREFIX = "hip"  # a runtime call of ROCm's


def device_kind(events: pl.DataFrame) -> str:
    """What recorded a file's device activity: "cuda", "rocm", "mtia", or "cpu" (no device activity).

    MTIA by its own categories; ROCm by its HIP runtime calls (Kineto files them under
    `cuda_runtime`); any other device activity is CUDA's. (parse_batch.py decides the same for
    each file of a batch at once, through `kind_of_device` and the two prefixes.)
    """
    # Distinct values first, then their text (not the text of every event).
    device = (events.lazy().filter(pl.col("device") == "gpu").select(pl.col("cat").unique()).collect()
              .select(pl.col("cat").cast(pl.String).str.to_lowercase()))
    if device.is_empty():
        return kind_of_device(False, False, False)
    if device["cat"].str.starts_with(MTIA_CAT_PREFIX).any():
        return kind_of_device(True, True, False)
    runtime = events.lazy().filter(pl.col("kind") == "runtime").select(pl.col("name").unique()).collect()["name"].cast(pl.String)
    return kind_of_device(True, False, bool(runtime.str.starts_with(HIP_RUNTIME_PREFIX).any()))


def kind_of_device(has_gpu: bool, mtia: bool, hip: bool) -> str:
    """The device kind from what a file holds: device activity, MTIA categories, HIP runtime calls."""
    return "cpu" if not has_gpu else "mtia" if mtia else "rocm" if hip else "cuda"


def known_category(low: pl.Expr) -> pl.Expr:
    """Whether a lowercased `cat` is one the rules above know (else its events count as CPU operators)."""
    return low.is_in(GPU_CATS + CPU_CATS) | low.str.contains(RUNTIME_CAT_RE)


def unknown_categories(events: pl.DataFrame) -> dict[str, int]:
    """Events per `cat` that no rule above knows (counted as CPU operators): {cat: n}."""
    cat = pl.col("cat").cast(pl.String)
    known = known_category(cat.str.to_lowercase())
    # Usually none: the distinct categories tell, without counting every event's.
    if events.select(pl.col("cat").unique()).filter(cat.is_not_null() & ~known).is_empty():
        return {}
    # Counted first (eagerly: a lazy query would push the filter below the count), then the
    # rules run on the few distinct categories, not on every event.
    counts = events.group_by("cat").len().filter(cat.is_not_null() & ~known)
    return {str(c): int(n) for c, n in counts.sort("cat").iter_rows()}

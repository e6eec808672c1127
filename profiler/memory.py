"""Memory: allocated bytes over time from `[memory]` events, peaks, and run.json's persistent sizes.

Kineto writes one `[memory]` instant event per allocation (positive `Bytes`) and free (negative),
with the device's running `Total Allocated` after it, when the profiler ran with
`profile_memory=True`. CPU events see only allocations made after profiling started, so a CPU
"allocated" curve starts near zero, not at the process's true footprint; CUDA's counter is the
caching allocator's own and includes everything allocated before.
"""

from __future__ import annotations

import polars as pl

from profiler.discover import manifest_field
from profiler.intervals import over, sorted_by, varying
from profiler.steps import KEYS, assign_steps

PERSISTENT_FIELDS = ["params_bytes", "params_at_rest_bytes", "grads_bytes", "optimizer_bytes", "max_memory_allocated_bytes",
                     "stashed_params_bytes"]  # the last: pipedream's weight stashing, else null


# `Device Type` of `[memory]` events is torch's c10::DeviceType. ROCm builds record their GPU as
# HIP (6), which torch itself calls "cuda" (torch.device("cuda:0") on ROCm): so do we.
DEVICE_TYPES = {1: "cuda", 6: "cuda", 12: "xpu", 13: "mps", 15: "hpu", 19: "mtia"}


def memory_timeline(events: pl.DataFrame) -> pl.DataFrame:
    """Per (run, rank, mem_device): ts_us, delta_bytes, allocated_bytes, reserved_bytes, step.

    mem_device is "cpu" or "<type>:<id>" (DEVICE_TYPES: "cuda:0" for CUDA and ROCm GPUs,
    "mtia:0", ...); an unknown type is "device<type>".
    """
    mem = events.lazy().filter(pl.col("kind") == "memory_event").select("kind").head(1).collect()
    device_type = pl.col("mem_device_type").replace_strict(DEVICE_TYPES, default=None, return_dtype=pl.String)
    device = (
        pl.when(pl.col("mem_device_type") == 0).then(pl.lit("cpu"))
        .when(device_type.is_not_null()).then(device_type + pl.lit(":") + pl.col("mem_device_id").cast(pl.String))
        .otherwise(pl.lit("device") + pl.col("mem_device_type").cast(pl.String))
    )
    if mem.is_empty():
        return pl.DataFrame(schema={"run": pl.Categorical, "rank": pl.Int32, "mem_device": pl.String, "ts_us": pl.Float64,
                                    "delta_bytes": pl.Int64, "allocated_bytes": pl.Int64, "reserved_bytes": pl.Int64, "step": pl.Int64})
    with_step = assign_steps(events).lazy().filter(pl.col("kind") == "memory_event")
    timeline = with_step.select(
        *KEYS,
        "mem_device_type", "mem_device_id",
        ts_us="ts_us",
        delta_bytes="mem_bytes",
        allocated_bytes="mem_total_allocated_bytes",
        reserved_bytes="mem_total_reserved_bytes",
        step="step",
    ).collect()
    # The device's name from its few distinct (type, id) pairs, not written out per event, with
    # its rank among the names (`_dev`) to sort by in its place.
    pairs = (timeline.select("mem_device_type", "mem_device_id").unique().with_columns(mem_device=device)
             .sort("mem_device").with_columns(_dev=pl.col("mem_device").rle_id()))
    timeline = timeline.join(pairs, on=["mem_device_type", "mem_device_id"], how="left", nulls_equal=True, maintain_order="left")
    # Sorted by the keys that vary only (one rank's frame: by device and time), as a stable sort:
    # the rows the keys do not order keep the trace's order either way.
    by = [{"mem_device": "_dev"}.get(k, k) for k in varying(timeline, [*KEYS, "mem_device"])]
    return (sorted_by(timeline, by, "ts_us")
            .select(*KEYS, "mem_device", "ts_us", "delta_bytes", "allocated_bytes", "reserved_bytes", "step"))


def memory_peaks(timeline: pl.DataFrame) -> pl.DataFrame:
    """Per (run, rank, mem_device): peak allocated bytes, when (ts_us and step), the reserved peak,
    and the floor: the level every step comes back down to, the highest of the steps' lowest levels
    (before or after any event; the span's lowest where no event is in a step). One step's dip is
    no floor: DDP frees and remakes its gradient buckets in its second step, 0.5 MiB below the
    level held all through every other step (an H100 ddp run, checked against torch's counter)."""
    # The level before the first event is its allocated − delta; every later one is an earlier
    # event's after-level: the min over both sides covers every level held.
    level = pl.min_horizontal("allocated_bytes", pl.col("allocated_bytes") - pl.col("delta_bytes"))
    floors = (timeline.group_by(*KEYS, "mem_device", "step").agg(low=level.min())
              .group_by(*KEYS, "mem_device")
              .agg(floor_allocated_bytes=pl.col("low").filter(pl.col("step").is_not_null()).max()
                   .fill_null(pl.col("low").min())))
    return (
        timeline.group_by(*KEYS, "mem_device")
        .agg(
            peak_allocated_bytes=pl.col("allocated_bytes").max(),
            peak_ts_us=pl.col("ts_us").sort_by("allocated_bytes").last(),
            peak_step=pl.col("step").sort_by("allocated_bytes").last(),
            peak_reserved_bytes=pl.col("reserved_bytes").max(),
            n_events=pl.len(),
        )
        .join(floors, on=[*KEYS, "mem_device"], how="left", nulls_equal=True)
        .sort(*KEYS, "mem_device")
    )


def persistent_memory(runs: dict[str, dict | None]) -> pl.DataFrame:
    """Per (run, rank): the persistent sizes run.json measured (docs/run-layout.md); runs without
    a manifest, or ranks without a `memory` block, are left out."""
    rows = []
    for run, manifest in runs.items():
        ranks = manifest_field(manifest, "ranks")
        for r in ranks if isinstance(ranks, list) else []:
            mem = r.get("memory") if isinstance(r, dict) else None
            if isinstance(mem, dict) and isinstance(r.get("rank"), int):
                rows.append({"run": run, "rank": r["rank"], **{f: _int_or_none(mem.get(f)) for f in PERSISTENT_FIELDS}})
    schema = {"run": pl.Categorical, "rank": pl.Int32, **{f: pl.Int64 for f in PERSISTENT_FIELDS}}
    return pl.DataFrame(rows, schema=schema)


def _int_or_none(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


CURVE_BUCKETS = 64  # enough for a one-line sparkline; small enough for the JSON report
CURVE_COLUMNS = {"run": pl.Categorical, "rank": pl.Int32, "mem_device": pl.String, "bucket": pl.Int64,
                 "start_us": pl.Float64, "allocated_bytes": pl.Int64, "min_allocated_bytes": pl.Int64}


def memory_curve(timeline: pl.DataFrame, buckets: int = CURVE_BUCKETS) -> pl.DataFrame:
    """Per (run, rank, mem_device): allocated bytes over the timeline's span in at most `buckets`
    equal time buckets; allocated_bytes is the highest level in the bucket, min_allocated_bytes the lowest.

    A bucket without events holds the level the last event before it left (the level is a step
    function of time), so an idle stretch is drawn at its level, not as a gap or a zero.
    """
    if timeline.is_empty():
        return pl.DataFrame(schema=CURVE_COLUMNS)
    keys = [*KEYS, "mem_device"]
    # Windows and sorts over the keys that vary only (one rank, often one device: none).
    groups = varying(timeline, keys)
    # Sorted by the groups, each group is one run of rows: windowed by its run number, not by the
    # key columns (a device's name is text).
    runs = ["_run"] if groups else []
    t0, t1 = over(pl.col("ts_us").min(), runs), over(pl.col("ts_us").max(), runs)
    n = pl.min_horizontal(pl.lit(buckets), over(pl.len(), runs)).cast(pl.Int64)  # no more buckets than events
    # One instant (or one event): one bucket; never a division by a zero span.
    n = pl.when(t1 > t0).then(n).otherwise(1)
    span = pl.when(t1 > t0).then(t1 - t0).otherwise(1.0)
    bucket = ((pl.col("ts_us") - t0) / span * n).floor().cast(pl.Int64).clip(0, n - 1)
    per = (
        timeline.sort(*groups, "ts_us", maintain_order=True)
        .with_columns(_run=pl.struct(groups).rle_id() if groups else pl.lit(0, pl.UInt32))
        .with_columns(bucket=bucket, n=n, t0=t0, width=(t1 - t0) / n)
        .group_by(*groups, "bucket")  # the keys that do not vary are put back as constants
        .agg(pl.col("allocated_bytes").max().alias("hi"), pl.col("allocated_bytes").min().alias("lo"),
             pl.col("allocated_bytes").last().alias("last"), pl.col("n", "t0", "width").first())
        .with_columns(pl.lit(timeline.get_column(k)[0], timeline.schema[k]).alias(k) for k in keys if k not in groups)
    )
    grid = (per.group_by(keys).agg(pl.col("n", "t0", "width").first())
            .with_columns(bucket=pl.int_ranges(0, pl.col("n"))).explode("bucket"))
    # The level entering each bucket is the last level of the bucket before it (carried over empty ones).
    prev = over(pl.col("last").shift(1).forward_fill(), groups)  # the frame is sorted by bucket in each group
    return (
        grid.join(per.drop("n", "t0", "width"), on=[*keys, "bucket"], how="left")
        .sort(*groups, "bucket")
        .with_columns(prev=prev)
        .select(
            *keys, "bucket",
            start_us=pl.col("t0") + pl.col("bucket") * pl.col("width"),
            allocated_bytes=pl.max_horizontal("hi", "prev"),
            min_allocated_bytes=pl.min_horizontal("lo", "prev"),
        )
        .cast({k: v for k, v in CURVE_COLUMNS.items() if k != "run"})
    )

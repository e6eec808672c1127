"""Compare at scale: many ranks drawn as groups (issue 16). Pure functions over the profiler's
per-rank summary frames; no events, no Dash.

Above SCALE_RANKS ranks a run's Compare cards stop drawing one item per rank. Its ranks are split
into groups (`rank_groups`: pipeline stages where run.json has a pipeline, else one group of all
ranks) and every card shows, per group, the median over the group's ranks with the min–max band
(`activity_bands` for the timeline, `memory_bands`, `breakdown_bands`), and names the ranks that
stand out (`outliers`). A rank missing from a bin (no activity there) counts as 0 busy: the median
is over every rank of the group, not only the busy ones.

Outliers and groups: profiler/outliers.py (the rule `ptprof analyze`'s outlier finding states too):
within its group, a rank whose mean step time or idle share lies beyond median ± OUTLIER_K × scale,
scale = max(1.4826 × MAD, a floor: 1 % of the median step time, 1 percentage point of idle share).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from profiler.outliers import MAD_SIGMA, OUTLIER_K, OUTLIER_RULE, outliers, rank_groups, rank_metrics  # noqa: F401  (moved: the viewer's names kept)

SCALE_RANKS = 16  # above this many ranks a run is drawn as groups (at or below: one lane per rank)
BAND_BINS = 400  # time bins of the aggregated timeline over the visible range
MEMORY_BINS = 64


def at_scale(n_ranks: int) -> bool:
    return n_ranks > SCALE_RANKS


def cumulative(activity: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
    """(keys, cum): one row per (run, rank, lane, category) with its t0_us and bin_us, and per key
    the running sum of its busy shares over its bins (cum[k, j] = busy bins 0..j-1, in bin units):
    from it any common bin's busy time is two lookups, whatever the range (built once per run)."""
    c = pl.col
    act = activity.with_columns(c("run").cast(pl.String)).sort("run", "rank", "lane_key", "category", "bin")
    act = act.with_columns(_key=pl.struct("run", "rank", "lane_key", "category").rle_id())
    keys = act.group_by("_key", maintain_order=True).agg(c("run", "rank", "lane", "lane_key", "category", "t0_us", "bin_us").first())
    m = int(act["bin"].max()) + 1 if act.height else 1
    dense = np.zeros((keys.height, m))
    dense[act["_key"].to_numpy(), act["bin"].to_numpy()] = act["busy"].to_numpy()
    cum = np.zeros((keys.height, m + 1))
    np.cumsum(dense, axis=1, out=cum[:, 1:])
    return keys.drop("_key"), cum


def shares(prep: tuple[pl.DataFrame, np.ndarray], origin_us: float, x_range: tuple[float, float], n: int = BAND_BINS) -> np.ndarray:
    """Each key's busy share of n common bins of x_range (ms from origin_us): a (keys, n) array.

    The busy time of a common bin [a, b) is C(b) - C(a), C the key's cumulative busy time (exact:
    a rank's busy share is constant within each of its own bins)."""
    keys, cum = prep
    x0, x1 = x_range
    w_us = (x1 - x0) / n * 1e3
    m = cum.shape[1] - 1
    t0, bw = keys["t0_us"].to_numpy(), keys["bin_us"].to_numpy()
    edges = origin_us + x0 * 1e3 + np.arange(n + 1) * w_us  # absolute µs
    u = np.clip((edges[None, :] - t0[:, None]) / bw[:, None], 0, m)  # in each key's bin units
    i = np.minimum(np.floor(u).astype(np.int64), m - 1)
    rows = np.arange(keys.height)[:, None]
    at = cum[rows, i] + (u - i) * (cum[rows, i + 1] - cum[rows, i])
    return np.clip(np.diff(at, axis=1) * bw[:, None] / w_us, 0.0, 1.0)


BAND_SCHEMA = {"run": pl.String, "group": pl.String, "group_key": pl.Int64, "lane": pl.String, "lane_key": pl.Int64,
               "category": pl.String, "bin": pl.Int64, "median": pl.Float64, "lo": pl.Float64, "hi": pl.Float64}


def activity_bands(activity: pl.DataFrame | tuple[pl.DataFrame, np.ndarray], groups: pl.DataFrame, origin_us: float,
                   x_range: tuple[float, float], n: int = BAND_BINS) -> pl.DataFrame:
    """Per (run, group, lane, category, bin of x_range): median, lo (min), hi (max) busy share
    over the group's ranks (a rank with nothing in that lane and category counts as 0), with t_ms
    (bin start) and bin_ms; only bins where some rank was busy. `activity`: the frame or its
    `cumulative` (made once per run, reused by every zoom)."""
    prep = cumulative(activity) if isinstance(activity, pl.DataFrame) else activity
    keys = prep[0]
    w = (x_range[1] - x_range[0]) / n
    if keys.is_empty():
        return pl.DataFrame(schema={**BAND_SCHEMA, "t_ms": pl.Float64, "bin_ms": pl.Float64})
    share = shares(prep, origin_us, x_range, n)
    size = dict(groups.group_by("group").agg(pl.len()).iter_rows())
    kk = keys.with_row_index("_i").join(groups, on="rank")
    out = []
    for (run, group, gk, lane, lk, cat), part in kk.group_by("run", "group", "group_key", "lane", "lane_key", "category"):
        stack = np.zeros((size[group], n))  # the group's ranks without this lane and category: 0
        stack[:part.height] = share[part["_i"].to_numpy()]
        hi = stack.max(axis=0)
        b = np.nonzero(hi > 1e-9)[0]
        out.append(pl.DataFrame({"run": run, "group": group, "group_key": gk, "lane": lane, "lane_key": lk, "category": cat,
                                 "bin": b, "median": np.median(stack[:, b], axis=0), "lo": stack[:, b].min(axis=0), "hi": hi[b]},
                                schema=BAND_SCHEMA))
    bands = pl.concat(out) if out else pl.DataFrame(schema=BAND_SCHEMA)
    return bands.with_columns(t_ms=x_range[0] + pl.col("bin") * w, bin_ms=pl.lit(w)).sort("run", "group_key", "lane_key", "category", "bin")


def activity_extent(activity: pl.DataFrame, origin_us: float) -> tuple[float, float]:
    """(first bin start, last bin end) in ms from origin_us; (0, 1) when empty."""
    if activity.is_empty():
        return 0.0, 1.0
    c = pl.col
    t = activity.select(lo=(c("t0_us") + c("bin") * c("bin_us")).min(), hi=(c("t0_us") + (c("bin") + 1) * c("bin_us")).max()).row(0)
    return (t[0] - origin_us) / 1e3, (t[1] - origin_us) / 1e3


def band_over_ranks(frame: pl.DataFrame, groups: pl.DataFrame, value_cols: list[str]) -> pl.DataFrame:
    """Per (run, group): median, min and max over the group's ranks of each value column:
    run, group, group_key, n_ranks, <col>_median, <col>_lo, <col>_hi."""
    c = pl.col
    f = frame.with_columns(c("run").cast(pl.String)).join(groups, on="rank")
    return f.group_by("run", "group", "group_key").agg(
        n_ranks=pl.len(),
        *[e for col in value_cols for e in (c(col).median().alias(f"{col}_median"), c(col).min().alias(f"{col}_lo"),
                                            c(col).max().alias(f"{col}_hi"))],
    ).sort("run", "group_key")


def memory_bands(curve: pl.DataFrame, groups: pl.DataFrame, origin_us: float, n: int = MEMORY_BINS) -> pl.DataFrame:
    """Allocated bytes over time per (run, group, mem_device) from the per-rank memory curves
    (profiler.memory.memory_curve, <= 64 buckets per rank): n bins over the run's span, each rank's
    level in a bin its highest bucket starting there (else the level it last had: the level is a step
    function), then median, lo, hi over the group's ranks with a level. run, group, mem_device, bin, t_ms, median, lo, hi."""
    if curve.is_empty():
        return pl.DataFrame(schema={"run": pl.String, "group": pl.String})
    c = pl.col
    t = curve.with_columns(c("run").cast(pl.String), t_ms=(c("start_us") - origin_us) / 1e3)
    x0, x1 = t["t_ms"].min(), t["t_ms"].max()
    w = max((x1 - x0) / n, 1e-9)
    per = (t.with_columns(bin=((c("t_ms") - x0) / w).floor().cast(pl.Int64).clip(0, n - 1))
           .group_by("run", "rank", "mem_device", "bin").agg(c("allocated_bytes").max()))
    grid = per.select("run", "rank", "mem_device").unique().join(pl.DataFrame({"bin": pl.int_range(0, n, eager=True)}), how="cross")
    dense = (grid.join(per, on=["run", "rank", "mem_device", "bin"], how="left").sort("run", "rank", "mem_device", "bin")
             .with_columns(c("allocated_bytes").forward_fill().over("run", "rank", "mem_device"))
             .filter(c("allocated_bytes").is_not_null()).join(groups, on="rank"))
    return (dense.group_by("run", "group", "group_key", "mem_device", "bin")
            .agg(median=c("allocated_bytes").median(), lo=c("allocated_bytes").min(), hi=c("allocated_bytes").max())
            .with_columns(t_ms=x0 + c("bin") * w).sort("run", "group_key", "mem_device", "bin"))

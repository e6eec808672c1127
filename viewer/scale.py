"""Compare at scale: many ranks drawn as groups (issue 16). Pure functions over the profiler's
per-rank summary frames; no events, no Dash.

Above SCALE_RANKS ranks a run's Compare cards stop drawing one item per rank. Its ranks are split
into groups (`rank_groups`: pipeline stages where run.json has a pipeline, else one group of all
ranks) and every card shows, per group, the median over the group's ranks with the min–max band
(`activity_bands` for the timeline, `memory_bands`, `breakdown_bands`), and names the ranks that
stand out (`outliers`). A rank missing from a bin (no activity there) counts as 0 busy: the median
is over every rank of the group, not only the busy ones.

Outliers: within its group, a rank whose mean step time or idle share lies beyond
median ± OUTLIER_K × scale, scale = max(1.4826 × MAD, a floor: 1 % of the median step time, 1
percentage point of idle share), so identical ranks never produce one and a group of two never
does (each is one MAD from the median).
"""

from __future__ import annotations

import polars as pl

from profiler.pipeline import positive_int

SCALE_RANKS = 16  # above this many ranks a run is drawn as groups (at or below: one lane per rank)
BAND_BINS = 400  # time bins of the aggregated timeline over the visible range
MEMORY_BINS = 64
OUTLIER_K = 3.0
MAD_SIGMA = 1.4826  # MAD of a normal distribution x 1.4826 = its standard deviation
OUTLIER_RULE = (f"outlier: a rank whose mean step time or idle share lies beyond its group's median ± {OUTLIER_K:g} × "
                f"max({MAD_SIGMA} × MAD, 1 % of the median step time / 1 point of idle share)")


def at_scale(n_ranks: int) -> bool:
    return n_ranks > SCALE_RANKS


def rank_groups(ranks: list[int], manifest: dict | None) -> pl.DataFrame:
    """rank, group (text), group_key (order): pipeline stages ("stage0", ...) where run.json has a
    pipeline of p > 1 ranks, else one group "all ranks".

    A stage is the rank's pp coordinate: `hybrid.groups.pp` where run.json lists it, else pp is
    the outermost mesh dimension (profiler/layout.py: rank // (ranks / pp))."""
    from profiler.pipeline import pp_coordinates

    m = manifest or {}
    pp = positive_int(((m.get("pipeline") or {}) if isinstance(m.get("pipeline"), dict) else {}).get("ranks")) \
        or positive_int((m.get("mesh") or {}).get("pp") if isinstance(m.get("mesh"), dict) else None)
    ranks = sorted(set(int(r) for r in ranks))
    if pp and pp > 1 and ranks:
        coords = pp_coordinates(m)
        world = positive_int(m.get("world_size")) or (max(ranks) + 1)
        per_stage = max(1, world // pp)
        stage = {r: (coords[r][1] if coords and r in coords else min(r // per_stage, pp - 1)) for r in ranks}
        return pl.DataFrame({"rank": ranks, "group": [f"stage{stage[r]}" for r in ranks], "group_key": [stage[r] for r in ranks]},
                            schema={"rank": pl.Int32, "group": pl.String, "group_key": pl.Int64})
    return pl.DataFrame({"rank": ranks, "group": ["all ranks"] * len(ranks), "group_key": [0] * len(ranks)},
                        schema={"rank": pl.Int32, "group": pl.String, "group_key": pl.Int64})


def padded_stats(frame: pl.DataFrame, by: list[str], value: str, n: str) -> pl.DataFrame:
    """Median, min and max of `value` per `by`, over `n` members of which those without a row
    count as 0 (values are >= 0: the zeros sort first). by..., median, lo, hi."""
    c = pl.col
    g = frame.group_by(*by, n).agg(_v=c(value).sort())
    k, total = c("_v").list.len(), c(n)
    z = total - k

    def at(i: pl.Expr) -> pl.Expr:
        return pl.when(i < z).then(0.0).otherwise(c("_v").list.get((i - z).clip(0), null_on_oob=True).cast(pl.Float64))

    return g.select(
        *by,
        median=(at((total - 1) // 2) + at(total // 2)) / 2,
        lo=pl.when(k < total).then(0.0).otherwise(c("_v").list.first().cast(pl.Float64)),
        hi=c("_v").list.last().cast(pl.Float64),
    )


def rebin(activity: pl.DataFrame, origin_us: float, x_range: tuple[float, float], n: int = BAND_BINS) -> pl.DataFrame:
    """Each rank's activity bins spread onto n common bins of x_range (ms from origin_us):
    run, rank, lane, lane_key, category, bin, busy (share of the common bin, 0..1)."""
    x0, x1 = x_range
    w = (x1 - x0) / n
    c = pl.col
    s = (c("t0_us") + c("bin").cast(pl.Float64) * c("bin_us") - origin_us) / 1e3  # source bin start, ms
    e = s + c("bin_us") / 1e3
    return (
        activity.with_columns(_s=s, _e=e)
        .filter((c("_e") > x0) & (c("_s") < x1))
        .with_columns(_b0=((c("_s") - x0) / w).floor().cast(pl.Int64).clip(0, n - 1),
                      _b1=(((c("_e") - x0) / w).ceil().cast(pl.Int64) - 1).clip(0, n - 1))
        .with_columns(_t=pl.int_ranges(c("_b0"), pl.max_horizontal("_b0", "_b1") + 1))
        .explode("_t")
        .with_columns(_cover=pl.min_horizontal(c("_e"), x0 + (c("_t") + 1) * w) - pl.max_horizontal(c("_s"), x0 + c("_t") * w))
        .filter(c("_cover") > 0)
        .group_by(c("run").cast(pl.String), "rank", "lane", "lane_key", "category", c("_t").alias("bin"))
        .agg(busy=(c("busy").cast(pl.Float64) * c("_cover")).sum() / w)
        .with_columns(c("busy").clip(0.0, 1.0))
    )


def activity_bands(activity: pl.DataFrame, groups: pl.DataFrame, origin_us: float, x_range: tuple[float, float],
                   n: int = BAND_BINS) -> pl.DataFrame:
    """Per (run, group, lane, category, bin of x_range): median, lo (min), hi (max) busy share
    over the group's ranks, with t_ms (bin start) and bin_ms. A (lane, category) drawn only where
    some rank of the group was busy in it."""
    if activity.is_empty():
        return pl.DataFrame(schema={"run": pl.String, "group": pl.String})
    sizes = groups.group_by("group", "group_key").agg(n_ranks=pl.len())
    binned = rebin(activity, origin_us, x_range, n).join(groups, on="rank").join(sizes, on=["group", "group_key"])
    stats = padded_stats(binned, ["run", "group", "group_key", "lane", "lane_key", "category", "bin"], "busy", "n_ranks")
    w = (x_range[1] - x_range[0]) / n
    return stats.with_columns(t_ms=x_range[0] + pl.col("bin") * w, bin_ms=pl.lit(w)).sort("run", "group_key", "lane_key", "category", "bin")


def activity_extent(activity: pl.DataFrame, origin_us: float) -> tuple[float, float]:
    """(first bin start, last bin end) in ms from origin_us; (0, 1) when empty."""
    if activity.is_empty():
        return 0.0, 1.0
    c = pl.col
    t = activity.select(lo=(c("t0_us") + c("bin") * c("bin_us")).min(), hi=(c("t0_us") + (c("bin") + 1) * c("bin_us")).max()).row(0)
    return (t[0] - origin_us) / 1e3, (t[1] - origin_us) / 1e3


def rank_metrics(steps: pl.DataFrame, breakdown: pl.DataFrame) -> pl.DataFrame:
    """Per (run, rank): step_ms (mean over its profiled steps) and idle_pct (idle share of its window)."""
    c = pl.col
    st = steps.group_by(c("run").cast(pl.String), "rank").agg(step_ms=c("dur_us").mean() / 1e3)
    if breakdown.height:
        bd = breakdown.select(c("run").cast(pl.String), "rank", idle_pct=100 * c("idle_us") / c("window_us"))
        st = st.join(bd, on=["run", "rank"], how="full", coalesce=True)
    else:
        st = st.with_columns(idle_pct=pl.lit(None, pl.Float64))
    return st


def outliers(metrics: pl.DataFrame, groups: pl.DataFrame, k: float = OUTLIER_K) -> pl.DataFrame:
    """The ranks that stand out within their group (the module docstring's rule): run, rank, group,
    metric ("step time" / "idle share"), value, median, why (one line naming the rank)."""
    c = pl.col
    floors = {"step_ms": ("step time", "ms", lambda med: 0.01 * med.abs()), "idle_pct": ("idle share", "%", lambda med: pl.lit(1.0))}
    out = []
    m = metrics.join(groups.select("rank", "group"), on="rank")
    for col, (name, unit, floor) in floors.items():
        if col not in m.columns:
            continue
        v = m.filter(c(col).is_not_null() & c(col).is_finite())
        if v.is_empty():
            continue
        med = c(col).median().over("run", "group")
        mad = (c(col) - med).abs().median().over("run", "group")
        flagged = v.with_columns(_med=med, _mad=mad).with_columns(_scale=pl.max_horizontal(MAD_SIGMA * c("_mad"), floor(c("_med")))).filter(
            (c(col) - c("_med")).abs() > k * c("_scale"))
        out.append(flagged.select(
            "run", "rank", "group", metric=pl.lit(name), value=c(col), median=c("_med"),
            why=pl.format("r{} ({}): {} {} {} vs median {} {}", "rank", "group", pl.lit(name), c(col).round(2), pl.lit(unit),
                          c("_med").round(2), pl.lit(unit)),
        ))
    schema = {"run": pl.String, "rank": pl.Int32, "group": pl.String, "metric": pl.String, "value": pl.Float64,
              "median": pl.Float64, "why": pl.String}
    return pl.concat([o.cast(schema) for o in out]).sort("run", "metric", "rank") if out else pl.DataFrame(schema=schema)


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

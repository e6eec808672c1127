"""Ranks that stand out within their group: the rule the viewer draws at scale and the `outlier`
finding states. Pure functions over the per-rank summary frames (steps, breakdown) and run.json.

Groups (`rank_groups`): pipeline stages where run.json has a pipeline, else one group of all ranks
(ranks of one stage do the same work; across stages they need not). Within a group, a rank whose
mean step time or idle share (idle / window, the temporal breakdown) lies beyond
median ± OUTLIER_K × scale, scale = max(1.4826 × MAD, a floor: 1 % of the median step time, 1
percentage point of idle share), is an outlier: identical ranks never produce one (the floor) and
a group of two never does (each is one MAD from the median). MAD, not the standard deviation: one
slow rank among 1,024 moves the standard deviation towards itself, the median not.
"""

from __future__ import annotations

import polars as pl

from profiler.pipeline import positive_int

OUTLIER_K = 3.0
MAD_SIGMA = 1.4826  # MAD of a normal distribution x 1.4826 = its standard deviation
OUTLIER_RULE = (f"outlier: a rank whose mean step time or idle share lies beyond its group's median ± {OUTLIER_K:g} × "
                f"max({MAD_SIGMA} × MAD, 1 % of the median step time / 1 point of idle share)")


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

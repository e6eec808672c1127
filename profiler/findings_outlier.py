"""Finding `outlier`: the ranks that stand out within their group (profiler/outliers.py's rule, the
one the viewer names at scale). The idle and straggler findings name the worst rank; a rank far
from its group's median, in either direction, is what to look at first on a many-rank job: its
data, its host, its device (docs/findings.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from profiler.findings_base import Row, _row, _runs
from profiler.findings_text import ms, num, pct
from profiler.textfmt import plural
from profiler.outliers import MAD_SIGMA, OUTLIER_K, outliers, rank_groups, rank_metrics

if TYPE_CHECKING:
    from profiler.report import Analysis

OUTLIERS_SHOWN = 4  # outlier ranks named in the evidence; the rest counted


def outlier_rule(a: "Analysis") -> list[Row]:
    """Per run, the rank furthest from its group's median, with the run's other outliers in the
    evidence. Score: that distance as a share of time: for a step time, of the longer of the rank's
    and the median step; for an idle share, points of the window."""
    steps, breakdown = getattr(a, "steps", None), getattr(a, "breakdown", None)
    if steps is None or steps.is_empty():
        return []
    metrics = rank_metrics(steps, breakdown if breakdown is not None else pl.DataFrame())
    # Ranks whose numbers are artefacts of the trace, not of the rank: a trace cut short (its last
    # step counts untraced time), a device that started late in its steps (its window is short),
    # a rank without ProfilerStep spans (one window over the whole trace): a warning says each.
    odd = [f.select(pl.col("run").cast(pl.String), pl.col("rank").cast(pl.Int32))
           for f in (getattr(a, "cut_steps", None), getattr(a, "late_devices", None),
                     steps.filter(~pl.col("has_profiler_steps")) if "has_profiler_steps" in steps.columns else None)
           if f is not None and f.height]
    if odd:
        metrics = metrics.join(pl.concat(odd).unique(), on=["run", "rank"], how="anti")
    out = []
    for run in _runs(a):
        ranks = a.ranks.filter(pl.col("run").cast(pl.String) == run)["rank"].to_list()
        if len(ranks) < 3:  # a group of two never has one (each is one MAD from the median)
            continue
        groups = rank_groups(ranks, (a.runs or {}).get(run))
        o = outliers(metrics.filter(pl.col("run") == run), groups)
        if o.is_empty():
            continue
        # How far each is, as a share of time: a step time's distance from the median as a share of
        # the longer of the two (a slower rank: the share of the job's step the others wait for it),
        # an idle share's distance in points of the window.
        gap = (pl.col("value") - pl.col("median")).abs()
        o = o.with_columns(off=pl.when(pl.col("metric") == "step time")
                           .then(100 * gap / pl.max_horizontal("value", "median")).otherwise(gap),
                           pct_of_median=100 * gap / pl.col("median"))
        o = o.filter(pl.col("off").is_finite()).sort(["off", "rank"], descending=[True, False])
        if o.is_empty():
            continue
        top = o.row(0, named=True)
        size = groups.filter(pl.col("group") == top["group"]).height
        group = f"the run's {size:,} ranks" if top["group"] == "all ranks" else f"the {size:,} ranks of pipeline {top['group']}"
        if top["metric"] == "step time":
            what = (f"its mean step takes {ms(1e3 * top['value'])} against its group's median {ms(1e3 * top['median'])} "
                    f"({'+' if top['value'] > top['median'] else '−'}{pct(top['pct_of_median'])})")
        else:
            what = (f"it is idle {pct(top['value'])} of its window against its group's median {pct(top['median'])} "
                    f"({'+' if top['value'] > top['median'] else '−'}{num(top['off'])} points)")
        ranks_out = o["rank"].unique(maintain_order=True).to_list()
        others = len(ranks_out) - 1
        text = (f"Rank {top['rank']} stands out among {group}: {what}"
                + (f"; {plural(others, 'other rank')} too" if others else ""))
        shown = o.unique("rank", keep="first", maintain_order=True).head(OUTLIERS_SHOWN)["why"].to_list()
        more = f", and {len(ranks_out) - OUTLIERS_SHOWN} more" if len(ranks_out) > OUTLIERS_SHOWN else ""
        evidence = (f"run {run}; beyond the group's median ± {OUTLIER_K:g} × max({MAD_SIGMA} × MAD, 1 % of the median step "
                    f"/ 1 point of idle): " + "; ".join(shown) + more)
        change = (f"look at what rank {top['rank']} does differently from the rest of its group: its data (shard sizes, "
                  "sequence lengths), its host (other processes, CPU or NUMA placement, throttling), its device and link; "
                  f"`ptprof view` draws its own timeline beside the group's band (&rank={top['rank']})")
        out.append(_row("outlier", run, top["rank"], top["off"], text + ".", evidence, change))
    return out

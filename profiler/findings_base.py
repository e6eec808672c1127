"""What every findings rule shares: the thresholds (docs/findings.md says why each is where it is),
the row builder and small frame helpers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import polars as pl

from profiler.alphabeta import TRUSTED_R2

if TYPE_CHECKING:
    from profiler.report import Analysis

EXPOSED_COMM_MIN_PCT = 5.0  # exposed communication, % of the worst rank's step time
BUBBLE_MIN_PCT = 10.0  # pipeline idle time, % of the pipeline window (mean over ranks and steps)
BUBBLE_PART_MIN_PCT = 5.0  # a part of the bubble (schedule, imbalance, communication) gets its change from this size
MEMORY_SAVING_MIN_PCT = 10.0  # what the next ZeRO stage saves, % of the persistent bytes per rank
SKEW_MIN_PCT = 5.0  # time some rank waits for a later one to start a collective, % of the step time
STRAGGLER_MIN_SHARE_PCT = 75.0  # a rank last in at least this share of its group's collectives ...
STRAGGLER_MIN_TIMES = 4  # ... and at least this many times is named a straggler
VOLUME_MIN_PCT = 1.0  # communication time the volume mismatch accounts for, % of the step
LATENCY_MIN_PCT = 5.0  # time at stake (calls x α, or the time beyond α + n/β), % of the step time
LATENCY_MAX_BW_FRACTION = 0.5  # ... while achieved bandwidth is at most this fraction of the fitted β
ALPHA_MIN_SHARE_PCT = 50.0  # the gap is latency only where α is at least this share of the predicted time
FIT_MIN_R2 = TRUSTED_R2  # an α-β fit with a lower R² is not trusted (profiler.alphabeta)
ACTIVATION_MIN_PCT = 50.0  # transient memory (peak - persistent), % of the device's peak
IDLE_MIN_PCT = 15.0  # device idle (no kernel, no copy), % of the worst rank's profiled window
COMPARE_MIN_PCT = 5.0  # step time difference between two runs, % of the slower step
MAX_COMPARISON_FINDINGS = 2  # comparisons between runs kept (the highest scores), so they do not crowd out the rest
MAX_FINDINGS = 12  # the list stays short: the highest scores are kept

Row = dict



def _finite(*values) -> bool:
    return all(v is not None and isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _row(rule: str, run, rank, score: float, text: str, evidence: str, change: str) -> Row:
    return {"run": None if run is None else str(run), "rank": rank, "rule": rule, "score": min(100.0, max(0.0, score)),
            "text": text, "evidence": evidence, "change": change}


def _runs(a: "Analysis") -> list[str]:
    return a.ranks["run"].cast(pl.String).unique(maintain_order=True).to_list()


def _pipeline_run(a: "Analysis", run: str) -> bool:
    """Whether `run` has pipeline action spans (`ptprof/pp/...`): its sends and receives are stage transfers."""
    actions = getattr(a, "pipeline_actions", None)
    return actions is not None and actions.height > 0 and (actions["run"].cast(pl.String) == run).any()


def _str_run(frame: pl.DataFrame | None) -> pl.DataFrame | None:
    if frame is None or "run" not in frame.columns:
        return frame
    return frame.with_columns(pl.col("run").cast(pl.String))


def _step_us(a: "Analysis") -> dict[str, float]:
    """Run -> the mean step time over its ranks and steps (breakdown_steps' window), µs."""
    b = _str_run(a.breakdown_steps)
    if b is None or b.is_empty():
        return {}
    means = b.filter(pl.col("window_us") > 0).group_by("run").agg(pl.col("window_us").mean())
    return {r: w for r, w in means.iter_rows() if _finite(w) and w > 0}


def incomplete_runs(ranks: pl.DataFrame | None) -> dict[str, tuple[int, int]]:
    """{run: (ranks loaded, world size)} of the runs with fewer ranks loaded than their traces'
    world size (distributedInfo): a pipeline of 2 read from one rank's file is no pipeline of one
    stage (a trial's partial gpipe run: "p=1, the slowest stage is stage 0, 1.00x")."""
    if ranks is None or ranks.is_empty() or "world_size" not in ranks.columns:
        return {}
    per = ranks.group_by("run").agg(have=pl.col("rank").n_unique(), world=pl.col("world_size").max())
    return {str(run): (have, world) for run, have, world in per.iter_rows() if world is not None and have < world}

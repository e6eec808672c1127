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
    """{run: (ranks loaded below the world size, world size)} of the runs that miss some rank below
    their traces' world size (distributedInfo): a pipeline of 2 read from one rank's file is no
    pipeline of one stage (a trial's partial gpipe run: "p=1, the slowest stage is stage 0, 1.00x").
    `Analysis.missing_ranks` (none under --rank, which selects ranks); report.missing_rank_warnings
    words the same runs."""
    if ranks is None or ranks.is_empty() or "world_size" not in ranks.columns:
        return {}
    out = {}
    for run, have, world in ranks.group_by("run", maintain_order=True).agg(
            have=pl.col("rank").unique(), world=pl.col("world_size").max()).iter_rows():
        inside = {r for r in have if r is not None and 0 <= r < world} if world is not None else set()
        if world is not None and len(inside) < world:
            out[str(run)] = (len(inside), world)
    return out


def routed_received(a: "Analysis", run: str, steps: list[int]) -> dict[int, float]:
    """{rank: mean pairs (token, expert) its experts received a step} over `steps`, from the ep
    theory's routing notes ("routing of step N: S pairs sent, R received"); {} where there are none."""
    t = getattr(a, "theory_comm", None)
    if t is None or t.is_empty() or "note" not in t.columns:
        return {}
    got = (t.filter((pl.col("run").cast(pl.String) == run) & pl.col("step").is_in(steps))
           .select("rank", "step", r=pl.col("note").cast(pl.String).str.extract(r"routing of step \d+: \d+ pairs sent, (\d+) received")
                   .cast(pl.Int64))
           .drop_nulls("r").unique(["rank", "step"]).group_by("rank").agg(pl.col("r").mean()))
    return {int(r): float(v) for r, v in got.iter_rows()}

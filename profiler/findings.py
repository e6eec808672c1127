"""Findings: what a run's numbers mean and what to change, from explicit rules (docs/findings.md).

SKELETON (issue 13): schema fixed here; the rules are filled in by the findings work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from profiler.report import Analysis

# One row per finding, most important first (score: the share of step time or memory at stake, 0-100).
# run is null for a finding about several runs (a comparison).
FINDING_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "rule": pl.String, "score": pl.Float64, "text": pl.String,
    "evidence": pl.String, "change": pl.String,
}


def findings(a: "Analysis") -> pl.DataFrame:
    """FINDING_COLUMNS: every rule over one analysis, ranked by score."""
    return pl.DataFrame(schema=FINDING_COLUMNS)

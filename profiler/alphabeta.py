"""The α–β (latency–bandwidth) model of collectives: time = α + n/β, fitted by least squares.

SKELETON (issue 13): schemas fixed here; filled in by the α–β work.
"""

from __future__ import annotations

import polars as pl

# Per (run, backend, collective, group_size): the fit over that run's own collectives.
FIT_COLUMNS = {
    "run": pl.String, "backend": pl.String, "collective": pl.String, "group_size": pl.Int64, "n_calls": pl.Int64,
    "n_sizes": pl.Int64, "alpha_us": pl.Float64, "beta_gbps": pl.Float64, "r2": pl.Float64, "note": pl.String,
}


def fit_alpha_beta(collectives: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """FIT_COLUMNS from profiler.collectives rows (one per collective call)."""
    return pl.DataFrame(schema=FIT_COLUMNS)

"""Communication/computation overlap per rank: HTA's `get_comm_comp_overlap`, plus exposed time.

overlap_pct = |comm ∩ compute| / |comm| * 100, where comm and compute are the unions of
communication and compute activity (GPU kernels, or gloo spans and CPU operators; see
profiler/breakdown.py for what counts as which). `exposed_comm_us` is communication with no compute
under it: the time a rank would save if that communication were hidden.
"""

from __future__ import annotations

import polars as pl

from profiler.breakdown import temporal_breakdown
from profiler.steps import KEYS


def comm_compute_overlap(events: pl.DataFrame, *, per_step: bool = False, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per rank (per step with per_step=True): comm_us, overlap_us, exposed_comm_us, overlap_pct."""
    by = [*KEYS, "step"] if per_step else KEYS
    return temporal_breakdown(events, per_step=per_step, steps=steps).select(
        *by, "device", "comm_us", "overlap_us", "exposed_comm_us", "overlap_pct"
    )

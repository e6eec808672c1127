"""HolisticTraceAnalysis side by side: its temporal breakdown and overlap on the same traces.

HTA is imported only here and only when asked (it is slow to import and pulls in plotly). HTA 0.5.0
needs pandas < 3 (its parser fails with a dtype error under pandas 3); we check that up front and
turn any HTA failure into a TraceError naming the folder, since HTA's own tracebacks say little.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import polars as pl

from profiler.errors import TraceError


def hta_breakdown(trace_files: dict[int, str | Path]) -> pl.DataFrame:
    """HTA's numbers for one run: rank, idle_us, compute_us, non_compute_us, window_us, overlap_pct.

    trace_files: rank -> trace file (all in one folder is not required). Runs HTA with
    include_last_profiler_step=True so its window is the same as ours.
    """
    if not trace_files:
        raise TraceError(None, "HTA: no trace files")
    try:
        import pandas as pd
    except ImportError:
        raise TraceError(None, "HTA needs pandas: pip install 'pandas<3'") from None
    if int(pd.__version__.split(".")[0]) >= 3:
        raise TraceError(None, f"HTA 0.5 fails on real traces under pandas {pd.__version__}; install 'pandas<3'")
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as e:
        raise TraceError(None, f"HTA is not installed ({e}); pip install HolisticTraceAnalysis") from None
    folder = Path(next(iter(trace_files.values()))).parent
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # HTA logs a warning per file parsed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pandas FutureWarnings from inside HTA
            ta = TraceAnalysis(trace_dir=str(folder), trace_files={r: str(p) for r, p in trace_files.items()},
                               include_last_profiler_step=True)
            tb = ta.get_temporal_breakdown(visualize=False)
            ov = ta.get_comm_comp_overlap(visualize=False)
    except Exception as e:  # HTA raises anything from KeyError to AssertionError on traces it cannot read
        raise TraceError(folder, f"HTA failed: {type(e).__name__}: {e}") from None
    finally:
        logging.disable(previous)
    frame = pl.from_pandas(tb.merge(ov, on="rank"))
    return frame.select(
        rank=pl.col("rank").cast(pl.Int32),
        window_us=pl.col("kernel_time(us)").cast(pl.Float64),
        compute_us=pl.col("compute_time(us)").cast(pl.Float64),
        non_compute_us=pl.col("non_compute_time(us)").cast(pl.Float64),
        idle_us=pl.col("idle_time(us)").cast(pl.Float64),
        overlap_pct=pl.col("comp_comm_overlap_pctg").cast(pl.Float64),
    )


def compare_with_hta(breakdown: pl.DataFrame, hta: pl.DataFrame) -> pl.DataFrame:
    """Ours beside HTA's per rank, with differences in % of the window (overlap in points)."""
    ours = breakdown.select("rank", "window_us", "compute_us", "non_compute_us", "idle_us", "overlap_pct")
    joined = ours.join(hta, on="rank", suffix="_hta")
    return joined.with_columns(
        [(100 * (pl.col(c) - pl.col(f"{c}_hta")) / pl.col("window_us_hta")).alias(f"{c}_diff_pct_of_window")
         for c in ("compute_us", "non_compute_us", "idle_us")]
        + [(pl.col("overlap_pct") - pl.col("overlap_pct_hta")).alias("overlap_diff_points")]
    )

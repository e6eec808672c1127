"""Theory beside measurement: the textbook communication of each paradigm, predicted from run.json,
and the table that sets it beside what the traces measured.

SKELETON (issue 13): schemas fixed here so the report, findings and viewer can be built against
them; the predictions are filled in by the theory work.
"""

from __future__ import annotations

import polars as pl

from profiler.theory_pipeline import PIPELINE_PARADIGMS, pipeline_p2p_rows

# One row per (run, rank, dim, phase, collective, group_size): what one rank does per step.
# bytes: nccl-tests "size" convention (all-reduce buffer, all-gather output, reduce-scatter input,
# all-to-all buffer, p2p message), the same as profiler.collectives' size_bytes, summed over calls.
# traffic_bytes: what the rank sends over a ring (bytes x the busbw factor). phi: the textbook
# volume in units of the run's parameter bytes Φ (all-reduce counts 2x, the others 1x).
COMM_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "dim": pl.String, "phase": pl.String, "collective": pl.String,
    "group_size": pl.Int64, "calls": pl.Int64, "bytes": pl.Int64, "traffic_bytes": pl.Float64, "phi": pl.Float64,
    "formula": pl.String, "note": pl.String,
}
# One row per (run, rank, quantity): predicted beside measured. verdict: "match", "above",
# "below" (measured vs predicted, outside the quantity's tolerance), "no theory", "no measurement".
CHECK_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "quantity": pl.String, "unit": pl.String, "predicted": pl.Float64,
    "measured": pl.Float64, "ratio": pl.Float64, "verdict": pl.String, "note": pl.String,
}


def predict_comm(runs: dict[str, dict | None]) -> pl.DataFrame:
    """Per run with a run.json: COMM_COLUMNS, the communication each rank does per step."""
    # Pipeline schedules: only their stage-boundary sends and receives (profiler.theory_pipeline).
    rows = [{"run": run, "rank": rank, **row} for run, m in runs.items() if m and m.get("paradigm") in PIPELINE_PARADIGMS
            for rank in _ranks(m) for row in pipeline_p2p_rows(m, rank)]
    return pl.DataFrame(rows, schema=COMM_COLUMNS)


def _ranks(manifest: dict) -> range:
    """0..world_size-1 of a run.json, empty where world_size is not a plausible count (user data)."""
    n = manifest.get("world_size")
    return range(n) if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 20 else range(0)


def comm_check(runs: dict[str, dict | None], comm: pl.DataFrame, collectives: pl.DataFrame) -> pl.DataFrame:
    """CHECK_COLUMNS for communication: bytes per step by collective kind (and dim), volume in Φ."""
    return pl.DataFrame(schema=CHECK_COLUMNS)


def theory_check(runs: dict[str, dict | None], comm: pl.DataFrame, collectives: pl.DataFrame,
                 memory: pl.DataFrame, persistent: pl.DataFrame) -> pl.DataFrame:
    """CHECK_COLUMNS: each predicted quantity beside its measurement (communication, then memory)."""
    from profiler.theory_memory import memory_check  # theory_memory reads COMM/CHECK schemas from here

    parts = [comm_check(runs, comm, collectives), memory_check(memory, persistent)]
    return pl.concat([p.select(list(CHECK_COLUMNS)).cast(CHECK_COLUMNS) for p in parts])

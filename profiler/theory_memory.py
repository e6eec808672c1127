"""Theory of persistent memory: parameters, gradients and optimizer state per rank (the ZeRO
table), the 16 bytes/parameter rule, and what each ZeRO stage would hold for the same model.

SKELETON (issue 13): schemas fixed here; filled in by the memory-theory work.
"""

from __future__ import annotations

import polars as pl

# Per (run, rank): the predicted persistent bytes of this run's layout.
MEMORY_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "n_params": pl.Int64, "params_bytes": pl.Int64, "grads_bytes": pl.Int64,
    "optimizer_bytes": pl.Int64, "total_bytes": pl.Int64, "rule_bytes_per_param": pl.Float64, "formula": pl.String,
}
# Per (run, layout): what every rank would hold under each data-parallel layout at this run's N.
WHATIF_COLUMNS = {
    "run": pl.String, "layout": pl.String, "dp": pl.Int64, "params_bytes": pl.Int64, "grads_bytes": pl.Int64,
    "optimizer_bytes": pl.Int64, "total_bytes": pl.Int64, "current": pl.Boolean,
}


def predict_memory(runs: dict[str, dict | None]) -> pl.DataFrame:
    """MEMORY_COLUMNS for every rank of every run with a run.json."""
    return pl.DataFrame(schema=MEMORY_COLUMNS)


def memory_whatif(runs: dict[str, dict | None]) -> pl.DataFrame:
    """WHATIF_COLUMNS: ddp, zero1, zero2, zero3/fsdp for each run's model and data-parallel degree."""
    return pl.DataFrame(schema=WHATIF_COLUMNS)


def memory_check(memory: pl.DataFrame, persistent: pl.DataFrame) -> pl.DataFrame:
    """profiler.theory.CHECK_COLUMNS rows: predicted params/grads/optimizer bytes per rank beside
    run.json's measured ones (profiler.memory.persistent_memory)."""
    from profiler.theory import CHECK_COLUMNS

    return pl.DataFrame(schema=CHECK_COLUMNS)

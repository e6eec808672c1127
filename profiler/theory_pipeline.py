"""Theory of pipeline communication: the activations sent forward and the gradients sent back
across stage boundaries, per microbatch, for every schedule (and a hybrid run's pp dimension).

SKELETON (issue 13): filled in by the pipeline-theory work.
"""

from __future__ import annotations


def pipeline_p2p_rows(manifest: dict, rank: int) -> list[dict]:
    """Rows of profiler.theory.COMM_COLUMNS (without run/rank) for the sends and receives global
    `rank` does per step in the pipeline (dim "pp"); [] when the run has no pipeline."""
    return []

"""Communication theory of sequence / context parallelism: DeepSpeed-Ulysses and ring attention.

(skeleton: being written for issue 14)
"""

from __future__ import annotations


# Rows are dicts of profiler.theory._row's keys: dim, phase, collective, group_size, calls, bytes,
# formula, note, step (one rank, one step; theory.predict_comm adds run, rank, traffic and phi).


def ulysses_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    return []


def ring_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    return []

"""Helpers for profiler tests: tiny literal event frames, and HTA's numbers computed once."""

from __future__ import annotations

import polars as pl
import pytest

from profiler.parse import SCHEMA
from tests.conftest import SHARED_TRACES

GPU_NCCL = SHARED_TRACES / "gpu_nccl_2_of_128"


def make_events(rows: list[dict], *, run: str = "r", rank: int = 0) -> pl.DataFrame:
    """An event frame (profiler.parse.SCHEMA) from a few hand-written rows.

    Each row gives at least name, kind, ts_us, dur_us; device defaults to "cpu", ph to "X",
    pid/tid to 1, run/rank to the arguments.
    """
    full = []
    for r in rows:
        row = {c: None for c in SCHEMA}
        row.update(run=run, rank=rank, pid=1, tid=1, ph="X", cat="cpu_op", device="cpu")
        row.update(r)
        row["end_us"] = row["ts_us"] + row["dur_us"]
        full.append(row)
    return pl.DataFrame(full, schema={c: (pl.String if t == pl.Categorical() else t) for c, t in SCHEMA.items()}).with_columns(
        [pl.col(c).cast(t) for c, t in SCHEMA.items()]
    )


def kernel(name: str, kind: str, ts: float, dur: float, corr: int, stream: int = 7, **kw) -> dict:
    return dict(name=name, kind=kind, device="gpu", cat="kernel", ts_us=ts, dur_us=dur, correlation=corr,
                stream=stream, pid=0, tid=stream, **kw)


def launch(ts: float, corr: int, **kw) -> dict:
    return dict(name="cudaLaunchKernel", kind="runtime", cat="cuda_runtime", ts_us=ts, dur_us=1.0, correlation=corr, **kw)


def step(k: int, ts: float, dur: float, **kw) -> dict:
    return dict(name=f"ProfilerStep#{k}", kind="annotation", cat="user_annotation", ts_us=ts, dur_us=dur, **kw)


@pytest.fixture(scope="session")
def hta_gpu_nccl() -> pl.DataFrame:
    """HTA 0.5's temporal breakdown + overlap on gpu_nccl_2_of_128, computed here, once."""
    from profiler.hta import hta_breakdown

    return hta_breakdown({r: GPU_NCCL / f"rank{r}.json.gz" for r in (0, 1)})

"""`ptprof project`'s own-layout formulas on hand-made measurements, the goldens worked out by
hand in the comments (docs/whatif.md, "Project"): the overlap rule, the carried-over host time,
and a 2-stage pipeline replay. No traces read: RunWork built directly, issue 8's rows given."""

from __future__ import annotations

import polars as pl
import pytest

import profiler.project as project
from profiler.cluster import Cluster, Link
from profiler.layout import Layout
from profiler.pipeline import ACTION_COLUMNS
from profiler.project_measure import STEP_COLUMNS, RunWork

# α = 0, 1 GB/s; HBM 1 GB/s at efficiency 1: a memory-bound op of X bytes takes X ns on the target
CLUSTER = Cluster(name="hand", peak_tflops=1.0, hbm_gib=80.0, hbm_gbps=1.0, gpus_per_node=8,
                  intra=Link("l", 1.0, 0.0), inter=Link("l", 1.0, 0.0), gemm_efficiency=1.0, hbm_efficiency=1.0,
                  link_efficiency=1.0)
ROW_SCHEMA = {"rank": pl.Int32, "dim": pl.String, "phase": pl.String, "collective": pl.String,
              "group_size": pl.Int64, "calls": pl.Int64, "bytes": pl.Int64, "step": pl.Int64, "stride": pl.Int64}


def _ops(rows):
    """rows of (rank, ts_us, dur_us, bytes): memory-bound ops of step 0."""
    return pl.DataFrame([{"rank": r, "step": 0, "ts_us": t, "dur_us": d, "name": "aten::add", "klass": "memory",
                          "flops": None, "bytes": float(b), "batch": None, "m": None, "n": None, "k": None,
                          "elem_bytes": 4} for r, t, d, b in rows],
                        schema={"rank": pl.Int32, "step": pl.Int64, "ts_us": pl.Float64, "dur_us": pl.Float64,
                                "name": pl.String, "klass": pl.String, "flops": pl.Float64, "bytes": pl.Float64,
                                "batch": pl.Int64, "m": pl.Int64, "n": pl.Int64, "k": pl.Int64, "elem_bytes": pl.Int64})


def _work(manifest, steps, ops, actions):
    return RunWork("hand", manifest, pl.DataFrame({"rank": [0]}), pl.DataFrame(steps, schema={
        "rank": pl.Int32, "step": pl.Int64, **{c: pl.Float64 for c in STEP_COLUMNS[2:]}}, orient="row"),
        ops, actions, pl.DataFrame(), False)


def test_own_layout_overlap_and_other_by_hand(monkeypatch):
    # measured: W = 100 µs, C = 60, comm 30 of which O = 20 under compute, E = 10 exposed.
    # one op of 60 µs moving 30,000 B: 30 µs on the target, ρ = 0.5 -> compute_t = 30 µs.
    # an all-reduce of 15,000 B over 2 ranks: ring traffic 2(n-1)/n = 1 x 15,000 B at 1 GB/s = 15 µs.
    # hidden = min(15, ρ·O = 10) = 10, exposed = 5; other = W - C - E = 30; step = 30 + 5 + 30 = 65 µs.
    rows = pl.DataFrame([{"rank": 0, "dim": "dp", "phase": "bwd", "collective": "all_reduce", "group_size": 2,
                          "calls": 1, "bytes": 15_000, "step": None, "stride": 1}], schema=ROW_SCHEMA)
    monkeypatch.setattr(project, "comm_rows", lambda work, layout: (rows, None))
    work = _work({"paradigm": "ddp", "world_size": 1}, [[0, 0, 100.0, 60.0, 30.0, 20.0, 10.0]],
                 _ops([(0, 5.0, 60.0, 30_000)]), pl.DataFrame(schema=ACTION_COLUMNS))
    out = project.own_layout_step(work, CLUSTER, CLUSTER, Layout(dp=2))
    b = out["breakdown_s"]
    assert out["step_s"] == pytest.approx(65e-6)
    assert b["compute"] == pytest.approx(30e-6) and b["other"] == pytest.approx(30e-6)
    assert b["comm_exposed:dp"] == pytest.approx(5e-6)


def test_two_stage_pipeline_replay_by_hand(monkeypatch):
    # 1 microbatch, stage s on rank s. Measured spans: F 10 µs (4 µs of ops), B 20 µs (8 µs of ops).
    # Replay: F0 [0,10], F1 [10,20], B1 [20,40], B0 [40,60]: M_src = 60 µs.
    # ops at ρ = 0.5 (X µs moving X·500 B): F -> 10 - 4 + 2 = 8, B -> 20 - 8 + 4 = 16: M_t = 48 µs.
    # rank 0: W = 70, C = 18 (12 of ops in actions + a 6 µs optimizer op outside, ρ 0.5 -> 3 µs).
    #   N = C - 12 = 6; R = W - M_src - N - P_src = 70 - 60 - 6 - 0 = 4.
    #   step = M_t + ρN + R = 48 + 3 + 4 = 55; compute = 2 + 4 + 3 = 9; bubble = M_t - busy_t
    #   = 48 - 24 = 24; other = R + host in actions (24 - 6) = 22.  9 + 24 + 22 = 55.
    # rank 1: the same spans (F 10..20, B 20..40) and W = 70, C = 12 (no optimizer op): N = 0,
    #   R = 70 - 60 - 0 = 10, step = 48 + 0 + 10 = 58 -> the job's step (the slowest rank).
    monkeypatch.setattr(project, "comm_rows", lambda work, layout: (pl.DataFrame(schema=ROW_SCHEMA), None))
    acts = pl.DataFrame([
        {"run": "hand", "rank": 0, "step": 0, "action": "F", "stage": 0, "microbatch": 0, "slot": 0,
         "start_us": 0.0, "end_us": 10.0, "dur_us": 10.0},
        {"run": "hand", "rank": 0, "step": 0, "action": "B", "stage": 0, "microbatch": 0, "slot": 1,
         "start_us": 40.0, "end_us": 60.0, "dur_us": 20.0},
        {"run": "hand", "rank": 1, "step": 0, "action": "F", "stage": 1, "microbatch": 0, "slot": 0,
         "start_us": 10.0, "end_us": 20.0, "dur_us": 10.0},
        {"run": "hand", "rank": 1, "step": 0, "action": "B", "stage": 1, "microbatch": 0, "slot": 1,
         "start_us": 20.0, "end_us": 40.0, "dur_us": 20.0}], schema=ACTION_COLUMNS)
    ops = _ops([(0, 1.0, 4.0, 2_000), (0, 41.0, 8.0, 4_000), (0, 62.0, 6.0, 3_000),
                (1, 11.0, 4.0, 2_000), (1, 21.0, 8.0, 4_000)])
    work = _work({"paradigm": "1f1b", "world_size": 2, "pipeline": {"loss_stage": 1}},
                 [[0, 0, 70.0, 18.0, 0.0, 0.0, 0.0], [1, 0, 70.0, 12.0, 0.0, 0.0, 0.0]], ops, acts)
    out = project.own_layout_step(work, CLUSTER, CLUSTER, Layout(pp=2, microbatches=2, microbatch=1))
    per = {r: s for r, s in zip(out["per_rank"]["ranks"], out["per_rank"]["projected_s"])}
    assert per[0] == pytest.approx(55e-6) and per[1] == pytest.approx(58e-6)
    st = out["per_step"].filter(pl.col("rank") == 0)
    assert st["compute_t"][0] == pytest.approx(9e-6) and st["bubble"][0] == pytest.approx(24e-6)
    assert st["other"][0] == pytest.approx(22e-6)
    assert out["step_s"] == pytest.approx(58e-6)

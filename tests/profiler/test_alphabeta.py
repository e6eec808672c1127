"""α–β fit: recovers a known latency and bandwidth from noisy synthetic collectives, refuses what
the data cannot support, and runs on real NCCL traces."""

from __future__ import annotations

import math
import re
import random

import polars as pl
import pytest

from profiler import load_traces
from profiler.alphabeta import FIT_COLUMNS, PREDICT_COLUMNS, alpha_beta_predict, fit_alpha_beta
from profiler.collectives import collectives
from tests.conftest import SHARED_TRACES
from tests.profiler.conftest import GPU_NCCL


def calls(rows: list[tuple[str, int, float]], *, run="r", group_size=4) -> pl.DataFrame:
    """profiler.collectives-like rows from (collective, size_bytes, dur_us), alternating ranks 0/1."""
    return pl.DataFrame(
        [{"run": run, "rank": i % 2, "step": 1, "seq": i, "collective": c, "group_size": group_size,
          "size_bytes": n, "dur_us": t} for i, (c, n, t) in enumerate(rows)],
        schema={"run": pl.Categorical, "rank": pl.Int32, "step": pl.Int64, "seq": pl.Int64, "collective": pl.String,
                "group_size": pl.Int64, "size_bytes": pl.Int64, "dur_us": pl.Float64},
    )


RANKS = pl.DataFrame({"run": ["r", "r"], "rank": [0, 1], "backend": ["nccl", "nccl"]},
                     schema={"run": pl.Categorical, "rank": pl.Int32, "backend": pl.String})


def test_recovers_alpha_and_beta_from_noisy_calls():
    alpha_us, beta_gbps = 30.0, 25.0  # 25 GB/s = 25e3 B/µs
    rng = random.Random(13)
    sizes = [64 * 1024 * k for k in range(1, 65)]  # 64 KiB .. 4 MiB: 32 .. 200 µs
    rows = [("all_reduce", n, alpha_us + n / (beta_gbps * 1e3) + rng.gauss(0, 1.0)) for n in sizes for _ in range(4)]
    fit = fit_alpha_beta(calls(rows), RANKS)
    assert fit.schema == pl.Schema(FIT_COLUMNS)
    row = fit.row(0, named=True)
    assert (row["backend"], row["n_calls"], row["n_sizes"], row["note"]) == ("nccl", 256, 64, None)
    assert row["alpha_us"] == pytest.approx(alpha_us, rel=0.05)
    assert row["beta_gbps"] == pytest.approx(beta_gbps, rel=0.05)
    assert row["r2"] > 0.99
    # nccl-tests busbw factor of an all-reduce over 4 ranks: 2(n-1)/n = 1.5.
    assert row["beta_busbw_gbps"] == pytest.approx(1.5 * row["beta_gbps"])


def test_two_sizes_give_a_line_but_no_r2():
    rows = [("broadcast", 1_000, 101.0), ("broadcast", 1_000, 99.0), ("broadcast", 9_000, 109.0)]
    row = fit_alpha_beta(calls(rows), RANKS).row(0, named=True)
    # the means (1000, 100) and (9000, 109): slope 9/8000 µs/B, α = 100 - 1000 * 9/8000
    assert row["alpha_us"] == pytest.approx(100 - 1000 * 9 / 8000) and row["r2"] is None
    assert "2 sizes" in row["note"] and "not trusted" in row["note"]


def test_a_scattered_fit_is_shown_but_flagged_not_trusted():
    # times 100 + n/1e3 µs plus waits of 0..2000 µs that have nothing to do with size: r² is low
    rng = random.Random(3)
    rows = [("all_reduce", n, 100 + n / 1e3 + rng.uniform(0, 2000)) for n in (1_000, 50_000, 100_000) for _ in range(6)]
    row = fit_alpha_beta(calls(rows), RANKS).row(0, named=True)
    assert row["beta_gbps"] is not None and row["r2"] < 0.8
    # r² is cut (not rounded) to 3 places: 0.7996 must never read "0.8 < 0.8"
    assert "not trusted" in row["note"] and f"r² {math.floor(row['r2'] * 1000) / 1000:.3f} < 0.8" in row["note"]
    # three decimals, never a float's long tail (0.17400000000000002)
    assert re.search(r"r² 0\.\d{3} < 0\.8:", row["note"])


def test_fastest_per_size_sees_through_waits_for_late_peers():
    alpha_us, beta_gbps = 20.0, 10.0
    rng = random.Random(7)
    sizes = [100_000 * k for k in range(1, 11)]  # 30 .. 120 µs
    rows = []
    for n in sizes:
        for _ in range(6):  # most calls wait for a late peer, up to 300 µs (more at the small sizes)
            wait = 0.0 if rng.random() < 0.3 else rng.uniform(0, 300) * (2 if n < 500_000 else 1)
            rows.append(("all_gather", n, alpha_us + n / (beta_gbps * 1e3) + wait + rng.gauss(0, 0.2)))
        rows.append(("all_gather", n, alpha_us + n / (beta_gbps * 1e3)))  # at least one undisturbed call
    c = calls(rows)
    fast = fit_alpha_beta(c, RANKS, fastest_per_size=True).row(0, named=True)
    assert fast["n_calls"] == 10
    assert fast["alpha_us"] == pytest.approx(alpha_us, rel=0.05) and fast["beta_gbps"] == pytest.approx(beta_gbps, rel=0.05)
    every = fit_alpha_beta(c, RANKS).row(0, named=True)
    assert every["note"] is not None or abs(every["beta_gbps"] / beta_gbps - 1) > 0.05  # the waits spoil the plain fit


def test_predicted_time_is_alpha_plus_n_over_beta():
    # Exact line: t = 10 + n / 1000 B/µs (β = 1 GB/s); one call 50 % slow.
    rows = [("all_gather", n, 10 + n / 1000) for n in (1000, 2000, 3000, 4000)] * 5
    c = calls(rows)
    fit = fit_alpha_beta(c, RANKS)
    assert fit["alpha_us"][0] == pytest.approx(10) and fit["beta_gbps"][0] == pytest.approx(1.0)
    slow = calls([("all_gather", 2000, 18.0)])  # predicted 12 µs
    p = alpha_beta_predict(slow, RANKS, fit)
    assert p.schema == pl.Schema(PREDICT_COLUMNS)
    r = p.row(0, named=True)
    assert r["predicted_us"] == pytest.approx(12.0) and r["time_ratio"] == pytest.approx(1.5)
    assert r["algbw_gbps"] == pytest.approx(2000 / 18 / 1000)
    assert r["bw_vs_beta"] == pytest.approx(2000 / 18 / 1000 / 1.0)


def test_refuses_a_single_size_a_falling_slope_and_a_negative_alpha():
    rows = ([("broadcast", 4096, t) for t in (5.0, 6.0, 7.0)]
            + [("all_to_all", n, 100 - n / 100) for n in (100, 200, 300)]
            + [("reduce_scatter", n, n / 10 - 50) for n in (1000, 2000, 3000)])
    fit = fit_alpha_beta(calls(rows), RANKS)
    notes = {r["collective"]: r for r in fit.iter_rows(named=True)}
    assert "fitting needs 2 sizes" in notes["broadcast"]["note"]
    assert "do not grow with size" in notes["all_to_all"]["note"]
    assert "α < 0" in notes["reduce_scatter"]["note"]
    assert fit["alpha_us"].is_null().all() and fit["beta_gbps"].is_null().all() and fit["r2"].is_null().all()
    assert alpha_beta_predict(calls(rows), RANKS, fit).is_empty()


def test_groups_are_separate_and_bad_rows_are_left_out():
    line = [(n, 5 + n / 2000) for n in (1000, 3000, 5000)]
    two = calls([("all_reduce", n, t) for n, t in line], group_size=2)
    eight = calls([("all_reduce", n, 2 * t) for n, t in line], group_size=8)
    bad = calls([("all_reduce", 7000, 0.0), ("all_reduce", 9000, float("nan")), ("barrier", 0, 3.0)], group_size=2)
    fit = fit_alpha_beta(pl.concat([two, eight, bad]), RANKS).sort("group_size")
    assert fit["group_size"].to_list() == [2, 8]
    assert fit["n_calls"].to_list() == [3, 3]  # zero / NaN durations and the barrier are not fitted
    assert fit["beta_gbps"].to_list() == pytest.approx([2.0, 1.0])
    assert fit["alpha_us"].to_list() == pytest.approx([5.0, 10.0])


def test_empty_input():
    assert fit_alpha_beta(calls([]), RANKS).schema == pl.Schema(FIT_COLUMNS)
    assert alpha_beta_predict(calls([]), RANKS, fit_alpha_beta(calls([]), RANKS)).is_empty()


@pytest.mark.parametrize("path", [GPU_NCCL, SHARED_TRACES / "single" / "nccl_args_rank0_of_2.json.gz",
                                  SHARED_TRACES / "single" / "v100_nccl_memory_rank1.json.gz"])
def test_real_nccl_traces(path):
    if not path.exists():
        pytest.skip(f"{path} not here")
    traces = load_traces(path)
    coll = collectives(traces.events, traces.ranks)
    fit = fit_alpha_beta(coll, traces.ranks)
    assert fit.height > 0 and set(fit["backend"]) == {"nccl"}
    if coll["size_bytes"].is_null().all():  # an older trace: timed, never sized
        assert (fit["note"] == "the trace gives no message sizes for these calls: no fit").all()
    good = fit.filter(pl.col("beta_gbps").is_not_null())
    # Every fit is physical or refused with a reason; never NaN or inf.
    assert (good["beta_gbps"] > 0).all() and (good["alpha_us"] >= 0).all()
    assert fit.filter(pl.col("beta_gbps").is_null())["note"].is_not_null().all()
    for c in ("alpha_us", "beta_gbps", "r2"):
        assert fit[c].drop_nulls().is_finite().all()
    pred = alpha_beta_predict(coll, traces.ranks, fit)
    assert pred["predicted_us"].drop_nulls().is_finite().all()

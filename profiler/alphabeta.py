"""The α–β (latency–bandwidth, Hockney) model of collectives: time = α + n/β, fitted by least squares.

n is the collective's nccl-tests "size" (profiler.collectives' size_bytes: the all-reduce buffer,
the all-gather output, the reduce-scatter input, the all-to-all buffer, the p2p message), so β is
an algorithm bandwidth in nccl-tests' sense (algbw = n / t for large n), in GB/s = 1e9 B/s; the
bus bandwidth it implies is β × nccl-tests' busbw factor (`beta_busbw_gbps`). α is the time of an
empty message, in µs. One fit per (run, backend, collective, group_size), over every call of that
kind in the run's profiled steps on all ranks. A call's duration is what the trace saw, waiting
for late peers included, so α and β describe the run, not the link. Formulas: docs/theory.md "α–β".
"""

from __future__ import annotations

import polars as pl

from profiler.collectives import BUSBW_FACTOR, GLOO_P2P_NOTE

# Per (run, backend, collective, group_size): the fit over that run's own collectives.
FIT_COLUMNS = {
    "run": pl.String, "backend": pl.String, "collective": pl.String, "group_size": pl.Int64, "n_calls": pl.Int64,
    "n_sizes": pl.Int64, "alpha_us": pl.Float64, "beta_gbps": pl.Float64, "r2": pl.Float64, "note": pl.String,
    "min_size_bytes": pl.Int64, "max_size_bytes": pl.Int64, "beta_busbw_gbps": pl.Float64,
}
# Per collective call with a fit: the model's time beside the measured one.
PREDICT_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "step": pl.Int64, "seq": pl.Int64, "backend": pl.String, "collective": pl.String,
    "group_size": pl.Int64, "size_bytes": pl.Int64, "dur_us": pl.Float64, "predicted_us": pl.Float64,
    "time_ratio": pl.Float64, "algbw_gbps": pl.Float64, "beta_gbps": pl.Float64, "bw_vs_beta": pl.Float64,
}
GROUP = ["run", "backend", "collective", "group_size"]
NO_PAYLOAD = ["barrier"]  # no bytes: nothing for β to describe
ONE_TO_ONE = ("send", "recv", "send_recv", "broadcast")  # busbw = algbw
# Below this r², sizes explain little of the times (waits, contention): the fit is shown, flagged.
TRUSTED_R2 = 0.8


def _timed(collectives: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Calls with a payload and a positive, finite duration, each with its rank's backend."""
    backend = ranks.select(pl.col("run").cast(pl.String), pl.col("rank").cast(pl.Int32), pl.col("backend").cast(pl.String)).unique(["run", "rank"])
    return (
        collectives.with_columns(pl.col("run").cast(pl.String), pl.col("rank").cast(pl.Int32))
        .filter(~pl.col("collective").is_in(NO_PAYLOAD) & pl.col("dur_us").is_not_null() & pl.col("dur_us").is_finite()
                & (pl.col("dur_us") > 0))
        .join(backend, on=["run", "rank"], how="left")
    )


def _usable(collectives: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Timed calls whose size is known."""
    return _timed(collectives, ranks).filter(pl.col("size_bytes").is_not_null() & (pl.col("size_bytes") >= 0))


def fit_alpha_beta(collectives: pl.DataFrame, ranks: pl.DataFrame, *, fastest_per_size: bool = False) -> pl.DataFrame:
    """FIT_COLUMNS from profiler.collectives rows (one per collective call).

    fastest_per_size: fit only the fastest call of each size (n_calls then counts those). A call
    that waited for a late peer is slower, never faster, than the collective itself, so the
    fastest of each size is the least disturbed: on a loaded host this turns a refused or
    scattered fit into a usable one.

    Ordinary least squares of dur_us on size_bytes: slope s = cov(n, t) / var(n) in µs/B,
    α = mean(t) − s·mean(n), β = 1/s B/µs = 1e-3/s GB/s, r² = corr(n, t)². Refused (α, β null,
    a note says why): fewer than 2 distinct sizes; s ≤ 0 (times do not grow with size, no finite
    positive β); α < 0 (the line crosses zero before n = 0: the sizes do not pin the latency).
    """
    timed = _timed(collectives, ranks)
    # Calls whose span is not the transfer (gloo's send and recv: post to wait): a row that says so, no fit.
    not_transfer = pl.col("note").eq_missing(GLOO_P2P_NOTE) if "note" in timed.columns else pl.lit(False)
    untimed, timed = timed.filter(not_transfer), timed.filter(~not_transfer)
    sizes = pl.col("size_bytes").drop_nulls().n_unique()
    # Counted as a fit counts its calls (the fastest of each size), as an unsized kind where no size is known.
    unfit = (untimed.group_by(GROUP).agg(n_calls=pl.when(sizes > 0).then(sizes).otherwise(pl.len()) if fastest_per_size
                                         else pl.len(), n_sizes=sizes)
             .with_columns(note=pl.lit("span = post to wait, not the transfer: no fit")))
    calls = timed.filter(pl.col("size_bytes").is_not_null() & (pl.col("size_bytes") >= 0))
    if fastest_per_size:
        # Sorted: the fit's sums run in a fixed order, so its last digits never vary between loads.
        calls = calls.group_by(*GROUP, "size_bytes").agg(pl.col("dur_us").min()).sort(*GROUP, "size_bytes", nulls_last=True)
    # Kinds the trace timed but never sized (older NCCL traces without args): a row that says so.
    unsized = (timed.group_by(GROUP).agg(n_calls=pl.len()).join(calls.select(GROUP).unique(), on=GROUP, how="anti", nulls_equal=True)
               .with_columns(n_sizes=pl.lit(0, pl.Int64), note=pl.lit("the trace gives no message sizes for these calls: no fit")))
    unsized = pl.concat([unsized, unfit.cast({"n_sizes": pl.Int64, "n_calls": unsized.schema["n_calls"]})], how="diagonal_relaxed")
    if calls.is_empty():
        return (pl.concat([pl.DataFrame(schema=FIT_COLUMNS), unsized], how="diagonal_relaxed").select(list(FIT_COLUMNS))
                .cast(FIT_COLUMNS).sort(GROUP, nulls_last=True))  # in one order every load, as below
    n, t = pl.col("size_bytes").cast(pl.Float64), pl.col("dur_us")
    fits = calls.group_by(GROUP).agg(
        n_calls=pl.len(), n_sizes=pl.col("size_bytes").n_unique(),
        min_size_bytes=pl.col("size_bytes").min(), max_size_bytes=pl.col("size_bytes").max(),
        # Centred sums: sizes reach 1e9 B, and Σn² − (Σn)²/k cancels catastrophically.
        slope=((n - n.mean()) * (t - t.mean())).sum() / ((n - n.mean()) ** 2).sum(),
        mean_n=n.mean(), mean_t=t.mean(),
        ss_tot=((t - t.mean()) ** 2).sum(), corr=pl.corr(n, t),
    )
    slope, alpha = pl.col("slope"), pl.col("mean_t") - pl.col("slope") * pl.col("mean_n")
    note = (
        pl.when(pl.col("n_sizes") < 2).then(pl.format("one size ({} B): fitting needs 2 sizes", "min_size_bytes"))
        .when(slope.is_null() | ~slope.is_finite() | (slope <= 0))
        .then(pl.lit("times do not grow with size (slope ≤ 0): no positive β"))
        .when(alpha < 0).then(pl.format("fitted α < 0 ({} µs): the sizes do not pin the latency", alpha.round(3)))
    )
    ok = note.is_null()
    out = fits.with_columns(note=note).with_columns(
        alpha_us=pl.when(ok).then(alpha),
        beta_gbps=pl.when(ok).then(1e-3 / slope),
        # Two sizes: the line passes through both means, r² is 1 whatever the data: no measure of fit.
        r2=pl.when(ok & pl.col("corr").is_finite() & (pl.col("n_sizes") > 2)).then(pl.col("corr") ** 2),
    ).with_columns(
        note=pl.when(ok & (pl.col("n_sizes") == 2))
        .then(pl.lit("2 sizes: the line passes through both, so nothing checks the fit (r² null); not trusted"))
        .otherwise(pl.col("note")),
    ).with_columns(
        note=pl.when(pl.col("r2") < TRUSTED_R2)
        # Cut (not rounded) to 3 decimals, written from whole thousandths: 0.174, never 0.17400000000000002.
        .then(pl.format("r² 0.{} < " + str(TRUSTED_R2) + ": sizes explain little of the times (waits, contention): "
                        "not trusted", (pl.col("r2") * 1000).floor().cast(pl.Int64).cast(pl.String).str.zfill(3)))
        .otherwise(pl.col("note")),
    )
    # nccl-tests' busbw factor of each fit (a handful of rows); p2p and broadcast move n once.
    busbw = [
        BUSBW_FACTOR[k](g) if k in BUSBW_FACTOR and g else 1.0 if k in ONE_TO_ONE else None
        for k, g in out.select("collective", "group_size").iter_rows()
    ]
    out = out.with_columns(bus_factor=pl.Series(busbw, dtype=pl.Float64)).with_columns(
        beta_busbw_gbps=pl.col("beta_gbps") * pl.col("bus_factor"))
    out = pl.concat([out.select(list(FIT_COLUMNS)).cast(FIT_COLUMNS), unsized], how="diagonal_relaxed")
    return out.select(list(FIT_COLUMNS)).cast(FIT_COLUMNS).sort(GROUP, nulls_last=True)


def alpha_beta_predict(collectives: pl.DataFrame, ranks: pl.DataFrame, fits: pl.DataFrame) -> pl.DataFrame:
    """PREDICT_COLUMNS: each call's α + n/β beside its measured time. time_ratio = measured /
    predicted (> 1: slower than the run's own fit); bw_vs_beta = achieved algbw (n / t) / β.
    Calls of a refused fit (null α or β) are left out."""
    good = fits.filter(pl.col("alpha_us").is_not_null() & pl.col("beta_gbps").is_not_null()).select(
        *GROUP, "alpha_us", "beta_gbps").cast({"run": pl.String})
    calls = _usable(collectives, ranks)
    if calls.is_empty() or good.is_empty():
        return pl.DataFrame(schema=PREDICT_COLUMNS)
    # β GB/s = 1e3 B/µs · β: n / (β · 1e3) µs.
    predicted = pl.col("alpha_us") + pl.col("size_bytes") / (pl.col("beta_gbps") * 1e3)
    return (
        calls.join(good, on=GROUP, how="inner", nulls_equal=True)
        .with_columns(predicted_us=predicted, algbw_gbps=pl.col("size_bytes") / pl.col("dur_us") * 1e-3)
        .with_columns(
            time_ratio=pl.when(pl.col("predicted_us") > 0).then(pl.col("dur_us") / pl.col("predicted_us")),
            bw_vs_beta=pl.col("algbw_gbps") / pl.col("beta_gbps"),
        )
        .select(list(PREDICT_COLUMNS)).cast(PREDICT_COLUMNS).sort("run", "rank", "step", "seq")
    )

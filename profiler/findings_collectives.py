"""The findings rules about collectives across ranks: stragglers and skew, communication volume
against the paradigm's formula, achieved bandwidth against the fitted β (docs/findings.md). Split
from findings.py at its seams; findings.RULES lists them with the others."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from profiler.discover import manifest_field
from profiler.findings_base import (ALPHA_MIN_SHARE_PCT, FIT_MIN_R2, LATENCY_MAX_BW_FRACTION, LATENCY_MIN_PCT, SKEW_MIN_PCT,
                                    STRAGGLER_MIN_SHARE_PCT, STRAGGLER_MIN_TIMES, VOLUME_MIN_PCT, Row, _finite, _row, _step_us,
                                    _str_run, routed_received)
from profiler.findings_text import bytes_text, ms, num, pct, steps_text
from profiler.intervals import union
from profiler.textfmt import fmt_r2

if TYPE_CHECKING:
    from profiler.report import Analysis

# ---------------------------------------------------------------------------------------------
# 4. Stragglers and skew


def straggler_rule(a: "Analysis") -> list[Row]:
    """The time ranks wait for the last to start each collective, and the rank that is last most often."""
    skew, strag = _str_run(a.skew), _str_run(a.stragglers)
    if skew is None or skew.is_empty():
        return []
    windows = _str_run(a.breakdown)
    out = []
    for run in skew["run"].unique(maintain_order=True).to_list():
        steps = _str_run(a.breakdown_steps)
        steps = steps.filter(pl.col("run") == run) if steps is not None else None
        # The k-th collective of two ranks is the same one only within a known group (module collectives).
        rs = skew.filter((pl.col("run") == run) & pl.col("spread_us").is_finite() & pl.col("group").is_not_null())
        win = windows.filter((pl.col("run") == run) & (pl.col("window_us") > 0))["window_us"].mean()
        if rs.is_empty() or not _finite(win):
            continue
        # Per group (different groups' collectives may run at once): the time some rank of the group
        # waits for a later one, the union of [first start, last start) over its collectives (a sum
        # would count concurrent collectives twice).
        waits = union(rs.select("group", start_us="first_start_us", end_us=pl.col("first_start_us") + pl.col("spread_us")), ["group"])
        by_group = (waits.group_by("group").agg(wait_us=(pl.col("end_us") - pl.col("start_us")).sum())
                    .join(rs.group_by("group").agg(n=pl.len(), spread_us=pl.col("spread_us").sum()), on="group")
                    .sort("wait_us", descending=True))
        group, wait, n, spread = by_group.row(0)
        share = 100 * wait / win
        if share < SKEW_MIN_PCT:
            continue
        worst = rs.filter(pl.col("group") == group).sort("spread_us", descending=True).row(0, named=True)
        named = strag.filter((pl.col("run") == run) & (pl.col("group") == group)
                             & (pl.col("share_pct") >= STRAGGLER_MIN_SHARE_PCT) & (pl.col("times_last") >= STRAGGLER_MIN_TIMES))
        # wait is a total over the profiled steps, against the rank's window over the same steps
        step_list = steps["step"].unique().to_list() if steps is not None else []
        text = (f"Ranks of group {group} start their collectives {ms(spread / n)} apart on average: "
                f"over {steps_text(step_list)}, for {ms(wait)} in all at least one rank is waiting for a later one "
                f"(not always the same rank), {pct(share)} of the profiled window")
        evidence = (f"run {run}, group {group}, {n:,} collectives; the widest: {worst['collective']} #{worst['seq']}, "
                    f"{ms(worst['spread_us'])}, last rank {worst['last_rank']}")
        if named.height:
            rank, times, share_last = named.select("rank", "times_last", "share_pct").row(0)
            text += f"; rank {rank} is the last to start in {pct(share_last)} of them ({times:,} of {n:,})"
            change = (f"look at what rank {rank} does before its collectives that the others do not (data loading, "
                      "logging or checkpointing on that rank, a slower device or a busy host); give it less work")
            if manifest_field((getattr(a, "runs", None) or {}).get(run), "paradigm") == "ep":
                # Expert parallelism: a rank's expert work is the tokens routed to it, which the
                # all-to-all's sizes show (theory's "routing of step N: pairs sent, received"; a trial's
                # straggler received 294 pairs against 250 sent and was told to look at data loading).
                got = routed_received(a, run, step_list)
                others = [v for r, v in got.items() if r != rank]
                routed = (f" (rank {rank}'s experts received {got[rank]:,.0f} routed pairs a step, the others' "
                          f"{sum(others) / len(others):,.0f}: Predicted communication, the ep all-to-all's routing)"
                          if rank in got and others else "")
                change = (f"in expert parallelism the last rank is often the one whose experts got the most tokens"
                          f"{routed}; balance the routing (an auxiliary load-balancing loss, a capacity factor that drops "
                          "the overflow), and failing that, " + change)
        else:
            rank = None
            top = strag.filter((pl.col("run") == run) & (pl.col("group") == group)).sort("share_pct", descending=True)
            if top.height and top["share_pct"][0] >= STRAGGLER_MIN_SHARE_PCT:
                # Consistent, but over fewer collectives than a straggler verdict needs: said as it is.
                r, times = top.select("rank", "times_last").row(0)
                text += (f"; rank {r} is the last to start in {times:,} of {n:,}, too few collectives "
                         f"(< {STRAGGLER_MIN_TIMES}) to call it a straggler")
            else:
                text += "; no one rank is last consistently"
            change = ("even out the work between collectives: equal batch shapes on every rank (pad or bucket variable "
                      "sequence lengths), no rank-0-only work in the step, no CPU contention from other processes")
        out.append(_row("straggler", run, rank, share, text + ".", evidence, change))
    return out


# ---------------------------------------------------------------------------------------------
# 5. Communication volume against the paradigm's formula


MEMORY_QUANTITY_RE = r"(?i)param|grad|optim|memory|persistent"


def comm_volume_rule(a: "Analysis") -> list[Row]:
    """Measured communication bytes per step that differ from the paradigm's textbook formula."""
    c = _str_run(a.theory_check)
    if c is None or c.is_empty():
        return []
    c = c.filter(pl.col("verdict").is_in(["above", "below"]) & ~pl.col("quantity").str.contains(MEMORY_QUANTITY_RE)
                 & pl.col("ratio").is_finite() & (pl.col("ratio") > 0) & pl.col("predicted").is_finite() & pl.col("measured").is_finite())
    b = _str_run(a.breakdown)
    out = []
    for run in c["run"].unique(maintain_order=True).to_list():
        rc = c.filter(pl.col("run") == run).with_columns(_off=(pl.col("ratio").log()).abs()).sort("_off", descending=True)
        n_checked = a.theory_check.filter((pl.col("run").cast(pl.String) == run)
                                         & ~pl.col("quantity").str.contains(MEMORY_QUANTITY_RE)
                                         & pl.col("verdict").is_in(["match", "above", "below"])).height
        row = rc.row(0, named=True)
        rb = b.filter((pl.col("run") == run) & (pl.col("window_us") > 0))
        if row["rank"] is not None and rb.filter(pl.col("rank") == row["rank"]).height:
            rb = rb.filter(pl.col("rank") == row["rank"])
        comm_share = (100 * rb["comm_us"].sum() / rb["window_us"].sum()) if rb.height else None
        if not _finite(comm_share):
            continue
        m, p = row["measured"], row["predicted"]
        # If time goes with bytes, the mismatch accounts for this much of the step.
        score = comm_share * abs(m - p) / max(abs(m), abs(p))
        if score < VOLUME_MIN_PCT:
            continue
        unit = row["unit"] or ""
        fmt = bytes_text if "byte" in unit.lower() else (lambda v: f"{num(v)} {unit}".strip())
        where = f"on rank {row['rank']}" if row["rank"] is not None else "per rank"
        text = (f"{row['quantity']} {where} is {fmt(m)}, {num(row['ratio'])}× the textbook {fmt(p)}"
                f" ({rc.height:,} of {n_checked:,} communication quantities differ; communication is {pct(comm_share)} of the step)")
        evidence = f"run {run}, quantity {row['quantity']}" + (f", rank {row['rank']}" if row["rank"] is not None else "") + (
            f"; {row['note']}" if row["note"] else "")
        change = ("find the traffic the formula does not count (an extra parameter broadcast, unfused or padded buckets, "
                  "a second all-gather from recomputation) and remove it" if row["verdict"] == "above" else
                  "check that every gradient is synchronised (frozen or unused parameters, a no_sync left on) before "
                  "trusting the speed")
        out.append(_row("comm-volume", run, row["rank"], score, text + ".", evidence, change))
    return out


# ---------------------------------------------------------------------------------------------
# 6. Achieved bandwidth against the fitted β


def _count(x: float) -> str:
    """A mean count to 3 significant digits, whole ones with thousands separators: 4, 1,200, 2.67."""
    v = float(f"{x:.3g}")
    return f"{v:,.0f}" if v == int(v) else f"{v:g}"


def bandwidth_rule(a: "Analysis") -> list[Row]:
    """Collectives far below their fitted β: latency-bound where α is most of the fitted time, else waiting."""
    fits = _str_run(a.alpha_beta)
    calls = _str_run(getattr(a, "alpha_beta_calls", None))
    steps = _step_us(a)
    if fits is None or fits.is_empty() or calls is None or calls.is_empty():
        return []
    keys = ["run", "backend", "collective", "group_size"]
    fits = fits.filter(pl.col("alpha_us").is_finite() & (pl.col("alpha_us") > 0) & pl.col("beta_gbps").is_finite()
                       & (pl.col("beta_gbps") > 0) & (pl.col("r2") >= FIT_MIN_R2))
    # β comes from the fastest call of each size (docs/theory.md "α–β"); every call of the profiled
    # steps is measured against it, waits included. Calls outside a step (null step) are left out.
    calls = calls.filter(pl.col("step").is_not_null() & (pl.col("dur_us") > 0) & pl.col("dur_us").is_finite()
                         & (pl.col("predicted_us") > 0) & pl.col("predicted_us").is_finite() & pl.col("size_bytes").is_not_null())
    by = (calls.join(fits.select(*keys, "alpha_us", "beta_gbps", "r2", "n_calls", "n_sizes"), on=keys, how="inner", nulls_equal=True)
          .group_by(keys).agg(pl.len().alias("calls"), pl.col("dur_us", "predicted_us", "size_bytes").sum(),
                              pl.col("size_bytes").quantile(0.5, interpolation="lower").alias("median_bytes"),
                              excess_us=(pl.col("dur_us") - pl.col("predicted_us")).clip(lower_bound=0).sum(),
                              *(pl.col(c).first() for c in ("alpha_us", "beta_gbps", "r2", "n_calls", "n_sizes")))
          .with_columns(achieved_gbps=pl.col("size_bytes") / pl.col("dur_us") / 1e3,
                        alpha_pct=100 * pl.col("calls") * pl.col("alpha_us") / pl.col("predicted_us")))
    bsteps = _str_run(a.breakdown_steps)
    out = []
    for run in by["run"].unique(maintain_order=True).to_list():
        n_steps = bsteps.filter(pl.col("run") == run).height if bsteps is not None else 0  # (rank, step) pairs
        if run not in steps or not n_steps:
            continue
        best = None
        for f in by.filter(pl.col("run") == run).sort(keys).iter_rows(named=True):
            if f["achieved_gbps"] > LATENCY_MAX_BW_FRACTION * f["beta_gbps"]:
                continue
            latency = f["alpha_pct"] >= ALPHA_MIN_SHARE_PCT
            # the time at stake per (rank, step), against the mean step: calls × α, or the time beyond α + n/β
            at_stake_us = f["calls"] * f["alpha_us"] if latency else f["excess_us"]
            score = 100 * (at_stake_us / n_steps) / steps[run]
            if _finite(score) and score >= LATENCY_MIN_PCT and (best is None or score > best[0]):
                best = (score, latency, f)
        if best is None:
            continue
        score, latency, f = best
        # a group the trace does not size (gloo records no collective args): said, never "None ranks"
        group = f"{f['group_size']} ranks" if f["group_size"] is not None else "a group of unknown size"
        text = (f"{f['collective']} on {group} reaches {num(f['achieved_gbps'])} GB/s over its {f['calls']:,} calls (all ranks), "
                f"{pct(100 * f['achieved_gbps'] / f['beta_gbps'])} of its fitted β {num(f['beta_gbps'])} GB/s")
        if latency:
            text += (f": the per-call latency α = {ms(f['alpha_us'])} is {pct(f['alpha_pct'])} of the time α + n/β predicts "
                     f"for them (median message {bytes_text(f['median_bytes'])}); {_count(f['calls'] / n_steps)} calls a step on "
                     f"each rank, on average, × α are {ms(f['calls'] * f['alpha_us'] / n_steps)}, {pct(score)} of its step")
            change = ("send fewer, larger messages: " + (
                "bigger buckets (DDP bucket_cap_mb), larger FSDP units, coalesced collectives"
                if f["collective"] in ("all_reduce", "reduce_scatter", "all_gather")
                else "batch several calls into one (a layer's or microbatches' exchanges together)") + "; each call pays α once")
        else:
            text += (f", while α + n/β predicts {ms(f['predicted_us'])} for them and they take {ms(f['dur_us'])} "
                     f"({num(f['dur_us'] / f['predicted_us'])}×); α is only {pct(f['alpha_pct'])} of the prediction, so the gap "
                     f"is waiting (for a later rank, or for a link shared with other traffic), not latency: "
                     f"{ms(f['excess_us'])} beyond the fit over all ranks and steps, {pct(score)} of each rank's step, on average")
            change = ("find what the calls wait for: a rank that starts them late (see the straggler finding) or other "
                      "traffic on the same link (concurrent collectives, a shared NIC); overlap them with compute to hide the wait")
        size = f["group_size"] if f["group_size"] is not None else "unknown (not in the trace)"
        evidence = (f"run {run}, {f['backend']} {f['collective']}, group size {size}: {f['calls']:,} calls in the "
                    f"profiled steps; fit (fastest call of each size) over {f['n_calls']:,} calls of {f['n_sizes']:,} sizes, "
                    f"R² {fmt_r2(f['r2'])}")  # cut to 3 decimals, as the Latency and bandwidth table and the fit's note
        out.append(_row("bandwidth", run, None, score, text + ".", evidence, change))
    return out

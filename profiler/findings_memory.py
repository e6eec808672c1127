"""Findings on memory (docs/findings.md, rules 3 and 7): the persistent state against the other
ZeRO layouts, and the activation share of the memory peak. Split from profiler.findings, which runs them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from profiler.findings_base import ACTIVATION_MIN_PCT, MEMORY_SAVING_MIN_PCT, Row, _row, _str_run
from profiler.findings_text import bytes_text, pct, switch_change
from profiler.theory_memory import ACTIVATION_COLUMNS
from profiler.theory_recompute import recompute_on

if TYPE_CHECKING:
    from profiler.report import Analysis


# ---------------------------------------------------------------------------------------------
# 3. Persistent memory and the next ZeRO stage


SMALL_STATE_BYTES = 1 << 30  # below 1 GiB a rank (persistent state and measured peak), no device is short of memory
COMPONENTS = {"params_bytes": "parameters", "grads_bytes": "gradients", "optimizer_bytes": "optimizer state"}
SUBJECT = {"params_bytes": "Parameters are", "grads_bytes": "Gradients are", "optimizer_bytes": "Optimizer state is"}


def persistent_memory_rule(a: "Analysis") -> list[Row]:
    """The largest persistent component, and what the next ZeRO stage and the smallest layout would hold instead."""
    w = _str_run(a.memory_whatif)
    if w is None or w.is_empty():
        return []
    measured = _str_run(a.persistent_memory)
    predicted = _str_run(a.theory_memory)
    out = []
    for run in w["run"].unique(maintain_order=True).to_list():
        rw = w.filter((pl.col("run") == run) & pl.col("total_bytes").is_not_null())  # the ZeRO order
        cur = rw.with_row_index("_i").filter(pl.col("current"))
        if cur.is_empty() or not cur["total_bytes"][0]:
            continue
        cur_i, cur_layout, cur_total = cur.select("_i", "layout", "total_bytes").row(0)
        after = rw.slice(cur_i + 1)
        smaller = rw.filter(pl.col("total_bytes") < cur_total)
        if after.is_empty() or smaller.is_empty():
            continue
        # The threshold is on the largest saving among the layouts: under FSDP2 the next stage
        # (ZeRO-2) may save almost nothing while FSDP saves a third.
        best_layout, best_total = smaller.sort("total_bytes", maintain_order=True).select("layout", "total_bytes").row(0)
        nxt_layout, nxt_total, nxt_params = after.select("layout", "total_bytes", "params_bytes").row(0)
        saving, nxt_saving = (100 * (cur_total - t) / cur_total for t in (best_total, nxt_total))
        if saving < MEMORY_SAVING_MIN_PCT:
            continue
        source, rank, comp, comp_bytes, total = (_largest_component(measured, run, "run.json")
                                                 or _largest_component(predicted, run, "theory") or (None,) * 5)
        if comp is not None:
            text = (f"{SUBJECT[comp]} the largest persistent memory on rank {rank}: "
                    f"{bytes_text(comp_bytes)} of {bytes_text(total)} ({pct(100 * comp_bytes / total)}, {source})")
        else:
            text = f"Each rank holds {bytes_text(cur_total)} of parameters, gradients and optimizer state ({cur_layout})"
        sign = "−" if nxt_saving >= 0 else "+"
        text += f"; {nxt_layout}, the next stage, would hold {bytes_text(nxt_total)} per rank ({sign}{pct(abs(nxt_saving))})"
        if best_layout != nxt_layout:
            text += f", {best_layout}, the smallest, {bytes_text(best_total)} (−{pct(saving)})"
        # torch's ZeRO-2 (FSDP2 reshard_after_forward=False) keeps the gathered parameters beside
        # the shard while training: more than the textbook ZeRO-2's one replica (the current
        # layout's parameters when it replicates them: ddp, zero1).
        replica = rw.filter(pl.col("layout").is_in(["ddp", "zero1"]))["params_bytes"].drop_nulls()
        if "zero2" in str(nxt_layout) and replica.len() and nxt_params is not None and nxt_params > replica.max():
            text += (f"; torch's ZeRO-2 (FSDP2 reshard_after_forward=False) holds {bytes_text(nxt_params)} of parameters while "
                     f"training, more than the textbook ZeRO-2's one replica ({bytes_text(replica.max())}): it keeps the "
                     "gathered parameters beside its shard")
        dp = cur["dp"][0]
        evidence = f"run {run}, layout {cur_layout}" + (f" at data-parallel degree {dp}" if dp else "") + "; per rank: " + ", ".join(
            f"{lay} {bytes_text(t)}" for lay, t in rw.select("layout", "total_bytes").iter_rows())
        change = (switch_change(nxt_layout, cur_layout) if nxt_saving >= MEMORY_SAVING_MIN_PCT
                  else switch_change(best_layout, cur_layout))
        if nxt_saving >= MEMORY_SAVING_MIN_PCT and best_layout != nxt_layout:
            change += f"; for the most memory, {switch_change(best_layout, cur_layout)}"
        # A test-sized model: the shares hold at any size, the bytes matter nowhere. The measured
        # peak too, where there is one: activations of a long sequence can fill a device that the
        # state leaves empty.
        peaks = _str_run(getattr(a, "memory_peaks", None))
        peak = (peaks.filter(pl.col("run") == run)["peak_allocated_bytes"].max()
                if peaks is not None and "peak_allocated_bytes" in peaks.columns else None)
        if max(cur_total, peak or 0) < SMALL_STATE_BYTES:
            text += (f"; at {bytes_text(cur_total)} a rank, memory limits nothing here: the shares carry to a larger "
                     "model of this layout, where they decide what fits")
            change = "if memory limits the model or the batch: " + change
        # Scored by the saving of the layout the change names first (the next stage when it saves
        # enough, else the smallest): what the first thing to try is worth.
        score = nxt_saving if nxt_saving >= MEMORY_SAVING_MIN_PCT else saving
        out.append(_row("persistent-memory", run, rank, score, text + ".", evidence, change))
    return out


def _largest_component(frame: pl.DataFrame | None, run: str, source: str) -> tuple | None:
    """(source, rank, component column, its bytes, the rank's total) of the rank with the largest total."""
    if frame is None or frame.is_empty() or not set(COMPONENTS) <= set(frame.columns):
        return None
    f = frame.filter((pl.col("run") == run) & pl.all_horizontal(pl.col(list(COMPONENTS)).is_not_null()))
    f = f.with_columns(_total=pl.sum_horizontal(list(COMPONENTS))).filter(pl.col("_total") > 0).sort("_total", descending=True)
    if f.is_empty():
        return None
    row = f.row(0, named=True)
    comp = max(COMPONENTS, key=lambda c: row[c])
    return source, row["rank"], comp, row[comp], row["_total"]


# ---------------------------------------------------------------------------------------------
# 7. The activation share of the memory peak


def activation_memory_rule(a: "Analysis") -> list[Row]:
    """What the memory peak holds beyond persistent state (Analysis.activation): activations and temporaries."""
    j = _activation_shares(a)
    out = []
    for run in j["run"].unique(maintain_order=True).to_list():
        row = j.filter(pl.col("run") == run).sort("activation_pct", descending=True).row(0, named=True)
        if row["activation_pct"] < ACTIVATION_MIN_PCT:
            continue
        held = ("parameters, gradients, optimizer state and stashed weights" if "stashed weights" in (row["basis"] or "")
                else "parameters, gradients and optimizer state")  # pipedream's stashes are persistent there
        text = (f"Activations and temporaries are {pct(row['activation_pct'])} of rank {row['rank']}'s memory at its peak "
                f"({bytes_text(row['activation_bytes'])} of {bytes_text(row['footprint_bytes'])} on {row['mem_device']}; "
                f"{held} hold {bytes_text(row['persistent_bytes'])}"
                + (f"; {bytes_text(row['other_bytes'])} more is held all step besides them: workspaces, the batch"
                   if row.get("other_bytes") else "") + ")")
        evidence = f"run {run}, rank {row['rank']}, {row['mem_device']}" + (f"; {row['basis']}" if row.get("basis") else "")
        if recompute_on((getattr(a, "runs", None) or {}).get(run) or {}):
            # Already checkpointed: what is left is block inputs, one block's activations, the head and loss.
            text += "; activation checkpointing is on (--recompute)"
            change = ("use smaller microbatches, or sequence / tensor parallelism to split what recomputation "
                      "leaves (each block's input, one block's activations during its backward, the logits)")
        else:
            change = ("recompute activations in backward (activation checkpointing: about +33 % compute, one more "
                      "forward), use smaller microbatches, or sequence parallelism to split the remaining activations")
        out.append(_row("activation-memory", run, row["rank"], row["activation_pct"], text + ".", evidence, change))
    return out


def _activation_shares(a: "Analysis") -> pl.DataFrame:
    """Analysis.activation (ACTIVATION_COLUMNS) rows with a share to speak of."""
    act = _str_run(getattr(a, "activation", None))
    if act is None or act.is_empty():
        return pl.DataFrame(schema=ACTIVATION_COLUMNS)
    return act.filter(pl.col("activation_pct").is_finite() & (pl.col("activation_bytes") > 0) & (pl.col("footprint_bytes") > 0)
                      & pl.col("persistent_bytes").is_not_null())

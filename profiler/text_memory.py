"""The memory sections of the text report (profiler.text): peaks timed from their step, a sparkline
per rank, persistent memory, what each ZeRO layout would hold, and the activations at the peak."""

from __future__ import annotations

import polars as pl

from profiler.errors import printable
from profiler.theory_memory import state_on_host
from profiler.textfmt import (
    MMM, NONE, WIDTH, collapse, collapsed_table, fmt_bytes, fmt_pct, fmt_since, min_median_max, more, per_run,
    sparkline, strings, table, title, truncate, wrap, _number,
)

SPARK_RANKS = 16  # sparkline lines per run unless full


def memory_sections(a, runs: list[str], full: bool) -> list[str]:
    """Memory peaks (timed from their step), sparklines over time, persistent memory, the ZeRO
    what-if and the activation share of the peak; [] without memory data."""
    out = []
    peaks = a.memory_peaks
    if not peaks.is_empty():
        out.append(title("Memory peaks", "the most allocated at once ([memory] events), and when"))
        if (peaks["mem_device"] == "cpu").any():  # torch's CPU [memory] events start with the profiler
            out.append("  (cpu: only allocations made while profiling ran, not host memory held from before)")
        if peaks["peak_allocated_bytes"].is_null().any():  # torch 1.8's [memory] events: Bytes alone
            out.append("  (—: [memory] events with each allocation's Bytes but no Total Allocated, as older torch (1.8)\n"
                       "   writes them: no allocated level to take a peak or a curve from)")
        at = _since_step(strings(peaks), a.steps, "peak_ts_us", "peak_step")
        if full:
            header = ["rank", "device", "peak allocated", "peak reserved", "when"]
            rows = lambda p: [[str(r["rank"]), r["mem_device"], fmt_bytes(r["peak_allocated_bytes"]),  # noqa: E731
                               fmt_bytes(r["peak_reserved_bytes"]), r["when"]] for r in p.sort("rank", "mem_device").to_dicts()]
            out += per_run(runs, at, lambda p: table(header, rows(p), "lrrrl", shrink=None))
        else:
            ranks_of = dict(strings(a.ranks).group_by("run").agg(pl.col("rank").n_unique()).iter_rows())

            def render(p: pl.DataFrame) -> list[str]:
                rows, lone, agreed = [], p["rank"].n_unique() == 1, []
                for (dev,), g in p.group_by("mem_device", maintain_order=True):
                    c = collapse(g, ["peak_allocated_bytes"])
                    if c.is_empty():  # events without Total Allocated: no peak to name
                        rows.append([dev, NONE, *([] if lone else ["", ""]), NONE])
                        continue
                    c = c.row(0, named=True)
                    when = g.filter(pl.col("rank") == c["max_rank"])["when"][0]
                    cells = min_median_max(c, fmt_bytes)
                    rows.append([dev, *cells[:1 if lone else 3], when])
                    agreed.append((dev, fmt_bytes(c["min"]), c["n"], f"{when} (rank {c['max_rank']})")
                    if cells[1:] == ["", ""] and c["n"] > 1 else None)
                if not lone and len(agreed) == len(rows) and None not in agreed and len({a[2] for a in agreed}) == 1:
                    # Every rank's peak the same on every device: said once in the header (as
                    # collapsed_table does), not under "min" beside empty median and max columns;
                    # "n of m ranks" where the run's other ranks recorded no [memory] event.
                    n, of = agreed[0][2], ranks_of.get(p["run"][0], 0)
                    who = f"every rank ({n})" if n >= of else f"{n} of {of} ranks"
                    return table(["device", f"peak, {who}", "reached at"],
                                 [[dev, v, when] for dev, v, _, when in agreed], "lrl", shrink=None)
                header = ["device", *(["peak"] if lone else MMM), "reached at" if lone else "max reached at"]
                return table(header, rows, "lrrrl" if not lone else "lrl", shrink=None)
            out += per_run(runs, at.sort("run", "mem_device", "rank"), render)
    curve = a.memory_curve
    if curve is not None and not curve.is_empty():
        out.append(title("Memory over time", "allocated bytes per rank over the recorded span, ▁ low to █ high"))
        out.append("  (one scale per run and device: ▁ its lowest level, █ its highest)")
        out += per_run(runs, strings(curve), lambda p: _sparklines(p, full))
    persistent = a.persistent_memory
    if not persistent.is_empty():
        labels = {"params_bytes": "parameters", "params_at_rest_bytes": "parameters at rest", "grads_bytes": "gradients",
                  "optimizer_bytes": "optimizer state", "max_memory_allocated_bytes": "max allocated (torch)"}
        if "stashed_params_bytes" in persistent.columns and persistent["stashed_params_bytes"].is_not_null().any():
            labels["stashed_params_bytes"] = "stashed weights (pipedream)"
        out.append(title("Persistent memory", "what each rank holds through the step (run.json)"))
        out += [printable(f"  (run {run}: in host memory, fsdp --offload; the GPU holds none of it between uses)")
                for run in runs if state_on_host(a.runs.get(run))]
        if full:
            header = ["rank", "params", "at rest", "grads", "optimizer", "max allocated", "stashed"][: len(labels) + 1]
            out += per_run(runs, strings(persistent), lambda p: table(header, [
                [str(r["rank"]), *[fmt_bytes(r[c]) for c in labels]] for r in p.sort("rank").to_dicts()], "r" * len(header),
                shrink=None))
        else:
            stats = collapse(strings(persistent), list(labels))
            out += per_run(runs, stats, lambda p: collapsed_table(p, labels, fmt_bytes))
    whatif = a.memory_whatif
    # A data-parallel degree of 1 (pipelines, tp): every ZeRO stage holds the same, nothing to show.
    whatif = whatif.filter(pl.col("dp") > 1) if whatif is not None and not whatif.is_empty() else whatif
    if whatif is not None and not whatif.is_empty():
        out.append(title("Memory by layout", "what every rank would hold under each ZeRO stage (theory)"))
        header = ["layout", "dp", "params", "grads", "optimizer", "total", "vs this run"]
        out += per_run(runs, whatif, lambda p: table(header, [
            [r["layout"] or NONE, str(r["dp"]), fmt_bytes(r["params_bytes"]), fmt_bytes(r["grads_bytes"]),
             fmt_bytes(r["optimizer_bytes"]), fmt_bytes(r["total_bytes"]), _saved(r)]
            for r in p.to_dicts()], "lrrrrrl", shrink=(6, 0)))
        if (whatif["layout"] == "zero2").any():
            # zero2 beside zero1 held more parameters and saved only on gradients, unexplained (trial)
            out += wrap("(zero2 is torch's: fully_shard(reshard_after_forward=False) keeps the gathered parameters (Φ) "
                        "beside their shards (Φ/N) from forward to backward, so it holds more parameters than zero1 and "
                        "saves on gradients only; DeepSpeed's stage 2 keeps the parameters once, the textbook's 2 + 14/N "
                        "bytes a parameter in mixed precision)", "  ", "   ")
    return out + _activation(a, runs, full)


def _saved(r: dict) -> str:
    # WHATIF_COLUMNS' saved_bytes: the run's total minus this layout's (negative: it costs more).
    if r.get("current"):
        return "◀ this run"
    saved = _number(r.get("saved_bytes"))
    text = NONE if saved is None else f"saves {fmt_bytes(saved)}" if saved >= 0 else f"costs {fmt_bytes(-saved)} more"
    return f"{text}; {r['note']}" if r.get("note") else text


def _activation(a, runs: list[str], full: bool) -> list[str]:
    act = getattr(a, "activation", None)
    if act is None or act.is_empty() or act["activation_bytes"].is_null().all():
        return []
    # "memory held all step" only where a device's is subtracted (a CPU counter sees none of it).
    all_step = " and memory held all step" if act["other_bytes"].is_not_null().any() else ""
    out = [title("Activations at the peak", f"the peak beyond params, grads, optimizer{all_step}")]
    act = strings(act)
    if full:
        header = ["rank", "device", "peak", "persistent", "other", "footprint", "activations", "share"]
        return out + per_run(runs, act, lambda p: table(header, [
            [str(r["rank"]), r["mem_device"], fmt_bytes(r["peak_allocated_bytes"]), fmt_bytes(r["persistent_bytes"]),
             fmt_bytes(r["other_bytes"]), fmt_bytes(r["footprint_bytes"]), fmt_bytes(r["activation_bytes"]),
             fmt_pct(r["activation_pct"])]
            for r in p.sort("rank", "mem_device").to_dicts()], "rlrrrrrr", shrink=1))

    def render(p: pl.DataFrame) -> list[str]:
        lines = []
        for (dev,), g in p.group_by("mem_device", maintain_order=True):
            # A device's other memory (held all step besides the model's state: workspaces, the batch).
            # The share is of the footprint at the peak, shown beside it: on a CPU counter that is the
            # peak plus the state allocated before profiling began, which the counter never saw.
            cols = (["activation_bytes", "footprint_bytes", "activation_pct"]
                    + (["other_bytes"] if g["other_bytes"].is_not_null().any() else []))
            stats = collapse(g, cols)
            lines += collapsed_table(stats, {"activation_bytes": f"{dev or NONE} activations",
                                             "footprint_bytes": f"{dev or NONE} footprint at the peak",
                                             "activation_pct": f"{dev or NONE} activations' share of it",
                                             "other_bytes": f"{dev or NONE} other, held all step"},
                                     {"activation_bytes": fmt_bytes, "footprint_bytes": fmt_bytes, "activation_pct": fmt_pct,
                                      "other_bytes": fmt_bytes})
        return lines

    return out + per_run(runs, act, render)


def _since_step(frame: pl.DataFrame, steps: pl.DataFrame, ts: str, step: str) -> pl.DataFrame:
    """`frame` with `when`: its `ts` column as "step S +t" from the start of that step on its rank
    (or from the rank's first step when the instant is in none)."""
    starts = strings(steps).select("run", "rank", pl.col("step").alias(step), step_start=pl.col("start_us"))
    first = strings(steps).group_by("run", "rank").agg(first_step=pl.col("step").sort_by("start_us").first(),
                                                     first_start=pl.col("start_us").min())
    f = frame.join(starts, on=["run", "rank", step], how="left").join(first, on=["run", "rank"], how="left")
    rows = []
    for r in f.to_dicts():
        if r["step_start"] is not None and _number(r[ts]) is not None:
            rows.append(f"step {r[step]} {fmt_since(r[ts] - r['step_start'])}")
        elif r["first_start"] is not None and _number(r[ts]) is not None:
            rows.append(f"step {r['first_step']} {fmt_since(r[ts] - r['first_start'])}")
        else:
            rows.append(NONE)
    return frame.with_columns(when=pl.Series(rows, dtype=pl.String))


def _sparklines(curve: pl.DataFrame, full: bool) -> list[str]:
    out = []
    for (dev,), g in curve.group_by("mem_device", maintain_order=True):
        lo, hi = g["min_allocated_bytes"].min(), g["allocated_bytes"].max()
        ranks = g.partition_by("rank", maintain_order=True)
        for k, r in enumerate(ranks):
            if not full and k == SPARK_RANKS:
                out += more(len(ranks), SPARK_RANKS)
                break
            r = r.sort("bucket")
            label = f"  rank {r['rank'][0]:<3} {truncate(printable(dev or NONE), 8):<8} "
            tail = f"  min {fmt_bytes(r['min_allocated_bytes'].min())}, peak {fmt_bytes(r['allocated_bytes'].max())}"
            line = sparkline(r["allocated_bytes"].to_list(), low=lo, high=hi, width=WIDTH - len(label) - len(tail))
            out.append(label + line + tail)
    return out

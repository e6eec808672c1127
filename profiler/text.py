"""The text report of `ptprof analyze`: findings first, then theory beside measurement, then
compact tables in human units (ms, MiB, GB/s; 3 significant digits), at most WIDTH columns.

Per-rank tables collapse to min / median / max over ranks and name the rank at each end;
`full=True` (`ptprof analyze --full`) shows every rank as a row instead. Times are relative to
the step they fall in, never epoch µs. Memory over time is a one-line sparkline per rank. Warning
and skipped lines are the one exception to the width: each stays one line, whole, so that it can
be read (and grepped) as one message. No I/O here: the CLI prints.
"""

from __future__ import annotations

import textwrap

import polars as pl

from profiler.collectives import GLOO_P2P_NOTE
from profiler.discover import paradigm_label
from profiler.errors import printable
from profiler.findings_base import STRAGGLER_MIN_SHARE_PCT, STRAGGLER_MIN_TIMES
from profiler.textfmt import (  # noqa: F401 (the formatting helpers are part of this module's interface)
    NONE, WIDTH, collapse, collapsed_table, fmt_bw, fmt_bytes, fmt_count, fmt_pct, fmt_r2, fmt_range, fmt_since,
    fmt_time, fmt_unit, min_median_max, model_label, more, per_run, plural, sig3, sparkline, strings, table, title, truncate,
    wrap, _number,
)
from profiler.findings_recompute import gathers_in_forward
from profiler.recompute import ratio_on_compute
from profiler.text_memory import memory_sections
from profiler.text_pipeline import pipeline_sections

ROWS = 12  # rows per run of a long table (collectives, operators) unless full


# ---------------------------------------------------------------------------------------------
# Sections: each returns its lines, [] when it has nothing to show


def format_tables(a, *, full: bool = False) -> str:
    """The text report of an Analysis (profiler.report.analyze): findings first, at most WIDTH
    columns but for warning/skipped lines; `full` shows every rank instead of min / median / max."""
    runs = a.ranks["run"].cast(pl.String).unique(maintain_order=True).to_list()
    out = _findings(a, runs, full) + _overview(a, full)
    for part in (_theory_check, _theory_comm, _time, _recompute, _collectives, _stragglers, pipeline_sections, memory_sections, _alpha_beta,
                 _top_operators, _top_kernels):
        lines = part(a, runs, full)
        out += lines
    if len(runs) > 1:
        out += _comparison(a, runs)
    # Each starts its own line, whatever a trace or folder name in it holds (printable: a newline
    # would start a line that poses as ours), wrapped at 100 columns with an indented rest.
    out += [line for w in a.warnings for line in wrap(f"warning: {w}", "", "    ")]
    # each kind of problem's first files, the rest counted (an Analysis made by hand may have no `skipped`)
    out += [line for p in (getattr(a, "skipped", None) or a.problems) for line in wrap(f"skipped: {p}", "", "    ")]
    return "\n".join(out)


def _overview(a, full: bool) -> list[str]:
    steps = a.steps.group_by("run", maintain_order=True).agg(lo=pl.col("step").min(), hi=pl.col("step").max())
    steps = {str(r): (lo if lo == hi else f"{lo}–{hi}") for r, lo, hi in steps.iter_rows()}
    rows = []
    for run in a.ranks["run"].cast(pl.String).unique(maintain_order=True):
        r = a.ranks.filter(pl.col("run").cast(pl.String) == run)
        manifest = a.runs.get(run) if isinstance(a.runs.get(run), dict) else {}
        files = r["file"].to_list()
        where = files[0] if len(files) == 1 else _common_folder(files) + f"/ ({len(files):,} files)"
        device = ", ".join(sorted({d for d in r["device_kind"].to_list() if d}))
        rows.append([run, paradigm_label(manifest) or "(foreign)", model_label(manifest), fmt_count(r.height),
                     "/".join(sorted({b for b in r["backend"].to_list() if b})) or NONE, device or NONE,
                     str(steps.get(run, NONE)), where])
    out = [title("Runs", "what was loaded (+sp, +lp loss parallel, +offload, +rc recompute; steps: profiled)")]
    out += table(["run", "paradigm", "model", "ranks", "backend", "device", "steps", "traces"], rows, "lllrllll",
                 shrink=(7, 0, 2), tail=True, least=24)
    if len({r[2] for r in rows if r[2] != NONE}) > 1:  # said here too: the side-by-side table comes last
        out += wrap("the runs trained different models: their times differ by model as much as by layout",
                    "  note: ", "    ")
    if full:
        files = strings(a.ranks).select("run", "rank", "n_events", "device_name", "file")
        out.append(title("Trace files", "one per rank"))
        out += table(["run", "rank", "events", "device", "file"],
                     [[r, str(k), f"{n:,}", d or NONE, f] for r, k, n, d, f in files.iter_rows()], "lrrll", shrink=4, tail=True)
    return out


def _common_folder(files: list[str]) -> str:
    import os.path

    try:
        return os.path.commonpath(files)
    except ValueError:  # relative beside absolute paths
        return "."


def _findings(a, runs: list[str], full: bool) -> list[str]:
    if a.findings is None or a.findings.is_empty():
        # Said, not left out: a user must not wonder whether the rules ran (docs/findings.md).
        return [title("Findings", "none: no rule's threshold was reached (docs/findings.md lists them)"), *_incomplete_note(a)]
    out = [title("Findings", "what the numbers say and what to try, most important first")]
    out += _incomplete_note(a)
    for i, f in enumerate(a.findings.to_dicts(), 1):
        text = f["text"] or ""
        if len(runs) > 1 and f.get("run"):
            text = f"[{f['run']}] {text}"
        out += wrap(text, f"  {i}. ", "    ")
        if f.get("evidence"):
            out += wrap(f"evidence: {f['evidence']}", "    ", "      ")
        if f.get("change"):
            out += wrap(f"try: {f['change']}", "    ", "      ")
    return out


def _incomplete_note(a) -> list[str]:
    """Before the findings, not only among the warnings at the end: a run with ranks missing."""
    partial = getattr(a, "missing_ranks", None) or {}
    if not partial:
        return []
    piped = set(a.pipeline["run"].cast(pl.String)) if a.pipeline is not None and not a.pipeline.is_empty() else set()
    parts = [f"run {run}: {have:,} of {world:,} ranks loaded" + (", no pipeline finding" if run in piped else "")
             for run, (have, world) in sorted(partial.items())]
    return wrap("(" + "; ".join(parts) + ": cross-rank findings cover the loaded ranks only; the warnings at the end name "
                "the missing ranks)", "  ", "   ")


def _theory_check(a, runs: list[str], full: bool) -> list[str]:
    check = a.theory_check
    if check is None or check.is_empty():
        return []
    header = ["quantity", "predicted", "measured", "ratio", "verdict", "rank"]

    def render(part: pl.DataFrame) -> list[str]:
        rows = []
        if full:
            for r in part.to_dicts():
                rows.append(_check_cells(r) + [NONE if r["rank"] is None else str(r["rank"])])
            return table(header, rows, "lrrrll", shrink=0)
        # Collapsed: the rank furthest from its prediction stands for the quantity.
        far = (pl.col("ratio").log().abs()).fill_nan(None).fill_null(-1.0)
        for _, g in part.with_columns(far=far).group_by("quantity", "unit", maintain_order=True):
            worst = g.sort("far", descending=True, maintain_order=True).row(0, named=True)
            cells = _check_cells(worst)
            n, agree = g.height, (g["verdict"] == worst["verdict"]).sum()
            if n > 1 and agree < n:
                cells[4] += f" ({agree:,} of {n:,})"
            same = g.select(pl.col("predicted", "measured").n_unique()).row(0) == (1, 1)
            rank = NONE if worst["rank"] is None else f"rank {worst['rank']}"
            rows.append(cells + ["every rank" if n > 1 and same else rank])
        return table(header, rows, "lrrrll", shrink=0) + _volume_note(part)

    out = [title("Theory vs measured", "the textbook formula's prediction beside the traces, per step")]
    if not full:
        out.append("  (per quantity, the rank furthest from its prediction; --full: every rank)")
    return out + per_run(runs, check, render)


def _volume_note(part: pl.DataFrame) -> list[str]:
    """What Φ and the volume are (the check's own note: "Φ = N B; all-reduce counted twice ..."),
    said under the table: the JSON alone had it (trial)."""
    if "note" not in part.columns:
        return []
    notes = part.filter(pl.col("quantity") == "volume/step")["note"].drop_nulls().unique(maintain_order=True).to_list()
    return wrap(f"(volume/step: the bytes a rank's collectives move per step in units of Φ, the model's parameters' bytes; "
                f"{notes[0]})", "  ", "   ") if notes else []


def _check_cells(r: dict) -> list[str]:
    return [r["quantity"] or NONE, fmt_unit(r["predicted"], r["unit"]), fmt_unit(r["measured"], r["unit"]),
            NONE if _number(r["ratio"]) is None else f"{sig3(r['ratio'])}×", r["verdict"] or NONE]


TIME_LABELS = {
    "mean_us": "step time (mean of the steps)",
    "window_us": "profiled window (all steps)",
    "compute_us": "compute",
    "non_compute_us": "non-compute (comm, copies)",
    "idle_us": "idle (nothing running)",
    "comm_us": "communication",
    "overlap_us": "comm hidden by compute",
    "exposed_comm_us": "exposed comm (not hidden)",
    "overlap_pct": "share of comm hidden",
}


def _time(a, runs: list[str], full: bool) -> list[str]:
    if a.breakdown.is_empty():
        return []
    per_rank = a.breakdown.join(a.step_stats.select("run", "rank", "mean_us"), on=["run", "rank"], how="left")
    fmt = {m: fmt_pct if m.endswith("_pct") else fmt_time for m in TIME_LABELS}
    out = [title("Where the time goes", "per rank, summed over the profiled steps (HTA's breakdown)")]
    if full:
        cols = ["window_us", "compute_us", "non_compute_us", "idle_us", "comm_us", "exposed_comm_us", "overlap_pct"]
        names = ["window", "compute", "non-comp", "idle", "comm", "exposed", "hidden"]
        def rows(p: pl.DataFrame, keys: list[str], first: str | None = None) -> list[list[str]]:
            return [[*[str(r[k]) for k in keys], *([fmt_time(r[first])] if first else []), *[fmt[c](r[c]) for c in cols]]
                    for r in p.sort(*keys).to_dicts()]

        header = ["rank", "step", *names]
        out += ["  (step: mean step time; exposed: comm no compute hides; hidden: share of comm hidden)"]
        out += per_run(runs, per_rank, lambda p: table(header, rows(p, ["rank"], "mean_us"), "r" * 9, shrink=None))
        out.append(title("Each step", "the same per rank and step"))
        out += per_run(runs, a.breakdown_steps, lambda p: table(header, rows(p, ["rank", "step"]), "r" * 9, shrink=None))
        return out
    stats = collapse(per_rank, list(TIME_LABELS))
    out += per_run(runs, stats, lambda p: collapsed_table(p, TIME_LABELS, fmt))
    return out


def _recompute(a, runs: list[str], full: bool) -> list[str]:
    """Forward, recompute and backward time per rank (mean per step) of runs with --recompute."""
    rc = getattr(a, "recompute", None)
    if rc is None or rc.is_empty():
        return []
    per_rank = (strings(rc).group_by("run", "rank").agg(
        pl.col("recompute_spans", "forward_us", "recompute_us", "backward_us", "forward_comm_us", "recompute_comm_us").mean(),
        pl.col("predicted_over_forward").first())
        .with_columns(ratio=ratio_on_compute()))
    out = [title("Recomputation", "forward run again in backward (--recompute): costs about one more forward")]
    header = ["rank", "spans/step", "forward", "recompute", "backward", "recomp/fwd", "predicted"]
    out += per_run(runs, per_rank, lambda p: table(header, [
        [str(r["rank"]), f"{r['recompute_spans']:g}", fmt_time(r["forward_us"]), fmt_time(r["recompute_us"]),
         fmt_time(r["backward_us"]), sig3(r["ratio"]), sig3(r["predicted_over_forward"])]
        for r in p.sort("rank").to_dicts()][: None if full else ROWS], "r" * 7, shrink=None))
    return out + wrap("(mean per step; backward includes the recompute; recomp/fwd on compute time: each less its exposed "
                      "communication, as a forward's collective waits are not recomputed; predicted: the blocks' share of "
                      "the forward FLOPs)", "  ", "   ") + [
        line for run in runs if gathers_in_forward(a, run) for line in wrap(
            f"{run}: its forward all-gathers parameters, which the recomputation does not repeat: recomp/fwd is not "
            "comparable with predicted", "  ", "   ")]


def _collectives(a, runs: list[str], full: bool) -> list[str]:
    stats = a.collective_stats
    if stats.is_empty():
        return []
    out = [title("Collectives", "time per rank in each, and nccl-tests bus bandwidth (busbw)")]
    notes = []  # why a busbw is missing, where one is
    if stats["group_size"].is_null().any():
        mark = "a collective whose group's size the trace does not say" if full else "(?): the trace does not say the group's size"
        notes += wrap(f"{mark}, so no busbw (the world size is never assumed: sub-groups are common; docs/profiler.md, "
                      "\"Group size\")", "  note: ", "    ")
    if (stats["note"] == GLOO_P2P_NOTE).any():
        # the pipeline clause only where a run has pipeline actions (a ring run's was told of them: trial)
        piped = a.pipeline_actions is not None and not a.pipeline_actions.is_empty()
        notes += wrap("send and recv on gloo: a span runs from the post (isend / irecv) to the wait that completes it, so "
                      "their time is what the rank had in flight, not the transfer: no busbw"
                      + (" (inside a pipeline action the breakdown counts none of it as communication)" if piped else ""),
                      "  note: ", "    ")
    if full:
        header = ["rank", "collective", "group", "dtype", "size", "calls", "total", "per call", "algbw", "busbw"]
        render = lambda p: table(header, [  # noqa: E731
            [str(r["rank"]), r["collective"], r["group"] or NONE, r["dtype"] or NONE, fmt_bytes(r["size_bytes"]), fmt_count(r["count"]),
             fmt_time(r["total_us"]), fmt_time(r["mean_us"]), fmt_bw(r["algbw_gbps"]), fmt_bw(r["busbw_gbps"])]
            for r in p.sort("rank", pl.col("total_us"), descending=[False, True]).to_dicts()], "rlllrrrrrr", shrink=(2, 3))
        return out + notes + per_run(runs, stats, render)
    timed = pl.col("wall_us").filter(pl.col("busbw_gbps").is_not_null())  # no group size, no busbw: left out
    # Per rank and collective kind (sizes and dtypes together: MoE all-to-alls differ in size on every rank):
    # its wall time (calls in flight together counted once), and the bus bandwidth of all its bytes
    # (busbw x time summed = factor x bytes).
    keys = ["run", "collective", "group_size"]
    per_rank = (strings(stats).group_by(*keys, "rank", maintain_order=True)
                .agg(calls=pl.col("count").sum(), total_us=pl.col("wall_us").sum(), lo=pl.col("size_bytes").min(),
                     hi=pl.col("size_bytes").max(),
                     busbw=pl.when(timed.sum() > 0).then((pl.col("busbw_gbps") * pl.col("wall_us")).sum() / timed.sum()))
                .with_columns(key=pl.concat_str(pl.col(keys[1:]).cast(pl.String).fill_null("?"), separator="|")))
    per = (per_rank.group_by("run", "key", *keys[1:], maintain_order=True)
           .agg(calls_lo=pl.col("calls").min(), calls_hi=pl.col("calls").max(), lo=pl.col("lo").min(), hi=pl.col("hi").max(),
                busbw=pl.col("busbw").median())
           .join(collapse(per_rank, ["total_us"], keys=["run", "key"]).drop("metric"), on=["run", "key"], how="left")
           .sort("run", "median", descending=[False, True], maintain_order=True))
    def render(p: pl.DataFrame) -> list[str]:
        lone = bool((p["n"] == 1).all())  # one rank: its time, no min / median / max
        header = ["collective (ranks)", "size", "calls", *(["time"] if lone else ["time: min", "median", "max"]), "busbw"]
        rows = []
        for r in p.head(ROWS).to_dicts():
            calls = fmt_count(r["calls_hi"]) if r["calls_lo"] == r["calls_hi"] else f"{fmt_count(r['calls_lo'])}–{fmt_count(r['calls_hi'])}"
            rows.append([f"{r['collective'] or NONE} ({r['group_size'] or '?'})", fmt_range(r["lo"], r["hi"], fmt_bytes),
                         calls, *min_median_max(r, fmt_time)[:1 if lone else 3], fmt_bw(r["busbw"])])
        return table(header, rows, "lrrrrrr", shrink=0) + more(p.height, ROWS)

    out += wrap("(per collective and group size: sizes of a call, calls and time per rank over the profiled steps, "
                "calls in flight together counted once (a ring's isend/irecv); busbw: of all its bytes over that time, "
                "median over ranks; --full: per rank, message size and dtype, total = summed call time)", "  ", "   ")
    return out + notes + per_run(runs, per, render)


def _stragglers(a, runs: list[str], full: bool) -> list[str]:
    s = a.stragglers
    if s.is_empty():
        return []
    out = [title("Stragglers", "the rank that starts a group's collectives last; the others wait for it")]
    # How many collectives each share is of: "100 %" of 2 is no straggler (the finding asks for
    # STRAGGLER_MIN_TIMES), and the table said it without the count.
    s = (strings(s).with_columns(of=pl.col("times_last").sum().over("run", "group"))
         .sort("run", "group", "times_last", "rank", descending=[False, False, True, False], maintain_order=True))
    if not full:
        s = s.group_by("run", "group", maintain_order=True).first()
    header = ["group", "rank", "last in", "mean wait when last"]

    def render(p: pl.DataFrame) -> list[str]:
        rows = [[r["group"] or NONE, str(r["rank"]), f"{fmt_pct(r['share_pct'])} ({fmt_count(r['times_last'])} of {fmt_count(r['of'])})",
                 fmt_time(r["mean_spread_us"])] for r in (p if full else p.head(ROWS)).to_dicts()]
        return table(header, rows, "lrrr", shrink=0) + ([] if full else more(p.height, ROWS))

    unknown = s["group"].is_null().any()
    out += wrap(f"(last in: the share of the group's collectives the rank started last; the findings call a rank a "
                f"straggler when that is at least {STRAGGLER_MIN_SHARE_PCT:g} % and {STRAGGLER_MIN_TIMES} collectives"
                + (f" of a known group; group {NONE}: the traces do not say which group a collective is of, so the k-th "
                   "call of two ranks may be two different collectives, and no finding names a straggler from it)"
                   if unknown else ")"), "  ", "   ")
    return out + per_run(runs, s, render)


def _alpha_beta(a, runs: list[str], full: bool) -> list[str]:
    fit = a.alpha_beta
    if fit is None or fit.is_empty():
        return []
    out = [title("Latency and bandwidth", "a collective of n bytes takes α + n/β (least squares fit)"),
           "  (calls: the fastest call of each message size on any rank, the ones fitted; Collectives counts",
           "   every call, per rank)"]
    notes = fit["note"].is_not_null().any()
    header = ["backend", "collective", "ranks", "calls", "sizes", "α", "β", "r²", *(["note"] if notes else [])]
    return out + per_run(runs, fit, lambda p: table(header, [
        [r["backend"] or NONE, r["collective"] or NONE, str(r["group_size"] or "?"), fmt_count(r["n_calls"]), fmt_count(r["n_sizes"]),
         fmt_time(r["alpha_us"]), fmt_bw(r["beta_gbps"]), fmt_r2(r["r2"]), *([r["note"] or ""] if notes else [])]
        for r in p.to_dicts()], "llrrrrrrl", shrink=(8, 1) if notes else 1))


def _theory_comm(a, runs: list[str], full: bool) -> list[str]:
    comm = a.theory_comm
    if comm is None or comm.is_empty():
        return []
    if not full:
        return _theory_formulas(a, comm, runs)
    out = [title("Predicted communication", "what the textbook says each rank moves per step")]
    header = ["rank", "dim", "phase", "collective", "ranks", "calls", "bytes", "ring traffic", "Φ"]
    return out + per_run(runs, comm, lambda p: table(header, [
        [str(r["rank"]), r["dim"] or NONE, r["phase"] or NONE, r["collective"] or NONE, str(r["group_size"] or "?"),
         fmt_count(r["calls"]), fmt_bytes(r["bytes"]), fmt_bytes(r["traffic_bytes"]), sig3(r["phi"])]
        for r in p.to_dicts()], "rlllrrrrr", shrink=(3, 2)))


def _theory_formulas(a, comm: pl.DataFrame, runs: list[str]) -> list[str]:
    """The formula behind each predicted row of the lowest rank of each run (send and recv of the
    same messages on one line), wrapped to the report's width: what the bytes in the theory check mean.
    Rows of one step only (DDP's step-1 bucket rebuild) are shown where that step was analysed."""
    out = [title("Predicted communication", "the formula behind each prediction (lowest rank; --full: all)")]
    b = strings(a.breakdown_steps) if a.breakdown_steps is not None else None

    def render(p: pl.DataFrame) -> list[str]:
        p = p.filter(pl.col("rank") == p["rank"].min())
        run = p["run"].cast(pl.String)[0]
        analysed = [] if b is None or "step" not in b.columns else b.filter(pl.col("run") == run)["step"].unique().to_list()
        p = p.filter(pl.col("step").is_null() | pl.col("step").is_in(analysed))
        lines, seen = [], {}
        for r in p.to_dicts():
            key = (r["dim"], r["phase"], r["formula"], r["note"], r["calls"], r["bytes"])
            if key in seen:  # a receive of the messages just sent: same line
                seen[key][0] += "/" + (r["collective"] or NONE)
                continue
            seen[key] = [r["collective"] or NONE, r]
        for kind, r in seen.values():
            calls = "?" if r["calls"] is None else plural(r["calls"], "call")
            head = f"{r['dim'] or NONE} {r['phase'] or NONE} {kind}: {calls}, {fmt_bytes(r['bytes'])}/step = "
            text = head + "; ".join(x for x in (r["formula"], r["note"]) if x)
            lines += textwrap.wrap(printable(text), WIDTH, initial_indent="  ", subsequent_indent="      ")
        return lines

    return out + per_run(runs, comm, render)


def _top(a, frame: pl.DataFrame, runs: list[str], full: bool, name: str, meaning: str, value: str,
         extra: list[tuple[str, str]]) -> list[str]:
    if frame.is_empty():
        return []
    out = [title(name, meaning)]
    frame = strings(frame)
    if full:
        header = ["rank", "name", "calls", *[h for h, _ in extra]]
        return out + per_run(runs, frame, lambda p: table(header, [
            [str(r["rank"]), r["name"], fmt_count(r["count"]), *[fmt_time(r[c]) for _, c in extra]] for r in p.to_dicts()],
            "rlr" + "r" * len(extra), shrink=1))
    stats = collapse(frame, [value], keys=["run", "name"])
    # A call count is whole: the range over the ranks (97–100), not a median of two ranks (98.5).
    calls = frame.group_by("run", "name").agg(calls_lo=pl.col("count").min(), calls_hi=pl.col("count").max())
    stats = stats.join(calls, on=["run", "name"], how="left").sort("run", "max", descending=[False, True], maintain_order=True)
    header = ["name", "ranks", "calls", "median", "max"]

    # As many rows as a rank's own list holds: --top N promises N rows (ROWS caps the other tables).
    # The union over ranks may name more; those are counted below the table.
    shown = frame.group_by("run", "rank").len()["len"].max()

    def render(p: pl.DataFrame) -> list[str]:
        rows = [[r["name"], fmt_count(r["n"]), _calls(r["calls_lo"], r["calls_hi"]), fmt_time(r["median"]),
                 f"{fmt_time(r['max'])} (rank {r['max_rank']})"]
                for r in p.head(shown).to_dicts()]
        return table(header, rows, "lrrrr", shrink=0) + more(p.height, shown)

    return out + ["  (ranks: how many ranks have it in their top list; calls: the fewest to the most of those ranks;",
                  "  time: the median over those ranks, and the max)"] + per_run(runs, stats, render)


def _calls(lo, hi) -> str:
    return fmt_count(lo) if lo == hi else f"{fmt_count(lo)}–{fmt_count(hi)}"


def _top_operators(a, runs: list[str], full: bool) -> list[str]:
    return _top(a, a.top_operators, runs, full, "Top CPU operators", "self time (not in the operators they call)",
                "self_us", [("self", "self_us"), ("total", "total_us")])


def _top_kernels(a, runs: list[str], full: bool) -> list[str]:
    return _top(a, a.top_kernels, runs, full, "Top GPU kernels", "total time on the device", "total_us",
                [("total", "total_us"), ("per call", "mean_us")])


COMPARE_LABELS = {
    "step_mean_us": "step time (mean)",
    "window_us": "profiled window",
    "compute_us": "compute",
    "non_compute_us": "non-compute",
    "idle_us": "idle",
    "comm_us": "communication",
    "overlap_us": "comm hidden by compute",
    "exposed_comm_us": "exposed comm",
    "overlap_pct": "share of comm hidden",
    "collective_us": "time in collectives",
    "peak_allocated_bytes_max": "memory peak (max rank)",
    "bubble_pct": "pipeline bubble",
    "bubble_textbook_pct": "  textbook for its shape",
}


def _comparison(a, runs: list[str]) -> list[str]:
    from profiler.report import compare_runs

    t = compare_runs(a)
    if t.is_empty():
        return []
    short = all(len(printable(r)) <= 14 for r in runs)
    names = [printable(r) if short else chr(ord("A") + i) for i, r in enumerate(runs)]
    out = [title("Runs side by side", "mean over ranks (memory: the largest rank), change vs the first"),
           "  (step time: the mean step; the other times: summed over each rank's profiled steps)"]
    if not short:
        out += [printable(truncate(f"  {n} = {r}", WIDTH)) for n, r in zip(names, runs)]
    models = [model_label(a.runs.get(r) if isinstance(a.runs.get(r), dict) else None) for r in runs]
    if len({m for m in models if m != NONE}) > 1:  # another model's step time says nothing of the layout: said first
        out += wrap("models differ (" + ", ".join(f"{n}: {m}" for n, m in zip(names, models)) + "): the changes below "
                    "are the models' as much as the layouts'", "  note: ", "    ")
    rows = []
    by = {r["metric"]: r for r in t.to_dicts()}
    for metric, label in COMPARE_LABELS.items():
        r = by.get(metric)
        if r is None:
            continue
        fmt = fmt_pct if metric.endswith("_pct") else fmt_bytes if metric.endswith("_bytes_max") else fmt_time
        diffs = []
        for run in runs[1:]:
            if metric.endswith("_pct"):  # points, never a percent of a percent
                d = r.get(f"{run}_diff_pts")
                diffs.append(NONE if _number(d) is None else f"{'+' if d >= 0 else ''}{sig3(d)} pts")
            else:
                d = r.get(f"{run}_diff_pct")
                diffs.append(NONE if _number(d) is None else f"{sig3(1 + d / 100)}×" if d >= 100  # 24.7×, not +2370 %
                             else f"{'+' if d >= 0 else ''}{sig3(d)} %")
        rows.append([label, *[fmt(r.get(run)) for run in runs], *diffs])
    # As many runs beside the first as fit the width; the rest in further blocks, each with the first.
    others = list(range(1, len(runs)))
    for per in range(len(others), 0, -1):
        blocks = [others[i:i + per] for i in range(0, len(others), per)]
        lines = []
        for block in blocks:
            vs = [f"vs {names[0]}" if len(runs) == 2 else f"{names[i]} vs {names[0]}" for i in block]
            header = ["", names[0], *[names[i] for i in block], *vs]
            cells = [[row[0], row[1], *[row[1 + i] for i in block], *[row[len(runs) + i] for i in block]] for row in rows]
            lines += ([""] if lines else []) + table(header, cells, "l" + "r" * (len(header) - 1), shrink=None)
        if per == 1 or max(map(len, lines)) <= WIDTH:
            return out + lines + _no_textbook(by, runs, names)
    return out


def _no_textbook(by: dict, runs: list[str], names: list[str]) -> list[str]:
    """Why a pipeline's textbook bubble is "—" in the Runs table (the Pipeline bubble section says it per run)."""
    bubble, book = by.get("bubble_pct") or {}, by.get("bubble_textbook_pct") or {}
    none = [n for r, n in zip(runs, names) if _number(bubble.get(r)) is not None and _number(book.get(r)) is None]
    if not none:
        return []
    return wrap(f"(textbook {NONE} for {', '.join(none)}: no closed form for its schedule, or its shape unknown; the "
                "Pipeline bubble section says which, and replays the ideal order)", "  ", "   ")


"""HolisticTraceAnalysis side by side: its temporal breakdown and overlap on the same traces.

HTA is imported only here and only when asked (it is slow to import and pulls in plotly). HTA 0.5.0
needs pandas < 3 (its parser fails with a dtype error under pandas 3); we check that up front and
turn any HTA failure into a TraceError naming the folder, since HTA's own tracebacks say little.

Nanosecond timestamps: HTA rounds every event of a trace with fractional µs inward to whole µs
(start up, end down: its `trace_parser.round_down_time_stamps`), which on busy traces turns up to
2 % of the window from busy into idle. ptprof keeps the exact times; `rounded_breakdown` recomputes
ours with HTA's rounding, so a difference from HTA can be told apart as the rounding's.
"""

from __future__ import annotations

import logging
import traceback
import warnings
from pathlib import Path

import polars as pl

from profiler.breakdown import temporal_breakdown
from profiler.errors import TraceError, printable
from profiler.steps import profiler_steps
from profiler.textfmt import NONE, WIDTH, _number, table, truncate, wrap

HTA_ROUNDING = ("nanosecond timestamps: HTA rounds each event inward to whole µs (start up, end down), ptprof keeps "
                "the exact times; the *_rounded columns are ptprof's with HTA's rounding")
BREAKDOWN = ("window_us", "compute_us", "non_compute_us", "idle_us")


def hta_breakdown(trace_files: dict[int, str | Path]) -> pl.DataFrame:
    """HTA's numbers for one run: rank, idle_us, compute_us, non_compute_us, window_us, overlap_pct.

    trace_files: rank -> trace file (all in one folder is not required). Runs HTA with
    include_last_profiler_step=True so its window is the same as ours.
    """
    if not trace_files:
        raise TraceError(None, "HTA: no trace files")
    try:
        import pandas as pd
    except ImportError:
        raise TraceError(None, "HTA needs pandas: pip install 'pandas<3'") from None
    if int(pd.__version__.split(".")[0]) >= 3:
        raise TraceError(None, f"HTA 0.5 fails on real traces under pandas {pd.__version__}; install 'pandas<3'")
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as e:
        raise TraceError(None, f"HTA is not installed ({e}); pip install HolisticTraceAnalysis") from None
    folder = Path(next(iter(trace_files.values()))).parent
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # HTA logs a warning per file parsed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pandas FutureWarnings from inside HTA
            ta = TraceAnalysis(trace_dir=str(folder), trace_files={r: str(p) for r, p in trace_files.items()},
                               include_last_profiler_step=True)
            tb = ta.get_temporal_breakdown(visualize=False)
            ov = ta.get_comm_comp_overlap(visualize=False)
    except Exception as e:  # HTA raises anything from KeyError to AssertionError on traces it cannot read
        raise TraceError(folder, f"HTA failed: {_where(e)}") from None
    finally:
        logging.disable(previous)
    frame = pl.from_pandas(tb.merge(ov, on="rank"))
    return frame.select(
        rank=pl.col("rank").cast(pl.Int32),
        window_us=pl.col("kernel_time(us)").cast(pl.Float64),
        compute_us=pl.col("compute_time(us)").cast(pl.Float64),
        non_compute_us=pl.col("non_compute_time(us)").cast(pl.Float64),
        idle_us=pl.col("idle_time(us)").cast(pl.Float64),
        overlap_pct=pl.col("comp_comm_overlap_pctg").cast(pl.Float64),
    )


def _where(e: Exception) -> str:
    """The exception in words; with no message of its own (HTA's bare asserts), where in HTA it
    was raised and the line: "AssertionError at hta/analyzers/breakdown_analysis.py:668 (assert
    non_compute_time >= 0)", so a user sees it is HTA's check that failed, not ptprof's."""
    if str(e):
        return f"{type(e).__name__}: {e}"
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return type(e).__name__
    last = frames[-1]
    path = Path(last.filename).as_posix()
    path = path[path.rindex("hta/"):] if "hta/" in path else Path(path).name
    return f"{type(e).__name__} at {path}:{last.lineno}" + (f" ({last.line.strip()})" if last.line else "")


def hta_rounding(events: pl.DataFrame) -> pl.DataFrame:
    """`events` with HTA's rounding of nanosecond traces: start up and end down to whole µs.

    An event shorter than that becomes empty (HTA leaves it a negative duration, which its interval
    merge absorbs; an empty one adds no time either way).
    """
    start, end = pl.col("ts_us").ceil(), pl.col("end_us").floor()
    return events.with_columns(ts_us=start, end_us=pl.max_horizontal(start, end), dur_us=(end - start).clip(0))


def has_sub_us_times(events: pl.DataFrame) -> bool:
    """True when some start or duration has a fraction of a µs (the traces HTA rounds)."""
    return bool(events.select(((pl.col("ts_us") % 1 != 0) | (pl.col("dur_us") % 1 != 0)).any()).item())


def rounded_breakdown(rank_events, *, step: int | None = None) -> pl.DataFrame:
    """Per (run, rank) with sub-µs times: our temporal breakdown recomputed with HTA's rounding.

    rank_events: an iterable of one-rank event frames (`Traces.rank_events()`); step: only that
    ProfilerStep, as `analyze(step=...)`. Columns run, rank and BREAKDOWN, each suffixed `_rounded`.
    """
    rows = []
    for events in rank_events:
        if not has_sub_us_times(events):
            continue
        rounded = hta_rounding(events)
        steps = profiler_steps(rounded)
        if step is not None:
            steps = steps.filter(pl.col("step") == step)
        rows.append(temporal_breakdown(rounded, steps=steps).select("run", "rank", *BREAKDOWN))
    schema = {"run": pl.Categorical, "rank": pl.Int32, **{c: pl.Float64 for c in BREAKDOWN}}
    frame = pl.concat(rows, how="vertical_relaxed") if rows else pl.DataFrame(schema=schema)
    return frame.rename({c: f"{c}_rounded" for c in BREAKDOWN})


def compare_with_hta(breakdown: pl.DataFrame, hta: pl.DataFrame, rounded: pl.DataFrame | None = None) -> pl.DataFrame:
    """Ours beside HTA's per rank, with differences in % of the window (overlap in points).

    rounded: `rounded_breakdown` of the same ranks. Where a rank has a row there, its `cause`
    names HTA's rounding and `<c>_rounded` / `<c>_rounded_diff_pct_of_window` give ours with that
    rounding and its difference from HTA; elsewhere those are null.
    """
    ours = breakdown.select("rank", "window_us", "compute_us", "non_compute_us", "idle_us", "overlap_pct")
    joined = ours.join(hta, on="rank", suffix="_hta")
    rounded = (rounded if rounded is not None else rounded_breakdown([])).drop("run", strict=False)
    joined = joined.join(rounded, on="rank", how="left")
    window = pl.col("window_us_hta")
    return joined.with_columns(
        [(100 * (pl.col(c) - pl.col(f"{c}_hta")) / window).alias(f"{c}_diff_pct_of_window")
         for c in ("compute_us", "non_compute_us", "idle_us")]
        + [(pl.col("overlap_pct") - pl.col("overlap_pct_hta")).alias("overlap_diff_points")]
        + [(100 * (pl.col(f"{c}_rounded") - pl.col(f"{c}_hta")) / window).alias(f"{c}_rounded_diff_pct_of_window")
           for c in ("compute_us", "non_compute_us", "idle_us")]
        + [pl.when(pl.col("window_us_rounded").is_not_null()).then(pl.lit(HTA_ROUNDING)).alias("cause")]
    )


# ---------------------------------------------------------------------------------------------
# Text (ptprof analyze --hta)

HTA_ROWS = {"window_us": "window", "compute_us": "compute", "non_compute_us": "non-compute", "idle_us": "idle",
            "overlap_pct": "comm hidden"}


def format_hta(section: list[dict], rounding: str = HTA_ROUNDING) -> str:
    """`ptprof analyze --hta`: HTA's breakdown beside ours per run and rank (ms to the µs, the
    difference in % of the window, in points for the overlap), and why they differ (`rounding`)."""
    out = []
    for entry in section:
        out += ["", truncate(printable(f"== HTA beside ours: {entry['run']}"), WIDTH)]
        if "error" in entry:
            skipped = entry["error"].startswith("HTA skipped")
            out += wrap(entry["error"] if skipped else f"HTA could not analyze this run: {entry['error']}", "", "  ")
            continue
        rows, rounded = [], False
        for r in entry["ranks"]:
            for q, label in HTA_ROWS.items():
                pct = q.endswith("_pct")
                # to the µs and the hundredth of a point: what a check of two tools needs, not 3 digits
                f = (lambda x: NONE if _number(x) is None else f"{x:.2f} %") if pct else \
                    (lambda us: NONE if _number(us) is None else f"{us / 1e3:,.3f} ms")
                diff = r.get("overlap_diff_points") if pct else r.get(f"{q}_diff_pct_of_window", _pct_of(r, q, ""))
                rdiff = None if pct else r.get(f"{q}_rounded_diff_pct_of_window", _pct_of(r, q, "_rounded"))
                rounded = rounded or r.get(f"{q}_rounded") is not None
                rows.append([str(r["rank"]), label, f(r.get(q)), f(r.get(f"{q}_hta")), _diff(diff, pct),
                             "" if pct else f(r.get(f"{q}_rounded")), "" if pct or r.get(f"{q}_rounded") is None else _diff(rdiff, False)])
        header = ["rank", "", "ours", "HTA", "diff", "ours, HTA's rounding", "diff"]
        keep = 7 if rounded else 5
        out += table(header[:keep], [row[:keep] for row in rows], "rlrrrrr"[:keep], shrink=None)
        out.append("  (diff: ours - HTA, in % of the window; for comm hidden in points)")
        if rounded:  # the JSON's wording names its *_rounded fields; here they are a column
            why = rounding.replace("the *_rounded columns are", "the column \"ours, HTA's rounding\" is")
            out += wrap(f"Why they differ: {why}.", "  ", "  ")
    return "\n".join(out)


def _pct_of(r: dict, q: str, ours: str) -> float | None:
    # The window's own difference (profiler.hta gives the others): ours - HTA in % of ours.
    a, b = _number(r.get(f"{q}{ours}")), _number(r.get(f"{q}_hta"))
    return None if a is None or b is None or a == 0 else 100 * (a - b) / a


def _diff(x, points: bool) -> str:
    x = _number(x)
    if x is None:
        return NONE
    return f"{x:+.2f} pts" if points else f"{x:+.2f} %"

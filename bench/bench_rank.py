"""CPU time of one rank's per-rank analyses (`rankmap.analyze_rank`) and of `classify`, per analysis.

    POLARS_MAX_THREADS=1 .venv/bin/python bench/bench_rank.py /tmp/ptprof-bench-8-100/rank0.json.gz
    POLARS_MAX_THREADS=1 .venv/bin/python bench/bench_rank.py FILE --repeat 9 --activity

The file is parsed once; then each step runs --repeat times on its events, as a map worker runs it
(one thread: the pool sets POLARS_MAX_THREADS=1, so set it here too), and the least and median CPU
time of the process (user + system) are printed in ms. To compare two checkouts, run the same
command with each one's code first on PYTHONPATH, one after the other, and repeat: on shared cores
the timings move by tens of percent from run to run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import polars as pl

from profiler.breakdown import gloo_worker_threads, multi_gpu_ranks, temporal_breakdowns
from profiler.classify import classify, device_kind, unknown_categories
from profiler.collectives import collectives
from profiler.exposed import exposed_comm
from profiler.memory import memory_curve, memory_peaks, memory_timeline
from profiler.parse import SCHEMA, parse_trace_file
from profiler.pipeline import pipeline_actions
from profiler.rankmap import analyze_rank, rank_row
from profiler.recompute import recompute_time
from profiler.steps import assign_steps, profiler_steps
from profiler.top_ops import top_kernels, top_operators


def cpu_ms(step, repeat: int) -> tuple[float, float]:
    """(least, median) CPU ms of `repeat` calls of step()."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        step()
        times.append((time.process_time() - start) * 1e3)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="one Kineto trace file (.json or .json.gz)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--activity", action="store_true", help="also the viewer's activity bins (with_activity=True)")
    args = ap.parse_args()

    frame, meta = parse_trace_file(args.trace)
    events = frame.with_columns(run=pl.lit("x", pl.Categorical), rank=pl.lit(0, pl.Int32)).select(list(SCHEMA)).rechunk()
    ranks = rank_row(meta, "x", 0, str(args.trace))
    raw = frame.drop("device", "kind")
    steps = profiler_steps(events)
    e = assign_steps(events, steps)
    colls = collectives(e, ranks)
    multi, gloo = multi_gpu_ranks(e), gloo_worker_threads(e)
    parts = {
        "analyze_rank": lambda: analyze_rank(events, ranks, {"x": None}, step=None, top_n=15, with_activity=args.activity),
        "  profiler_steps": lambda: profiler_steps(events),
        "  assign_steps": lambda: assign_steps(events, steps),
        "  collectives": lambda: collectives(e, ranks),
        "  multi_gpu + gloo threads": lambda: (multi_gpu_ranks(e), gloo_worker_threads(e)),
        "  temporal_breakdowns": lambda: temporal_breakdowns(e, steps=steps, multi=multi, gloo_threads=gloo),
        "  exposed_comm": lambda: exposed_comm(e, colls, multi=multi, gloo_threads=gloo),
        "  pipeline_actions": lambda: pipeline_actions(e, steps=steps, runs={"x": None}),
        "  memory": lambda: (memory_peaks(tl := memory_timeline(e)), memory_curve(tl)),
        "  top_operators": lambda: top_operators(e, n=15),
        "  top_kernels": lambda: top_kernels(e, n=15),
        "  recompute_time": lambda: recompute_time(e),
        "classify (parse)": lambda: classify(raw),
        "device_kind + unknown_categories (parse)": lambda: (device_kind(frame), unknown_categories(frame)),
    }
    print(f"{args.trace}: {events.height:,} events, CPU ms over {args.repeat} runs (least / median)")
    for name, step in parts.items():
        least, median = cpu_ms(step, args.repeat)
        print(f"{name:42s} {least:8.1f} {median:8.1f}")


if __name__ == "__main__":
    main()

"""ptprof.profiler: Kineto traces -> a normalized event frame -> one analysis per module -> report.

    from profiler import load_traces, temporal_breakdown
    traces = load_traces("traces/ddp-2r-20261122-210000")
    temporal_breakdown(traces.events)

Never imports torch, dash, plotly, runners or viewer (see pyproject's import-linter contracts).
"""

from profiler.breakdown import temporal_breakdown
from profiler.collectives import collective_skew, collective_stats, collectives, stragglers
from profiler.errors import TraceError
from profiler.load import SCHEMA, Traces, load_traces
from profiler.memory import memory_peaks, memory_timeline, persistent_memory
from profiler.overlap import comm_compute_overlap
from profiler.pipeline import (
    ideal_orders, pipeline_actions, pipeline_grid, pipeline_summary, simulate_order, theory_bubble_pct,
)
from profiler.report import REPORT_SCHEMA, analyze, build_report, compare_runs
from profiler.steps import NO_STEP, assign_steps, profiler_steps, step_time_stats
from profiler.text import format_tables
from profiler.top_ops import self_times, top_kernels, top_operators

__all__ = [
    "REPORT_SCHEMA", "SCHEMA", "NO_STEP", "TraceError", "Traces",
    "load_traces", "profiler_steps", "assign_steps", "step_time_stats",
    "temporal_breakdown", "comm_compute_overlap",
    "collectives", "collective_stats", "collective_skew", "stragglers",
    "pipeline_actions", "pipeline_grid", "pipeline_summary", "ideal_orders", "simulate_order", "theory_bubble_pct",
    "memory_timeline", "memory_peaks", "persistent_memory",
    "self_times", "top_operators", "top_kernels",
    "analyze", "build_report", "compare_runs", "format_tables",
]

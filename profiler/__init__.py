"""ptprof.profiler: Kineto traces -> a normalized event frame -> one analysis per module -> report.

    from profiler import load_traces, temporal_breakdown
    traces = load_traces("traces/ddp-2r-20261122-210000")
    temporal_breakdown(traces.events)

Never imports torch, dash, plotly, runners or viewer (see pyproject's import-linter contracts).

The public names below are imported when first used (PEP 562), so a process that needs only
part of the profiler does not pay for the rest: a worker of the per-rank map (pool.py) starts
~0.1 s sooner without the report, theory and findings modules, and `import profiler` imports
neither polars nor numpy, so `ptprof analyze` can start its worker processes before its own
~0.2 s of imports (cli.py); `load_traces` and `analyze` do the same for a script (api.py).
`collectives` is both a function and the module that holds it: the import system binds the
package's attribute to the module when the module is first imported, so the name is a property
of the package (`_Package`) that stays the function, as it was.
"""

import sys
import types
from importlib import import_module

from profiler.errors import TraceError
from profiler.startup import collector_paused

_LAZY = {
    "collective_skew": "collectives", "collective_stats": "collectives", "stragglers": "collectives",
    "temporal_breakdown": "breakdown",
    "SCHEMA": "load", "Traces": "load", "load_traces": "api",
    "memory_peaks": "memory", "memory_timeline": "memory", "persistent_memory": "memory",
    "comm_compute_overlap": "overlap",
    "ideal_orders": "pipeline", "pipeline_actions": "pipeline", "pipeline_grid": "pipeline",
    "pipeline_summary": "pipeline", "simulate_order": "pipeline", "theory_bubble_pct": "pipeline",
    "REPORT_SCHEMA": "report", "analyze": "api", "build_report": "report", "compare_runs": "report",
    "NO_STEP": "steps", "assign_steps": "steps", "profiler_steps": "steps", "step_time_stats": "steps",
    "format_tables": "text",
    "self_times": "top_ops", "top_kernels": "top_ops", "top_operators": "top_ops",
}

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


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:  # a submodule (`from profiler import plan`) is found by the import system
        raise AttributeError(f"module 'profiler' has no attribute {name!r}")
    with collector_paused():  # profiler.startup: ~20 ms of a cold import
        value = getattr(import_module(f"profiler.{module}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """This package, whose `collectives` is always the function (see the module docstring)."""

    @property
    def collectives(self):
        with collector_paused():
            return import_module("profiler.collectives").collectives

    @collectives.setter
    def collectives(self, value) -> None:
        pass  # the submodule being bound on its first import: the name stays the function


sys.modules[__name__].__class__ = _Package

"""What each event is (profiler/classify.py): the rules, and the two ways of applying them.

Small frames are classified per distinct (cat, name, ph) and joined back; large ones by per-value
bit flags looked up by category code. Both must give the same frame: checked here on hand-made
rows covering every rule (answers read off the module docstring's rules) and on a shipped rank.
"""

from __future__ import annotations

import polars as pl
import pytest

import profiler.classify as classify_module
from profiler.classify import classify, device_kind, unknown_categories
from profiler.parse import parse_trace_file
from tests.conftest import REPO

# (cat, name, ph) -> (device, kind), by the rules in classify.py's docstring and comments.
CASES = [
    ("Kernel", "ncclKernel_AllReduce_RING", "X", "gpu", "comm"),  # torch < 1.10 capitalises cats
    ("kernel", "ncclDevKernel_Generic", "X", "gpu", "comm"),
    ("kernel", "void gemm<float>", "X", "gpu", "compute"),
    ("kernel", "fooSyncBar", "X", "gpu", "other"),  # HTA: ...Sync... is neither compute nor memory
    ("kernel", "Memset (Device)", "X", "gpu", "memory"),
    ("gpu_memcpy", "anything", "X", "gpu", "memory"),
    ("mtia_ccp_events", "dma_copy", "X", "gpu", "memory"),
    ("gpu_user_annotation", "ncclKernel_x", "X", "gpu", "annotation"),  # the annotation rule comes first
    ("cuda_runtime", "cudaLaunchKernel", "X", "cpu", "runtime"),
    ("xpu_driver", "zeLaunch", "X", "cpu", "runtime"),
    ("cpu_op", "gloo:all_reduce", "X", "cpu", "comm"),
    ("cpu_op", "c10d::allreduce_", "X", "cpu", "enqueue"),
    ("cpu_op", "record_param_comms", "X", "cpu", "enqueue"),
    # the functional collectives' blocking wait is the collective's, not compute (a tp+sp trial)
    ("cpu_op", "_c10d_functional::wait_tensor", "X", "cpu", "enqueue"),
    ("cpu_op", "c10d_functional::wait_tensor", "X", "cpu", "enqueue"),  # torch < 2.3
    ("cpu_op", "_c10d_functional::all_reduce", "X", "cpu", "op"),  # the call's own work (its enqueue is inside)
    ("cpu_op", "[memory]", "i", "cpu", "memory_event"),
    ("cpu_instant_event", "marker", "i", "cpu", "instant"),
    ("user_annotation", "ptprof/forward", "X", "cpu", "annotation"),
    ("cpu_op", "aten::mm", "X", "cpu", "op"),
    # torch 1.8 files the step's span under Operator: it counted as an operator with the step's self time
    ("Operator", "ProfilerStep#5", "X", "cpu", "annotation"),
    ("Operator", "ProfilerStep#5 extra", "X", "cpu", "op"),  # only the step's own name
    (None, "aten::mm", None, "cpu", "op"),  # nulls match no rule
    ("cpu_op", None, "X", "cpu", "op"),
    ("strange_cat", "aten::add", "X", "cpu", "op"),
]


def _raw(rows) -> pl.DataFrame:
    return pl.DataFrame({"cat": [r[0] for r in rows], "name": [r[1] for r in rows], "ph": [r[2] for r in rows]},
                        schema={"cat": pl.Categorical, "name": pl.Categorical, "ph": pl.Categorical})


@pytest.mark.parametrize("flags_from", [0, 10**9])  # the flags, then the join
def test_every_rule_gives_its_device_and_kind(monkeypatch, flags_from):
    monkeypatch.setattr(classify_module, "FLAGS_FROM", flags_from)
    out = classify(_raw(CASES))
    assert out.schema["device"] == pl.Categorical and out.schema["kind"] == pl.Categorical
    assert out.select(pl.col("device", "kind").cast(pl.String)).rows() == [(d, k) for *_, d, k in CASES]
    assert device_kind(out) == "mtia"
    assert unknown_categories(out) == {"strange_cat": 1}


def test_flags_and_join_agree_on_a_shipped_rank(monkeypatch):
    frame, meta = parse_trace_file(REPO / "traces" / "sample-fsdp-2r" / "rank0.json.gz")
    raw = frame.drop("device", "kind")
    monkeypatch.setattr(classify_module, "FLAGS_FROM", 0)
    flagged = classify(raw)
    monkeypatch.setattr(classify_module, "FLAGS_FROM", 10**9)
    joined = classify(raw)
    assert flagged.equals(joined) and flagged.schema == joined.schema
    assert flagged["kind"].cast(pl.String).n_unique() >= 5  # a real mix of kinds, not one label
    assert meta["unknown_categories"] == {}

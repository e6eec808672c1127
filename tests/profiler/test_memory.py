"""Memory: the allocated-bytes timeline from [memory] events, its peaks, and run.json's sizes."""

from __future__ import annotations

import polars as pl

from profiler import memory_peaks, memory_timeline, persistent_memory
from tests.profiler.conftest import make_events, step


def mem(ts: float, delta: int, total: int, *, device_type: int = 1, device_id: int = 0, reserved: int = 1000) -> dict:
    return dict(name="[memory]", kind="memory_event", ph="i", cat="cpu_instant_event", ts_us=ts, dur_us=0, mem_bytes=delta,
                mem_total_allocated_bytes=total, mem_total_reserved_bytes=reserved, mem_device_type=device_type,
                mem_device_id=device_id)


EVENTS = make_events([
    step(1, 0, 100), step(2, 100, 100),
    mem(10, 100, 100), mem(20, 300, 400, reserved=2000), mem(150, -200, 200), mem(160, 500, 700, reserved=3000),
    mem(30, 64, 64, device_type=0, device_id=0), mem(40, -64, 0, device_type=0, device_id=0),
    dict(name="aten::mm", kind="op", ts_us=5, dur_us=10),
])


def test_timeline_per_device_with_steps():
    tl = memory_timeline(EVENTS)
    cuda = tl.filter(pl.col("mem_device") == "cuda:0")
    assert cuda.select("ts_us", "delta_bytes", "allocated_bytes", "step").rows() == [
        (10.0, 100, 100, 1), (20.0, 300, 400, 1), (150.0, -200, 200, 2), (160.0, 500, 700, 2)]
    assert tl.filter(pl.col("mem_device") == "cpu")["allocated_bytes"].to_list() == [64, 0]


def test_peaks_say_when():
    peaks = memory_peaks(memory_timeline(EVENTS))
    rows = {r["mem_device"]: r for r in peaks.iter_rows(named=True)}
    assert (rows["cuda:0"]["peak_allocated_bytes"], rows["cuda:0"]["peak_ts_us"], rows["cuda:0"]["peak_step"]) == (700, 160.0, 2)
    assert rows["cuda:0"]["peak_reserved_bytes"] == 3000 and rows["cuda:0"]["n_events"] == 4
    assert (rows["cpu"]["peak_allocated_bytes"], rows["cpu"]["peak_ts_us"]) == (64, 30.0)


def test_no_memory_events_is_an_empty_timeline():
    tl = memory_timeline(make_events([step(1, 0, 10)]))
    assert tl.is_empty() and "allocated_bytes" in tl.columns
    assert memory_peaks(tl).is_empty()


def test_persistent_memory_from_run_json():
    runs = {
        "a": {"ranks": [{"rank": 0, "memory": {"params_bytes": 10, "params_at_rest_bytes": 5, "grads_bytes": 5,
                                               "optimizer_bytes": 20, "max_memory_allocated_bytes": None}},
                        {"rank": 1}]},  # no memory block: left out
        "foreign": None,
    }
    p = persistent_memory(runs)
    assert p.select("run", "rank", "params_bytes", "optimizer_bytes", "max_memory_allocated_bytes").rows() == [("a", 0, 10, 20, None)]


def test_rocm_memory_events_are_the_gpu():
    # ROCm records its GPU's allocations with Device Type 6 (HIP); torch calls that device cuda:<id>.
    tl = memory_timeline(make_events([step(1, 0, 100), mem(10, 100, 100, device_type=6, device_id=2),
                                      mem(20, 8, 8, device_type=19), mem(30, 8, 8, device_type=42)]))
    assert sorted(set(tl["mem_device"])) == ["cuda:2", "device42", "mtia:0"]


def test_rocm_memory_on_a_real_mi300_trace():
    from profiler import load_traces
    from tests.conftest import SHARED_TRACES

    ev = load_traces(SHARED_TRACES / "single" / "mi300_timesformer_memory.json.gz").events
    peaks = memory_peaks(memory_timeline(ev))
    assert sorted(peaks["mem_device"]) == ["cpu", "cuda:0"]
    assert peaks.filter(pl.col("mem_device") == "cuda:0")["n_events"].item() == 1302  # Device Type 6 events in the file

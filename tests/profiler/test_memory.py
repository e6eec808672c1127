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


def test_the_floor_is_the_level_every_step_comes_back_down_to():
    # cuda:0 starts at 0 (100 - 100) in step 1, but step 2 never goes below 200: the floor is 200.
    rows = {r["mem_device"]: r for r in memory_peaks(memory_timeline(EVENTS)).iter_rows(named=True)}
    assert (rows["cuda:0"]["floor_allocated_bytes"], rows["cpu"]["floor_allocated_bytes"]) == (200, 0)
    # A device holding 64 MiB all along (cuBLAS's workspace) that frees 30 B first: the level before
    # that free is no floor; the lowest level is after it.
    base = 64 << 20
    held = make_events([step(1, 0, 100), mem(10, -30, base + 970), mem(20, 500, base + 1470), mem(30, -600, base + 870)])
    (row,) = memory_peaks(memory_timeline(held)).iter_rows(named=True)
    assert (row["floor_allocated_bytes"], row["peak_allocated_bytes"]) == (base + 870, base + 1470)
    # A first event that allocates: the level before it is the floor.
    first = make_events([step(1, 0, 100), mem(10, 40, base + 40), mem(20, -10, base + 30)])
    assert memory_peaks(memory_timeline(first))["floor_allocated_bytes"].to_list() == [base]
    # One step's dip (DDP frees and remakes a 500 B bucket in step 2) is no floor: steps 1 and 3
    # never go below base + 1000.
    dip = make_events([step(1, 0, 100), step(2, 100, 100), step(3, 200, 100),
                       mem(10, 300, base + 1300), mem(20, -300, base + 1000),
                       mem(110, -500, base + 500), mem(120, 500, base + 1000), mem(130, 300, base + 1300),
                       mem(210, -300, base + 1000)])
    assert memory_peaks(memory_timeline(dip))["floor_allocated_bytes"].to_list() == [base + 1000]
    # Events outside any step: the span's lowest level.
    loose = make_events([mem(10, 300, base + 1300), mem(20, -300, base + 1000)])
    assert memory_peaks(memory_timeline(loose))["floor_allocated_bytes"].to_list() == [base + 1000]


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

"""Temporal breakdown and overlap: tiny hand-computed frames, then HTA itself on a real trace."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import comm_compute_overlap, load_traces, temporal_breakdown
from profiler.steps import profiler_steps
from tests.conftest import SHARED_TRACES
from tests.profiler.conftest import GPU_NCCL, kernel, launch, make_events, step


# One step [0, 100). GPU: compute [10, 30) and [25, 40) -> union 30; comm [35, 60) -> 25,
# of which [35, 40) under compute; memcpy [70, 80); window = 10..80 = 70.
GPU_RANK = [
    step(1, 0, 100),
    launch(1, 1), launch(2, 2), launch(3, 3), launch(4, 4),
    kernel("gemm", "compute", 10, 20, 1),
    kernel("gemm2", "compute", 25, 15, 2, stream=8),
    kernel("ncclKernel_AllReduce", "comm", 35, 25, 3, stream=9),
    kernel("Memcpy HtoD", "memory", 70, 10, 4),
]
# Step [0, 100). Main thread ops [0, 40) and [60, 90), the enqueue [20, 25) inside the first:
# compute = 40 - 5 + 30 = 65. gloo span on its own thread [22, 70): overlap with compute is
# [25, 40) + [60, 70) = 25, comm 48, exposed 23. idle = 100 - (65 + 23) = 12.
CPU_RANK = [
    step(1, 0, 100),
    dict(name="aten::mm", kind="op", ts_us=0, dur_us=40),
    dict(name="c10d::allreduce_", kind="enqueue", ts_us=20, dur_us=5),
    dict(name="aten::add", kind="op", ts_us=60, dur_us=30),
    dict(name="gloo:all_reduce", kind="comm", cat="user_annotation", tid=2, ts_us=22, dur_us=48),
]


def test_a_functional_collectives_wait_is_communication_not_compute():
    """A tp+sp gloo rank waits for its collectives in `_c10d_functional::wait_tensor` on the main
    thread: counted as compute, its 180 ms hid the communication under it (73 % "hidden", trial).
    Step [0, 100): mm [0, 30), the wait [30, 90) while gloo's span runs [30, 90) on its thread:
    compute 30, comm 60, all of it exposed."""
    from profiler.classify import classify

    row = temporal_breakdown(classify(make_events([  # kinds as the loader gives them, by classify's rules
        step(1, 0, 100),
        dict(name="aten::mm", kind=None, ts_us=0, dur_us=30),
        dict(name="_c10d_functional::wait_tensor", kind=None, ts_us=30, dur_us=60),
        dict(name="gloo:all_reduce", kind=None, cat="user_annotation", tid=2, ts_us=30, dur_us=60),
    ]))).row(0, named=True)
    assert (row["compute_us"], row["comm_us"], row["overlap_us"], row["exposed_comm_us"]) == (30, 60, 0, 60)


def test_gpu_breakdown_by_hand():
    row = temporal_breakdown(make_events(GPU_RANK)).row(0, named=True)
    assert row["window_us"] == 70
    assert row["compute_us"] == 30
    assert row["non_compute_us"] == 20 + 10  # comm not under compute + memcpy
    assert row["idle_us"] == 70 - 30 - 30
    assert (row["comm_us"], row["overlap_us"], row["exposed_comm_us"]) == (25, 5, 20)
    assert row["overlap_pct"] == pytest.approx(20.0)


def test_gpu_kernels_launched_outside_steps_are_left_out():
    # Two steps (HTA's condition for this filter): b's launch follows the last step, c's is not in
    # the trace (launched before profiling began); only a counts.
    ev = make_events([step(1, 0, 10), step(2, 10, 10), launch(1, 1), launch(50, 2),
                      kernel("a", "compute", 2, 4, 1), kernel("b", "compute", 60, 100, 2), kernel("c", "compute", -20, 10, 3)])
    assert temporal_breakdown(ev)["window_us"].item() == 4


# One step [0, 10): a launched inside it, b launched after it, c launched before profiling began
# (its launch is not in the trace). HTA filters none of them when a trace has fewer than two
# ProfilerSteps: window -20..160 = 180, compute 4 + 100 + 10 = 114, idle 66.
SINGLE_STEP = [launch(1, 1), launch(50, 2), kernel("a", "compute", 2, 4, 1), kernel("b", "compute", 60, 100, 2),
               kernel("c", "compute", -20, 10, 3)]


def test_single_step_trace_keeps_activity_launched_outside_it():
    row = temporal_breakdown(make_events([step(1, 0, 10), *SINGLE_STEP])).row(0, named=True)
    assert (row["window_us"], row["compute_us"], row["idle_us"]) == (180, 114, 66)
    per_step = temporal_breakdown(make_events([step(1, 0, 10), *SINGLE_STEP]), per_step=True)
    assert per_step.select("step", "window_us").rows() == [(1, 180)]


def test_trace_without_steps_keeps_activity_launched_outside_it():
    row = temporal_breakdown(make_events(SINGLE_STEP)).row(0, named=True)
    assert (row["window_us"], row["compute_us"], row["idle_us"], row["has_profiler_steps"]) == (180, 114, 66, False)


def test_selecting_one_step_of_several_keeps_the_launch_filter():
    # `analyze --step 1` hands assign_steps one step of a two-step trace: the rule counts the
    # trace's ProfilerSteps, not the selection's.
    ev = make_events([step(1, 0, 10), step(2, 10, 10), *SINGLE_STEP])
    steps = profiler_steps(ev).filter(pl.col("step") == 1)
    assert temporal_breakdown(ev, steps=steps)["window_us"].item() == 4


def test_cpu_breakdown_by_hand():
    row = temporal_breakdown(make_events(CPU_RANK)).row(0, named=True)
    assert row["device"] == "cpu"
    assert (row["window_us"], row["compute_us"], row["comm_us"]) == (100, 65, 48)
    assert (row["overlap_us"], row["exposed_comm_us"], row["non_compute_us"], row["idle_us"]) == (25, 23, 23, 12)


def test_gpu_and_cpu_ranks_in_one_frame_each_get_their_accounting():
    ev = pl.concat([make_events(GPU_RANK, rank=0), make_events(CPU_RANK, rank=1)])
    rows = {r["rank"]: r for r in temporal_breakdown(ev).iter_rows(named=True)}
    assert (rows[0]["device"], rows[0]["window_us"], rows[0]["compute_us"], rows[0]["comm_us"], rows[0]["overlap_us"]) == ("gpu", 70, 30, 25, 5)
    assert (rows[1]["device"], rows[1]["window_us"], rows[1]["compute_us"], rows[1]["comm_us"], rows[1]["overlap_us"]) == ("cpu", 100, 65, 48, 25)


def test_cpu_gloo_spans_on_the_main_thread_leave_its_compute():
    # Pipelines: gloo records send/recv on the main thread (tid 1, the one with ProfilerStep), while
    # collectives run on worker threads (tid 2) whose operators are part of the collective.
    # compute = [0, 40) + [50, 80) = 70; comm = [42, 70) + [85, 95) = 38, overlap [50, 70) = 20,
    # exposed 18; idle = 100 - 70 - 18 = 12.
    ev = make_events([
        step(1, 0, 100),
        dict(name="aten::mm", kind="op", ts_us=0, dur_us=40),
        dict(name="c10d::send", kind="enqueue", ts_us=40, dur_us=2),
        dict(name="gloo:send", kind="comm", cat="user_annotation", ts_us=42, dur_us=28),
        dict(name="aten::mm", kind="op", ts_us=50, dur_us=30),
        dict(name="gloo:all_reduce", kind="comm", cat="user_annotation", tid=2, ts_us=85, dur_us=10),
        dict(name="aten::add", kind="op", tid=2, ts_us=86, dur_us=4),
    ])
    row = temporal_breakdown(ev).row(0, named=True)
    assert (row["compute_us"], row["comm_us"], row["overlap_us"], row["exposed_comm_us"]) == (70, 38, 20, 18)
    assert (row["non_compute_us"], row["idle_us"], row["window_us"]) == (18, 12, 100)


def test_per_step_rows_split_at_step_boundaries():
    ev = make_events([
        step(1, 0, 50), step(2, 50, 50),
        dict(name="gloo:all_reduce", kind="comm", tid=2, ts_us=40, dur_us=20),  # straddles the boundary
        dict(name="aten::mm", kind="op", ts_us=0, dur_us=100),
    ])
    per_step = temporal_breakdown(ev, per_step=True).sort("step")
    assert per_step["comm_us"].to_list() == [10, 10]
    assert per_step["overlap_us"].to_list() == [10, 10]


def test_no_profiler_step_is_one_window():
    ev = make_events([dict(name="aten::mm", kind="op", ts_us=5, dur_us=10), dict(name="aten::add", kind="op", ts_us=30, dur_us=5)])
    row = temporal_breakdown(ev).row(0, named=True)
    assert row["has_profiler_steps"] is False
    assert (row["window_us"], row["compute_us"], row["idle_us"]) == (30, 15, 15)


def test_overlap_is_the_breakdowns_overlap():
    ev = make_events([step(1, 0, 100), dict(name="aten::mm", kind="op", ts_us=0, dur_us=50),
                      dict(name="gloo:all_reduce", kind="comm", tid=2, ts_us=25, dur_us=50)])
    row = comm_compute_overlap(ev).row(0, named=True)
    assert (row["comm_us"], row["overlap_us"], row["overlap_pct"]) == (50, 25, 50.0)


def test_matches_hta_on_gpu_nccl_2_of_128(hta_gpu_nccl):
    ours = temporal_breakdown(load_traces(GPU_NCCL).events).sort("rank")
    joined = ours.join(hta_gpu_nccl, on="rank", suffix="_hta")
    assert joined.height == 2
    for row in joined.iter_rows(named=True):
        window = row["window_us_hta"]
        for c in ("compute_us", "non_compute_us", "idle_us"):
            assert abs(row[c] - row[f"{c}_hta"]) <= 0.005 * window, (row["rank"], c, row[c], row[f"{c}_hta"])
        assert abs(row["overlap_pct"] - row["overlap_pct_hta"]) <= 0.5, (row["rank"], row["overlap_pct"], row["overlap_pct_hta"])


@pytest.mark.parametrize("name", ["v100_rank1_of_2", "v100_nccl_memory_rank1", "a100_rank3_of_8", "nccl_args_rank0_of_2",
                                  "v100_ns_resolution_rank0", "mi300_timesformer_memory", "torch18_v100_resnet50_rank0",
                                  "mi250_rocm_single", "a100_cudagraphs_rank0_of_16"])
def test_matches_hta_on_single_rank_gpu_traces(name, tmp_path):
    # HTA's numbers computed here; v100_rank1_of_2 has kernels launched before profiling began,
    # which HTA leaves out of every step (so does assign_steps). mi300 has one ProfilerStep: HTA
    # then keeps every kernel (so do we). torch18 is the torch 1.8 format ("stream 7" tids).
    from profiler.hta import hta_breakdown

    src = SHARED_TRACES / "single" / f"{name}.json.gz"
    traces = load_traces(src)
    rank = traces.ranks["rank"][0]
    hta = hta_breakdown({rank: src})
    events = traces.events
    if (events["ts_us"] % 1 != 0).any():
        # ns-resolution trace (nccl_args): HTA rounds every event inward to whole µs (ts up, end
        # down: its trace_parser.round_down_time_stamps), which adds up to 2 µs of idle per kernel
        # (0.52 % of the window over 3,804 kernels). We keep the exact times; compare like for like.
        events = _hta_rounded(events)
    row = temporal_breakdown(events).join(hta, on="rank", suffix="_hta").row(0, named=True)
    window = row["window_us_hta"]
    for c in ("window_us", "compute_us", "non_compute_us", "idle_us"):
        assert abs(row[c] - row[f"{c}_hta"]) <= 0.005 * window, (name, c, row[c], row[f"{c}_hta"])
    if row["overlap_pct_hta"] is None:  # no communication kernels: neither has an overlap
        assert row["overlap_pct"] is None, (name, row["overlap_pct"])
    else:
        assert abs(row["overlap_pct"] - row["overlap_pct_hta"]) <= 0.5, (name, row["overlap_pct"], row["overlap_pct_hta"])


def test_torch18_matches_htas_published_numbers():
    # ../shared/traces/README.md: HTA 0.5.0's breakdown of this file (include_last_profiler_step=True).
    # Before torch 1.8's "stream 7" tids were read, every GPU event was dropped and the rank was
    # analysed as CPU (compute 838,326 µs, idle 164).
    row = temporal_breakdown(load_traces(SHARED_TRACES / "single" / "torch18_v100_resnet50_rank0.json.gz").events).row(0, named=True)
    hta = {"compute_us": 594868, "non_compute_us": 19545, "idle_us": 187137}
    window = sum(hta.values())
    assert row["device"] == "gpu" and abs(row["window_us"] - window) <= 0.005 * window
    for c, v in hta.items():
        assert abs(row[c] - v) <= 0.005 * window, (c, row[c], v)


def test_mtia_matches_hta():
    # Meta MTIA: device activity in `mtia_ccp_events`, one ProfilerStep, ns timestamps. HTA 0.5.0
    # (pandas 2.3, include_last_profiler_step=True) on this file: window 13,328,071 µs, compute
    # 7,305,597, non-compute 372,998, idle 5,649,476 (not recomputed here: HTA takes ~10 s on it).
    # Compared under HTA's rules, i.e. with its rounding to whole µs. The rest of the difference:
    # 137 DMA requests recorded without a stream, which HTA leaves out and we count as memory.
    row = temporal_breakdown(_hta_rounded(load_traces(SHARED_TRACES / "single" / "mtia_rank0.json.gz").events)).row(0, named=True)
    hta = {"window_us": 13328071, "compute_us": 7305597, "non_compute_us": 372998, "idle_us": 5649476}
    assert row["device"] == "gpu"
    for c, v in hta.items():
        assert abs(row[c] - v) <= 0.005 * hta["window_us"], (c, row[c], v)


def _hta_rounded(events: pl.DataFrame) -> pl.DataFrame:
    # HTA's trace_parser.round_down_time_stamps: start up, end down to whole µs.
    events = events.with_columns(ts_us=pl.col("ts_us").ceil(), end_us=pl.col("end_us").floor())
    return events.with_columns(dur_us=(pl.col("end_us") - pl.col("ts_us")).clip(0))


def kernel_on(gpu: int, *args, **kw) -> dict:
    return {**kernel(*args, **kw), "pid": gpu}


# One process driving two GPUs (torch.nn.DataParallel): its trace holds both GPUs' kernels under
# one rank, pid = the GPU's index. GPU 0 computes [10, 30), GPU 1 [40, 60) while GPU 0 is idle:
# swept together they would read as one GPU computing 40 of 55 µs, a device that does not exist.
TWO_GPUS = [
    step(1, 0, 100),
    launch(1, 1), launch(2, 2), launch(3, 3),
    kernel_on(0, "ncclDevKernel_Broadcast", "comm", 5, 4, 3),
    kernel_on(0, "gemm", "compute", 10, 20, 1),
    kernel_on(1, "gemm", "compute", 40, 20, 2),
]


def test_a_rank_driving_two_gpus_gets_no_breakdown_and_is_named():
    from profiler.breakdown import multi_gpu_ranks

    two = make_events(TWO_GPUS)
    one = make_events(GPU_RANK, rank=1)  # an ordinary one-GPU rank beside it keeps its numbers
    events = pl.concat([two, one])
    assert multi_gpu_ranks(events).select("rank", "gpus").rows() == [(0, 2)]
    assert multi_gpu_ranks(one).is_empty()
    for per_step in (False, True):
        b = temporal_breakdown(events, per_step=per_step)
        assert b["rank"].to_list() == [1] and b["compute_us"].to_list() == [30]
        assert temporal_breakdown(two, per_step=per_step).is_empty()  # refused, not one made-up GPU


def test_analyze_refuses_the_gpu_timeline_of_a_multi_gpu_process_with_a_warning(tmp_path):
    import json

    from profiler import analyze, load_traces
    from profiler.text import format_tables

    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 9, "tid": 9, "ts": 1000, "dur": 100},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 9, "tid": 9, "ts": 1001, "dur": 5}]
    # DataParallel's parameter broadcast (torch.cuda.comm: an NCCL kernel, no c10d op) then a gemm per GPU
    kernels = [("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 0, 1004), ("gemm", 0, 1010),
               ("gemm", 1, 1040)]
    for corr, (name, gpu, ts) in enumerate(kernels, start=1):
        ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": 1001 + corr,
                "dur": 1, "args": {"correlation": corr}},
               {"ph": "X", "cat": "kernel", "name": name, "pid": gpu, "tid": 7, "ts": ts, "dur": 5 if corr == 1 else 20,
                "args": {"correlation": corr, "device": gpu, "stream": 7}}]
    doc = {"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    a = analyze(load_traces(tmp_path))
    assert a.breakdown.is_empty() and a.breakdown_steps.is_empty() and a.exposed.is_empty()
    (warning,) = [w for w in a.warnings if "GPUs" in w]
    assert "rank 0: one process driving 2 GPUs" in warning and "not supported yet" in warning
    assert a.collectives.height == 1  # per-kernel numbers stay: the broadcast, the gemms
    assert "gemm" in a.top_kernels["name"].cast(pl.String).to_list()
    assert "one process driving 2 GPUs" in format_tables(a)


def test_a_gpu_that_starts_late_in_the_step_is_a_warning():
    # single/mi300: the GPU's first kernel starts ~269 ms into a 391 ms ProfilerStep, so HTA's
    # window (first to last GPU activity) is 121 ms and its idle ~1 ms; the report says what the
    # window leaves out. Numbers from the trace's JSON, independently of the loader.
    import gzip
    import json

    from profiler import analyze, load_traces
    from tests.conftest import SHARED_TRACES

    path = SHARED_TRACES / "single" / "mi300_timesformer_memory.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    (step,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    window = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    assert 120e3 < window < 122e3 and 390e3 < step["dur"] < 391e3
    a = analyze(load_traces(path, progress=False))
    (w,) = [w for w in a.warnings if "was active, first to last" in w]
    assert w.startswith(f"run single: the GPU of rank 0 was active, first to last, in 121 ms of its 391 ms of profiled "
                        f"steps ({100 * window / step['dur']:.1f} %)")
    assert f"leaves out the {(step['dur'] - window) / 1e3:.0f} ms before the GPU's first work or after its last" in w
    # a GPU busy through its steps: no such warning
    assert not [w for w in analyze(load_traces(SHARED_TRACES / "gpu_nccl_2_of_128", progress=False)).warnings
                if "was active, first to last" in w]


def _late_case(window_us: float, *, stepped: bool = True, kind: str = "cuda", tail_us: float = 0.0):
    from profiler.report import late_device_warnings, late_devices

    key = {"run": ["r"], "rank": [3]}
    breakdown = pl.DataFrame({**key, "device": ["gpu"], "window_us": [window_us], "idle_us": [1000.0]})
    steps = pl.DataFrame({"run": ["r"] * 2, "rank": [3, 3], "step": [1, 2], "dur_us": [50_000.0] * 2,
                          "has_profiler_steps": [stepped] * 2})
    tails = pl.DataFrame({**key, "step": [2], "tail_us": [tail_us], "dur_us": [50_000.0]})
    ranks = pl.DataFrame({**key, "device_kind": [kind]})
    return late_device_warnings(late_devices(breakdown, steps, tails, ranks))


def test_the_late_device_warning_starts_under_three_quarters_of_the_steps():
    # two steps of 50 ms: a window of 74 ms is 74 % (warned), 76 ms is 76 % (not)
    (w,) = _late_case(74_000.0)
    assert w.startswith("run r: the GPU of rank 3 was active, first to last, in 74.0 ms of its 100 ms of profiled steps (74.0 %)")
    assert "so its idle (1.00 ms) leaves out the 26.0 ms before the GPU's first work or after its last" in w
    assert _late_case(76_000.0) == []
    # said of a trace without ProfilerSteps and of an MTIA device in their own words
    (w,) = _late_case(40_000.0, stepped=False, kind="mtia")
    assert "the MTIA device of rank 3" in w and "of its 100 ms of trace (no ProfilerStep: one window)" in w
    # a trace cut short (its last step runs 10 ms past its last event, > 5 %): that warning says it, not this one
    assert _late_case(40_000.0, tail_us=10_000.0) == []

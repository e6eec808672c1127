"""`ptprof project`: FLOPs of recorded shapes, the self-projection of the shipped samples onto
the cluster they were measured on, the calibrated cluster's round trip, and the CLI's errors.
No new `ptprof run`: the shipped traces/sample-* and hand-made traces."""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from profiler.cli_whatif import project_main
from profiler.cluster import load_cluster
from profiler.project import project_details
from profiler.project_measure import calibrate, measure_run
from profiler.workload import trace_ops

SAMPLES = Path(__file__).resolve().parents[2] / "traces"


def _op(name, ts, dur, dims, types, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Input Dims": dims, "Input type": types}}


def test_flops_of_hand_made_ops(tmp_path):
    events = [
        _op("aten::mm", 0, 10, [[4, 8], [8, 16]], ["float", "float"]),  # 2·4·8·16 = 1024
        _op("aten::addmm", 20, 10, [[16], [4, 8], [8, 16]], ["float", "float", "float"]),  # 1024
        _op("aten::bmm", 40, 10, [[2, 4, 8], [2, 8, 16]], ["float", "float"]),  # 2·2·4·8·16 = 2048
        # linear [3, 4, 8] x W[16, 8]: 2·12·8·16 = 3072; its mm inside is not counted again
        _op("aten::linear", 60, 20, [[3, 4, 8], [16, 8], [16]], ["float", "float", "float"]),
        _op("aten::mm", 62, 10, [[12, 8], [8, 16]], ["float", "float"]),
        # a backward wrapper passes the count to its mm: 2·8·12·16 = 3072
        _op("MmBackward0", 90, 20, [], []),
        _op("aten::mm", 92, 10, [[8, 12], [12, 16]], ["float", "float"]),
        # memory-bound: (32 + 32) float inputs read + 32 written = 96 x 4 B = 384 B
        _op("aten::add", 120, 5, [[4, 8], [4, 8], []], ["float", "float", "Scalar"]),
        # a view: no work
        _op("aten::view", 130, 1, [[4, 8], []], ["float", "ScalarList"]),
        # SDPA q, k, v [1, 2, 16, 8]: 4·1·2·16·16·8 = 16384; its CPU flash kernel inside not counted
        _op("aten::scaled_dot_product_attention", 140, 30, [[1, 2, 16, 8]] * 3, ["float"] * 3),
        _op("aten::_scaled_dot_product_flash_attention_for_cpu", 141, 28, [[1, 2, 16, 8]] * 3, ["float"] * 3),
    ]
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    ops = trace_ops(path)
    assert ops["name"].to_list() == ["aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::mm", "aten::add",
                                     "aten::scaled_dot_product_attention"]
    assert ops["flops"].to_list()[:5] == [1024.0, 1024.0, 2048.0, 3072.0, 3072.0]
    assert ops["flops"][6] == 16384.0
    assert ops["bytes"][5] == 384.0 and ops["klass"][5] == "memory"


@pytest.fixture(scope="module")
def works():
    return {p: measure_run(SAMPLES / f"sample-{p}-2r", workers=1) for p in ("ddp", "fsdp", "1f1b", "zbv", "ring")}


@pytest.mark.parametrize("paradigm", ["ddp", "fsdp", "1f1b", "zbv", "ring"])
def test_projection_onto_its_own_cluster_returns_its_measured_step(works, paradigm):
    # the test: a cluster equal to the one the run was measured on gives back its step (10 %)
    work = works[paradigm]
    d = project_details(work.run_dir, calibrate(work), work=work)
    step, measured = d["estimate"].step_s, d["measured_step_s"]
    assert measured > 0 and abs(step / measured - 1) < 0.10
    assert abs(sum(d["estimate"].breakdown_s.values()) - step) < 1e-9 * step
    assert d["estimate"].layout == d["own_layout"]
    # most of ddp's and 1f1b's compute time has its work known from shapes; fsdp's ~26 %: FSDP2's hooks
    # and DTensor's dispatch are Python, not aten ops
    assert {"ddp": 70, "fsdp": 20, "1f1b": 70, "zbv": 40, "ring": 30}[paradigm] < d["coverage"]["known_pct"] <= 100
    # both sides the same statistic: the slowest rank's mean over the profiled steps
    windows = work.steps.group_by("rank").agg(pl.col("window_us").mean())["window_us"]
    assert d["measured_step_s"] == pytest.approx(windows.max() * 1e-6)


def test_faster_cluster_gives_faster_compute(works):
    import dataclasses
    work = works["ddp"]
    cal = calibrate(work)
    fast = dataclasses.replace(cal, peak_tflops=cal.peak_tflops * 10, hbm_gbps=cal.hbm_gbps * 10)
    base = project_details(work.run_dir, cal, work=work)["estimate"].breakdown_s["compute"]
    assert project_details(work.run_dir, fast, work=work)["estimate"].breakdown_s["compute"] == pytest.approx(base / 10)


def test_save_cluster_round_trip(works, tmp_path, capsys):
    out = tmp_path / "cal.json"
    run = str(SAMPLES / "sample-ddp-2r")
    assert project_main([run, "--cluster", run, "--save-cluster", str(out)]) == 0
    text = capsys.readouterr().out
    assert "measured" in text and "predicted step" in text
    assert max(map(len, text.splitlines())) <= 100
    loaded, cal = load_cluster(str(out)), calibrate(works["ddp"])
    # the calibrated rates, plus a note of the host time project carried over ("other", which plan
    # on this file leaves out)
    assert replace(loaded, notes=loaded.notes[:-1]) == cal
    other_s = project_details(run, cal, work=works["ddp"])["estimate"].breakdown_s["other"]
    assert 1e-3 < other_s < 10e-3  # the README's 3.86 ms of 18 ms
    assert loaded.notes[-1].startswith(f"host time per step of the calibration run: {other_s * 1e3:.3g} ms")
    assert "ptprof plan on this file leaves it out" in loaded.notes[-1]
    js = tmp_path / "p.json"
    assert project_main([run, "--cluster", str(out), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert doc["schema"] == "ptprof.projection/1" and doc["estimate"]["step_s"] > 0


def _error(argv, capsys) -> str:
    assert project_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    return err


def test_cli_errors(tmp_path, capsys):
    run = str(SAMPLES / "sample-ddp-2r")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    shutil.copy(SAMPLES / "sample-ddp-2r" / "rank0.json.gz", foreign / "rank0.json.gz")
    assert "no run.json" in _error([str(foreign), "--cluster", "h100"], capsys)
    nodims = tmp_path / "nodims"
    shutil.copytree(SAMPLES / "sample-ddp-2r", nodims)
    manifest = json.loads((nodims / "run.json").read_text())
    del manifest["model"]["d_model"]
    (nodims / "run.json").write_text(json.dumps(manifest))
    assert "model.d_model" in _error([str(nodims), "--cluster", "h100"], capsys)
    assert "no-such-gpu" in _error([run, "--cluster", "no-such-gpu"], capsys)
    assert "does not divide" in _error([run, "--cluster", "h100", "--layout", "dp=3"], capsys)
    assert "heads" in _error([run, "--cluster", "h100", "--layout", "dp=1,tp=8"], capsys)
    assert "--nodes 1" in _error([run, "--cluster", "h100", "--nodes", "1", "--layout", "dp=2,tp=4,pp=2"], capsys)


def _gpu_run(tmp_path) -> Path:
    """A hand-made one-GPU run: per step an aten::mm launching a 400 µs kernel and an aten::add
    launching a 100 µs one, on an H100."""
    bf16 = ["c10::BFloat16", "c10::BFloat16"]
    events, corr = [], 0
    for step, t0 in ((2, 0), (3, 2000)):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": t0, "dur": 1000})
        for name, ts, k_ts, k_dur in (("aten::mm", 10, 100, 400), ("aten::add", 70, 510, 100)):
            corr += 1
            events.append(_op(name, t0 + ts, 50 if name == "aten::mm" else 20, [[4096, 4096], [4096, 4096]], bf16))
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": t0 + ts + 5, "dur": 5, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": f"kernel_{name}", "pid": 0, "tid": 7, "ts": t0 + k_ts,
                           "dur": k_dur, "args": {"correlation": corr, "stream": 7, "device": 0}})
    run = tmp_path / "gpu-run"
    run.mkdir()
    doc = {"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}],
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
    (run / "rank0.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    manifest = json.loads((SAMPLES / "sample-ddp-2r" / "run.json").read_text())
    manifest.update(run_id="gpu-run", world_size=1, mesh={"dp": 1}, backend="nccl", device="cuda",
                    ranks=manifest["ranks"][:1], device_name="NVIDIA H100 80GB HBM3")
    (run / "run.json").write_text(json.dumps(manifest))
    return run


def test_gpu_trace_uses_kernel_times(tmp_path):
    import dataclasses
    work = measure_run(_gpu_run(tmp_path), workers=1)
    assert sorted(work.ops["dur_us"].to_list()) == [100.0, 100.0, 400.0, 400.0]  # kernels, not the CPU ops
    own = calibrate(work)
    assert "H100" in own.name and own.peak_tflops == load_cluster("h100").peak_tflops
    d = project_details(work.run_dir, own, work=work)
    # the GPU window: kernels from 100 to 610 µs, 500 µs of them compute
    assert d["measured_step_s"] == pytest.approx(510e-6)
    assert d["estimate"].step_s == pytest.approx(510e-6)
    fast = dataclasses.replace(own, peak_tflops=own.peak_tflops * 2, hbm_gbps=own.hbm_gbps * 2)
    # kernel time x (roofline there / roofline on its own H100) = half; the 10 µs gap is carried over
    assert project_details(work.run_dir, fast, work=work)["estimate"].step_s == pytest.approx(260e-6)


def test_layouts_of_the_samples_runs():
    from profiler.layout import Layout
    from profiler.project import run_layout, run_spec

    def own(p):
        m = json.loads((SAMPLES / f"sample-{p}-2r" / "run.json").read_text())
        return run_layout(m, run_spec(m))

    assert own("ddp") == Layout(dp=2, microbatch=4)  # 8 sequences over 2 replicas
    assert own("fsdp") == Layout(dp=2, zero=3, microbatch=4)
    assert own("1f1b") == Layout(pp=2, schedule="1f1b", microbatch=2, microbatches=4)
    assert own("zbv") == Layout(pp=2, schedule="zero-bubble", microbatch=2, microbatches=4)
    assert own("ring") == Layout(cp=2, microbatch=8)
    # hybrid's dp is fully_shard with reshard_after_forward=pp == 1 (runners/hybrid.py): ZeRO-2 beside a
    # pipeline, as analyze's memory table says (it said zero=3: trial)
    hybrid = json.loads((SAMPLES / "sample-fsdp-2r" / "run.json").read_text())
    hybrid.update(paradigm="hybrid", world_size=4, mesh={"dp": 2, "pp": 2},
                  pipeline={"ranks": 2, "microbatches": 4, "schedule": "1f1b"})
    assert run_layout(hybrid, run_spec(hybrid)).zero == 2
    hybrid.update(world_size=2, mesh={"dp": 2}, pipeline=None)
    assert run_layout(hybrid, run_spec(hybrid)).zero == 3


def test_another_layout_scales_the_cost_model_by_the_trace(works):
    work = works["ddp"]
    cal = calibrate(work)
    own = project_details(work.run_dir, cal, work=work)["estimate"]
    # ZeRO-1 computes what DDP computes: the model's compute, scaled by trace / model for the run's
    # own layout, is the trace-driven compute
    z1 = project_details(work.run_dir, cal, work=work, layout="dp=2,zero=1")["estimate"]
    assert z1.layout.zero == 1 and z1.layout.microbatch == 4
    assert z1.breakdown_s["compute"] == pytest.approx(own.breakdown_s["compute"], rel=1e-9)
    assert z1.breakdown_s["other"] == pytest.approx(own.breakdown_s["other"])  # host time carried over
    assert any("compute_scale" in a for a in z1.assumptions)
    # one definition of the scale (both terms on the target), not the cost model's "on the source run" too
    assert not any("on the source run" in a for a in z1.assumptions)


def test_link_fit_recovers_alpha_beta():


    from profiler.project_measure import fit_link

    # all-reduce over 2 ranks: 2(n-1) = 2 latency steps, traffic 2(n-1)/n x size = size.
    # α = 50 µs, bw = 1 GB/s: 1 MB takes 2·50 + 1000 = 1100 µs, 2 MB 2100 µs at best (the 2500 µs
    # call waited for a late peer). A receive of 0.5 MB: 1 step + 500 µs = 550 µs at best.
    colls = pl.DataFrame({"collective": ["all_reduce", "all_reduce", "all_reduce", "recv", "recv"],
                          "size_bytes": [1_000_000, 2_000_000, 2_000_000, 500_000, 500_000],
                          "group_size": [2, 2, 2, 2, 2], "dur_us": [1100.0, 2100.0, 2500.0, 550.0, 9000.0]})
    link, how = fit_link(colls)
    assert link.latency_us == pytest.approx(50.0, rel=1e-6)
    assert link.bw_gbps == pytest.approx(1.0, rel=1e-6)
    assert "least squares" in how
    # one size: α and β not separable; with a bandwidth prior of 2 GB/s, 1 MB moves in 500 µs and
    # the 2 latency steps take the other 600 µs: α = 300 µs; without one, α = 0 and bw = 1 MB / 1.1 ms
    one = colls.head(1)
    link, how = fit_link(one, bw_prior_gbps=2.0)
    assert (link.bw_gbps, link.latency_us) == (2.0, pytest.approx(300.0))
    link, how = fit_link(one)
    assert link.latency_us == 0.0 and link.bw_gbps == pytest.approx(1e6 / 1100e-6 / 1e9)


def test_dtensor_dispatch_and_functional_waits(tmp_path):
    f = ["float", "float"]
    events = [
        # DTensor: the outer add_ (40 µs) dispatches the real one (10 µs) inside PythonSubclass
        _op("aten::add_", 0, 40, [[64], [64]], f),
        _op("PythonSubclass", 2, 36, [], []),
        _op("aten::add_", 5, 10, [[64], [64]], f),
        # tensor parallel: an add (100 µs) that waits 70 µs for its all-reduce inside
        _op("aten::add", 50, 100, [[64], [64]], f),
        _op("_c10d_functional::wait_tensor", 60, 70, [[64]], ["float"]),
    ]
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    ops = trace_ops(path)
    assert ops.select("name", "klass", "dur_us").rows() == [
        ("aten::add_", "memory", 10.0), ("aten::add", "memory", 30.0), ("_c10d_functional::wait_tensor", "wait", 70.0)]


def test_a_run_without_shapes_is_refused(tmp_path, capsys):
    run = tmp_path / "noshapes"
    shutil.copytree(SAMPLES / "sample-ddp-2r", run)
    for f in run.glob("rank*.json.gz"):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for e in doc["traceEvents"]:
            (e.get("args") or {}).pop("Input Dims", None)
        f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert "record_shapes" in _error([str(run), "--cluster", "h100"], capsys)


def test_files_written_are_named_and_an_empty_cluster_is_said_empty(works, tmp_path, capsys):
    run, cal, js = str(SAMPLES / "sample-ddp-2r"), tmp_path / "cal.json", tmp_path / "p.json"
    assert project_main([run, "--cluster", "h100", "--save-cluster", str(cal), "--json", str(js)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [f"cluster: {cal}", f"projection: {js}"] and cal.exists() and js.exists()
    # Path("") is the current folder: it was read as a run folder ("no run.json" in ".")
    assert _error([run, "--cluster", ""], capsys) == ("ptprof project: error: --cluster '': empty; give a preset "
                                                      "(a100, b200, h100, h200, mi300x), a .toml/.json cluster file or a run folder")


def test_wave_quantization_is_claimed_only_with_an_sm_count(works):
    work = works["ddp"]
    cpu = project_details(work.run_dir, calibrate(work), work=work)["estimate"].assumptions[0]
    assert "without wave quantization (no SM count: a CPU or an unknown GPU)" in cpu
    h100 = project_details(work.run_dir, load_cluster("h100"), work=work)["estimate"].assumptions[0]
    assert "with wave quantization over 132 SMs" in h100  # H100 SXM5: 132 SMs (NVIDIA H100 whitepaper)


def test_json_dash_is_the_projection_alone_on_stdout(capsys, tmp_path):
    run = str(SAMPLES / "sample-ddp-2r")
    assert project_main([run, "--cluster", "h100", "--json", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    assert project_main([run, "--cluster", "h100", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((tmp_path / "p.json").read_text())


def test_a_copied_run_is_calibrated_under_its_folders_name(tmp_path):
    # as ptprof analyze names it: the copy "before", not run.json's run_id of the run it was copied from
    from tests.conftest import REPO

    shutil.copytree(REPO / "traces" / "sample-ddp-2r", tmp_path / "before")
    work = measure_run(tmp_path / "before")
    assert work.run_id == "before" and json.loads((tmp_path / "before" / "run.json").read_text())["run_id"] == "sample-ddp-2r"
    assert calibrate(work).name == "measured:before"


def test_ulysses_all_to_alls_are_the_cp_groups_communication():
    """Theory names Ulysses' rows "sp"; project took them for Megatron's sequence parallelism, on
    the tp group: a Ulysses run's all-to-alls read `comm_exposed:tp` beside `layout cp=2`, and were
    placed by tp's stride (trial)."""
    from types import SimpleNamespace

    from profiler.project import comm_rows, run_layout, run_spec

    m = json.loads((SAMPLES / "sample-ring-2r" / "run.json").read_text())
    m["paradigm"] = "ulysses"
    lay = run_layout(m, run_spec(m))
    assert lay.cp == 2 and not lay.sp
    rows, why = comm_rows(SimpleNamespace(manifest=m), lay)
    assert why is None and set(rows["dim"]) == {"cp"}
    assert rows.filter(pl.col("collective") == "all_to_all").height > 0


def test_a_pipelines_host_time_inside_its_actions_is_said_with_its_share(works):
    """A gpipe run projected a 1.04 ms bubble beside 0.11 ms of compute, unexplained (trial): the
    replay keeps each action's host time (its span beyond its ops). The assumption gives that
    share, here summed by hand over the actions and the ops starting inside them."""
    import re

    work = works["1f1b"]
    d = project_details(work.run_dir, calibrate(work), work=work)
    (line,) = [a for a in d["estimate"].assumptions if a.startswith("pipeline: the schedule's order replayed")]
    got = int(re.search(r"here (\d+) % of the actions' measured time is such host time", line).group(1))
    ops = work.ops.select("rank", "ts_us", "dur_us").rows()
    span = inside = 0.0
    for rank, start, end, dur in work.actions.select("rank", "start_us", "end_us", "dur_us").rows():
        span += dur
        inside += min(dur, sum(d_ for r, t, d_ in ops if r == rank and start <= t < end))
    assert got == round(100 * (1 - inside / span))
    assert 10 < got < 90

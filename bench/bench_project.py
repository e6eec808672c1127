"""Validation (b) of `ptprof project` on this machine (issue 15; README "How good are the predictions").

    python bench/bench_project.py --cpu [--repeats 3] [--paradigms zero1,zero2,fsdp,tp,1f1b,gpipe,ep]

Profiles `ptprof run ddp --gpus 2` (gloo ranks on the CPU) `--repeats` times, calibrates the CPU
"cluster" from the first ddp run (op throughput from its ops, gloo α–β from its collectives:
profiler.project.calibrate_cluster), then runs every other paradigm at 2 ranks `--repeats` times
and predicts each run's measured step on that cluster two ways (and again from the first run of
each other `--calibrate-from` paradigm: a ddp run has one message size, which cannot separate
gloo's per-call latency α from its bandwidth; an fsdp run has several):

- trace: the run's own trace projected onto the ddp-calibrated cluster (its ops re-timed with the
  ddp run's throughput, its communication under the ddp run's α–β: `ptprof project RUN --cluster DDP_RUN`);
- layout: the ddp run projected to the paradigm's layout (`ptprof project DDP_RUN --cluster DDP_RUN
  --layout ...`: the analytical cost model scaled by the ddp run's trace-driven compute).
Runs already in `--out` (a folder of an earlier bench) are reused.

Error = predicted / measured - 1, the mean over the repeats per paradigm. Other work on the machine
shares its cores, so timings are noisy. (A separate file from bench_whatif.py, whose section (a)
another part of issue 15 writes, to keep the two apart.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from profiler.project import project_details  # noqa: E402
from profiler.project_measure import calibrate, measure_run  # noqa: E402

# --layout of each paradigm for the analytical (layout) prediction from the ddp run; None: not mappable
LAYOUTS = {"ddp": "dp=2", "zero1": "dp=2,zero=1", "zero2": "dp=2,zero=2", "fsdp": "dp=2,zero=3", "tp": "tp=2",
           "1f1b": "pp=2,schedule=1f1b,m=4", "gpipe": "pp=2,schedule=gpipe,m=4", "ep": None, "ring": "cp=2",
           "ulysses": "cp=2", "zbv": None}


def run_once(paradigm: str, out: Path, name: str, steps: int, active: int) -> Path:
    """One `ptprof run PARADIGM --gpus 2` on gloo CPU ranks; its folder."""
    cmd = [sys.executable, "-m", "runners.cli", "run", paradigm, "--gpus", "2", "--device", "cpu", "--steps", str(steps),
           "--warmup", "1", "--active", str(active), "--out", str(out), "--name", name]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip().splitlines()[-1:]}")
    return out / name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", required=True, help="section (b): this machine's CPU ranks")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paradigms", default="zero1,zero2,fsdp,tp,1f1b,gpipe,ep,ring")
    ap.add_argument("--calibrate-from", default="ddp,fsdp",
                    help="paradigms whose first run is a calibration source, each with its own table (default ddp,fsdp)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--active", type=int, default=3)
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-project-"))
    sources = [p for p in args.calibrate_from.split(",") if p]
    paradigms = list(dict.fromkeys(["ddp", *sources, *(p for p in args.paradigms.split(",") if p)]))
    runs = {p: [out / f"{p}-{i}" if (out / f"{p}-{i}" / "run.json").is_file()
                else run_once(p, out, f"{p}-{i}", args.steps, args.active) for i in range(args.repeats)]
            for p in paradigms}
    for source in sources:
        base = measure_run(runs[source][0])
        cluster = calibrate(base)
        print(f"\nCalibrated from {runs[source][0].name}: peak {cluster.peak_tflops * 1e3:.2f} GFLOP/s, memory-bound "
              f"{cluster.hbm_gbps:.2f} GB/s, link {cluster.intra.bw_gbps:.3f} GB/s + {cluster.intra.latency_us:.0f} µs.\n")
        print("| paradigm | runs | measured ms | trace ms | trace error % | layout ms | layout error % |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        errs: dict[str, list[float]] = {"trace": [], "layout": []}
        for paradigm in paradigms:
            todo = runs[paradigm][1:] if paradigm == source else runs[paradigm]
            if not todo:
                continue
            meas, pred, lay = [], [], []
            for run in todo:
                d = project_details(str(run), cluster)
                meas.append(d["measured_step_s"])
                pred.append(d["estimate"].step_s)
                spec = LAYOUTS.get(paradigm)
                if spec:
                    try:
                        lay.append(project_details(str(runs[source][0]), cluster, layout=spec, work=base)["estimate"].step_s)
                    except ValueError as err:
                        print(f"  {paradigm}: layout {spec}: {err}")
            m, p = statistics.mean(meas), statistics.mean(pred)
            err = statistics.mean(q / r - 1 for q, r in zip(pred, meas))
            errs["trace"].append(abs(err))
            cells = f"{m * 1e3:.2f} | {p * 1e3:.2f} | {100 * err:+.1f}"
            if lay:
                lay_err = statistics.mean(q / r - 1 for q, r in zip(lay, meas))
                errs["layout"].append(abs(lay_err))
                cells += f" | {statistics.mean(lay) * 1e3:.2f} | {100 * lay_err:+.1f}"
            else:
                cells += " | - | -"
            print(f"| {paradigm} | {len(todo)} | {cells} |")
        print("\nmean |error|: " + ", ".join(f"{k} {100 * statistics.mean(v):.1f} % over {len(v)} paradigms"
                                           for k, v in errs.items() if v))
    print(f"\nruns in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

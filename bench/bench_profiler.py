"""Time `load + all analyses` in ptprof against HTA's load + temporal breakdown + overlap.

    .venv/bin/python bench/bench_profiler.py                 # 8 ranks x ~100 MB, built once in /tmp
    .venv/bin/python bench/bench_profiler.py --ranks 2 --mb 20   # a quick one

The trace set is built by scaling a real trace (../shared/traces/single/v100_nccl_memory_rank1:
V100, NCCL, [memory] events): its events are repeated back to back, each copy shifted by the
trace's span and given fresh correlation ids, until the JSON reaches --mb; each rank gets its own
copy with its `distributedInfo.rank`. Each tool runs in a fresh process (ptprof with an empty cache,
so it parses everything) and its peak RSS is the largest sum over its process tree, sampled every
50 ms (HTA and ptprof both parse ranks in worker processes).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import psutil

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "traces" / "single" / "v100_nccl_memory_rank1.json.gz"

PTPROF = """
import sys
from profiler import load_traces, analyze
a = analyze(load_traces(sys.argv[1], cache=False, progress=False))
print(a.breakdown.select("rank", "compute_us", "idle_us", "overlap_pct"))
"""
HTA = """
import sys, logging, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
print(ta.get_temporal_breakdown(visualize=False)[["rank", "compute_time(us)", "idle_time(us)"]])
print(ta.get_comm_comp_overlap(visualize=False))
"""


def build_trace_set(out: Path, ranks: int, mb: float) -> Path:
    """Scaled copies of SOURCE as out/rank<R>.json.gz (skipped when already there)."""
    if out.is_dir() and len(list(out.glob("rank*.json.gz"))) == ranks:
        return out
    out.mkdir(parents=True, exist_ok=True)
    doc = orjson.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc["traceEvents"]
    is_work = [e.get("ph") != "M" and isinstance(e.get("pid"), int) for e in events]
    work = [e for e, w in zip(events, is_work) if w]
    meta = [e for e, w in zip(events, is_work) if not w]
    ts = [e["ts"] for e in work if "ts" in e]
    span = max(ts) - min(ts) + 1000
    copies = max(1, round(mb * 1e6 / len(orjson.dumps(doc))))
    corr_step = 10 ** (len(str(max((e.get("args", {}).get("correlation", 0) for e in work), default=0))) + 1)
    scaled = list(meta)
    for c in range(copies):
        for e in work:
            e2 = dict(e, ts=e["ts"] + c * span)
            args = e.get("args")
            if args and ("correlation" in args or "External id" in args):
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += c * corr_step
                e2["args"] = args
            if "id" in e2 and isinstance(e2["id"], int):
                e2["id"] += c * corr_step
            scaled.append(e2)
    for r in range(ranks):
        body = dict(doc, traceEvents=scaled, distributedInfo={"backend": "nccl", "rank": r, "world_size": ranks})
        (out / f"rank{r}.json.gz").write_bytes(gzip.compress(orjson.dumps(body), compresslevel=1))
    print(flush=True)
    print(f"built {ranks} ranks x {len(orjson.dumps(body)) / 1e6:.0f} MB JSON ({copies} copies of {SOURCE.name}) in {out}")
    return out


def measure(code: str, folder: Path, cache_dir: str) -> tuple[float, float, str]:
    """(wall seconds, peak RSS of the process tree in MB, stdout) of `python -c code folder`."""
    env = {"PTPROF_CACHE_DIR": cache_dir, "PATH": "/usr/bin:/bin"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=env)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    stop.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"failed:\n{err[-3000:]}")
    return wall, peak / 2**20, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--mb", type=float, default=100, help="uncompressed JSON per rank (MB)")
    p.add_argument("--dir", type=Path, default=None, help="where the scaled trace set lives (default /tmp/ptprof-bench-R-MB)")
    args = p.parse_args()
    folder = build_trace_set(args.dir or Path(tempfile.gettempdir()) / f"ptprof-bench-{args.ranks}-{int(args.mb)}", args.ranks, args.mb)
    with tempfile.TemporaryDirectory() as cache:
        ours_s, ours_mb, ours_out = measure(PTPROF, folder, cache)
    hta_s, hta_mb, hta_out = measure(HTA, folder, "")
    print(ours_out, hta_out, sep="\n")
    print(f"ptprof  load + all analyses         {ours_s:7.1f} s   peak RSS {ours_mb:7.0f} MB")
    print(f"HTA     load + breakdown + overlap  {hta_s:7.1f} s   peak RSS {hta_mb:7.0f} MB")
    print(f"speed-up {hta_s / ours_s:.1f}x   memory {ours_mb / hta_mb:.2f} of HTA's")


if __name__ == "__main__":
    main()

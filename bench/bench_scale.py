"""How `ptprof analyze` scales with ranks and bytes: wall, CPU, peak RSS against the parse floor.

    .venv/bin/python bench/bench_scale.py                        # 8, 64, 256, 1,024 ranks x 1 and 10 MB, + Dask
    .venv/bin/python bench/bench_scale.py --ranks 8,64 --mb 1    # a quick one
    .venv/bin/python bench/bench_scale.py --markdown scale.md    # also the table as Markdown (README)

Trace sets: bench_profiler's scaled V100/NCCL trace (`build_trace_set`: the real trace's events
repeated and cut at --mb of JSON per rank, each rank under its own distributedInfo.rank), built
once as /tmp/ptprof-scale-R-MB/ and reused.

For each set, each a fresh process (bench_profiler's `measure`: wall, CPU of the process tree,
peak RSS of the tree sampled every 50 ms):
  cold   `python -m profiler analyze SET --json FILE --quiet` with an empty PTPROF_CACHE_DIR
         (every file hashed, parsed, cached, its per-rank summary made), the local engine;
  warm   the same with the cache the cold run left;
  floor  the least any reader must do: gunzip + JSON decode of every file, each parsed then
         dropped, on a 2-process pool, wall time (isal's gunzip and orjson.loads where installed,
         else gzip and msgspec.json.decode: the note under the table names them), timed inside
         this already started process;
  floor command  the same floor as a command of its own (`python -c`, timed by `measure` as
         `ptprof analyze` is): Python's start and the floor's imports included, which any
         command pays and which the in-process floor leaves out (~0.05 s: at 8 x 1 MB the floor
         itself is ~0.08 s, and importing polars and numpy alone takes ~0.24 s).
--repeat N measures cold, warm and the floor command N times each (a fresh cache for each cold
run) and reports the medians.
Goals (issue 16): cold within 3x the floor at every size (time linear in bytes, the per-rank fixed
cost a few ms) and peak RSS flat, at most 2 GB at 1,024 ranks.

Dask (--dask-ranks, default 64): the same cold and warm with `--cluster ADDRESS` on a
`distributed.LocalCluster(n_workers=2, threads_per_worker=1)` started for the set in a process of
its own (scheduler in it, two worker processes under its nanny), sharing the cache folder with the
client. The measured tree is the analyze client plus that whole cluster (its CPU during the run;
its RSS, idle baseline included: the cluster's idle RSS is printed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_profiler import REPO, build_trace_set, measure  # noqa: E402  (the same scaled traces and timer)

GOAL_FLOOR_RATIO = 3.0
GOAL_RSS_MB = 2048
GOAL_RSS_RANKS = 1024

CLUSTER = """
import sys
from distributed import LocalCluster
if __name__ == "__main__":
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    print(cluster.scheduler_address, flush=True)
    sys.stdin.read()  # until the bench closes our stdin
    cluster.close()
"""


def _floor_tools():
    """The fastest gunzip and JSON-to-Python decoder installed: isal and orjson, else the stdlib's gzip / msgspec."""
    try:
        from isal.igzip import decompress
    except ImportError:
        from gzip import decompress
    try:
        from orjson import loads
    except ImportError:
        from msgspec.json import decode as loads
    return decompress, loads


# _floor_tools and _parse_one, restated so that the command imports only what the floor needs.
FLOOR_COMMAND = """
import multiprocessing, sys
from pathlib import Path
try:
    from isal.igzip import decompress
except ImportError:
    from gzip import decompress
try:
    from orjson import loads
except ImportError:
    from msgspec.json import decode as loads

def parse_one(path):
    raw = decompress(Path(path).read_bytes())
    loads(raw)
    return len(raw)

files = sorted(str(p) for p in Path(sys.argv[1]).glob("rank*.json.gz"))
with multiprocessing.get_context("fork").Pool(2) as pool:
    print(sum(pool.imap_unordered(parse_one, files, chunksize=1)))
"""


def _parse_one(path: str) -> int:
    decompress, loads = _floor_tools()
    raw = decompress(Path(path).read_bytes())
    loads(raw)  # every object and string built, then dropped
    return len(raw)


def parse_floor(folder: Path, workers: int = 2) -> tuple[float, float, int]:
    """(wall s, CPU s, JSON bytes) of gunzip + JSON decode of every file on a `workers`-process pool."""
    files = sorted(str(p) for p in folder.glob("rank*.json.gz"))
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        total = sum(pool.imap_unordered(_parse_one, files, chunksize=1))
        pool.close()
        pool.join()  # reaped, so their CPU is in RUSAGE_CHILDREN
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), total


def _checked(out_json: Path, ranks: int) -> None:
    report = json.loads(out_json.read_text())
    seen = sum(len(run["ranks"]) for run in report["runs"])
    if seen != ranks:
        raise SystemExit(f"{out_json}: the report has {seen} ranks of {ranks}: the timing would not be of the whole set")


def run_analyze(folder: Path, ranks: int, cache: str, extra: list[str] = (), also=()) -> tuple[float, float, float]:
    out_json = Path(cache) / "report.json"
    argv = ["-m", "profiler", "analyze", str(folder), "--json", str(out_json), "--quiet", *extra]
    wall, cpu, rss, _, _ = measure(None, folder, cache, argv=argv, also=list(also), pss=False)
    _checked(out_json, ranks)
    out_json.unlink()
    return wall, cpu, rss


def start_cluster(cache: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PTPROF_CACHE_DIR": cache, "PYTHONPATH": str(REPO),
           "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "error"}
    # Its stderr goes to a file: the shutdown's closed-connection tracebacks are noise, a failed
    # start's message is shown.
    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, cwd=REPO, env=env)
    address = proc.stdout.readline().strip()
    if not address.startswith("tcp://"):
        proc.kill()
        err.seek(0)
        raise SystemExit(f"the LocalCluster did not start (it printed {address!r}):\n{err.read()[-3000:]}")
    return proc, address


def stop_cluster(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _tree_rss_mb(proc: psutil.Process) -> float:
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def _median(runs: list[tuple]) -> tuple:
    """The run of median wall time (its CPU and RSS with it)."""
    return sorted(runs)[len(runs) // 2]


def floor_command(folder: Path, json_bytes: int) -> tuple[float, float]:
    """(wall s, CPU s) of the floor as a command of its own (FLOOR_COMMAND), timed by `measure`."""
    with tempfile.TemporaryDirectory(prefix="ptprof-scale-floor-") as scratch:
        wall, cpu, _, out, _ = measure(FLOOR_COMMAND, folder, scratch, pss=False)
    if int(out.split()[-1]) != json_bytes:
        raise SystemExit(f"{folder}: the floor command read {out.split()[-1]} bytes, not {json_bytes}")
    return wall, cpu


def bench_set(folder: Path, ranks: int, mb: float, dask: bool, repeat: int = 1) -> dict:
    floor, floor_cpu, json_bytes = parse_floor(folder)
    row = {"ranks": ranks, "mb": mb, "json_mb": json_bytes / 1e6, "floor": floor, "floor_cpu": floor_cpu}
    print(f"  floor {floor:.2f} s, CPU {floor_cpu:.2f} s ({json_bytes / 1e6:,.0f} MB of JSON)", flush=True)
    row["floor_cmd"] = _median([floor_command(folder, json_bytes) for _ in range(repeat)])
    print(f"  floor command {row['floor_cmd'][0]:.2f} s, CPU {row['floor_cmd'][1]:.2f} s", flush=True)
    colds, warms = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="ptprof-scale-cache-") as cache:
            colds.append(run_analyze(folder, ranks, cache))
            print(f"  cold  {colds[-1][0]:.2f} s, CPU {colds[-1][1]:.2f} s, {colds[-1][2]:,.0f} MB", flush=True)
            warms.append(run_analyze(folder, ranks, cache))
            print(f"  warm  {warms[-1][0]:.2f} s, CPU {warms[-1][1]:.2f} s, {warms[-1][2]:,.0f} MB", flush=True)
    row["cold"], row["warm"] = _median(colds), _median(warms)
    if dask:
        with tempfile.TemporaryDirectory(prefix="ptprof-scale-cache-") as cache:
            proc, address = start_cluster(cache)
            try:
                cluster = psutil.Process(proc.pid)
                time.sleep(1)
                row["cluster_idle_mb"] = _tree_rss_mb(cluster)
                for key in ("dask_cold", "dask_warm"):
                    row[key] = run_analyze(folder, ranks, cache, ["--cluster", address], also=[cluster])
                    print(f"  {key.replace('_', ' ')} {row[key][0]:.1f} s, CPU {row[key][1]:.1f} s, "
                          f"{row[key][2]:,.0f} MB (idle cluster {row['cluster_idle_mb']:,.0f} MB)", flush=True)
            finally:
                stop_cluster(proc)
    return row


def fixed_cost(rows: list[dict]) -> list[str]:
    """Per-rank fixed cost: seconds = a·ranks + b·bytes + c, least squares over the sets (wall and CPU)."""
    import numpy as np

    lines = []
    # Three unknowns: at least three sets, with both the rank count and the size varying.
    if len(rows) >= 3 and len({r["mb"] for r in rows}) >= 2 and len({r["ranks"] for r in rows}) >= 2:
        x = np.array([[r["ranks"], r["json_mb"], 1.0] for r in rows])
        series = {"cold wall": [r["cold"][0] for r in rows], "cold CPU": [r["cold"][1] for r in rows],
                  "warm wall": [r["warm"][0] for r in rows], "warm CPU": [r["warm"][1] for r in rows],
                  "floor wall": [r["floor"] for r in rows], "floor CPU": [r["floor_cpu"] for r in rows]}
        for label, y in series.items():
            (a, b, c), *_ = np.linalg.lstsq(x, np.array(y), rcond=None)
            lines.append(f"fit {label} = {a * 1e3:.1f} ms/rank + {b * 1e3:.2f} s/GB + {c:.1f} s")
    return lines


HEAD = ["ranks", "MB/rank", "JSON MB", "cold wall (CPU)", "warm wall (CPU)", "floor wall (CPU)", "cold/floor wall (CPU)",
        "floor command wall", "cold/floor command", "cold MB/s", "(cold-floor)/rank wall (CPU)", "peak RSS cold / warm", "<= 3x floor (wall / CPU)", "RSS <= 2 GB"]


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        (cw, cc, cr), (ww, wc, wr) = r["cold"], r["warm"]
        ratio = cw / r["floor"]
        rss_ok = "yes" if max(cr, wr) <= GOAL_RSS_MB else "NO"
        cpu_ratio = cc / r["floor_cpu"] if r["floor_cpu"] >= 0.05 else None  # too small to divide by
        out.append([f"{r['ranks']:,}", f"{r['mb']:g}", f"{r['json_mb']:,.0f}", f"{cw:.2f} s ({cc:.2f})",
                    f"{ww:.1f} s ({wc:.1f})", f"{r['floor']:.2f} s ({r['floor_cpu']:.2f})", f"{ratio:.1f}x ({'-' if cpu_ratio is None else f'{cpu_ratio:.1f}x'})",
                    f"{r['floor_cmd'][0]:.2f} s", f"{cw / r['floor_cmd'][0]:.1f}x", f"{r['json_mb'] / cw:,.0f}", f"{(cw - r['floor']) / r['ranks'] * 1e3:.0f} ms ({(cc - r['floor_cpu']) / r['ranks'] * 1e3:.0f})", f"{cr:,.0f} / {wr:,.0f} MB",
                    " / ".join("-" if x is None else "yes" if x <= GOAL_FLOOR_RATIO else "NO" for x in (ratio, cpu_ratio)),
                    rss_ok + ("" if r["ranks"] >= GOAL_RSS_RANKS else " (goal at 1,024)")])
    return out


DASK_HEAD = ["ranks", "MB/rank", "engine", "cold wall (CPU)", "warm wall (CPU)", "peak RSS cold / warm"]


def dask_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        if "dask_cold" not in r:
            continue
        for label, cold, warm in (("local (default: in-process or 2 workers)", r["cold"], r["warm"]),
                                  ("LocalCluster 2x1 (client + cluster)", r["dask_cold"], r["dask_warm"])):
            out.append([f"{r['ranks']:,}", f"{r['mb']:g}", label, f"{cold[0]:.1f} s ({cold[1]:.1f})",
                        f"{warm[0]:.1f} s ({warm[1]:.1f})", f"{cold[2]:,.0f} / {warm[2]:,.0f} MB"])
    return out


def plain(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [head, *rows])


def markdown(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(line) + " |" for line in [head, ["---"] * len(head), *rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="8,64,256,1024", help="comma-separated rank counts (default 8,64,256,1024)")
    p.add_argument("--mb", default="1,10", help="comma-separated MB of JSON per rank (default 1,10)")
    p.add_argument("--dask-ranks", default="64", help="rank counts also run on a 2-worker LocalCluster (default 64)")
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()), help="where the sets live (ptprof-scale-R-MB)")
    p.add_argument("--skip-build", action="store_true", help="use only sets already built (skip the others)")
    p.add_argument("--skip-dask", action="store_true", help="no LocalCluster runs")
    p.add_argument("--markdown", type=Path, metavar="FILE", help="also write the tables as Markdown here")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="cold, warm and the floor command N times each: medians (default 1)")
    args = p.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    mbs = [float(m) for m in args.mb.split(",")]
    dask_ranks = set() if args.skip_dask else {int(r) for r in args.dask_ranks.split(",") if r}

    rows = []
    begin = time.perf_counter()
    for mb in mbs:
        for r in ranks:
            folder = args.root / f"ptprof-scale-{r}-{mb:g}"
            if args.skip_build and len(list(folder.glob("rank*.json.gz"))) != r:
                print(f"{r} ranks x {mb:g} MB: not built ({folder}), skipped", flush=True)
                continue
            t0 = time.perf_counter()
            build_trace_set(folder, r, mb)
            print(f"{r:,} ranks x {mb:g} MB ({folder}, ready in {time.perf_counter() - t0:.0f} s)", flush=True)
            rows.append(bench_set(folder, r, mb, r in dask_ranks, max(1, args.repeat)))
    if not rows:
        raise SystemExit("no trace set to measure")
    load = os.getloadavg()
    note = (f"{os.cpu_count()} cores; load average at the end {load[0]:.1f} (others' jobs show up as wall above CPU); "
            f"the whole bench took {time.perf_counter() - begin:.0f} s")
    gunzip, loads = _floor_tools()
    note += f"; floor = {gunzip.__module__}.{gunzip.__name__} + {loads.__module__}.{loads.__name__}"
    fits = fixed_cost(rows)
    print()
    print(plain(HEAD, table_rows(rows)))
    if any("dask_cold" in r for r in rows):
        print()
        print(plain(DASK_HEAD, dask_rows(rows)))
        print("  (LocalCluster rows: CPU and RSS of the analyze client plus the whole cluster, idle RSS "
              + ", ".join(f"{r['cluster_idle_mb']:,.0f} MB" for r in rows if "cluster_idle_mb" in r) + ")")
    for line in [*fits, note]:
        print(line)
    if args.markdown:
        parts = [markdown(HEAD, table_rows(rows))]
        if any("dask_cold" in r for r in rows):
            parts.append(markdown(DASK_HEAD, dask_rows(rows)))
        parts.append("\n".join(f"- {line}" for line in [*fits, note]))
        args.markdown.write_text("\n\n".join(parts) + "\n")
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()

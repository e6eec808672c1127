"""Time `load + all analyses` in ptprof against HTA's load + temporal breakdown + overlap.

    .venv/bin/python bench/bench_profiler.py                 # 8 ranks x ~100 MB, built once in /tmp
    .venv/bin/python bench/bench_profiler.py --ranks 2 --mb 20   # a quick one

The trace set is built by scaling a real trace (../shared/traces/single/v100_nccl_memory_rank1:
V100, NCCL, [memory] events, 54 MB of JSON): its events are repeated back to back, each copy
shifted by the trace's span and given fresh correlation / External ids, the last copy cut in time
where the JSON reaches --mb; each rank gets the same events under its own `distributedInfo.rank`. Files are written the
way Kineto writes them (one event per line, `"key": value` spacing, distributedInfo before the
events): HTA finds a file's rank with the regex `"rank":\s+(\d+)` line by line, so compact JSON
would make every file rank 0 and HTA would analyze one rank only (the bench checks it saw all).
The cut falls inside a step, whose ProfilerStep span stays whole: the report warns that the trace
was cut short (at 1 MB the set holds one step, longer than its profiled window; README, Odd input).

Each tool runs in a fresh process: ptprof cold (empty parquet cache: parses every file), ptprof
warm (the cache the cold run left), `ptprof analyze` cold as a user runs it (`python -m profiler
analyze SET --json FILE --quiet`: every analysis and the report built and written), ptprof cold
with the C parser off (PTPROF_PURE_PARSER=1:
msgspec only, what a machine without a C compiler gets), then HTA (its default parser; its own
multiprocessing pool).
Wall time, CPU time of the process tree (user + sys, so a busy shared machine shows up as wall
above CPU) and peak memory, sampled every 50 ms as the largest sum over the process tree of RSS
and of PSS. Each row is two runs: times and RSS from one that samples RSS only, PSS from a second
that samples both (reading PSS slows the measured processes: `measure`). RSS counts a page once
per process that maps it: ptprof's parent and two workers each map polars' 50 MB library, so
their RSS sum counts it three times. PSS (proportional set
size, /proc/PID/smaps_rollup) splits each shared page between the processes that map it: the
tree's PSS sum is the memory it really holds. For one process (HTA's parent) the two are close.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import psutil

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "traces" / "single" / "v100_nccl_memory_rank1.json.gz"

PTPROF = """
import sys
from profiler import load_traces, analyze
a = analyze(load_traces(sys.argv[1], progress=False))
print(a.breakdown.select("rank", "compute_us", "idle_us", "overlap_pct"))
print("NUMBERS", a.breakdown.select("rank", "window_us", "compute_us", "idle_us", "overlap_pct").write_json())
"""
HTA = """
import sys, logging, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
print(tb[["rank", "compute_time(us)", "idle_time(us)"]])
print(ov)
print("HTA_RANKS", len(tb))
out = tb.merge(ov, on="rank")[["rank", "kernel_time(us)", "compute_time(us)", "idle_time(us)", "comp_comm_overlap_pctg"]]
out.columns = ["rank", "window_us", "compute_us", "idle_us", "overlap_pct"]
print("NUMBERS", out.to_json(orient="records"))
"""


def _kineto_head(header: dict, rank: int, world: int) -> bytes:
    """A trace file's start as Kineto writes it: header fields one per line, up to the events."""
    head = {k: v for k, v in header.items() if k not in ("distributedInfo", "traceEvents")}
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(f'  "distributedInfo": {json.dumps({"backend": "nccl", "rank": rank, "world_size": world})},')
    lines.append('  "traceEvents": [')
    return ("\n".join(lines) + "\n  ").encode()


def _kineto_body(event_lines: list[str]) -> bytes:
    """The rest of the file: one event per line, then the closing brackets."""
    return (",\n  ".join(event_lines) + "\n  ]\n}\n").encode()


def build_trace_set(out: Path, ranks: int, mb: float) -> Path:
    """Scaled copies of SOURCE as out/rank<R>.json.gz (skipped when already there)."""
    if out.is_dir() and len(list(out.glob("rank*.json.gz"))) == ranks:
        return out
    out.mkdir(parents=True, exist_ok=True)
    doc = msgspec.json.decode(gzip.decompress(SOURCE.read_bytes()))
    events = doc.pop("traceEvents")
    is_work = [e.get("ph") != "M" and isinstance(e.get("pid"), int) for e in events]
    work = [e for e, w in zip(events, is_work) if w]
    meta = [json.dumps(e) for e, w in zip(events, is_work) if not w]
    work.sort(key=lambda e: e.get("ts", 0))
    # Each copy is a further run of iterations: its ProfilerStep#k are renumbered after the last
    # copy's (the same step numbers twice would merge two copies' steps into one span).
    step_ids = [int(e["name"].split("#")[1]) for e in work if str(e.get("name", "")).startswith("ProfilerStep#")]
    n_steps = max(step_ids) - min(step_ids) + 1 if step_ids else 0
    ts = [e["ts"] for e in work if "ts" in e]
    span = max(ts) - min(ts) + 1000
    ids = [a.get(k, 0) for e in work if isinstance(a := e.get("args"), dict) for k in ("correlation", "External id")]
    id_step = 10 ** len(str(max([i for i in ids if isinstance(i, int)], default=0)))
    # Whole copies while they fit, then the first part (in time) of one more, up to --mb.
    lines = list(meta)
    size, target, copies = sum(map(len, meta)), mb * 1e6, 0
    while size < target:
        for e in work:
            e2 = dict(e, ts=e["ts"] + copies * span)
            if copies and str(e.get("name", "")).startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + copies * n_steps}"
            args = e.get("args")
            if args and ("correlation" in args or "External id" in args):
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += copies * id_step
                e2["args"] = args
            if isinstance(e2.get("id"), int):
                e2["id"] += copies * id_step
            lines.append(json.dumps(e2))
            size += len(lines[-1]) + 4
            if size >= target:
                break
        copies += 1
    # Ranks differ only in distributedInfo.rank: the events are compressed once and each file is
    # two gzip members (its own header, then the shared events), which gunzip, Python's gzip,
    # HTA and ptprof read as one stream; 1,024 ranks x 10 MB build in seconds, not minutes.
    body = _kineto_body(lines)
    packed = gzip.compress(body, compresslevel=1)
    for r in range(ranks):
        head = _kineto_head(doc, r, ranks)
        tmp = out / f".rank{r}.json.gz.part"  # renamed when whole: a killed build is redone, never half-used
        tmp.write_bytes(gzip.compress(head, compresslevel=1) + packed)
        tmp.rename(out / f"rank{r}.json.gz")
    text_mb = (len(head) + len(body)) / 1e6
    print(f"built {ranks} ranks x {text_mb:.1f} MB JSON ({len(lines) - len(meta)} events: {copies} copies, the last cut, "
          f"of {SOURCE.name}) in {out}", flush=True)
    return out


def measure(code: str | None, folder: Path, cache_dir: str, extra_env: dict | None = None, *,
            argv: list[str] | None = None, also: list[psutil.Process] = (), pss: bool = True) -> tuple[float, float, float, str, float]:
    """(wall s, CPU s of the process tree, peak RSS of the tree in MB, stdout, peak PSS of the tree
    in MB) of `python -c code folder`,
    or of `python ARGV...` where argv is given. `also`: processes started elsewhere (a Dask cluster's
    scheduler and workers) whose CPU and RSS count with the tree's (their children included).
    pss=False samples RSS only (PSS is then 0): reading /proc/PID/smaps_rollup walks the process's
    page tables under its memory lock every 50 ms, and slowed ptprof's cold 8 x 100 MB run by
    0.3-0.45 s (10-13 %) on 2 cores where sampling RSS alone cost nothing measurable."""
    env = {"PTPROF_CACHE_DIR": cache_dir, "PATH": "/usr/bin:/bin", **(extra_env or {})}
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    others0 = _tree_cpu(also)
    start = time.perf_counter()
    cmd = [sys.executable, *argv] if argv is not None else [sys.executable, "-c", code, str(folder)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    peak = peak_pss = 0
    stop = threading.Event()

    def sample():
        nonlocal peak, peak_pss
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                for other in also:
                    tree += [other, *other.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
                if pss:
                    peak_pss = max(peak_pss, sum(_pss_bytes(p.pid) for p in tree))
            except psutil.Error:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    others1 = _tree_cpu(also)
    stop.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"failed:\n{err[-3000:]}")
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime) + (others1 - others0)
    return wall, cpu, peak / 2**20, out, peak_pss / 2**20


def _pss_bytes(pid: int) -> int:
    """The process's proportional set size (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_cpu(roots) -> float:
    """User + system CPU seconds of these processes and their live children (and the children they reaped)."""
    total = 0.0
    for root in roots:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                c = p.cpu_times()
                total += c.user + c.system + c.children_user + c.children_system
            except psutil.Error:
                pass
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--mb", type=float, default=100, help="uncompressed JSON per rank (MB)")
    p.add_argument("--dir", type=Path, default=None, help="where the scaled trace set lives (default /tmp/ptprof-bench-R-MB)")
    p.add_argument("--skip-hta", action="store_true", help="time ptprof only")
    p.add_argument("--skip-pure", action="store_true", help="skip the cold load with the msgspec parser only")
    args = p.parse_args()
    folder = build_trace_set(args.dir or Path(tempfile.gettempdir()) / f"ptprof-bench-{args.ranks}-{int(args.mb)}", args.ranks, args.mb)
    from profiler import parse as load

    if load._kineto is None:
        print("note: profiler._kineto is not built; every ptprof load below parses with msgspec")
    # Every row is two runs: its times (and RSS) from one without the PSS sampler, its PSS from
    # another with it (measure's pss): the sampler slows what it measures.
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        cold = measure(PTPROF, folder, cache, pss=False)
        warm = measure(PTPROF, folder, cache, pss=False)
        warm = (*warm[:4], measure(PTPROF, folder, cache)[4])
    with tempfile.TemporaryDirectory() as cache:
        cold = (*cold[:4], measure(PTPROF, folder, cache)[4])
    print(cold[3])
    rows += [("ptprof cold (parse, no cache)", cold), ("ptprof warm (parquet cache)", warm)]
    # What a user runs: the command, its report built and written too (more than the code above);
    # it also starts its workers, or its scan of a small set, before its own imports (pool.py).
    rows.append(("ptprof analyze cold (command)", _twice(lambda cache, pss: measure(
        None, folder, cache, argv=["-m", "profiler", "analyze", str(folder), "--json", str(Path(cache) / "report.json"),
                                   "--quiet"], pss=pss))))
    if not args.skip_pure:
        # The same cold load with the C parser switched off: what the C parser buys, in this run.
        rows.append(("ptprof cold, msgspec parser only",
                     _twice(lambda cache, pss: measure(PTPROF, folder, cache, {load.PURE_PARSER_ENV: "1"}, pss=pss))))
    if not args.skip_hta:
        hta = _twice(lambda cache, pss: measure(HTA, folder, "", pss=pss))
        print(hta[3])
        seen = int(hta[3].split("HTA_RANKS")[-1].split()[0])
        if seen != args.ranks:
            raise SystemExit(f"HTA analyzed {seen} of {args.ranks} ranks: the comparison would be unfair")
        rows.append(("HTA (load + breakdown + overlap)", hta))
    print(f"{args.ranks} ranks x {args.mb:.0f} MB JSON, {os.cpu_count()} cores")  # each file is cut at --mb
    for label, (wall, cpu, rss, _, pss) in rows:
        print(f"{label:34s} wall {wall:7.1f} s   cpu {cpu:7.1f} s   peak RSS {rss:7.0f} MB   peak PSS {pss:7.0f} MB")
    if not args.skip_hta:
        for label, (wall, cpu, rss, _, pss) in rows[:-1]:
            print(f"{label:34s} speed-up {hta[0] / wall:5.1f}x wall, {hta[1] / cpu:5.1f}x cpu; "
                  f"memory {rss / hta[2]:.2f} of HTA's (RSS), {pss / hta[4]:.2f} (PSS)")
        # Same numbers, or the speed means nothing: largest difference over ranks.
        ours, theirs = (_numbers(cold[3]), _numbers(hta[3]))
        worst = max(abs(ours[r][c] - theirs[r][c]) / theirs[r]["window_us"] * 100 for r in theirs for c in ("compute_us", "idle_us"))
        worst_ov = max(abs(ours[r]["overlap_pct"] - theirs[r]["overlap_pct"]) for r in theirs)
        print(f"agreement with HTA: compute/idle within {worst:.2f} % of the window, overlap within {worst_ov:.2f} points")


def _twice(run) -> tuple[float, float, float, str, float]:
    """run(cache, pss) in a fresh cache folder twice: times, RSS and stdout of the run without the
    PSS sampler, PSS of the run with it."""
    with tempfile.TemporaryDirectory() as cache:
        timed = run(cache, False)
    with tempfile.TemporaryDirectory() as cache:
        sampled = run(cache, True)
    return (*timed[:4], sampled[4])


def _numbers(stdout: str) -> dict[int, dict]:
    rows = json.loads(stdout.split("NUMBERS", 1)[1].strip().splitlines()[0])
    return {int(r["rank"]): r for r in rows}


if __name__ == "__main__":
    main()

"""Peak RSS of one rank's per-rank analyses, per analysis, in a map worker's own flow (Linux only).

    rm -rf /tmp/ptprof-memcache && PTPROF_CACHE_DIR=/tmp/ptprof-memcache \
        _RJEM_MALLOC_CONF=dirty_decay_ms:50,muzzy_decay_ms:0 MALLOC_MMAP_THRESHOLD_=1048576 POLARS_MAX_THREADS=1 \
        .venv/bin/python bench/bench_rank_memory.py /tmp/ptprof-bench-8-100/rank{0,1,2}.json.gz

Each file goes through `batchmap.summarize_batch` as a worker runs it (parse or read its parquet
entry, analyse, cache the summary; set the allocator variables as `pool._WORKER_ENV` does, or the
numbers are not a worker's), with every analysis that `rankmap.analyze_rank` calls wrapped: the
process's peak RSS (VmHWM, reset through /proc/self/clear_refs) is read around each, so a line
says what RSS was before the analysis, its peak during it and RSS after it, in MB. The line
`analyses` is the whole `analyze_rank` (its peak is the highest of the lines above it); `file`
the whole file. A second run over the same cache reads the entries back (delete the *.summary
files first, or the summaries are served). RSS counts the pages polars frees until its allocator
hands them back (~50 ms), so numbers move by a few MB between runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import profiler.batchmap as batchmap
import profiler.rankmap as rankmap
from profiler.cache import cache_dir, lookup
from profiler.rankmap import MapOptions, RankTask

ANALYSES = ["profiler_steps", "assign_steps", "top_operators", "collectives", "multi_gpu_ranks", "gloo_worker_threads",
            "temporal_breakdowns", "exposed_comm", "pipeline_actions", "memory_timeline", "memory_peaks", "memory_curve",
            "top_kernels", "recompute_time", "activity"]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM"))


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", type=Path, nargs="+", help="Kineto trace files, each summarized alone")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--activity", action="store_true", help="also the viewer's activity bins")
    args = ap.parse_args()
    rows: list[tuple[str, float, float, float]] = []
    seen: list[float] = []  # every peak read (then reset) since the file started

    def reset() -> None:
        seen.append(peak_mb())
        reset_peak()

    def wrap(module, name: str, label: str) -> None:
        fn = getattr(module, name)

        def measured(*a, **k):
            before, start = rss_mb(), len(seen)
            reset()
            try:
                return fn(*a, **k)
            finally:
                reset()
                rows.append((label, before, max(seen[start + 1:]), rss_mb()))

        setattr(module, name, measured)

    for name in ANALYSES:
        wrap(rankmap, name, "  " + name)
    wrap(batchmap, "analyze_rank", "analyses")
    cache = cache_dir()
    for path in args.traces:
        _, ident = lookup(path, cache)
        before = rss_mb()
        reset_peak()
        seen.clear()
        task = RankTask(path=str(path), run="x", manifest=None, cache=str(cache), ident=ident,
                        options=MapOptions(step=args.step, activity=args.activity))
        got = batchmap.summarize_batch([task])[0]
        rows.append((f"file {path.name}" + ("" if isinstance(got, rankmap.RankSummary) else f" ({got})"),
                     before, max([*seen, peak_mb()]), rss_mb()))
        for label, b, p, a in rows:
            print(f"{label:40s} before {b:6.0f}  peak {p:6.0f}  after {a:6.0f}")
        rows.clear()


if __name__ == "__main__":
    main()

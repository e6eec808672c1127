"""Time the viewer's Compare page for two 8-rank runs, and the bytes its timeline sends, at two
trace sizes.

    .venv/bin/python bench/bench_viewer.py                   # 8 ranks, ~42 and ~84 MB JSON per rank
    .venv/bin/python bench/bench_viewer.py --ranks 2 --sizes 42   # a quick one

Each size builds (once, in /tmp) two runs of 8 ranks with bench_profiler's scaled V100/NCCL trace
(GPU streams, NCCL kernels, [memory] events; whole copies of a 42 MB trace, so sizes round to
multiples of 42 MB), then, in this process with an empty parse cache:

- cold: every Compare callback for the two runs (status, timeline, breakdown, steps, pipeline,
  memory, collectives), which includes loading and analyzing both runs;
- warm: the same again, runs cached (what revisiting Compare or changing the selection costs);
- zoom: one timeline re-render for a zoom to 1 % of the time range;
and the JSON bytes of the timeline figure (what Dash sends the browser) for the whole range and
for the zoom, against the number of events drawn from.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from bench_profiler import build_trace_set  # noqa: E402  (the same scaled traces as the profiler's bench)


def make_runs(ranks: int, mb: float) -> Path:
    """<tmp>/ptprof-bench-viewer-R-MB/{run-a,run-b}: run-b hard-links run-a's files (parsed separately)."""
    root = Path(tempfile.gettempdir()) / f"ptprof-bench-viewer-{ranks}-{int(mb)}"
    a = build_trace_set(root / "run-a", ranks, mb)
    b = root / "run-b"
    b.mkdir(exist_ok=True)
    for f in a.glob("rank*.json.gz"):
        if not (b / f.name).exists():
            os.link(f, b / f.name)
    return root


def render_compare(store, pages, run_ids: list[str]) -> dict[str, int]:
    """Every Compare callback's work, as the page does on load; returns payload bytes per output."""
    import plotly.io as pio

    from viewer import data, figures

    c = pages.compare
    runs = store.get_many(run_ids)
    out = {
        "status": c.status_children(store, run_ids),
        "timeline": c.timeline_figure(store, run_ids),
        "breakdown": figures.build_breakdown_figure(data.breakdown_frame(runs), run_ids),
        "steps": figures.build_step_time_figure(data.steps_frame(runs), run_ids),
        "pipeline": figures.build_pipeline_figure(*data.pipeline_frames(runs), run_ids),
        "memory": figures.build_memory_figure(*data.memory_frames(runs), run_ids),
        "persistent": figures.build_persistent_figure(data.persistent_frame(runs), run_ids),
        "collectives": figures.build_collectives_table(*data.collectives_frames(runs)),
    }
    return {k: len(pio.to_json(v)) if hasattr(v, "to_plotly_json") else len(str(v)) for k, v in out.items()}


def bench(root: Path) -> dict:
    os.environ["PTPROF_CACHE_DIR"] = tempfile.mkdtemp(prefix="ptprof-bench-cache-")
    from viewer.app import create_app
    from viewer.pages import STORE_KEY

    app = create_app(root)
    import types

    from viewer.pages import compare

    pages = types.SimpleNamespace(compare=compare)
    store = app.server.config[STORE_KEY]
    run_ids = ["run-a", "run-b"]
    t = time.perf_counter()
    payload = render_compare(store, pages, run_ids)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    render_compare(store, pages, run_ids)
    warm = time.perf_counter() - t
    lo, hi = (min(x) for x in zip(*[(r.timeline()[0]["start_ms"].min(), -r.timeline()[0]["end_ms"].max()) for r in store.get_many(run_ids)]))
    hi = -hi
    zoom = {"xaxis.range[0]": lo + (hi - lo) * 0.5, "xaxis.range[1]": lo + (hi - lo) * 0.51}
    t = time.perf_counter()
    zoomed = compare.timeline_figure(store, run_ids, zoom)
    zoom_s = time.perf_counter() - t
    n_events = sum(r.traces.events.height for r in store.get_many(run_ids))
    n_drawn = sum(r.timeline()[0].height for r in store.get_many(run_ids))
    return dict(cold=cold, warm=warm, zoom=zoom_s, timeline_bytes=payload["timeline"], zoom_bytes=len(zoomed.to_json()),
                total_bytes=sum(payload.values()), events=n_events, drawn=n_drawn)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--sizes", type=float, nargs="+", default=[42, 84], help="uncompressed JSON per rank (MB), one bench each")
    args = p.parse_args()
    rows = []
    for mb in args.sizes:
        root = make_runs(args.ranks, mb)
        # A fresh process per size: each starts from an empty app, store and parse cache.
        import subprocess

        res = subprocess.run([sys.executable, __file__, "--one", str(root)], capture_output=True, text=True, cwd=REPO)
        if res.returncode != 0:
            raise SystemExit(res.stderr[-3000:])
        rows.append((mb, eval(res.stdout.strip().splitlines()[-1])))  # a dict literal we printed ourselves
    print(f"\nCompare, 2 runs x {args.ranks} ranks (seconds; payload = JSON sent to the browser)")
    print(f"{'MB/rank':>8} {'events':>11} {'drawn':>11} {'cold s':>8} {'warm s':>8} {'zoom s':>8} "
          f"{'timeline KB':>12} {'zoomed KB':>10} {'page KB':>8}")
    for mb, r in rows:
        print(f"{mb:8.0f} {r['events']:11,d} {r['drawn']:11,d} {r['cold']:8.2f} {r['warm']:8.2f} {r['zoom']:8.2f} "
              f"{r['timeline_bytes'] / 1e3:12.0f} {r['zoom_bytes'] / 1e3:10.0f} {r['total_bytes'] / 1e3:8.0f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(bench(Path(sys.argv[2])))
    else:
        main()

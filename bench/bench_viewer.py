"""Time the viewer's Compare page for two runs, and the bytes it sends, at two trace sizes.

    .venv/bin/python bench/bench_viewer.py                   # 8 ranks, ~42 and ~84 MB JSON per rank
    .venv/bin/python bench/bench_viewer.py --ranks 2 --sizes 42   # a quick one
    .venv/bin/python bench/bench_viewer.py --ranks 1024 --mb 1    # at scale: groups, bands, outliers

Above 16 ranks Compare draws groups (viewer/scale.py): the runs get a run.json with a mesh of
--pp pipeline stages (default 4) so there are groups, and the table gives the JSON bytes of each
Compare output.

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


def make_runs(ranks: int, mb: float, pp: int = 4) -> Path:
    """<tmp>/ptprof-bench-viewer-R-MB/{run-a,run-b}: run-b hard-links run-a's files (parsed separately).
    Above 16 ranks each gets a minimal run.json whose mesh has `pp` stages (the groups)."""
    import json

    root = Path(tempfile.gettempdir()) / f"ptprof-bench-viewer-{ranks}-{mb:g}"
    a = build_trace_set(root / "run-a", ranks, mb)
    b = root / "run-b"
    b.mkdir(exist_ok=True)
    for f in a.glob("rank*.json.gz"):
        if not (b / f.name).exists():
            os.link(f, b / f.name)
    if ranks > 16 and pp > 1 and ranks % pp == 0:
        for run in (a, b):
            (run / "run.json").write_text(json.dumps({"schema": "ptprof.run/1", "run_id": run.name, "world_size": ranks,
                                                      "mesh": {"pp": pp, "dp": ranks // pp}}))
    return root


def render_compare(store, pages, run_ids: list[str]) -> dict[str, int]:
    """Every Compare callback's work, as the page does on load; returns payload bytes per output."""
    import plotly.graph_objects as go
    import plotly.io as pio

    import json

    from plotly.utils import PlotlyJSONEncoder

    c = pages.compare
    memory, persistent = c.memory_figures(store, run_ids)
    out = {
        "status": c.status_children(store, run_ids),
        "findings": c.findings_card(store, run_ids),
        "theory": c.theory_card(store, run_ids),
        "timeline": c.timeline_figure(store, run_ids),
        "breakdown": c.breakdown_figure(store, run_ids),
        "steps": c.steps_figure(store, run_ids),
        "pipeline": c.pipeline_figure(store, run_ids),
        "memory": memory,
        "persistent": persistent,
        "collectives": c.collectives_rows(store, run_ids),
        "drill-down options": c.scale_data.view_options(store.get_many(run_ids)),
    }
    # Dash sends figures, components and table rows as JSON (plotly's encoder: what Dash uses)
    return {k: len(pio.to_json(v)) if isinstance(v, go.Figure) else len(json.dumps(v, cls=PlotlyJSONEncoder)) for k, v in out.items()}


def bench(root: Path) -> dict:
    os.environ["PTPROF_CACHE_DIR"] = tempfile.mkdtemp(prefix="ptprof-bench-cache-")
    from viewer import aggregate
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
    runs = store.get_many(run_ids)
    at_scale = any(r.at_scale for r in runs)
    # The extent without building the events at scale (the activity bins'), else the timeline's.
    spans = [r.activity_extent() if at_scale else aggregate.extent(r.timeline()[0]) for r in runs]
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    zoom = {"xaxis.range[0]": lo + (hi - lo) * 0.5, "xaxis.range[1]": lo + (hi - lo) * 0.51}
    t = time.perf_counter()
    zoomed = compare.timeline_figure(store, run_ids, zoom)
    zoom_s = time.perf_counter() - t
    t = time.perf_counter()
    drill = compare.timeline_figure(store, run_ids, view="rank:1")
    drill_s = time.perf_counter() - t
    n_events = sum(int(r.traces.ranks["n_events"].sum()) for r in runs)
    n_drawn = None if at_scale else sum(r.timeline()[0].height for r in runs)
    return dict(cold=cold, warm=warm, zoom=zoom_s, drill=drill_s, timeline_bytes=payload["timeline"], zoom_bytes=len(zoomed.to_json()),
                drill_bytes=len(drill.to_json()), total_bytes=sum(payload.values()), events=n_events, drawn=n_drawn, payload=payload)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--sizes", "--mb", type=float, nargs="+", default=[42, 84], help="uncompressed JSON per rank (MB), one bench each")
    p.add_argument("--pp", type=int, default=4, help="pipeline stages in the runs' run.json above 16 ranks (the groups)")
    args = p.parse_args()
    rows = []
    for mb in args.sizes:
        root = make_runs(args.ranks, mb, args.pp)
        # A fresh process per size: each starts from an empty app, store and parse cache.
        import subprocess

        res = subprocess.run([sys.executable, __file__, "--one", str(root)], capture_output=True, text=True, cwd=REPO)
        if res.returncode != 0:
            raise SystemExit(res.stderr[-3000:])
        rows.append((mb, eval(res.stdout.strip().splitlines()[-1])))  # a dict literal we printed ourselves
    print(f"\nCompare, 2 runs x {args.ranks} ranks (seconds; payload = JSON sent to the browser)")
    print(f"{'MB/rank':>8} {'events':>13} {'drawn':>11} {'cold s':>8} {'warm s':>8} {'zoom s':>8} {'rank s':>7} "
          f"{'timeline KB':>12} {'zoomed KB':>10} {'rank KB':>8} {'page KB':>8}")
    for mb, r in rows:
        drawn = f"{r['drawn']:11,d}" if r["drawn"] is not None else f"{'(bands)':>11}"
        print(f"{mb:8g} {r['events']:13,d} {drawn} {r['cold']:8.2f} {r['warm']:8.2f} {r['zoom']:8.2f} {r['drill']:7.2f} "
              f"{r['timeline_bytes'] / 1e3:12.0f} {r['zoom_bytes'] / 1e3:10.0f} {r['drill_bytes'] / 1e3:8.0f} {r['total_bytes'] / 1e3:8.0f}")
    print("\nJSON bytes per Compare output (KB; rank = the drill-down to rank 1):")
    for mb, r in rows:
        print(f"  {mb:g} MB/rank: " + ", ".join(f"{k} {v / 1e3:.1f}" for k, v in r["payload"].items()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(bench(Path(sys.argv[2])))
    else:
        main()

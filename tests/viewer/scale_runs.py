"""Cheap many-rank runs for the viewer's scale tests and bench: copies of one shipped sample rank,
distributedInfo's rank and world size rewritten, a hand-made run.json with a mesh (so groups exist).

    make_run(tmp_path / "big", ranks=64, pp=4)   # stage0..stage3, 16 ranks each
    make_run(..., slow={5: 1.5})                  # rank 5's timestamps stretched 1.5x from its start
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "sample-ddp-2r" / "rank0.json.gz"


def make_run(folder: Path, ranks: int, pp: int = 1, slow: dict[int, float] | None = None, sample: Path = SAMPLE) -> Path:
    """A run folder of `ranks` trace files; `slow` maps a rank to a factor its times are scaled by
    (ts and dur, from the trace's first event), so that rank's steps take that factor longer."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = json.loads(gzip.decompress(sample.read_bytes()))
    t0 = min(e["ts"] for e in trace["traceEvents"] if "ts" in e)
    mesh = {"pp": pp, "dp": ranks // pp} if pp > 1 else {"dp": ranks}
    rest = {k: v for k, v in trace.items() if k not in ("traceEvents", "distributedInfo")}
    events = json.dumps(trace["traceEvents"])  # once: only distributedInfo differs between ranks
    for r in range(ranks):
        info = {**trace["distributedInfo"], "rank": r, "world_size": ranks,
                "pg_config": [{**trace["distributedInfo"]["pg_config"][0], "pg_size": ranks, "ranks": list(range(ranks))}]}
        f = (slow or {}).get(r)
        ev = json.dumps([_stretch(e, t0, f) for e in trace["traceEvents"]]) if f else events
        text = json.dumps({**rest, "distributedInfo": info})[:-1] + ', "traceEvents": ' + ev + "}"
        # mtime 0 and level 1: fast to write, and the same bytes every time (the parse cache hits)
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(text.encode(), compresslevel=1, mtime=0))
    (folder / "run.json").write_text(json.dumps({"schema": "ptprof.run/1", "run_id": folder.name, "paradigm": "ddp",
                                                 "world_size": ranks, "mesh": mesh, "backend": "gloo", "device": "cpu"}))
    return folder


def _stretch(e: dict, t0: float, f: float) -> dict:
    e = dict(e)
    if "ts" in e:
        e["ts"] = t0 + (e["ts"] - t0) * f
    if "dur" in e:
        e["dur"] = e["dur"] * f
    return e

"""`ptprof list`: the runs under a traces folder, one row each, and a row naming what is wrong
with any run.json that cannot be listed (kept apart from runners/cli.py, which launches runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import stat
from pathlib import Path

_MANIFEST_MAX_BYTES = 64 << 20  # a run.json is a few KB; anything this big is not one


def find_runs(root: Path) -> list[dict]:
    """Complete runs under `root` (folders with a run.json), newest first, then folders of traces
    without one (`_foreign_runs`). Hidden folders skipped.

    A run.json that cannot be listed (unreadable, not JSON, too deep, wrong types) gives a row
    {"run_id": folder, "error": what is wrong} instead of failing the listing.
    """
    runs = []
    if not root.is_dir():
        return runs
    for manifest in sorted(root.glob("*/run.json")):
        if manifest.parent.name.startswith("."):
            continue
        data, problem = _read_manifest(manifest)
        if problem:
            runs.append({"run_id": manifest.parent.name, "error": problem})
            continue
        data["_path"] = str(manifest.parent)
        runs.append(data)
    runs += _foreign_runs(root)
    return sorted(runs, key=lambda r: r["created_at"] if isinstance(r.get("created_at"), str) else "", reverse=True)


_OWN_OUTPUT = re.compile(rb'\A\s*\{\s*"schema"\s*:\s*"ptprof\.')  # a report, projection, plan or saved cluster (ptprof writes "schema" first)


def _foreign_runs(root: Path) -> list[dict]:
    """A row for each folder of traces without a run.json (torch's tensorboard_trace_handler
    output, a job's traces copied in): the viewer shows such a folder as a run, so a listing
    that left it out would disagree with it. What is known is only the file count. ptprof's own
    reports saved there are no traces (profiler.discover.own_output's test: runners import no profiler)."""
    rows = []
    try:
        folders = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except OSError:  # a root we may not list: no runs to show, as the glob above finds none
        return rows
    for folder in folders:
        try:
            if not folder.is_dir() or os.path.lexists(folder / "run.json"):  # a dangling run.json is the glob's row
                continue
            traces = [f for f in folder.iterdir() if not f.name.startswith(".") and f.name.endswith((".json", ".json.gz"))
                      and not _own_output(f)]
        except OSError:  # a folder we may not enter is no run of ours to list
            continue
        if traces:
            rows.append({"run_id": folder.name, "_path": str(folder), "_whole": True,
                         "error": f"{len(traces):,} trace file{'s' if len(traces) != 1 else ''}, no run.json "
                                  f"(not made by `ptprof run`): `ptprof analyze {shlex.quote(_printable(str(folder), 10**6))}`"})
    return rows


def _own_output(f: Path) -> bool:
    if not f.name.endswith(".json"):
        return False
    try:
        if not stat.S_ISREG(f.stat().st_mode):
            return False
        with open(f, "rb") as fh:
            return bool(_OWN_OUTPUT.match(fh.read(64)))
    except OSError:
        return False


def _read_manifest(path: Path) -> tuple[dict | None, str | None]:
    """(run.json's content, None), or (None, a short description of what is wrong with it)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # never opened: a FIFO would block the listing forever
            return None, "run.json is not a regular file"
        if st.st_size > _MANIFEST_MAX_BYTES:
            return None, f"run.json is {st.st_size >> 20} MiB, too large for a manifest"
        data = json.loads(path.read_bytes())
    except RecursionError:
        return None, "unreadable run.json: nested too deeply"
    except (OSError, ValueError) as err:  # ValueError: bad JSON, or bytes that are not UTF-8
        return None, f"unreadable run.json: {err}"
    if not isinstance(data, dict):
        return None, f"run.json holds a JSON {type(data).__name__}, not an object"
    return data, _manifest_problem(data)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _manifest_problem(data: dict) -> str | None:
    """The first field `ptprof list` shows that is missing or of the wrong type, or None."""
    for key, ok, what in (
        ("paradigm", lambda v: isinstance(v, str), "a string"),
        ("world_size", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer"),
        ("backend", lambda v: isinstance(v, str), "a string"),
        ("losses", lambda v: isinstance(v, list) and all(x is None or _is_number(x) for x in v), "a list of numbers"),
    ):
        if key not in data:
            return f"run.json has no {key!r}"
        if not ok(data[key]):
            return f"run.json's {key!r} is not {what}: {_printable(json.dumps(data[key])[:40])}"
    if "created_at" in data and not isinstance(data["created_at"], str):
        return "run.json's 'created_at' is not a string"
    return None


def _printable(text: str, limit: int = 60) -> str:
    """`text` for a terminal: control characters and undecodable bytes escaped, long text cut."""
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The variant flags of `ptprof run` as "+" suffixes of the paradigm ("tp+lp", "ddp+rc"), as in
# ptprof analyze's Runs table (profiler.discover.paradigm_label).
VARIANT_FLAGS = (("sp", "sp"), ("loss_parallel", "lp"), ("offload", "offload"), ("recompute", "rc"))


def paradigm_label(r: dict) -> str:
    options = r.get("options") if isinstance(r.get("options"), dict) else {}
    return "+".join([r["paradigm"], *(short for key, short in VARIANT_FLAGS if options.get(key) is True)])


def cmd_list(ns: argparse.Namespace) -> int:
    root = Path(ns.traces)
    runs = find_runs(root)
    if not runs:
        print(f"no runs under {_printable(str(root), 200)}/ (make one with `ptprof run ddp --gpus 2`)")
        return 0
    # "steps run": every step trained, as in run.json's losses; the traces hold only the profiled ones.
    names = [_printable(Path(r["_path"]).name if "_path" in r else r["run_id"]) for r in runs]
    labels = [_printable(paradigm_label(r), 24) if "error" not in r else "" for r in runs]
    # Columns as wide as their longest entry ("interleaved-1f1b" pushed its row out of line: trial).
    nw, pw = max(36, *map(len, names)), max(14, *map(len, labels))
    print(f"{'run':<{nw}} {'paradigm':<{pw}} {'ranks':>5} {'backend':<7} {'steps run':>9} {'final loss':>10}  created")
    for r, name, label in zip(runs, names, labels):
        if "error" in r:
            print(f"{name:<{nw}} {_printable(r['error'], 10**6 if r.get('_whole') else 200)}")  # a command is never cut
            continue
        losses = [x for x in r["losses"] if x is not None]
        final = f"{losses[-1]:.4f}" if losses else "-"
        print(
            f"{name:<{nw}} {label:<{pw}} {r['world_size']:>5} {_printable(r['backend'], 10):<7} "
            f"{len(r['losses']):>9} {final:>10}  {_printable(r.get('created_at', ''), 40)}"
        )
    return 0

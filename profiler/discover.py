"""Finding trace files: expand the paths a user names into trace files grouped by run.

A file belongs to the run of its folder; a folder holding traces is one run; a folder holding
only run folders (our `traces/`) is one run per sub-folder. The run id is run.json's `run_id`,
else the folder's name.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from profiler.errors import TraceError

RUN_MANIFEST = "run.json"
TRACE_SUFFIXES = (".json", ".json.gz")


@dataclasses.dataclass(frozen=True)
class Source:
    """One trace file, the run it belongs to, and the folder whose run.json describes it."""

    run: str
    path: Path
    run_dir: Path | None  # the folder whose run.json (if any) describes this file


def is_trace_file(p: Path) -> bool:
    return p.is_file() and not p.name.startswith(".") and p.name != RUN_MANIFEST and p.name.endswith(TRACE_SUFFIXES)


def _trace_files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if is_trace_file(p))


def _run_name(folder: Path) -> str:
    manifest = folder / RUN_MANIFEST
    if manifest.is_file():
        try:
            run_id = json.loads(manifest.read_text()).get("run_id")
            if isinstance(run_id, str) and run_id:
                return run_id
        except (OSError, ValueError):
            pass  # an unreadable manifest is reported by read_manifest
    return folder.resolve().name


def find_sources(paths: list[str | Path]) -> list[Source]:
    """Expand files and folders into trace files grouped by run.

    A file belongs to the run of its folder; a folder holding traces is one run; a folder holding
    only sub-folders of traces (our `traces/` output folder) is one run per sub-folder.
    """
    sources: list[Source] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise TraceError(p, "no such file or folder")
        if p.is_file():
            sources.append(Source(_run_name(p.parent), p, p.parent))
            continue
        files = _trace_files_in(p)
        if files:
            sources += [Source(_run_name(p), f, p) for f in files]
            continue
        subdirs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
        nested = [(d, _trace_files_in(d)) for d in subdirs]
        nested = [(d, fs) for d, fs in nested if fs]
        if not nested:
            raise TraceError(p, "no trace files here (expected *.json or *.json.gz, or run folders holding them)")
        for d, fs in nested:
            sources += [Source(_run_name(d), f, d) for f in fs]
    return sources


def read_manifest(run_dir: Path | None) -> dict | None:
    if run_dir is None or not (run_dir / RUN_MANIFEST).is_file():
        return None
    try:
        manifest = json.loads((run_dir / RUN_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise TraceError(run_dir / RUN_MANIFEST, f"unreadable run manifest: {e}") from None
    return manifest if isinstance(manifest, dict) else None

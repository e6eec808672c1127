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
    only sub-folders of traces (our `traces/` output folder) is one run per sub-folder. Two
    different folders never share a run: a name already taken by another folder gets its parent's
    name in front (`a/run`), then `#2`, `#3`. (`split_jobs` then splits a folder holding several
    jobs.)
    """
    sources: list[Source] = []
    names: dict[Path, str] = {}  # folder -> its run id, one id per folder

    def source(folder: Path, f: Path) -> Source:
        key = folder.resolve()
        if key not in names:
            name, taken = _run_name(folder), set(names.values())
            if name in taken:
                name = f"{key.parent.name}/{name}"
            base, k = name, 2
            while name in taken:
                name, k = f"{base}#{k}", k + 1
            names[key] = name
        return Source(names[key], f, folder)

    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise TraceError(p, "no such file or folder")
        if p.is_file():
            sources.append(source(p.parent, p))
            continue
        files = _trace_files_in(p)
        if files:
            sources += [source(p, f) for f in files]
            continue
        subdirs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
        nested = [(d, _trace_files_in(d)) for d in subdirs]
        nested = [(d, fs) for d, fs in nested if fs]
        if not nested:
            raise TraceError(p, "no trace files here (expected *.json or *.json.gz, or run folders holding them)")
        for d, fs in nested:
            sources += [source(d, f) for f in fs]
    return sources


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """What tells one job's trace files from another's: distributedInfo's backend and world size,
    and the span of the trace's clock (µs)."""

    backend: str | None
    world_size: int | None
    start_us: float | None
    end_us: float | None


def split_jobs(sources: list[Source], facts: list[JobFacts | None]) -> tuple[list[Source], list[str]]:
    """The sources with each run split into its jobs, and one note per run that was split.

    facts[i] describes sources[i] (None for a file that failed to load: it keeps its run). Files of
    one run are one job when they agree on backend and world size and their clock spans chain
    into one (every rank of a job records the same steps, so their spans overlap). Otherwise
    each job becomes its own run, `<run>/<file stem>` (one file) or `<run>/<first>..<last>`.
    """
    by_run: dict[str, list[int]] = {}
    for i, s in enumerate(sources):
        if facts[i] is not None:
            by_run.setdefault(s.run, []).append(i)
    out, notes = list(sources), []
    for run, idx in by_run.items():
        jobs = _jobs(idx, facts)
        if len(jobs) == 1:
            continue
        taken: set[str] = set()
        labels = []
        for job in jobs:
            stems = sorted(_stem(sources[i].path) for i in job)
            name = f"{run}/{stems[0]}" if len(stems) == 1 else f"{run}/{stems[0]}..{stems[-1]}"
            base, k = name, 2
            while name in taken:
                name, k = f"{base}#{k}", k + 1
            taken.add(name)
            labels.append(name)
            for i in job:
                out[i] = dataclasses.replace(sources[i], run=name, run_dir=_manifest_dir(sources[i].run_dir, facts[i]))
        notes.append(f"{sources[idx[0]].run_dir or run}: files of {len(jobs)} different jobs (world size or backend differ, "
                     f"or their clocks never overlap); analysed as separate runs: {', '.join(labels)}")
    return out, notes


def _jobs(idx: list[int], facts: list[JobFacts | None]) -> list[list[int]]:
    """Indices grouped into jobs: same (backend, world size), clock spans chained by overlap."""
    groups: dict[tuple, list[int]] = {}
    for i in idx:
        groups.setdefault((facts[i].backend, facts[i].world_size), []).append(i)
    jobs = []
    for members in groups.values():
        members = sorted(members, key=lambda i: (facts[i].start_us is None, facts[i].start_us or 0.0))
        current, reach = [], None
        for i in members:
            f = facts[i]
            # A file with no timed events cannot be placed by its clock: it joins the current job.
            if current and f.start_us is not None and reach is not None and f.start_us > reach:
                jobs.append(current)
                current, reach = [], None
            current.append(i)
            if f.end_us is not None:
                reach = f.end_us if reach is None else max(reach, f.end_us)
        jobs.append(current)
    return sorted(jobs, key=lambda job: min(job))


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _manifest_dir(run_dir: Path | None, facts: JobFacts) -> Path | None:
    """The run folder whose run.json describes this job: only where run.json's world size is the job's."""
    try:
        manifest = read_manifest(run_dir)
    except TraceError:
        return run_dir  # reported when the run's manifest is read
    if manifest is None or manifest.get("world_size") in (None, facts.world_size):
        return run_dir
    return None


def read_manifest(run_dir: Path | None) -> dict | None:
    if run_dir is None or not (run_dir / RUN_MANIFEST).is_file():
        return None
    try:
        manifest = json.loads((run_dir / RUN_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise TraceError(run_dir / RUN_MANIFEST, f"unreadable run manifest: {e}") from None
    return manifest if isinstance(manifest, dict) else None

"""Finding trace files: expand the paths a user names into trace files grouped by run.

A file belongs to the run of its folder; a folder holding traces is one run; a folder holding
only run folders (our `traces/`) is one run per sub-folder, named by its folder (as the viewer and
`ptprof list` name it). Odd paths (empty, devices, FIFOs, unreadable folders, names too long or
not UTF-8) and damaged run.json files end in one TraceError naming the path (docs/profiler.md,
"Odd input").
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import stat
from pathlib import Path

from profiler.errors import TraceError, path_text

RUN_MANIFEST = "run.json"
TRACE_SUFFIXES = (".json", ".json.gz")
MAX_MANIFEST_BYTES = 64 << 20  # ours are a few KB; 10k ranks x 100 steps of losses is ~10 MB


@dataclasses.dataclass(frozen=True)
class Source:
    """One trace file, the run it belongs to, and the folder whose run.json describes it."""

    run: str
    path: Path
    run_dir: Path | None  # the folder whose run.json (if any) describes this file
    listed: bool = False  # found by listing a folder (not a file named on its own)


def is_trace_file(p: Path) -> bool:
    return p.is_file() and _trace_named(p)


def _list(folder: Path) -> list[Path]:
    # In number order (rank2 before rank10): the order files are read, and their skipped lines said, in.
    try:
        return sorted(folder.iterdir(), key=lambda p: (_natural(p.name), p.name))
    except OSError as e:
        raise TraceError(folder, f"cannot list this folder: {e.strerror or e}") from None


def _trace_named(p: Path) -> bool:
    return not p.name.startswith(".") and p.name != RUN_MANIFEST and p.name.endswith(TRACE_SUFFIXES)


def _trace_files_in(folder: Path) -> list[Path]:
    # Every entry named like a trace but a folder: a FIFO or a dangling link named rank1.json is
    # reported (not_a_regular_file), not skipped in silence, or a rank would vanish unsaid.
    # ptprof's own reports saved beside the traces (`--json run/report.json`) are not read.
    return [p for p in _list(folder) if _trace_named(p) and not p.is_dir() and not own_output(p)]


_OWN_OUTPUT = re.compile(rb'\A\s*\{\s*"schema"\s*:\s*"ptprof\.')  # jsonfile writes "schema" first


def own_output(p: Path) -> bool:
    """Whether `p` is a JSON file ptprof wrote (a report, projection, plan or saved cluster: `"schema": "ptprof.…"`
    first), which a folder's listing leaves out: saved in the run folder, it failed the next load
    as a trace that was not one. Only plain .json regular files are opened (64 bytes read)."""
    if not p.name.endswith(".json"):
        return False
    try:
        st = p.stat()
    except OSError:  # the load says what is wrong with it
        return False
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block: not_a_regular_file says it
        return False
    return _starts_as_own_output(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1 << 16)
def _starts_as_own_output(path: str, size: int, mtime_ns: int) -> bool:
    # Once per version of a file in a process: the early start, the load and the unread-files note
    # each ask (a torch trace folder of plain .json files on a network filesystem pays per open).
    try:
        with open(path, "rb") as f:
            return bool(_OWN_OUTPUT.match(f.read(64)))
    except OSError:
        return False


def not_a_regular_file(p: Path) -> str | None:
    """Why `p` (found in a folder) is no trace file to open, or None for a regular file: never opened.
    The load lists it as skipped (`skipped: FILE: rank N: why`): the why does not say it again."""
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return "not a regular file (a link to nothing)"
    except OSError as e:
        return f"cannot open: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"not a regular file ({kind}{', through a link' if p.is_symlink() else ''})"


def run_name(folder: Path) -> str:
    # The folder's name, not run.json's run_id: the runner names the folder by the run id, so the
    # two differ only once a folder is renamed or copied (`cp -r traces/ddp-2r before`), and then
    # the folder's name is the one the user typed and the viewer shows; the id would name two
    # copies alike. Valid text: polars and terminals take no undecodable bytes of a non-UTF-8 name.
    return path_text(folder.resolve().name)


def _kind(p: Path) -> str:
    """"file", "folder" or "other" for a path the user named (links followed); TraceError if none."""
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise TraceError(p, "no such file or folder") from None
    except OSError as e:  # a name too long, a loop of links, a folder we may not enter
        raise TraceError(p, f"cannot open: {e.strerror or e}") from None
    return "file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode) else "other"


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

    def source(folder: Path, f: Path, listed: bool = True) -> Source:
        key = folder.resolve()
        if key not in names:
            name, taken = run_name(folder), set(names.values())
            if name in taken:
                name = f"{path_text(key.parent.name)}/{name}"
            base, k = name, 2
            while name in taken:
                name, k = f"{base}#{k}", k + 1
            names[key] = name
        return Source(names[key], f, folder, listed)

    for raw in paths:
        if isinstance(raw, str) and not raw:  # Path("") is the current folder: never what was meant
            raise TraceError(None, 'an empty path ("") names no trace; give a file or folder (e.g. ".")')
        p = Path(raw)
        kind = _kind(p)
        if kind == "other":  # never opened: a FIFO would block, /dev/zero would never end
            raise TraceError(p, "not a trace file or folder (a device, FIFO or socket)")
        if kind == "file":
            sources.append(source(p.parent, p, listed=False))
            continue
        files = _trace_files_in(p)
        if files:
            sources += [source(p, f) for f in files]
            continue
        subdirs = [d for d in _list(p) if d.is_dir() and not d.name.startswith(".")]
        nested = [(d, _trace_files_in(d)) for d in subdirs]
        nested = [(d, fs) for d, fs in nested if fs]
        if not nested:
            own = [f.name for f in _list(p) if _trace_named(f) and own_output(f)]
            mine = f"; {', '.join(path_text(n) for n in own[:UNREAD_SHOWN])}: ptprof's own output, no trace" if own else ""
            raise TraceError(p, f"no trace files here (expected *.json or *.json.gz, or run folders holding them){mine}")
        for d, fs in nested:
            sources += [source(d, f) for f in fs]
    return sources


UNREAD_SHOWN = 3  # names shown in an unread-files note; the rest counted


def unread_notes(sources: list[Source]) -> list[str]:
    """One note per run folder holding files that are not read: named unlike a trace (say
    torch's export_memory_timeline `.raw.gz`, a memory snapshot `.pickle`, `rank3.json.gz.bak`).
    A file a user counted on as a rank must not vanish unsaid. run.json and hidden files are the
    layout's own; a folder of run folders (our traces/) is not a run: its README is no news."""
    notes = []
    for folder in dict.fromkeys(s.run_dir for s in sources if s.listed and s.run_dir is not None):
        try:
            entries = [p for p in _list(folder) if not p.name.startswith(".") and p.name != RUN_MANIFEST]
        except TraceError:  # listed once already; a folder gone since is the load's to say
            continue
        # No stat of the traces themselves (1,024 of them in a big run's folder): only the other
        # names are asked whether they are regular files (a FIFO named like a trace is already a
        # problem: not_a_regular_file), and only plain .json ones whether they are ptprof's own.
        others = [p.name for p in entries if not _trace_named(p) and p.is_file()]
        own = [p.name for p in entries if _trace_named(p) and own_output(p)]
        for what, names in (("not named like a trace (*.json, *.json.gz)", others),
                            ("ptprof's own output (a report, projection, plan or saved cluster)", own)):
            if names:
                shown = ", ".join(path_text(n) for n in names[:UNREAD_SHOWN])
                more = f" and {len(names) - UNREAD_SHOWN:,} more" if len(names) > UNREAD_SHOWN else ""
                notes.append(f"{path_text(folder)}: not read, {what}: {shown}{more}")
    return notes


def same_files(sources: list[Source]) -> tuple[list[Source], list[str]]:
    """The sources with each file read once, and a note on the files named again: the same path
    given twice, a symlink to a file already named, a hard link (one device and inode). Read
    twice, a file would be its own duplicate rank (load.py refuses duplicate ranks, with a hint
    that cannot help there)."""
    kept: list[Source] = []
    first: dict[tuple[int, int], Source] = {}
    again: list[str] = []
    for s in sources:
        try:
            st = os.stat(s.path)
        except OSError:  # the load names it
            kept.append(s)
            continue
        key = (st.st_dev, st.st_ino)
        if key not in first:
            first[key] = s
            kept.append(s)
            continue
        same = Path(os.path.abspath(s.path)) == Path(os.path.abspath(first[key].path))
        again.append(f"{path_text(s.path)} named twice" if same else
                     f"{path_text(s.path)} is {path_text(first[key].path)} (a link to the same file)")
    if not again:
        return kept, []
    if len(again) == 1:
        return kept, [f"{again[0]}: read once"]
    return kept, [f"{len(again):,} files named again (the same path twice, or a link to a file already named), each "
                  f"read once: {again[0]}, ..."]


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """What tells one job's trace files from another's: distributedInfo's backend and world size,
    and the span of the trace's clock (µs)."""

    backend: str | None
    world_size: int | None
    start_us: float | None
    end_us: float | None
    rank: int | None = None  # distributedInfo's: tells a job split by its hosts' clocks (_skewed_hint)


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
        # run.json describes one job at most: where several jobs fit it (the same world size: two
        # runs' files copied into one folder), which one cannot be told, and its paradigm, model and
        # memory would be another job's theory: it is used for none of them, and said.
        first = sources[idx[0]]
        fits = [job for job in jobs if _manifest_dir(first.run_dir, facts[job[0]]) is not None]
        ambiguous = first.run_dir is not None and len(fits) > 1 and _has_manifest(first.run_dir)
        for job in jobs:
            stems = sorted((path_text(_stem(sources[i].path)) for i in job), key=_natural)  # rank2 before rank10
            name = f"{run}/{stems[0]}" if len(stems) == 1 else f"{run}/{stems[0]}..{stems[-1]}"
            base, k = name, 2
            while name in taken:
                name, k = f"{base}#{k}", k + 1
            taken.add(name)
            labels.append(name)
            for i in job:
                out[i] = dataclasses.replace(sources[i], run=name,
                                             run_dir=None if ambiguous else _manifest_dir(sources[i].run_dir, facts[i]))
        notes.append(f"{sources[idx[0]].run_dir or run}: files of {len(jobs)} different jobs (world size or backend differ, "
                     f"or their clocks never overlap); analysed as separate runs: {', '.join(labels)}"
                     + (f"; its run.json fits {len(fits)} of them (its world size and backend, where it states them), "
                        f"so it describes none: no paradigm, model or memory facts from it" if ambiguous else "")
                     + _skewed_hint(jobs, labels, facts))
    return out, notes


def _skewed_hint(jobs: list[list[int]], labels: list[str], facts: list[JobFacts]) -> str:
    """A clause for jobs of one backend and world size whose ranks complement each other (none
    twice, all below the world size): one job whose hosts' clocks are apart by more than the trace
    lasts splits so. Merging them would compare times across those clocks (skew, stragglers), so
    they stay apart; the clause says why and what to do."""
    by_kind: dict[tuple, list[int]] = {}
    for j, job in enumerate(jobs):
        by_kind.setdefault((facts[job[0]].backend, facts[job[0]].world_size), []).append(j)
    for (_, world), js in by_kind.items():
        ranks = [facts[i].rank for j in js for i in jobs[j]]
        if (len(js) < 2 or world is None or any(r is None or not 0 <= r < world for r in ranks)
                or len(set(ranks)) < len(ranks)):
            continue
        starts = [min(facts[i].start_us for i in jobs[j] if facts[i].start_us is not None) for j in js
                  if any(facts[i].start_us is not None for i in jobs[j])]
        apart = f" by {_span_text((max(starts) - min(starts)) / 1e6)}" if len(starts) > 1 else ""
        shown = "they" if len(js) == len(jobs) else ", ".join(labels[j] for j in js)
        return (f"; {shown} hold different ranks of one world size ({world}): if they are one job, its hosts' clocks are "
                f"apart{apart}, more than the trace lasts, and no time can be compared across them (skew, stragglers): "
                f"sync the hosts' clocks (chrony or NTP) and profile again")
    return ""


def _span_text(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


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


def _natural(text: str) -> tuple:
    """A sort key reading runs of digits as numbers: rank0, rank2, rank10 (not rank0, rank10, rank2)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _has_manifest(run_dir: Path) -> bool:
    try:
        return read_manifest(run_dir) is not None
    except TraceError:
        return False


def _manifest_dir(run_dir: Path | None, facts: JobFacts) -> Path | None:
    """The run folder whose run.json describes this job: only where run.json's world size and
    backend (where it states them, and the job's traces too) are the job's."""
    try:
        manifest = read_manifest(run_dir)
    except TraceError:
        return run_dir  # reported when the run's manifest is read
    if manifest is None:
        return run_dir
    backend = manifest.get("backend")
    if isinstance(backend, str) and facts.backend and backend.lower() != str(facts.backend).lower():
        return None
    return run_dir if manifest.get("world_size") in (None, facts.world_size) else None


def read_manifest(run_dir: Path | None) -> dict | None:
    """The run's run.json as a dict, None where there is none; TraceError where it is damaged:
    not a regular file, over MAX_MANIFEST_BYTES, not JSON, nested too deeply, not an object, or
    a field the profiler reads with the wrong type (`manifest_problem`)."""
    if run_dir is None:
        return None
    path = run_dir / RUN_MANIFEST
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TraceError(path, f"unreadable run manifest: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):  # never opened: a FIFO would block
        raise TraceError(path, "run manifest is not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise TraceError(path, f"unreadable run manifest: {e.strerror or e}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise TraceError(path, f"run manifest over {MAX_MANIFEST_BYTES >> 20} MiB: not one ptprof wrote")
    try:
        manifest = json.loads(data)
    except RecursionError:
        raise TraceError(path, "unreadable run manifest: JSON nested too deeply") from None
    except ValueError as e:
        raise TraceError(path, f"unreadable run manifest: {e}") from None
    if not isinstance(manifest, dict):
        raise TraceError(path, f"run manifest is a JSON {type(manifest).__name__}, not an object (docs/run-layout.md)")
    problem = manifest_problem(manifest)
    if problem:
        raise TraceError(path, f"run manifest: {problem} (docs/run-layout.md)")
    return manifest


def manifest_field(manifest: dict | None, *keys: str):
    """manifest[k1][k2]... or None where a level is absent or not an object (run.json is user data)."""
    value = manifest
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return value


def model_of(manifest: dict | None) -> dict | None:
    """run.json's model as {"preset": "tiny", "n_params": 133760}: each None where run.json lacks
    it or it cannot be one (run.json is user data: a bool, NaN, 1e40, an empty name); None where
    neither is there (a foreign trace)."""
    preset, n = manifest_field(manifest, "model", "preset"), manifest_field(manifest, "model", "n_params")
    preset = preset if isinstance(preset, str) and preset else None
    # A count a model can have: 1 to 10^15 parameters, whole.
    n = int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and 1 <= n < 1e15 and n == int(n) else None
    return {"preset": preset, "n_params": n} if preset is not None or n is not None else None


# The variant flags of `ptprof run`, as the short suffix the Runs table shows ("tp+lp", "ddp+rc").
VARIANT_FLAGS = (("sp", "sp"), ("loss_parallel", "lp"), ("offload", "offload"), ("recompute", "rc"))


def paradigm_label(manifest: dict | None) -> str | None:
    """run.json's paradigm with its variant flags (options sp, loss_parallel, offload, recompute) as
    "+" suffixes: "tp+sp+lp", "ddp+rc"; None without a paradigm."""
    paradigm = manifest_field(manifest, "paradigm")
    if not isinstance(paradigm, str):
        return None
    return "+".join([paradigm, *(short for key, short in VARIANT_FLAGS if manifest_field(manifest, "options", key) is True)])


def _is_whole(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _is_action(a) -> bool:
    # The microbatch may be negative: a stream schedule's (pipedream) previous-step microbatch.
    return (isinstance(a, list) and len(a) == 3 and isinstance(a[0], str) and _is_whole(a[1], 0)
            and isinstance(a[2], int) and not isinstance(a[2], bool))


# The run.json fields the profiler reads, and what each must be when present and not null.
_FIELDS = {
    ("run_id",): (lambda v: isinstance(v, str), "a string"),
    ("paradigm",): (lambda v: isinstance(v, str), "a string"),
    ("backend",): (lambda v: isinstance(v, str), "a string"),
    ("world_size",): (lambda v: _is_whole(v, 1), "a whole number ≥ 1"),
    ("ranks",): (lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v), "a list of objects"),
    ("pipeline",): (lambda v: isinstance(v, dict), "an object"),
    ("pipeline", "span_format"): (lambda v: isinstance(v, str), "a string"),
    ("pipeline", "schedule"): (lambda v: isinstance(v, str), "a string"),
    ("pipeline", "ranks"): (lambda v: _is_whole(v, 1), "a whole number ≥ 1"),
    ("pipeline", "stages_per_rank"): (lambda v: _is_whole(v, 1), "a whole number ≥ 1"),
    ("pipeline", "microbatches"): (lambda v: _is_whole(v, 1), "a whole number ≥ 1"),
    ("pipeline", "loss_stage"): (lambda v: _is_whole(v, 0), "a whole number ≥ 0"),
    ("pipeline", "ideal_order"): (lambda v: isinstance(v, list) and all(isinstance(r, list) and all(map(_is_action, r)) for r in v),
                                  "a list (per rank) of [kind, stage, microbatch] lists"),
    ("hybrid",): (lambda v: isinstance(v, dict), "an object"),
    ("hybrid", "groups"): (lambda v: isinstance(v, dict), "an object"),
    ("hybrid", "groups", "pp"): (lambda v: isinstance(v, list) and all(isinstance(g, list) and all(_is_whole(r, 0) for r in g) for g in v),
                                 "a list of lists of ranks"),
}
_RANK_FIELDS = {
    "rank": (lambda v: _is_whole(v, 0), "a whole number ≥ 0"),
    "memory": (lambda v: isinstance(v, dict), "an object of byte counts"),  # each field: manifest_problem
}


def _is_byte_count(key: str, v) -> bool:
    # `max_memory_allocated_by_gpu_bytes` is a list, one peak per GPU the process drives (CUDA runs).
    if key == "max_memory_allocated_by_gpu_bytes" and isinstance(v, list):
        return all(_is_whole(x, 0) for x in v)
    return v is None or _is_whole(v, 0)


def manifest_problem(manifest: dict) -> str | None:
    """The first run.json field the profiler reads that has the wrong type, said in words; None if
    every one is absent, null or right (a wrong one would be a wrong number or a crash later)."""
    for keys, (ok, what) in _FIELDS.items():
        v = manifest_field(manifest, *keys)
        if v is not None and not ok(v):
            return f"`{'.'.join(keys)}` is {_shown(v)}, not {what}"
    for i, r in enumerate(manifest.get("ranks") or []):
        for key, (ok, what) in _RANK_FIELDS.items():
            if r.get(key) is not None and not ok(r[key]):
                return f"`ranks[{i}].{key}` is {_shown(r[key])}, not {what}"
        memory = r.get("memory")
        for key, v in (memory.items() if isinstance(memory, dict) else ()):
            if not _is_byte_count(key, v):  # the field itself, where the block is an object
                what = ("a list of byte counts, one per GPU (whole numbers ≥ 0)" if key == "max_memory_allocated_by_gpu_bytes"
                        else "a byte count (a whole number ≥ 0) or null")
                return f"`ranks[{i}].memory.{key}` is {_shown(v)}, not {what}"
    return None


def _shown(v) -> str:
    """A value as the user wrote it where it is short ([1, "x"], -5), else what it is."""
    try:
        text = json.dumps(v)
    except (ValueError, RecursionError):  # nested too deeply to write back
        text = None
    if isinstance(v, (dict, list)) and (text is None or len(text) > 40):
        return f"a JSON object of {len(v)} keys" if isinstance(v, dict) else f"a JSON list of {len(v)}"
    return text if len(text) <= 40 else text[:40] + "..."

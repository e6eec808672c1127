"""The parquet cache of parsed traces: hits, stale and damaged entries, its folder, a full disk."""

from __future__ import annotations

import errno
import gc
import os
import random
import shutil
import stat
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest

import profiler.cache as cache_module
from profiler import TraceError, load_traces
from profiler.cache import CACHE_ENV, cache_dir
from profiler.cli import analyze_main
from profiler.report import analyze
from tests.profiler.conftest import GPU_NCCL


def _copy(tmp_path: Path, rank: int = 0) -> Path:
    """A private copy of a small real GPU trace (its own cache entry, free to rewrite)."""
    return Path(shutil.copy(GPU_NCCL / f"rank{rank}.json.gz", tmp_path / f"rank{rank}.json.gz"))


def _entry(f: Path, folder: Path | None = None) -> tuple[Path, Path]:
    """(parquet, header JSON) of `f`'s cache entry."""
    traces = load_traces(f)
    pq = Path(traces.parts[0].parquet)
    assert pq.parent == (folder or cache_dir())
    return pq, pq.with_suffix(".json")


def _same_load(a, b) -> bool:
    return a.events.equals(b.events) and a.ranks.equals(b.ranks)


def test_second_load_reads_the_cache():
    f = GPU_NCCL / "rank1.json.gz"
    first = load_traces(f)
    assert any(cache_dir().glob("*.parquet"))
    second = load_traces(f)
    assert second.events.equals(first.events)


def test_an_unchanged_file_is_not_parsed_again(tmp_path, monkeypatch):
    f = _copy(tmp_path)
    first = load_traces(f)

    def boom(path):
        raise AssertionError("parsed again")

    monkeypatch.setattr(cache_module, "parse_trace_file", boom)
    assert _same_load(load_traces(f), first)


def test_a_rewrite_with_the_same_size_and_mtime_is_parsed_again(tmp_path):
    # A tool rewriting a trace in place within the file system's mtime granularity (or restoring
    # the mtime, as rsync -t and tar do) leaves size and mtime as they were: only the bytes differ.
    f = tmp_path / "rank0.json"
    events = '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": %d}'
    f.write_text('{"traceEvents": [%s]}' % (events % 25))
    st = f.stat()
    assert load_traces(f).events["dur_us"].to_list() == [25.0]
    f.write_text('{"traceEvents": [%s]}' % (events % 75))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert load_traces(f).events["dur_us"].to_list() == [75.0]


def _flip(path: Path, original: bytes, bit: int) -> None:
    damaged = bytearray(original)
    damaged[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(damaged))


def test_flipped_bits_in_a_cache_entry_never_change_the_frame(tmp_path):
    # Each flip is one damaged entry (disk or memory error, a killed copy): the load must notice
    # it and parse the trace again, never fail and never give other numbers.
    f = _copy(tmp_path)
    reference = load_traces(f, cache=False)
    pq, header = _entry(f)
    rng = random.Random(12)
    for entry_file, n_flips in ((pq, 24), (header, 8)):
        original = entry_file.read_bytes()
        for bit in sorted(rng.sample(range(len(original) * 8), n_flips)):
            _flip(entry_file, original, bit)
            assert _same_load(load_traces(f), reference), f"{entry_file.name}: bit {bit} flipped"


def test_a_missing_entry_file_is_parsed_again(tmp_path):
    f = _copy(tmp_path)
    reference = load_traces(f, cache=False)
    pq, header = _entry(f)
    header.write_text('{"distributed_info": {"ra')  # a process killed mid-write (older entries)
    assert _same_load(load_traces(f), reference)
    pq.unlink()
    assert _same_load(load_traces(f), reference)


def test_a_file_name_that_is_not_utf8_has_an_entry(tmp_path):
    # The key hashes the name's bytes (the whole load of such a name is section B's; this is the cache's part).
    f = Path(os.fsdecode(bytes(tmp_path) + b"/rank0-\xff.json.gz"))
    shutil.copy(GPU_NCCL / "rank0.json.gz", f)
    first = cache_module.load_one_safe(f, tmp_path)
    assert not isinstance(first, TraceError), first
    assert first.parquet is not None
    assert cache_module.lookup(f, tmp_path)[0] == first


# ---- the folder ------------------------------------------------------------------------------


@pytest.fixture
def no_home_cache(tmp_path, monkeypatch):
    """$PTPROF_CACHE_DIR that cannot be made (its parent is a file), and a private temp dir."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp))
    return tmp


def test_the_fallback_folder_is_per_user_and_private(no_home_cache, tmp_path):
    folder = cache_dir()
    assert folder == no_home_cache / f"ptprof-cache-{os.getuid()}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    pq, _ = _entry(_copy(tmp_path), folder)
    assert pq.parent == folder


@pytest.mark.parametrize("unsafe", ["group-writable", "another user's"])
def test_an_unsafe_fallback_folder_is_refused(no_home_cache, tmp_path, monkeypatch, unsafe):
    if unsafe == "another user's":
        # Tests run as root: pretend to be uid 4242, whose folder root made first.
        monkeypatch.setattr(cache_module, "_my_uid", lambda: 4242)
        folder = no_home_cache / "ptprof-cache-4242"
        folder.mkdir(mode=0o700)
    else:
        folder = no_home_cache / f"ptprof-cache-{os.getuid()}"
        folder.mkdir()
        folder.chmod(0o777)  # made by someone else, waiting for our entries
    f = _copy(tmp_path)
    reference = load_traces(f, cache=False)
    traces = load_traces(f)
    assert _same_load(traces, reference) and traces.problems == []
    assert list(folder.iterdir()) == []
    (note,) = traces.notes
    assert str(folder) in note and "not cached" in note
    assert ("another user" if unsafe == "another user's" else "writable by other users") in note
    assert note in analyze(traces).warnings


# ---- a full disk ------------------------------------------------------------------------------


def _enospc_write(path, data):
    """An entry's file written on a full disk: part of it gets out, then ENOSPC."""
    Path(path).write_bytes(bytes(data[:6]))
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_analyses_from_memory_with_one_warning(tmp_path, monkeypatch):
    files = [_copy(tmp_path, 0), _copy(tmp_path, 1)]
    reference = load_traces(files, cache=False, workers=1)
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    monkeypatch.setattr(cache_module, "_write_file", _enospc_write)
    traces = load_traces(files, workers=1)  # parsed in this process, where the write is patched
    assert _same_load(traces, reference) and traces.problems == []
    assert list(folder.iterdir()) == []  # no .tmp files, no half entries
    (note,) = traces.notes
    assert "2 of 2" in note and "No space left on device" in note and str(folder) in note
    analysis = analyze(traces)
    assert note in analysis.warnings and analysis.problems == []


def test_the_full_disk_note_counts_with_thousands_separators():
    note = cache_module.unstored_note(Path("/c"), ["No space left on device"] * 1200, 1024 + 1200)
    assert note.startswith("1,200 of 2,224 parsed trace files could not be written to /c (No space left on device);")


def test_a_full_disk_is_a_warning_not_a_failure_in_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cache_module, "_write_file", _enospc_write)
    assert analyze_main([str(_copy(tmp_path))]) == 0
    out = capsys.readouterr()
    assert "skipped" not in out.out + out.err
    # The report wraps the warning (with its cache path, as long as tmp_path) at spaces.
    assert "warning:" in out.out and "No space left on device" in " ".join(out.out.split())


def test_workers_that_cannot_write_hand_the_frame_back(tmp_path, monkeypatch):
    # The worker processes do not see a monkeypatch; a folder where the entry's parquet should go
    # makes their write fail as a full disk would.
    files = [_copy(tmp_path, 0), _copy(tmp_path, 1)]
    reference = load_traces(files, cache=False, workers=1)
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv(CACHE_ENV, str(folder))
    for f in files:
        (folder / f"{cache_module.entry_key(f)}.parquet" / "in-the-way").mkdir(parents=True)
    traces = load_traces(files, workers=2, progress=False)
    assert _same_load(traces, reference) and traces.problems == []
    assert not list(folder.glob("*.tmp"))
    (note,) = traces.notes
    assert "2 of 2" in note


def test_old_tmp_files_are_removed_fresh_ones_kept(tmp_path, monkeypatch):
    # Left by writers killed mid-write, or by older ptprofs on a full disk; a fresh one may be
    # another process's entry being written now.
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv(CACHE_ENV, str(folder))
    old, fresh = folder / "0123abcd.4242.tmp", folder / "4567cdef.parquet.4243.tmp"
    for f in (old, fresh):
        f.write_bytes(b"PAR1")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    load_traces(_copy(tmp_path))
    assert not old.exists() and fresh.exists()


def test_no_cache_keeps_ranks_on_disk_until_the_traces_go():
    traces = load_traces(GPU_NCCL, cache=False)
    folders = {Path(p.parquet).parent for p in traces.parts}
    assert len(folders) == 1 and cache_dir() not in folders
    (folder,) = folders
    assert folder.is_dir() and traces.events.height == traces.ranks["n_events"].sum()
    del traces
    gc.collect()
    assert not folder.exists()


# ---- the worker pool -------------------------------------------------------------------------


def test_a_cold_load_hashes_each_trace_once(tmp_path, monkeypatch):
    # The lookup's hash is handed to the parse: a miss must not read and hash the file again.
    f = _copy(tmp_path)
    hashed = []
    real = cache_module.hashlib.file_digest
    monkeypatch.setattr(cache_module.hashlib, "file_digest", lambda fh, algo: hashed.append(fh.name) or real(fh, algo))
    load_traces(f, workers=1)
    assert sum(1 for h in hashed if isinstance(h, int)) == 1  # the trace is read through its fd once


def test_workers_that_cannot_start_fail_their_files_instead_of_hanging(tmp_path, monkeypatch):
    import subprocess

    files = [shutil.copy(GPU_NCCL / f"rank{r}.json.gz", tmp_path / f"rank{r}.json.gz") for r in (0, 1)]

    def no_process(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(TraceError) as err:  # every file failed: the load says why, for each file
        load_traces(tmp_path, cache=False, workers=2, progress=False)
    assert all(f.name in str(err.value) for f in files) and "Resource temporarily unavailable" in str(err.value)


def test_a_worker_flooding_stderr_does_not_block_the_load(tmp_path, monkeypatch):
    # More than a pipe holds on stderr, written before any result on stdout.
    for r in (0, 1):
        shutil.copy(GPU_NCCL / f"rank{r}.json.gz", tmp_path / f"rank{r}.json.gz")
    sitecustomize = tmp_path / "site"
    sitecustomize.mkdir()
    (sitecustomize / "sitecustomize.py").write_text("import sys\nsys.stderr.write('x' * 1_000_000)\nsys.stderr.flush()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(sitecustomize), os.environ.get("PYTHONPATH", "")]))
    traces = load_traces(tmp_path, cache=False, workers=2, progress=False)
    assert sorted(traces.ranks["rank"].to_list()) == [0, 1] and not traces.problems

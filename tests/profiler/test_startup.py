"""The fixed cost of a cold `ptprof analyze` (issue 16): what was moved to save it still holds.

- cache.py writes a just-parsed file's parquet entry in the background while its analyses run
  (batchmap.py's `background_write`, the in-process path): whole when summarize returns, none
  half-written after a failure or an interrupt, the frame kept in memory where the write fails;
- pool.py starts worker processes early (before the parent's imports): the map uses them, the
  ones it has no batch for are stopped, and `close` stops the rest;
- `import profiler` imports neither polars nor numpy, and `profiler.collectives` stays the function;
- a worker sends the summary bytes it has just cached instead of encoding them a second time.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import profiler.batchmap as batchmap
import profiler.cache as cache_module
import profiler.pool as pool
from profiler.cache import Parsed, entry_key, lookup, settle
from profiler.load import load_traces
from profiler.pool import LocalEngine, uncached_files
from profiler.rankmap import HOLD_LOG_ENV, MapOptions, RankSummary, RankTask
from tests.conftest import REPO


def _tiny(path: Path, rank: int) -> Path:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 900}]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{k % 3}", "pid": 1, "tid": 1, "ts": 1010 + 50 * k,
                "dur": 20 + rank} for k in range(10)]
    path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 4, "backend": "gloo"}, "traceEvents": events}))
    return path


def _task(path: Path, cache: Path) -> RankTask:
    return RankTask(str(path), "x", None, MapOptions(), str(cache), ident=lookup(path, cache)[1])


# ---- the parquet entry written in the background ---------------------------------------------


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("background", [True, False], ids=["in-process", "worker"])
def test_the_entry_is_whole_when_summarize_returns(tmp_path, batch, background, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    files = [_tiny(tmp_path / f"rank{r}.json", r) for r in range(batch)]
    queued = []
    real = cache_module._writer
    monkeypatch.setattr(cache_module, "_writer", lambda: queued.append(1) or real())
    got = batchmap.summarize_batch([_task(f, cache) for f in files], background_write=background)
    assert len(queued) == (batch if background else 0)  # a worker process writes each entry itself
    for f, summary in zip(files, got):
        assert isinstance(summary, RankSummary) and summary.unstored is None
        entry, _ = lookup(f, cache)  # served only when whole and matching its recorded digests
        assert entry is not None and entry.parquet == summary.parquet
    assert not list(cache.glob("*.tmp"))


@pytest.mark.parametrize("stop", [ValueError, KeyboardInterrupt])
def test_a_failing_or_interrupted_analysis_leaves_no_half_entry(tmp_path, monkeypatch, stop):
    cache = tmp_path / "cache"
    cache.mkdir()
    f = _tiny(tmp_path / "rank0.json", 0)
    wrote = []
    real = cache_module._write_entry

    def slow_write(*args):  # still writing when the analysis stops
        import time

        time.sleep(0.3)
        wrote.append(real(*args))
        return wrote[-1]

    def analysis_stops(*args, **kwargs):
        raise stop("stopped midway")

    monkeypatch.setattr(cache_module, "_write_entry", slow_write)
    monkeypatch.setattr(batchmap, "analyze_rank", analysis_stops)
    if stop is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            batchmap.summarize_one(_task(f, cache), background_write=True)
    else:
        assert "stopped midway" in batchmap.summarize_one(_task(f, cache), background_write=True).problem
    # Gone from summarize only once its write was over: the entry is whole (the next load reads
    # it), no temporary file is left, no summary was stored for the failed analysis.
    assert wrote and lookup(f, cache)[0] is not None
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".parquet"]


def test_a_background_write_that_fails_keeps_the_frame_in_memory(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    f = _tiny(tmp_path / "rank0.json", 0)

    def full_disk(path, data):
        Path(path).write_bytes(bytes(data[:6]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache_module, "_write_file", full_disk)
    (parsed,) = cache_module.load_many_safe([f], cache, [None], background=True)
    assert parsed.writing is not None
    done = settle(parsed)
    assert isinstance(done, Parsed) and done.parquet is None and done.unstored == "No space left on device"
    assert done.frame is not None and done.frame.height == 11
    assert list(cache.iterdir()) == []
    # summarize says the same: the numbers from memory, the reason beside them
    summary = batchmap.summarize_one(_task(f, cache), background_write=True)
    assert summary.parquet is None and summary.unstored == "No space left on device"


# ---- worker processes started early ----------------------------------------------------------


def _job(folder: Path, ranks: int) -> Path:
    folder.mkdir()
    for r in range(ranks):
        _tiny(folder / f"rank{r}.json", r)
    return folder


def test_uncached_files_are_the_files_without_an_entry(tmp_path, monkeypatch):
    job = _job(tmp_path / "job", 3)
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(cache))
    assert len(uncached_files([job])) == 3
    assert [Path(f).name for f in uncached_files([job])] == ["rank0.json", "rank1.json", "rank2.json"]
    assert len(uncached_files([job], most=2)) == 2  # as many as workers are enough to know
    load_traces(job / "rank1.json", workers=1, progress=False)  # rank 1 cached
    assert (cache / f"{entry_key(job / 'rank1.json')}.json").exists()
    assert len(uncached_files([job])) == 2
    assert [Path(f).name for f in uncached_files([job])] == ["rank0.json", "rank2.json"]
    assert len(uncached_files([job], cache=False)) == 3  # --no-cache parses them all
    assert len(uncached_files([tmp_path / "nowhere"])) == 0  # the load itself says what is wrong
    monkeypatch.setattr(pool, "PROBE_FILES", 1)  # rank0 first: cached, so the set is taken as warm
    load_traces(job / "rank0.json", workers=1, progress=False)
    assert len(uncached_files([job])) == 0


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_workers_started_early_do_the_map_and_the_unused_ones_are_stopped(tmp_path, monkeypatch):
    job = _job(tmp_path / "job", 4)
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    log = tmp_path / "held.log"
    monkeypatch.setenv(HOLD_LOG_ENV, str(log))
    engine = LocalEngine(3)
    engine.start_early(sorted(job.glob("*.json"))[:3])  # 4 files on 3 workers: batches of 2 and 2, so one worker is left over
    early = [w.proc.pid for w in engine._early]
    assert len(early) == 3 and all(_running(p) for p in early)
    traces = load_traces(job, engine=engine, progress=False)
    # The map itself stops and reaps every one (none left for close(), not even a zombie).
    assert not [p for p in early if Path(f"/proc/{p}").exists()] and engine._early == []
    assert traces.ranks["rank"].to_list() == [0, 1, 2, 3] and not traces.problems
    workers = {int(line.split()[1]) for line in log.read_text().splitlines()}
    assert len(workers) == 2 and workers < set(early)  # the map ran in two of the early ones


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_close_stops_early_workers_no_map_took(tmp_path):
    engine = LocalEngine(2)
    engine.start_early([tmp_path / f"rank{r}.json" for r in range(5)])
    early = [w.proc.pid for w in engine._early]
    assert len(early) == 2
    engine.close()
    assert not [p for p in early if _running(p)] and engine._early == []
    engine = LocalEngine(2)
    engine.start_early([tmp_path / "rank0.json"])  # one file is analysed in this process: no worker
    assert engine._early == []  # (prescan: tests/profiler/test_prescan.py)


def _environ(proc: subprocess.Popen) -> dict[str, str]:
    """The environment a running process was started with."""
    # Popen returns once exec closed the child's error pipe, which the kernel does before it
    # lays out the new stack: for a moment /proc/PID/environ still reads empty (CI saw `{}`).
    # A process that has exited reads empty too: that is said, not waited on.
    deadline = time.monotonic() + 10
    while not (text := Path(f"/proc/{proc.pid}/environ").read_text()) and time.monotonic() < deadline:
        assert proc.poll() is None, f"worker {proc.pid} exited with {proc.returncode}"
        time.sleep(0.01)
    return dict(kv.split("=", 1) for kv in text.split("\0") if "=" in kv)


def _early_worker_envs() -> list[dict[str, str]]:
    """The environments of the workers LocalEngine(2).start_early starts for two files."""
    engine = LocalEngine(2)
    try:
        engine.start_early(["rank0.json", "rank1.json"])  # two files to analyse: two workers
        return [_environ(w.proc) for w in engine._early]
    finally:
        engine.close()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_workers_get_the_allocator_tuning_unless_the_user_set_their_own(monkeypatch):
    # pool.py's comment: jemalloc's decay 50 ms, glibc's mmap threshold 1 MB and trim threshold 4 MB
    # and numpy's OpenBLAS on one thread (startup.py)
    tuned = {"_RJEM_MALLOC_CONF": "dirty_decay_ms:50,muzzy_decay_ms:0", "MALLOC_MMAP_THRESHOLD_": "1048576",
             "MALLOC_TRIM_THRESHOLD_": "4194304", "OPENBLAS_NUM_THREADS": "1"}
    for name in (*tuned, "POLARS_MAX_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    envs = _early_worker_envs()
    assert len(envs) == 2
    threads = str(max(1, len(os.sched_getaffinity(0)) // 2))  # the cores (this process may use) shared by the 2 workers
    assert all({k: e.get(k) for k in (*tuned, "POLARS_MAX_THREADS")} == tuned | {"POLARS_MAX_THREADS": threads} for e in envs), envs
    # A user's own setting wins, as for POLARS_MAX_THREADS: this process runs with it too.
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    monkeypatch.setenv("POLARS_MAX_THREADS", "1")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    envs = _early_worker_envs()
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # read by OpenBLAS too: the user's, so no value of ours
    omp = _early_worker_envs()
    assert len(omp) == 2 and all("OPENBLAS_NUM_THREADS" not in e and e["OMP_NUM_THREADS"] == "4" for e in omp), omp
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:2")
    envs += _early_worker_envs()
    # jemalloc takes the last value of a key: the user's after ours.
    mine = tuned | {"MALLOC_TRIM_THRESHOLD_": "131072", "POLARS_MAX_THREADS": "1", "OPENBLAS_NUM_THREADS": "2"}
    assert len(envs) == 4 and envs[2]["_RJEM_MALLOC_CONF"] == "dirty_decay_ms:50,muzzy_decay_ms:0,narenas:2", envs
    envs = envs[:2]
    assert len(envs) == 2 and all({k: e.get(k) for k in mine} == mine for e in envs), envs


_ANALYZE_THEN_SAY_BLAS = """
import atexit, os, runpy, sys
# The variables OpenBLAS reads, as they are when numpy is imported (the audit hook sees the import
# begin), said as the command exits.
seen = []
sys.addaudithook(lambda event, args: event == "import" and args[0] == "numpy" and not seen and seen.append(
    [os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")]))
atexit.register(lambda: print("BLAS", seen, file=sys.stderr))
sys.argv = ["profiler", "analyze", sys.argv[1], "--json", "-"]
runpy.run_module("profiler", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("user, want", [({}, ["1", None]), ({"OPENBLAS_NUM_THREADS": "3"}, ["3", None]),
                                        ({"OMP_NUM_THREADS": "4"}, [None, "4"])])
def test_the_command_imports_numpy_with_one_blas_thread_unless_the_user_said(tmp_path, user, want):
    """`python -m profiler` (what `ptprof analyze` runs) sets OPENBLAS_NUM_THREADS=1 before
    numpy's import, which reads it (startup.one_blas_thread); a user's own setting of any
    variable OpenBLAS reads is left to rule."""
    trace = _tiny(tmp_path / "rank0.json", 0)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")}
    env.update({"PYTHONPATH": str(REPO), "PTPROF_CACHE_DIR": str(tmp_path / "cache"), **user})
    done = subprocess.run([sys.executable, "-c", _ANALYZE_THEN_SAY_BLAS, str(trace)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"], done.stdout[:300]
    assert done.stderr.strip().splitlines()[-1] == f"BLAS {[want]}", done.stderr  # numpy imported once, with these


def test_one_blas_thread_keeps_numpys_openblas_from_starting_threads():
    """Where numpy's BLAS is OpenBLAS on a machine of 2+ cores, its import starts a thread per
    further core; after one_blas_thread it starts none."""
    code = """
import os, sys
if sys.argv[1] == "1":
    from profiler.startup import one_blas_thread
    one_blas_thread()
import numpy
print(len(os.listdir("/proc/self/task")))
"""
    # OpenBLAS reads OMP_NUM_THREADS and GOTO_NUM_THREADS too (a runner's test may have set one here)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    threads = [int(subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, cwd=REPO, env=env,
                                  timeout=60, check=True).stdout) for arg in ("0", "1")]
    if threads[0] == 1:
        pytest.skip("numpy started no BLAS thread here (one core, or a BLAS other than OpenBLAS)")
    assert threads == [threads[0], 1], threads


def test_polars_own_jemalloc_setting_is_not_taken_for_the_users():
    """`import polars` writes its defaults into _RJEM_MALLOC_CONF (before a user's value): once
    this process has imported it (the Python API, the viewer), the workers still get our decay,
    then the user's own value if there was one (jemalloc takes the last of a key)."""
    code = """
import os, sys
import polars  # writes _RJEM_MALLOC_CONF
from profiler.pool import _worker_env
print(os.environ["_RJEM_MALLOC_CONF"])
print(_worker_env(2)["_RJEM_MALLOC_CONF"])
"""
    ours = "dirty_decay_ms:50,muzzy_decay_ms:0"
    for user, thp, want in ((None, None, ours), ("narenas:2", None, ours + ",narenas:2"),
                            (None, "1", ours), ("dirty_decay_ms:7", "1", ours + ",dirty_decay_ms:7")):
        env = {k: v for k, v in os.environ.items() if k not in ("_RJEM_MALLOC_CONF", "POLARS_THP")}
        env.update({"PYTHONPATH": str(REPO), **({"_RJEM_MALLOC_CONF": user} if user else {}),
                    **({"POLARS_THP": thp} if thp else {})})
        polars_wrote, worker = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                                              env=env, check=True).stdout.split()
        assert polars_wrote != (user or "") and worker == want, (polars_wrote, worker)


def _ctrl_c_while_workers_start(tmp_path, monkeypatch, capsys, popen_then_interrupt) -> tuple[int, str, list]:
    """`ptprof analyze` of 3 uncached files on 3 workers, `popen_then_interrupt(real_popen, n)`
    standing in for the n-th worker's Popen: (exit status, stderr, the Popen objects made)."""
    from profiler.cli import main

    job = _job(tmp_path / "job", 3)
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    real, made = pool.subprocess.Popen, []

    def popen(*args, **kwargs):
        def start():
            made.append(real(*args, **kwargs))  # kept here, whatever happens next, to be checked below
            return made[-1]
        return popen_then_interrupt(start, len(made) + 1)

    monkeypatch.setattr(pool.subprocess, "Popen", popen)
    try:
        code = main(["analyze", str(job), "--workers", "3", "--quiet"])
    finally:
        monkeypatch.undo()
        alive = [p.pid for p in made if _running(p.pid)]
        for p in made:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not alive, f"workers left running: {alive}"
    return code, capsys.readouterr().err, made


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_between_two_workers_starting_stops_the_started_one(tmp_path, monkeypatch, capsys):
    def popen(start, n):
        if n == 2:
            raise KeyboardInterrupt  # Ctrl-C before the second worker's fork
        return start()

    code, err, made = _ctrl_c_while_workers_start(tmp_path, monkeypatch, capsys, popen)
    assert len(made) == 1 and code == 130 and err == "ptprof analyze: interrupted\n", err  # the CLI's Ctrl-C: one line


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_while_popen_waits_for_the_exec_loses_no_worker(tmp_path, monkeypatch, capsys):
    import signal
    import time

    def popen(start, n):
        proc = start()
        if n == 2:  # the child exists, Popen has not returned it yet (it waits for the exec): a real Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # where the KeyboardInterrupt is raised, unless held until the worker is kept
        return proc

    code, err, made = _ctrl_c_while_workers_start(tmp_path, monkeypatch, capsys, popen)
    assert len(made) >= 2 and code == 130 and err == "ptprof analyze: interrupted\n", err


# ---- a light `import profiler` ----------------------------------------------------------------


def test_import_profiler_is_light_and_collectives_stays_the_function():
    code = """
import sys
import profiler, profiler.cli, profiler.pool, profiler.cache
print(sorted(m for m in ("polars", "numpy") if m in sys.modules))
import profiler.collectives            # binds the submodule on the package: the name stays the function
from profiler import collectives, stragglers
print(callable(collectives) and collectives.__name__ == "collectives" and profiler.collectives is collectives)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


# ---- a worker sends the summary it stored ------------------------------------------------------


def test_a_worker_sends_the_summary_it_stored_and_encodes_only_without_one(tmp_path, monkeypatch):
    import io

    import profiler._worker as worker
    from profiler.rankmap import decode, encode

    cache = tmp_path / "cache"
    cache.mkdir()
    task = _task(_tiny(tmp_path / "rank0.json", 0), cache)
    (summary,) = batchmap.summarize_batch([task])
    encoded = []
    monkeypatch.setattr(worker, "encode", lambda s: encoded.append(s) or encode(s))

    def sent(res) -> bytes:
        out = io.BytesIO()
        worker._write(out, 7, task, res)
        head, _, blob = out.getvalue().partition(b"\n")
        assert json.loads(head) == {"index": 7, "path": task.path, "summary_bytes": len(blob)}
        return blob

    blob = sent(summary)
    assert encoded == [] and blob == encode(summary)  # the stored bytes, the same as encoding it
    for p in cache.glob("*.summary"):
        p.unlink()
    assert decode(sent(summary)).frames.keys() == summary.frames.keys() and encoded == [summary]


# ---- a small map is done in this process -------------------------------------------------------


def test_json_bytes_reads_a_gzips_trailer_and_caps_it(tmp_path):
    body = b'{"traceEvents": [], "x": "%s"}' % os.urandom(9_486).hex().encode()  # inflates ~2x, under the cap
    (tmp_path / "a.json.gz").write_bytes(gzip.compress(body))
    (tmp_path / "a.json").write_bytes(body)
    assert pool.json_bytes(tmp_path / "a.json.gz") == len(body) == 19_000
    assert pool.json_bytes(tmp_path / "a.json") == 19_000
    damaged = gzip.compress(body)[:-4] + (2**32 - 1).to_bytes(4, "little")  # a trailer of any 4 bytes
    (tmp_path / "b.json.gz").write_bytes(damaged)
    assert pool.json_bytes(tmp_path / "b.json.gz") == 100 * len(damaged)
    wrapped = gzip.compress(body)[:-4] + (5).to_bytes(4, "little")  # 4 GiB + 5 bytes, mod 4 GiB
    (tmp_path / "c.json.gz").write_bytes(wrapped)
    assert pool.json_bytes(tmp_path / "c.json.gz") == len(wrapped)  # never less than the file


def test_in_process_is_quicker_below_the_pools_worth(tmp_path):
    def files(n: int, mb: float) -> list[Path]:
        out = []
        for i in range(n):
            p = tmp_path / f"{n}-{mb}-{i}.json"
            with open(p, "wb") as f:
                f.truncate(int(mb * 1e6))  # sparse: only the size is read
            out.append(p)
        return out

    # Hand-computed at 1.5 ms a file and 9 ms a MB against 0.35 s x w / (w - 1): 0.7 s on 2
    # workers, 0.4 s on 8. 64 x 1 MB: 0.672 s; 8 x 10 MB: 0.732 s; one 77 MB: 0.6945 s; one
    # 78 MB: 0.7035 s (one file alone: always here, whatever its size).
    assert pool.in_process_is_quicker(files(64, 1), 2) and not pool.in_process_is_quicker(files(8, 10), 2)
    assert pool.in_process_is_quicker(files(1, 77) + files(1, 0), 2)  # 0.6945 + 0.0015 = 0.696
    assert not pool.in_process_is_quicker(files(1, 78) + files(1, 0), 2)  # 0.705
    assert not pool.in_process_is_quicker(files(64, 1), 8)  # more workers pay sooner: 0.4 s
    assert pool.in_process_is_quicker(files(4, 10), 8)  # 0.366 s; and on 4 workers (0.467 s)
    assert pool.in_process_is_quicker(files(1, 500), 2)  # one file: no one to share it with
    assert not pool.in_process_is_quicker(files(65, 0.001), 2)  # past what is probed: the pool
    assert not pool.in_process_is_quicker([tmp_path / "missing.json"] * 2, 2)


def test_a_set_larger_than_the_probe_starts_its_workers_early(tmp_path, monkeypatch):
    """64 small files alone would be analysed here; past the 64 files looked at, the map takes
    the pool, so start_early starts its workers (and no prescan child)."""
    from profiler import prescan

    monkeypatch.setattr(pool, "PROBE_FILES", 3)
    monkeypatch.setattr(prescan, "start", lambda paths: pytest.fail("no prescan for a set past the probe"))
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    job = _job(tmp_path / "job", 4)
    files = uncached_files([job])
    assert len(files) == 3 and files.more
    engine = LocalEngine()
    try:
        engine.start_early(files)
        assert len(engine._early) == min(engine.workers, 3) or engine.workers < 2
    finally:
        engine.close()
    small = uncached_files([job / "rank0.json", job / "rank1.json"])
    assert not small.more and len(small) == 2


def test_a_small_map_runs_here_unless_workers_are_asked_for(tmp_path, monkeypatch):
    job = _job(tmp_path / "job", 3)
    log = tmp_path / "held.log"
    monkeypatch.setenv(HOLD_LOG_ENV, str(log))
    for workers, here in ((None, True), (2, False)):
        monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / f"cache-{workers}"))
        log.unlink(missing_ok=True)
        traces = load_traces(job, engine=LocalEngine(workers), progress=False)
        assert traces.ranks["rank"].to_list() == [0, 1, 2] and not traces.problems
        pids = {int(line.split()[1]) for line in log.read_text().splitlines()}
        assert (pids == {os.getpid()}) is here and len(pids) == (1 if here else 2)


def test_the_collector_pause_freezes_what_the_cli_imported_and_only_there():
    """The CLI's imports, paused, left ~200k objects in the youngest generation for the next two
    collections to walk (~25 ms of an 8 x 1 MB run); frozen, they are never walked. The API's pause
    does not freeze (its caller's objects would never be collected)."""
    import gc

    from profiler.startup import collector_paused

    gc.unfreeze()
    try:
        with collector_paused():
            junk = [[] for _ in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() == 0
        with collector_paused(freeze=True):
            with collector_paused():  # re-entrant: the inner block leaves it paused
                assert not gc.isenabled()
            junk = [[] for _ in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= 1000
    finally:
        gc.unfreeze()
        del junk


def test_the_cli_freezes_its_imports(tmp_path):
    """`ptprof analyze` itself (not via __main__, which freezes at exit anyway) leaves its imports frozen."""
    code = ("import gc, sys; from profiler.cli import main; "
            f"main(['analyze', 'traces/sample-ddp-2r', '--quiet', '--no-cache', '--json', {str(tmp_path / 'r.json')!r}]); "
            "print(gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 10_000  # polars' and the analyses' module objects

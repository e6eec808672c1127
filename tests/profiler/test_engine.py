"""The engines of the per-rank map (profiler/pool.py, profiler/dask_pool.py): a Dask cluster gives
the local engine's numbers exactly; a worker that dies or a file that fails costs that file only,
named with its rank, and leaves nothing half-written in the caches; progress counts ranks; no more
ranks' events are in memory at once than there are workers.

One `distributed.LocalCluster` of 2 worker processes serves the whole module (it takes seconds).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from profiler import TraceError, load_traces
from profiler.cache import entry_key
from profiler.cli import analyze_main
from profiler.dask_pool import DaskEngine
from profiler.load import RankPart
from profiler.rankmap import HOLD_LOG_ENV
from profiler.report import analyze, build_report
from tests.conftest import REPO, SHARED_TRACES, ptprof
from tests.profiler.conftest import GPU_NCCL

SAMPLES = REPO / "traces"

# Makes the process that parses a trace whose distributedInfo says rank 1 die (SIGKILL, as the
# kernel's out-of-memory killer does) in the middle of writing its cache entry: the parquet is on
# disk under its temporary name, nothing is renamed. Installed in the workers, never in ptprof:
# through sitecustomize in local worker processes, through `client.run` in Dask workers.
DIE_MID_WRITE = """
import os, signal
import profiler.cache as _cache
_real = getattr(_cache, "_undying_write_entry", _cache._write_entry)
def _dying_write_entry(cache, key, sha, frame, meta, _real=_real):
    if (meta.get("distributed_info") or {}).get("rank") == 1:
        frame.write_parquet(cache / f"{key}.parquet.{os.getpid()}.tmp")
        os.kill(os.getpid(), signal.SIGKILL)
    return _real(cache, key, sha, frame, meta)
_cache._undying_write_entry = _real
_cache._write_entry = _dying_write_entry
"""
UNDO_DIE = """
import profiler.cache as _cache
_cache._write_entry = getattr(_cache, "_undying_write_entry", _cache._write_entry)
"""


@pytest.fixture(scope="module")
def dask_cache(tmp_path_factory) -> Path:
    """The Dask workers' own cache: nothing the local engine parsed or summarized is served to them."""
    return tmp_path_factory.mktemp("dask-cache")


@pytest.fixture(scope="module")
def client(dask_cache):
    """A Client of a 2-process LocalCluster whose scheduler gives a task up after its first worker
    death (KilledWorker at once; the default retries it on 3 more workers)."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                               env={"PTPROF_CACHE_DIR": str(dask_cache)})
    c = Client(cluster)
    assert set(c.run(os.getenv, "PTPROF_CACHE_DIR").values()) == {str(dask_cache)}
    yield c
    c.close()
    cluster.close()


def _frames_equal(a, b) -> None:
    """Every rank's summary frames are the same, row for row."""
    assert [(p.run, p.rank) for p in a.parts] == [(p.run, p.rank) for p in b.parts]
    for pa, pb in zip(a.parts, b.parts):
        assert pa.frames.keys() == pb.frames.keys()
        for k in pa.frames:
            assert pa.frames[k].equals(pb.frames[k]), (pa.run, pa.rank, k)


def _tiny_rank(rank: int, world: int) -> dict:
    """A hand-made gloo rank: one step, a few operators, an all_reduce (each rank a little different)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 900}]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{k % 4}", "pid": 1, "tid": 1, "ts": 1010 + 40 * k,
                "dur": 30 + rank % 7} for k in range(20)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1850, "dur": 20,
                   "args": {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                            "dtype": "Float", "Group size": world, "Process Group Name": "0"}})
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}, "traceEvents": events}


def _tiny_job(folder: Path, ranks: int) -> Path:
    """A folder of `ranks` hand-made ranks of one job (rank<R>.json)."""
    folder.mkdir(exist_ok=True)
    for r in range(ranks):
        (folder / f"rank{r}.json").write_text(json.dumps(_tiny_rank(r, ranks)))
    return folder


# ---- Dask == local ---------------------------------------------------------------------------


# single's smaller files, 4 jobs in one folder: split into runs and relabelled after the map, two
# with no rank anywhere (rank 0, noted). All of single (12 jobs, 15 MB) gives the same, at ~10x the cost.
SINGLE_SMALL = ["cpu_gloo_rank34_of_300", "mi250_rocm_single", "no_distributed_info", "nccl_args_rank0_of_2"]


@pytest.mark.parametrize("name", ["sample-ddp-2r", "sample-1f1b-2r", "gpu_nccl_2_of_128", "single"])
def test_dask_gives_the_local_numbers(client, tmp_path, name):
    if name == "single":
        path = tmp_path / "single"
        path.mkdir()
        for stem in SINGLE_SMALL:
            shutil.copy(SHARED_TRACES / "single" / f"{stem}.json.gz", path)
    else:
        path = GPU_NCCL if name == "gpu_nccl_2_of_128" else SAMPLES / name
    # Local worker processes for the 2-rank samples (their summaries come back as bytes), this
    # process for the rest: the same `summarize` either way, without more start-ups.
    local = load_traces(path, progress=False, workers=2 if name.startswith("sample") else 1)
    dask = load_traces(path, progress=False, engine=DaskEngine(client=client))
    _frames_equal(dask, local)
    assert dask.ranks.equals(local.ranks) and dask.notes == local.notes
    assert [str(p) for p in dask.problems] == [str(p) for p in local.problems]
    assert build_report(analyze(dask)) == build_report(analyze(local))
    if name == "single":
        assert dask.ranks.height == 4 and dask.ranks["run"].n_unique() == 4 and "4 different jobs" in dask.notes[0]
    # The events stay on the workers: nothing event-level pretends to be here.
    assert all(p.parquet is None and p.frame is None for p in dask.parts)
    with pytest.raises(TraceError, match="load without --cluster"):
        dask.parts[0].events()


def test_cluster_on_the_command_line(client, tmp_path):
    # The shipped DDP run plus a damaged third rank: the report covers ranks 0 and 1, the bad file
    # is one `skipped` line naming it, exit 2 -- the same report the local engine makes.
    run = tmp_path / "ddp"
    shutil.copytree(SAMPLES / "sample-ddp-2r", run)
    bad = run / "rank2.json.gz"
    bad.write_bytes((run / "rank1.json.gz").read_bytes()[:5000])
    report = tmp_path / "dask.json"
    res = ptprof("analyze", str(run), "--cluster", client.scheduler.address, "--json", str(report), "--quiet", timeout=120)
    assert res.returncode == 2, res.stderr
    skipped = [line for line in res.stderr.splitlines() if line.startswith("ptprof analyze: skipped")]
    assert len(skipped) == 1 and str(bad) in skipped[0] and "truncated" in skipped[0], res.stderr
    local = load_traces(run, progress=False, workers=1)
    assert json.loads(report.read_text()) == json.loads(json.dumps(build_report(analyze(local))))


# ---- failures --------------------------------------------------------------------------------


def _no_half_entries(cache: Path, good: list[Path], dead: Path) -> None:
    """The good files have whole entries (parquet, header, summary) and no temporary file; the
    dead one has no entry at all (at most the .tmp its killed writer left, which is never read)."""
    names = [p.name for p in cache.iterdir()]
    dead_key = entry_key(dead)
    assert not [n for n in names if n.startswith(dead_key) and not n.endswith(".tmp")]
    for f in good:
        key = entry_key(f)
        mine = [n for n in names if n.startswith(key)]
        assert f"{key}.parquet" in mine and f"{key}.json" in mine and not [n for n in mine if n.endswith(".tmp")]


def test_a_local_worker_that_dies_costs_its_file_only(tmp_path, monkeypatch):
    folder = _tiny_job(tmp_path / "job", 4)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DIE_MID_WRITE)  # worker processes only: ptprof itself is untouched
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(cache))
    # 2 workers take ranks (0, 1) and (2, 3): the first dies in rank 1's write; a fresh worker
    # takes 0 and 1 alone (1 dies again, named).
    traces = load_traces(folder, workers=2, progress=False)
    assert traces.ranks["rank"].to_list() == [0, 2, 3]
    (problem,) = traces.problems
    assert str(problem).startswith(f"{folder / 'rank1.json'}: rank 1: not analysed: its worker process died")
    assert "SIGKILL" in str(problem) and "\n" not in str(problem)
    good = [folder / f"rank{r}.json" for r in (0, 2, 3)]
    _no_half_entries(cache, good, folder / "rank1.json")
    assert len(list(cache.glob("*.summary"))) == 3  # one per good rank; none for the dead one


def test_a_local_worker_killed_once_costs_no_rank(tmp_path, monkeypatch):
    # Two files on two workers, one each; rank 1's worker is killed once (from outside, say), not
    # by its file: a fresh worker takes the file again and it loads. (A file whose worker dies
    # twice is named, as above.)
    folder = _tiny_job(tmp_path / "job", 2)
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "killed-once"
    once = DIE_MID_WRITE.replace('if (meta.get("distributed_info") or {}).get("rank") == 1:',
                                 f'if (meta.get("distributed_info") or {{}}).get("rank") == 1 and not os.path.exists({str(marker)!r}):\n'
                                 f'        open({str(marker)!r}, "w").close()')
    assert once != DIE_MID_WRITE
    (site / "sitecustomize.py").write_text(once)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    traces = load_traces(folder, workers=2, progress=False)
    assert marker.exists()  # it was killed
    assert traces.ranks["rank"].to_list() == [0, 1] and traces.problems == []


def test_a_local_worker_that_dies_in_a_batch_costs_its_file_only(tmp_path, monkeypatch):
    # 8 files on 2 workers: one batch each, (0, 1, 2, 3) and (4, 5, 6, 7). The worker dies in
    # its batch: a fresh one takes 0, 1, 2 and 3 alone (1 dies again, named); ranks 0, 2 and 3
    # share their batch with the deadly file and still load.
    folder = _tiny_job(tmp_path / "job", 8)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DIE_MID_WRITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    traces = load_traces(folder, workers=2, progress=False)
    assert traces.ranks["rank"].to_list() == [0, 2, 3, 4, 5, 6, 7]
    (problem,) = traces.problems
    assert str(problem).startswith(f"{folder / 'rank1.json'}: rank 1: not analysed: its worker process died")
    monkeypatch.setenv("PYTHONPATH", os.environ["PYTHONPATH"].split(os.pathsep, 1)[1])
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache2"))
    (folder / "rank1.json").unlink()
    _frames_equal(traces, load_traces(folder, workers=1, progress=False))


def test_a_dask_worker_that_dies_costs_its_file_only(client, dask_cache, tmp_path):
    # Two files on two idle workers, one each: a worker's death counts against every task it was
    # given (with allowed-failures 0 here, each fails at once), so a third file could share the
    # dying worker and be given up too. With Dask's default (3 retries) such a file runs again.
    folder = _tiny_job(tmp_path / "job", 2)
    client.run(exec, DIE_MID_WRITE, {})
    try:
        traces = load_traces(folder, progress=False, engine=DaskEngine(client=client))
    finally:
        client.run(exec, UNDO_DIE, {})
        client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed one
    assert set(client.run(os.getenv, "PTPROF_CACHE_DIR").values()) == {str(dask_cache)}  # restarted as it was
    assert traces.ranks["rank"].to_list() == [0]
    (problem,) = traces.problems
    assert str(problem).startswith(f"{folder / 'rank1.json'}: rank 1: not analysed: its Dask task failed (KilledWorker")
    assert str(problem).endswith("memory limit or the out-of-memory killer; the workers' logs say which)")  # whole, not cut mid-word
    _no_half_entries(dask_cache, [folder / "rank0.json"], folder / "rank1.json")
    assert len(list(dask_cache.glob(f"{entry_key(folder / 'rank0.json')}.*.summary"))) == 1
    # The good rank's analysis is the local engine's.
    local = load_traces(folder / "rank0.json", progress=False, workers=1)
    _frames_equal(traces, local)


def test_a_scheduler_without_workers_is_one_error_not_a_wait_forever():
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as empty:
        with pytest.raises(TraceError, match=rf"--cluster {empty.scheduler_address}: the scheduler has no workers after 0.5 s"):
            DaskEngine(empty.scheduler_address, timeout_s=0.5)


def test_workers_all_gone_midway_is_one_error_not_a_wait_forever(tmp_path):
    # The only worker hangs in a parse, then its nanny is closed (as when `dask worker` is
    # stopped, or killed with its nanny): the tasks would wait on the scheduler for good.
    import threading
    import time

    from distributed import Client, LocalCluster

    from tests.profiler.test_midway import DASK_HANG

    hang = tmp_path / "hang"
    hang.mkdir()
    folder = _tiny_job(tmp_path / "job", 2)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        c.run(exec, DASK_HANG % str(hang), {})
        engine = DaskEngine(client=c)
        engine.workers_gone_s = 2.0

        def stop_workers():
            deadline = time.monotonic() + 60
            while not list(hang.iterdir()) and time.monotonic() < deadline:  # the map is under way
                time.sleep(0.05)
            cluster.scale(0)

        threading.Thread(target=stop_workers, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(TraceError, match=r"^--cluster: no Dask worker for 2 s after 0 of 2 ranks: every worker left or "
                                             r"died .*nothing was reported"):
            load_traces(folder, progress=False, engine=engine)
        assert time.monotonic() - started < 60


def test_workers_running_other_code_are_refused(client):
    client.run(exec, "import profiler.summary_cache as s; s._real_code_version = s.code_version; "
                     "s.code_version = lambda: 'another'", {})
    try:
        with pytest.raises(TraceError, match=r"--cluster: 2 of 2 Dask workers run another version of ptprof's profiler "
                                             r"\(code another on tcp://"):
            DaskEngine(client=client)
    finally:
        client.run(exec, "import profiler.summary_cache as s; s.code_version = s._real_code_version", {})
    DaskEngine(client=client)  # the same code again: accepted


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address, fragment", [
    # FREE: a port nobody listens on, found when the test runs (not in the test id: xdist's
    # workers must collect the same ids). Refused: at once, not after the timeout.
    ("tcp://127.0.0.1:FREE", "cannot reach the Dask scheduler (["),
    ("tcp://no-such-host.invalid:8786", "cannot reach the Dask scheduler"),
    ("scheduler", "not a scheduler address (missing port number"),
    ("tcp://127.0.0.1:99999", "not a scheduler address (port 99999 is not a port number)"),
    ("http://127.0.0.1:8786", "not a scheduler address (unknown address scheme 'http'"),
    ("", "not a scheduler address"),
    # a URL's trailing slash, a port that is no number: said as that, not as int()'s error (trial)
    ("tcp://127.0.0.1:8786/", "not a scheduler address ('127.0.0.1:8786/' has a '/' after the host and port"),
    ("tcp://127.0.0.1:abc", "not a scheduler address ('127.0.0.1:abc': the port is not a number)"),
])
def test_a_wrong_cluster_address_is_one_line(capsys, address, fragment):
    address = address.replace("FREE", str(_free_port()))
    assert analyze_main([str(GPU_NCCL), "--cluster", address, "--quiet"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"ptprof analyze: error: --cluster {address}: ") and fragment in line


def test_cluster_without_dask_installed_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` raises ImportError
    assert analyze_main([str(GPU_NCCL), "--cluster", "tcp://127.0.0.1:8786", "--quiet"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "ptprof analyze: error: --cluster needs dask's distributed package on this machine and the workers: " \
                   "pip install 'dask[distributed]'"


def test_hta_with_cluster_is_refused(capsys):
    assert analyze_main([str(GPU_NCCL), "--cluster", "tcp://127.0.0.1:8786", "--hta", "--quiet"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "ptprof analyze: error: --hta needs the events on this machine; leave out --cluster to compare with HTA"


# ---- progress --------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_progress_counts_ranks_to_the_total(client, capsys, tmp_path, engine):
    folder = _tiny_job(tmp_path, 3)
    kw = {"engine": DaskEngine(client=client)} if engine == "dask" else {"workers": 2}
    load_traces(folder, progress=True, **kw)
    err = capsys.readouterr().err
    assert "analysing ranks" in err and "3/3 " in err and "4/3" not in err


# ---- bounded memory --------------------------------------------------------------------------


def test_no_more_ranks_held_at_once_than_workers_batches(tmp_path, monkeypatch):
    # 64 hand-made ranks (a shipped rank copied 64 times works the same, at ~10x the time).
    _tiny_job(tmp_path, 64)
    log = tmp_path / "held.log"
    monkeypatch.setenv(HOLD_LOG_ENV, str(log))
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))

    def no_events_here(self):
        raise AssertionError("the summary path read a rank's events in the main process")

    monkeypatch.setattr(RankPart, "events", no_events_here)
    traces = load_traces(tmp_path, workers=2, progress=False)
    analysis = analyze(traces)
    assert "events" not in traces._memo  # Traces.events (every rank at once) was never built
    assert analysis.breakdown.height == 64 and analysis.top_operators["rank"].n_unique() == 64
    held, peak, pids = 0, 0, set()
    mine: dict[int, int] = {}  # ranks each worker holds
    most = 0
    lines = log.read_text().splitlines()
    for line in lines:
        sign, pid, _ = line.split(" ", 2)
        held += 1 if sign == "+" else -1
        mine[int(pid)] = mine.get(int(pid), 0) + (1 if sign == "+" else -1)
        peak, most = max(peak, held), max(most, mine[int(pid)])
        pids.add(int(pid))
    assert len(lines) == 128 and held == 0  # every rank held once, and released
    # A worker holds one batch at a time: 64 files, 2 local workers, one batch each -> 32 files
    # (profiler/batchmap.py plan_batches, MAX_BATCH_FILES), never the load.
    assert 1 < most <= 32 and peak <= 2 * 32 and os.getpid() not in pids and len(pids) == 2


def test_hold_log_counts_a_rank_held_in_this_process(tmp_path, monkeypatch):
    # The marks themselves (so the bound above cannot pass on a log nothing writes): one file,
    # summarized in this process, is one + and one - from this pid.
    (tmp_path / "rank0.json").write_text(json.dumps(_tiny_rank(0, 1)))
    log = tmp_path / "held.log"
    monkeypatch.setenv(HOLD_LOG_ENV, str(log))
    load_traces(tmp_path / "rank0.json", workers=1, cache=False, progress=False)
    assert log.read_text().splitlines() == [f"+ {os.getpid()} {tmp_path / 'rank0.json'}",
                                            f"- {os.getpid()} {tmp_path / 'rank0.json'}"]



def test_a_port_that_accepts_and_never_answers_is_one_line_not_a_hang():
    # What answers on the dashboard's port 8787, or any other service, may accept and say nothing:
    # distributed's own timeout does not cover that first exchange; ours does (timeout + grace).
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(4)], daemon=True).start()
    try:
        with pytest.raises(TraceError, match=r"cannot reach the Dask scheduler \(no Dask answer within 2 s: is it the "
                                             r"scheduler's port \(8786 by default; 8787 is its dashboard\)\?\)"):
            DaskEngine(f"tcp://127.0.0.1:{server.getsockname()[1]}", timeout_s=1)
    finally:
        for conn, _ in held:
            conn.close()
        server.close()

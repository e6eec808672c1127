"""Files of different jobs in one folder or one command are separate runs, never one merged run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl

from profiler import analyze, load_traces
from tests.conftest import REPO, SHARED_TRACES


def write_trace(path, *, rank: int, world: int | None, t0: float, backend: str = "gloo") -> None:
    """A tiny Kineto trace: one ProfilerStep of 1 ms at t0 (µs) holding one operator."""
    doc = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + 10, "dur": 500},
    ]}
    if world is not None:
        doc["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world}
    path.write_text(json.dumps(doc))


def runs_of(traces) -> dict[str, list[int]]:
    return {r: sorted(traces.ranks.filter(pl.col("run") == r)["rank"].to_list()) for r in traces.runs}


def test_one_job_stays_one_run(tmp_path):
    for r in (0, 1):
        write_trace(tmp_path / f"rank{r}.json", rank=r, world=2, t0=1e15 + 3 * r)
    traces = load_traces(tmp_path)
    assert runs_of(traces) == {tmp_path.name: [0, 1]} and traces.notes == []


def test_different_world_sizes_are_different_runs(tmp_path):
    write_trace(tmp_path / "rank0.json", rank=0, world=2, t0=1e15)
    write_trace(tmp_path / "rank1.json", rank=1, world=2, t0=1e15)
    write_trace(tmp_path / "other_rank0.json", rank=0, world=8, t0=1e15)  # same clock, another job
    traces = load_traces(tmp_path)
    name = tmp_path.name
    assert runs_of(traces) == {f"{name}/other_rank0": [0], f"{name}/rank0..rank1": [0, 1]}
    assert not traces.problems  # rank 0 twice is two jobs, not a duplicate
    (note,) = traces.notes
    assert "2 different jobs" in note and f"{name}/other_rank0" in note


def test_a_split_job_is_named_by_its_first_and_last_rank_in_number_order(tmp_path):
    # 12 ranks of one job beside another job's file: rank0..rank11 (by name, rank0..rank9 said
    # a 10-rank job)
    for r in range(12):
        write_trace(tmp_path / f"rank{r}.json", rank=r, world=12, t0=1e15)
    write_trace(tmp_path / "other_rank0.json", rank=0, world=8, t0=1e15)
    traces = load_traces(tmp_path, progress=False)
    assert runs_of(traces) == {f"{tmp_path.name}/other_rank0": [0], f"{tmp_path.name}/rank0..rank11": list(range(12))}


def test_backends_and_clocks_that_never_overlap_split_too(tmp_path):
    write_trace(tmp_path / "a_rank0.json", rank=0, world=2, t0=1e15)
    write_trace(tmp_path / "a_rank1.json", rank=1, world=2, t0=1e15 + 400)  # overlaps a_rank0: same job
    write_trace(tmp_path / "b_rank0.json", rank=0, world=2, t0=2e15)  # a day later: another job
    write_trace(tmp_path / "c_rank1.json", rank=1, world=2, t0=1e15, backend="nccl")
    traces = load_traces(tmp_path)
    name = tmp_path.name
    assert runs_of(traces) == {f"{name}/a_rank0..a_rank1": [0, 1], f"{name}/b_rank0": [0], f"{name}/c_rank1": [1]}
    # no skew across jobs: each run's ranks share a clock
    a = analyze(traces)
    assert a.skew.filter(pl.col("spread_us") > 1000).is_empty()


def test_a_job_split_by_its_hosts_clocks_is_said_to_be_possibly_one(tmp_path):
    """Ranks 0-1 and 2-3 of a 4-rank job whose second host's clock runs 90 s ahead (a trial): split
    by their clocks, as two jobs would be. They stay apart (their times cannot be compared), and the
    note says they may be one job, by how much the clocks are apart, and what to do."""
    for r in range(4):
        write_trace(tmp_path / f"rank{r}.json", rank=r, world=4, t0=1e15 + (90e6 if r >= 2 else 0) + r)
    traces = load_traces(tmp_path, progress=False)
    name = tmp_path.name
    assert runs_of(traces) == {f"{name}/rank0..rank1": [0, 1], f"{name}/rank2..rank3": [2, 3]}
    (note,) = traces.notes
    assert note.endswith("analysed as separate runs: "
                         f"{name}/rank0..rank1, {name}/rank2..rank3; they hold different ranks of one world size (4): if they "
                         "are one job, its hosts' clocks are apart by 1.5 min, more than the trace lasts, and no time can "
                         "be compared across them (skew, stragglers): sync the hosts' clocks (chrony or NTP) and profile "
                         "again"), note
    # two whole jobs of one world size (each has ranks 0-1): two jobs, no such clause
    for r in range(4):
        write_trace(tmp_path / f"rank{r}.json", rank=r % 2, world=2, t0=1e15 + (90e6 if r >= 2 else 0) + r)
    (note,) = load_traces(tmp_path, progress=False).notes
    assert "2 different jobs" in note and "clocks are apart" not in note
    # beside a third job of another world size, the two parts are named
    write_trace(tmp_path / "other_rank0.json", rank=0, world=8, t0=1e15)
    for r in range(4):
        write_trace(tmp_path / f"rank{r}.json", rank=r, world=4, t0=1e15 + (90e6 if r >= 2 else 0) + r)
    (note,) = load_traces(tmp_path, progress=False).notes
    assert f"; {name}/rank0..rank1, {name}/rank2..rank3 hold different ranks of one world size (4)" in note


def test_two_folders_of_one_name_are_two_runs(tmp_path):
    for parent, t0 in (("x", 1e15), ("y", 1e15)):
        (tmp_path / parent / "job").mkdir(parents=True)
        write_trace(tmp_path / parent / "job" / "rank0.json", rank=0, world=1, t0=t0)
    traces = load_traces([tmp_path / "x" / "job", tmp_path / "y" / "job"])
    assert runs_of(traces) == {"job": [0], "y/job": [0]} and not traces.problems


def test_the_shared_single_folder_is_one_run_per_job():
    # 14 files of at least 12 jobs: merged, they made one run with a 930,797,661,766,480 µs skew
    traces = load_traces(SHARED_TRACES / "single")
    assert "single" not in traces.runs
    assert traces.ranks.group_by("run").len()["len"].max() == 1  # every file there is its own job
    assert any("different jobs" in n for n in traces.notes)
    a = analyze(traces)
    assert a.skew.is_empty() and a.stragglers.is_empty()
    assert any("different jobs" in w for w in a.warnings)


def test_a_run_folder_with_a_foreign_trace_keeps_run_json_for_its_own_job(tmp_path):
    tmp_path = tmp_path / "mine"
    tmp_path.mkdir()
    for r in (0, 1):
        write_trace(tmp_path / f"rank{r}.json", rank=r, world=2, t0=1e15)
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "mine", "world_size": 2}))
    shutil.copy(SHARED_TRACES / "gpu_nccl_2_of_128" / "rank0.json.gz", tmp_path / "theirs_rank0.json.gz")
    traces = load_traces(tmp_path)
    assert runs_of(traces) == {"mine/rank0..rank1": [0, 1], "mine/theirs_rank0": [0]}
    assert traces.runs["mine/rank0..rank1"]["run_id"] == "mine" and traces.runs["mine/theirs_rank0"] is None


def test_run_json_that_fits_two_jobs_describes_neither(tmp_path):
    """ddp's run.json and rank0 beside fsdp's rank1 (a trial): split by their clocks, both of world
    size 2, and fsdp's file was given ddp's paradigm, theory and memory. Which job run.json
    describes cannot be told: neither gets it, and the note says so."""
    run = tmp_path / "mixed"
    run.mkdir()
    write_trace(run / "rank0.json", rank=0, world=2, t0=1e15)
    write_trace(run / "rank1.json", rank=1, world=2, t0=2e15)  # never overlaps rank0's clock
    (run / "run.json").write_text(json.dumps({"run_id": "mine", "paradigm": "ddp", "world_size": 2}))
    traces = load_traces(run, progress=False)
    assert runs_of(traces) == {"mixed/rank0": [0], "mixed/rank1": [1]}
    assert traces.runs["mixed/rank0"] is None and traces.runs["mixed/rank1"] is None
    (note,) = [n for n in traces.notes if "different jobs" in n]
    assert ("analysed as separate runs: mixed/rank0, mixed/rank1; its run.json fits 2 of them (its world "
            "size and backend, where it states them), so it describes none: no paradigm, model or memory "
            "facts from it; ") in note, note
    # run.json's backend tells a gloo job from an nccl one of the same world size: it keeps to its own
    write_trace(run / "rank1.json", rank=1, world=2, t0=2e15, backend="nccl")
    (run / "run.json").write_text(json.dumps({"run_id": "mine", "paradigm": "ddp", "world_size": 2, "backend": "gloo"}))
    traces = load_traces(run, progress=False)
    assert traces.runs["mixed/rank0"]["paradigm"] == "ddp" and traces.runs["mixed/rank1"] is None
    assert not any("describes none" in n for n in traces.notes)
    (run / "run.json").write_text(json.dumps({"run_id": "mine", "paradigm": "ddp", "world_size": 2}))
    # a third file of another world size does not make it ambiguous: run.json still fits one job
    (run / "rank1.json").unlink()
    write_trace(run / "rank5.json", rank=5, world=8, t0=1e15)
    traces = load_traces(run, progress=False)
    assert traces.runs["mixed/rank0"]["paradigm"] == "ddp" and traces.runs["mixed/rank5"] is None
    assert not any("describes none" in n for n in traces.notes)


def test_copies_of_a_run_are_named_by_their_folders(tmp_path):
    # `cp -r traces/sample-ddp-2r before; cp -r ... after`: both run.json files say the same
    # run_id; the runs are the folders the user named (as the viewer names them), each whole,
    # and run.json's run_id stays in each run's manifest.
    for name in ("before", "after"):
        shutil.copytree(REPO / "traces" / "sample-ddp-2r", tmp_path / name)
    traces = load_traces([tmp_path / "before", tmp_path / "after"])
    assert runs_of(traces) == {"before": [0, 1], "after": [0, 1]}
    assert traces.runs["before"]["run_id"] == traces.runs["after"]["run_id"] == "sample-ddp-2r"
    # every finding ties between the copies: in the order the runs were given, not by name
    runs = analyze(load_traces([tmp_path / "before", tmp_path / "after"])).findings["run"].drop_nulls().to_list()
    assert runs[:2] == ["before", "after"] and len(runs) % 2 == 0
    runs = analyze(load_traces([tmp_path / "after", tmp_path / "before"])).findings["run"].drop_nulls().to_list()
    assert runs[:2] == ["after", "before"]


def test_a_folders_files_are_read_and_their_problems_said_in_number_order(tmp_path):
    for r in (0, 1):
        write_trace(tmp_path / f"rank{r}.json", rank=r, world=12, t0=1e15)
    for r in (10, 2, 11):
        (tmp_path / f"rank{r}.json").write_bytes(b"")
    problems = [Path(p.path).name for p in load_traces(tmp_path, progress=False).problems]
    assert problems == ["rank2.json", "rank10.json", "rank11.json"]  # by name it was rank10, rank11, rank2

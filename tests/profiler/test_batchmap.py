"""The batched map (profiler/batchmap.py): several files, one analysis, each file's exact numbers.

A batch runs `analyze_rank` once over the concatenated events of its files and splits the frames
back per (run, rank). That is only allowed where every frame of a rank is bit-identical to the
rank analysed alone: the first test checks it on the traces where it once was not (single's
mi300: top_kernels sums 1 ulp off; a100_cudagraphs: two collectives starting together, in
another order), the rest that batches are planned the same way every time and that failures stay
per file.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import profiler.batchmap as batchmap
import profiler.rankmap as rankmap
from profiler.batchmap import plan_batches, summarize_batch
from profiler.cache import load_one_safe
from profiler.errors import TraceError
from profiler.rankmap import MapOptions, RankSummary, RankTask, _events, analyze_rank, rank_row, rank_rows
from tests.conftest import REPO, SHARED_TRACES

BATCH = [SHARED_TRACES / "single" / f"{n}.json.gz" for n in
         ("mi300_timesformer_memory", "a100_cudagraphs_rank0_of_16", "cpu_gloo_rank34_of_300", "no_distributed_info")]
BATCH += sorted((REPO / "traces" / "sample-zbv-2r").glob("rank*.json.gz"))


def test_a_batch_gives_each_rank_its_numbers_alone_bit_for_bit(tmp_path):
    ready = []
    for r, path in enumerate(BATCH):  # one run, a rank each: the frame a batch of these files makes
        parsed = load_one_safe(path, tmp_path)
        task = RankTask(str(path), "x", None, MapOptions(activity=True), str(tmp_path), rank=r)
        ready.append(batchmap._Ready(task, parsed, r, tmp_path))
    together = batchmap._analyse_together(ready)
    for r, path in enumerate(BATCH):
        p = ready[r].parsed
        alone = analyze_rank(_events(p, "x", r), rank_row(p.meta, "x", r, str(path)), {"x": None}, step=None, top_n=15)
        mine = together[("x", r)]
        assert list(mine) == list(alone)
        for name, frame in alone.items():
            assert mine[name].schema == frame.schema, (path.name, name)
            assert mine[name].equals(frame), (path.name, name)  # row order and every bit of every float
        assert alone["top_kernels"].height or alone["top_operators"].height


def test_activity_bins_of_a_rank_do_not_move_in_a_batch(tmp_path):
    # Hand-made ranks with round times: a span ending on a bin edge. Alone, one rank's bin width
    # is a single value and polars divided by its reciprocal; beside another rank, element by
    # element: the span's end fell 1 ulp past the edge alone, on it in a batch (one sliver row less).
    from tests.profiler.test_engine import _tiny_rank

    tasks = []
    for r in range(2):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(_tiny_rank(r, 8)))
        tasks.append(RankTask(str(tmp_path / f"rank{r}.json"), "job", None, MapOptions(activity=True), str(tmp_path / "c1"), rank=r))
    got = summarize_batch(tasks)
    alone = _summaries_alone(tasks, tmp_path / "c2")
    for a, b in zip(got, alone):
        _same(a, b)
    assert got[0].frames["activity"].height > 700


def _tasks(tmp_path: Path, sizes: list[int], run: str = "x") -> list[RankTask]:
    out = []
    for k, size in enumerate(sizes):
        f = tmp_path / f"{run}-rank{k}.json"
        f.write_bytes(b" " * size)
        out.append(RankTask(str(f), run, None, MapOptions()))
    return out


def test_batches_are_consecutive_and_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(batchmap, "MAX_BATCH_BYTES", 1000)
    monkeypatch.setattr(batchmap, "ALONE_BYTES", 600)
    # 2 workers, 10 files: about two batches per worker, so up to ceil(10 / 4) = 3 files a batch
    tasks = _tasks(tmp_path, [100] * 10)
    assert plan_batches(tasks, 2) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    # one batch per worker (the local pool): ceil(10 / 2) = 5 files a batch
    assert plan_batches(tasks, 2, per_worker=1) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    # bytes: 400 + 400 fit, a third would pass 1000; a file of 600 or more is alone
    tasks = _tasks(tmp_path, [400, 400, 400, 700, 100, 100])
    assert plan_batches(tasks, 1) == [[0, 1], [2], [3], [4, 5]]
    # a gzip file counts its JSON's bytes, not its compressed ones
    big = tmp_path / "big.json.gz"
    big.write_bytes(gzip.compress(b" " * 700))
    assert big.stat().st_size < 100
    zipped = tasks[:1] + [dataclasses.replace(tasks[4], path=str(big))] + tasks[4:]
    assert plan_batches(zipped, 1) == [[0], [1], [2, 3]]
    # another run (or run.json, or options) starts a batch
    mixed = _tasks(tmp_path, [10, 10], "a") + _tasks(tmp_path, [10, 10], "b")
    assert plan_batches(mixed, 1) == [[0, 1], [2, 3]]
    other = [mixed[0], dataclasses.replace(mixed[1], options=MapOptions(top_n=3))]
    assert plan_batches(other, 1) == [[0], [1]]
    # a pure function of the tasks: the same batches for a Dask client and a local pool
    assert plan_batches(tasks, 1) == plan_batches(list(tasks), 1)
    assert plan_batches([], 4) == []


def _tiny(path: Path, rank: int) -> None:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 900}]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{k % 3}", "pid": 1, "tid": 1, "ts": 1010 + 50 * k,
                "dur": 20 + rank} for k in range(10)]
    path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 4, "backend": "gloo"}, "traceEvents": events}))


def _summaries_alone(tasks: list[RankTask], cache: Path) -> list:
    from profiler.rankmap import summarize

    return [summarize(dataclasses.replace(t, cache=str(cache))) for t in tasks]


def _same(a, b) -> None:
    assert isinstance(a, RankSummary) and isinstance(b, RankSummary)
    assert a.rank == b.rank and list(a.frames) == list(b.frames)
    assert all(a.frames[k].equals(b.frames[k]) for k in a.frames)


def test_a_bad_file_in_a_batch_is_its_own_error(tmp_path):
    for r in range(3):
        _tiny(tmp_path / f"rank{r}.json", r)
    (tmp_path / "rank1.json").write_bytes(gzip.compress(b"{"))  # not JSON inside
    tasks = [RankTask(str(tmp_path / f"rank{r}.json"), "x", None, MapOptions(), str(tmp_path / "c1"), rank=r) for r in range(3)]
    got = summarize_batch(tasks)
    assert isinstance(got[1], TraceError) and str(got[1].path) == str(tmp_path / "rank1.json")
    alone = _summaries_alone(tasks, tmp_path / "c2")
    _same(got[0], alone[0])
    _same(got[2], alone[2])
    # each good file has its own cached summary: a second batch reads them back, the same numbers
    again = summarize_batch([dataclasses.replace(t, ident=None) for t in tasks])
    _same(again[0], alone[0])


def test_a_failing_batched_analysis_falls_back_to_each_file_alone(tmp_path, monkeypatch):
    for r in range(3):
        _tiny(tmp_path / f"rank{r}.json", r)
    real = batchmap.analyze_rank

    def fussy(events, ranks, runs, **kw):  # trips on rank 2's events, whatever else is with them
        if 2 in events["rank"].to_list():
            raise ValueError("odd events")
        return real(events, ranks, runs, **kw)

    monkeypatch.setattr(batchmap, "analyze_rank", fussy)
    tasks = [RankTask(str(tmp_path / f"rank{r}.json"), "x", None, MapOptions(), str(tmp_path / "c1"), rank=r) for r in range(3)]
    got = summarize_batch(tasks)
    assert isinstance(got[2], TraceError) and str(got[2].path) == str(tmp_path / "rank2.json") and "odd events" in got[2].problem
    alone = _summaries_alone(tasks[:2], tmp_path / "c2")
    _same(got[0], alone[0])
    _same(got[1], alone[1])


def test_files_labelled_alike_in_a_batch_are_analysed_apart(tmp_path):
    # Two rank-less files: a worker labels both rank 0 (load.py sorts them out); concatenated,
    # they would be one rank of twice the events.
    for k in range(2):
        _tiny(tmp_path / f"f{k}.json", 0)
    tasks = [RankTask(str(tmp_path / f"f{k}.json"), "x", None, MapOptions(), str(tmp_path / "c1")) for k in range(2)]
    got = summarize_batch(tasks)
    alone = _summaries_alone(tasks, tmp_path / "c2")
    for a, b in zip(got, alone):
        _same(a, b)
    assert got[0].frames["top_operators"]["count"].sum() == 10  # one file's 10 operators, not 20


def test_step_that_a_rank_lacks_leaves_it_only_its_steps(tmp_path):
    # --step 1 over a batch where rank 1 has no ProfilerStep#1: as alone, only all_steps.
    _tiny(tmp_path / "rank0.json", 0)
    _tiny(tmp_path / "rank1.json", 1)
    doc = json.loads((tmp_path / "rank1.json").read_text())
    doc["traceEvents"][0]["name"] = "ProfilerStep#2"
    (tmp_path / "rank1.json").write_text(json.dumps(doc))
    opts = MapOptions(step=1)
    tasks = [RankTask(str(tmp_path / f"rank{r}.json"), "x", None, opts, str(tmp_path / "c1"), rank=r) for r in range(2)]
    got = summarize_batch(tasks)
    alone = _summaries_alone(tasks, tmp_path / "c2")
    assert list(got[1].frames) == ["all_steps", "empty_steps"]
    for a, b in zip(got, alone):
        _same(a, b)
    assert pl.concat([got[0].frames["all_steps"], got[1].frames["all_steps"]])["step"].to_list() == [1, 2]


def test_frames_split_back_per_rank_keep_their_rows_in_order():
    # Each (run, rank)'s rows in their order, whether a rank's rows are together (slices) or not.
    run = pl.Series(["x", "x", "x", "y", "x"], dtype=pl.Categorical)
    frame = pl.DataFrame({"run": run, "rank": pl.Series([0, 0, 1, 0, 2], dtype=pl.Int32), "v": [1.0, 2.0, 3.0, 4.0, 5.0]})
    parts = batchmap._by_rank(frame)
    assert {k: p["v"].to_list() for k, p in parts.items()} == {("x", 0): [1.0, 2.0], ("x", 1): [3.0], ("y", 0): [4.0],
                                                               ("x", 2): [5.0]}
    assert all(p.schema == frame.schema for p in parts.values())
    mixed = frame.with_columns(rank=pl.Series([0, 1, 0, 0, 1], dtype=pl.Int32))  # rank 0 of x in two places
    parts = batchmap._by_rank(mixed)
    assert {k: p["v"].to_list() for k, p in parts.items()} == {("x", 0): [1.0, 3.0], ("x", 1): [2.0, 5.0], ("y", 0): [4.0]}
    assert batchmap._by_rank(frame.clear()) == {}


def test_a_batch_s_rank_rows_are_each_file_s_row():
    metas = [{"has_gpu": True, "distributed_info": {"rank": 0, "world_size": 4, "backend": "nccl", "pg_config": [{"pg_size": 4}]}},
             {"has_gpu": False, "distributed_info": None},
             {"has_gpu": False, "distributed_info": {"world_size": "8"}}]
    files = [(m, "x", r, f"rank{r}.json") for r, m in enumerate(metas)]
    together = rank_rows(files)
    alone = pl.concat([rank_row(*f) for f in files])
    assert together.schema == alone.schema and together.equals(alone)
    assert together["world_size"].to_list() == [4, None, 8] and together["backend"].to_list() == ["nccl", None, None]


def test_a_deadly_file_without_a_usable_cache_is_its_own_error(tmp_path, monkeypatch):
    # A Dask worker whose cache folder is unusable parses into memory: a file nested too deeply
    # for the parser (RecursionError, not a TraceError) is that file's error, not the batch's.
    import profiler.cache as cache

    def unusable():
        raise cache.CacheUnusable("no cache here")

    monkeypatch.setattr(cache, "cache_dir", unusable)
    deep = tmp_path / "rank1.json"
    deep.write_text('{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": '
                    + "[" * 100_000 + "]" * 100_000 + "}]}")
    good = REPO / "traces" / "sample-ddp-2r" / "rank0.json.gz"
    res = summarize_batch([RankTask(str(good), "r", None, MapOptions()), RankTask(str(deep), "r", None, MapOptions())])
    assert isinstance(res[0], RankSummary) and res[0].rank == 0
    assert isinstance(res[1], TraceError) and Path(res[1].path) == deep
    assert "nested too deeply" in res[1].problem


@pytest.mark.parametrize("read_whole_bytes", [0, 1 << 30], ids=["column by column", "in one read"])
def test_a_worker_s_frame_holds_only_the_analysed_columns(tmp_path, monkeypatch, read_whole_bytes):
    monkeypatch.setattr(rankmap, "READ_WHOLE_BYTES", read_whole_bytes)  # big entries are read a column at a time
    # The columns no per-rank analysis reads stay in the parquet entry, out of a worker's memory;
    # the frame read back from the entry (those columns only, one chunk each) is the one just parsed.
    from profiler.parse import SCHEMA

    path = REPO / "traces" / "sample-1f1b-2r" / "rank0.json.gz"
    parsed = load_one_safe(path, tmp_path)
    assert parsed.fresh is not None and parsed.parquet is not None
    fresh = _events(parsed, "x", 0)
    read = _events(dataclasses.replace(parsed, fresh=None), "x", 0)
    assert set(SCHEMA) - set(fresh.columns) == {"thread", "cat", "external_id", "group_desc", "copy_bytes", "mem_addr"}
    assert read.columns == fresh.columns and read.n_chunks("all") == [1] * read.width
    assert read.equals(fresh)
    runs = {"x": json.loads((path.parent / "run.json").read_text())}
    full = parsed.fresh.with_columns(run=pl.lit("x", pl.Categorical), rank=pl.lit(0, pl.Int32)).select(list(SCHEMA))
    whole = analyze_rank(full, rank_row(parsed.meta, "x", 0, str(path)), runs, step=None, top_n=15)
    mine = analyze_rank(read, rank_row(parsed.meta, "x", 0, str(path)), runs, step=None, top_n=15)
    assert list(mine) == list(whole) and all(mine[k].equals(whole[k]) for k in whole)
    assert whole["top_operators"].height and whole["actions"].height


def test_a_batch_of_read_back_and_just_parsed_files_is_analysed_together(tmp_path, monkeypatch):
    # A file whose entry exists (here: made by a load with --step 3) beside one parsed now: the
    # frames hold different columns until both are cut to the analysed ones; the batch is then one
    # analysis, not each file alone (a fallback that gives the same numbers, so only a spy sees it).
    run = REPO / "traces" / "sample-ddp-2r"
    man = json.loads((run / "run.json").read_text())

    def task(r, step=None, cache=tmp_path / "a"):
        cache.mkdir(exist_ok=True)
        return RankTask(str(run / f"rank{r}.json.gz"), "ddp", man, MapOptions(step=step, top_n=15), cache=str(cache), rank=r)

    summarize_batch([task(0, step=3)])
    raised = []
    together = batchmap._analyse_together

    def spy(batch):
        try:
            return together(batch)
        except Exception as e:
            raised.append(e)
            raise

    monkeypatch.setattr(batchmap, "_analyse_together", spy)
    both = summarize_batch([task(0), task(1)])
    assert raised == [] and all(isinstance(r, RankSummary) for r in both)
    alone = [summarize_batch([task(r, cache=tmp_path / "b")])[0] for r in (0, 1)]  # parsed afresh, each alone
    for got, want in zip(both, alone):  # the same numbers (the entries' paths differ: two caches)
        assert (got.rank, got.meta, list(got.frames)) == (want.rank, want.meta, list(want.frames))
        assert all(got.frames[k].equals(want.frames[k]) for k in want.frames)

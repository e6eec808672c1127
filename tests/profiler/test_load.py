"""The loader on every real trace we have, and on bad input (its cache: test_cache.py)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import msgspec
import polars as pl
import pytest

from profiler import SCHEMA, TraceError, load_traces
from profiler.parse import parse_trace_file
from tests.conftest import SHARED_TRACES
from tests.profiler.conftest import GPU_NCCL

SINGLE = SHARED_TRACES / "single"
# file -> (rank, has_gpu, device_kind) for those that load; a message fragment for those that must not.
LOADS = {
    "a100_cudagraphs_rank0_of_16.json.gz": (0, True, "cuda"),
    "a100_rank3_of_8.json.gz": (3, True, "cuda"),
    "cpu_gloo_rank34_of_300.json.gz": (34, False, "cpu"),
    "nccl_args_rank0_of_2.json.gz": (0, True, "cuda"),
    "v100_nccl_memory_rank1.json.gz": (1, True, "cuda"),
    "v100_rank1_of_2.json.gz": (1, True, "cuda"),
    "v100_ns_resolution_rank0.json.gz": (0, True, "cuda"),
    "mtia_rank0.json.gz": (0, True, "mtia"),
    # torch 1.8: GPU tids "stream 7" (every GPU event was dropped: analysed as CPU)
    "torch18_v100_resnet50_rank0.json.gz": (0, True, "cuda"),
    # no rank anywhere: each is its run's only file here, so rank 0 with a note
    "mi250_rocm_single.json.gz": (0, True, "rocm"),
    "mi300_timesformer_memory.json.gz": (0, True, "rocm"),
    "no_distributed_info.json.gz": (0, False, "cpu"),  # an A100 host's trace recorded without CUDA activity
}
NO_RANK = {"mi250_rocm_single.json.gz", "mi300_timesformer_memory.json.gz", "no_distributed_info.json.gz"}
FAILS = {
    "export_memory_timeline.raw.gz": "not a Kineto/Chrome trace",
}


def test_every_shared_trace_is_listed():
    assert {p.name for p in SINGLE.iterdir()} == set(LOADS) | set(FAILS)


@pytest.mark.parametrize("name", sorted(LOADS))
def test_shared_trace_loads(name):
    traces = load_traces(SINGLE / name)
    rank, has_gpu, kind = LOADS[name]
    assert traces.ranks["rank"].to_list() == [rank]
    assert traces.ranks["has_gpu"].to_list() == [has_gpu]
    assert traces.ranks["device_kind"].to_list() == [kind]
    assert traces.ranks["unknown_categories"].to_list() == [None]  # every event's category is known
    assert traces.events.schema == pl.Schema(SCHEMA)
    assert traces.events.height > 0
    assert traces.events.filter(pl.col("dur_us") < 0).is_empty()
    if name in NO_RANK:
        assert len(traces.notes) == 1 and name in traces.notes[0] and "rank 0" in traces.notes[0]
    else:
        assert traces.notes == []


@pytest.mark.parametrize("name", sorted(FAILS))
def test_shared_trace_fails_clearly(name):
    with pytest.raises(TraceError) as err:
        load_traces(SINGLE / name)
    assert name in str(err.value) and FAILS[name] in str(err.value)


def test_missing_rank_can_be_supplied():
    traces = load_traces(SINGLE / "mi250_rocm_single.json.gz", default_rank=5)
    assert traces.ranks["rank"].to_list() == [5] and traces.notes == []
    kinds = set(traces.events.filter(pl.col("device") == "gpu")["kind"].cast(pl.String))
    assert {"compute", "memory"} <= kinds  # ROCm kernels classified like CUDA ones


def test_several_files_without_a_rank_in_one_run_are_errors(tmp_path):
    # Two rankless files of one run would both be rank 0: neither is guessed, and the message says why.
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(SINGLE / "no_distributed_info.json.gz", tmp_path / name)
    with pytest.raises(TraceError) as err:
        load_traces(tmp_path)
    assert "a.json.gz" in str(err.value) and "b.json.gz" in str(err.value) and "not the only file of its run" in str(err.value)


def test_a_rankless_file_beside_ranked_ones_is_an_error(tmp_path):
    # One job (no distributedInfo in either, overlapping clocks): rank 1 by its name, and a file
    # naming none, which as rank 0 would be a guess among the job's ranks.
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1e15, "dur": 1000},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1e15 + 10, "dur": 500}]
    for name in ("rank1.json", "trace.json"):
        _write(tmp_path / name, msgspec.json.encode({"traceEvents": events}))
    traces = load_traces(tmp_path)
    assert traces.ranks["rank"].to_list() == [1] and not any("rank 0" in n for n in traces.notes)
    assert len(traces.problems) == 1 and "trace.json: no rank" in str(traces.problems[0])


def test_normalized_columns_on_a_gpu_trace():
    ev = load_traces(GPU_NCCL).events
    assert ev["run"].unique().to_list() == ["gpu_nccl_2_of_128"]
    assert sorted(ev["rank"].unique()) == [0, 1]
    gpu = ev.filter(pl.col("device") == "gpu")
    assert gpu["stream"].null_count() == 0 and gpu["correlation"].null_count() == 0
    assert (ev["end_us"] == ev["ts_us"] + ev["dur_us"]).all()
    # Kineto's "Spans"/"Traces" pseudo-processes (string pids) are not events
    assert ev["pid"].null_count() == 0


def test_nccl_args_are_flattened():
    ev = load_traces(SINGLE / "nccl_args_rank0_of_2.json.gz").events
    k = ev.filter((pl.col("device") == "gpu") & (pl.col("kind") == "comm"))
    assert k["collective"].cast(pl.String).unique().sort().to_list() == ["allreduce", "broadcast"]
    assert k["in_nelems"].null_count() == 0 and set(k["group_ranks"].cast(pl.String)) == {"[0, 1]"}


def test_memory_events_are_flattened():
    ev = load_traces(SINGLE / "v100_nccl_memory_rank1.json.gz").events
    mem = ev.filter(pl.col("kind") == "memory_event")
    assert mem.height == 28010
    assert mem["mem_bytes"].null_count() == 0 and mem["mem_total_allocated_bytes"].null_count() == 0


# ---- bad input -------------------------------------------------------------------------------


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("content, fragment", [
    (b"", "empty file"),
    (gzip.compress(b'{"traceEvents": [{"ph": "X"}]}', mtime=0)[:-10], "truncated or corrupt gzip"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1', "not valid JSON"),
    (b'{"hello": 1}', "not a Kineto/Chrome trace"),
    (b"[1, 2, 3]", "not a Kineto/Chrome trace"),
    # what each odd file is, said: a gzip inside the gzip, a byte-order mark, torch's memory
    # timeline export, ptprof's own report
    (gzip.compress(gzip.compress(b'{"traceEvents": []}', mtime=0), mtime=0), "the file is gzip'ed twice: gunzip it once"),
    (b'\xef\xbb\xbf{"traceEvents": []}', "it starts with a UTF-8 byte-order mark, which JSON does not allow"),
    (b"[[-1, 1, 37888, 7], [-1, 1, 512, 7]]", "a list of lists, as torch's export_memory_timeline writes (.raw.gz)?"),
    (b'{\n "schema": "ptprof.report/1",\n "findings": []}', "ptprof's own output (ptprof.report/1: a report, projection, plan or saved cluster)"),
])
def test_bad_files(tmp_path, content, fragment):
    f = _write(tmp_path / "rank0.json", content)
    with pytest.raises(TraceError) as err:
        load_traces(f)
    assert str(f) in str(err.value) and fragment in str(err.value)


def test_folder_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(TraceError, match="no trace files"):
        load_traces(tmp_path)


def test_duplicate_ranks_are_named(tmp_path):
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(GPU_NCCL / "rank0.json.gz", tmp_path / name)
    traces = load_traces(tmp_path)
    assert traces.ranks.height == 1
    assert [str(p) for p in traces.problems] == [f"{tmp_path / 'b.json.gz'}: duplicate rank 0 in run {tmp_path.name!r} (kept: "
                                                 f"{tmp_path / 'a.json.gz'}, read first); pass the files of one run only"]


def test_a_duplicate_rank_is_told_of_rank_from_filename_only_where_it_would_help(tmp_path):
    # rank0.json.gz beside rank5.json.gz, both rank 0 inside: the names give two ranks, so
    # --rank-from-filename would load both; given already, or with names alike, it is not offered.
    for name in ("rank0.json.gz", "rank5.json.gz"):
        shutil.copy(GPU_NCCL / "rank0.json.gz", tmp_path / name)
    (problem,) = load_traces(tmp_path).problems
    assert str(problem).endswith("pass the files of one run only, or --rank-from-filename")
    assert sorted(load_traces(tmp_path, rank_from_filename_first=True).ranks["rank"].to_list()) == [0, 5]
    shutil.copy(GPU_NCCL / "rank0.json.gz", tmp_path / "rank0 (copy).json.gz")
    problems = load_traces(tmp_path, rank_from_filename_first=True).problems
    assert [str(p) for p in problems] == [f"{tmp_path / 'rank0.json.gz'}: duplicate rank 0 in run {tmp_path.name!r} (kept: "
                                          f"{tmp_path / 'rank0 (copy).json.gz'}, read first); pass the files of one run only"]


def test_partial_load_names_the_bad_rank(tmp_path):
    shutil.copy(GPU_NCCL / "rank0.json.gz", tmp_path / "rank0.json.gz")
    _write(tmp_path / "rank1.json.gz", b"")
    traces = load_traces(tmp_path)
    assert traces.ranks["rank"].to_list() == [0]
    assert "rank1.json.gz: rank 1: empty file" in str(traces.problems[0])  # the rank its name gives, then why


def test_unknown_categories_are_counted_with_thousands_separators(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]
    events += [{"ph": "X", "cat": "hpu_op", "name": "matmul", "pid": 7, "tid": 2, "ts": 10 + k, "dur": 1} for k in range(1200)]
    f = _write(tmp_path / "rank0.json", msgspec.json.encode({"traceEvents": events}))
    assert load_traces(f, progress=False).ranks["unknown_categories"].to_list() == ["hpu_op (1,200)"]


def test_rank_from_filename_and_chrome_array_form(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
              {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 12, "s": "t"},
              {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 10, "cat": "fwdbwd", "name": "fwdbwd"},
              {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 0, "dur": 9}]
    f = _write(tmp_path / "rank7_trace.json", msgspec.json.encode(events))
    traces = load_traces(f)
    assert traces.ranks["rank"].to_list() == [7]
    assert traces.events["name"].cast(pl.String).to_list() == ["aten::mm", "mark"]
    assert traces.events.filter(pl.col("name") == "mark")["dur_us"].item() == 0.0


def test_several_files_in_parallel_match_one_by_one():
    both = load_traces(GPU_NCCL, cache=False, workers=2, progress=False)
    one = pl.concat([load_traces(GPU_NCCL / f"rank{r}.json.gz", cache=False).events for r in (0, 1)])
    assert both.events.sort("rank", "ts_us", "name").equals(one.sort("rank", "ts_us", "name"))


def test_parse_keeps_thread_names():
    frame, meta = parse_trace_file(SINGLE / "cpu_gloo_rank34_of_300.json.gz")
    assert meta["distributed_info"]["rank"] == 34
    assert frame["thread"].cast(pl.String).str.contains("pt_main_thread").all()
    assert set(frame.filter(pl.col("kind") == "comm")["name"].cast(pl.String)) == {"gloo:all_reduce"}


def test_loose_field_types_are_normalized(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "12", "tid": 3, "ts": 1.5, "dur": 2},  # numeric-string pid
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 12, "tid": 3, "ts": 2, "dur": 1,
         "args": {"stream": "0x0", "correlation": 7, "External id": "5"}},  # ROCm's string stream
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 3, "dur": 1, "args": {"correlation": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 12, "tid": 3, "ts": 4, "dur": 1,
         "args": {"Input Dims": [[[2, 3], [4]], []], "Input type": ["TensorList", "Scalar"], "Process Group Ranks": [0, 1]}},
        {"ph": "B", "name": "begin", "pid": 12, "tid": 3, "ts": 5},  # other ph: dropped, counted
        {"ph": "X", "name": "no time", "pid": 12, "tid": 3},  # no ts: dropped, counted
        {"ph": "M", "name": "thread_name", "pid": 12, "tid": 3, "args": {"name": "pt_main_thread"}},
    ]
    frame, meta = parse_trace_file(_write(tmp_path / "t.json", msgspec.json.encode({"traceEvents": events})))
    rows = {r["name"]: r for r in frame.with_columns(pl.col(pl.Categorical).cast(pl.String)).iter_rows(named=True)}
    assert set(rows) == {"aten::mm", "hipLaunchKernel", "gemm", "c10d::allreduce_"}
    assert (rows["aten::mm"]["pid"], rows["aten::mm"]["ts_us"], rows["aten::mm"]["thread"]) == (12, 1.5, "pt_main_thread")
    assert (rows["hipLaunchKernel"]["stream"], rows["hipLaunchKernel"]["external_id"]) == (None, 5)
    assert (rows["gemm"]["device"], rows["gemm"]["stream"], rows["gemm"]["correlation"]) == ("gpu", 7, 7)
    assert rows["c10d::allreduce_"]["arg_nelems"] == [2 * 3 + 4, None]
    assert rows["c10d::allreduce_"]["group_ranks"] == "[0, 1]"
    assert meta["dropped"] == {"flow": 0, "string_pid": 0, "no_ts": 1, "bad_ts": 0, "no_dur": 0, "bad_dur": 0, "bad_step": 0,
                               "other_ph": 1}


@pytest.mark.parametrize("doc, fragment", [
    ({"traceEvents": [1, 2]}, "$.traceEvents[0]"),
    ({"traceEvents": [{"ph": "X", "name": "a", "args": "oops"}]}, "$.traceEvents[0].args"),
])
def test_malformed_events_name_the_place(tmp_path, doc, fragment):
    f = _write(tmp_path / "rank0.json", msgspec.json.encode(doc))
    with pytest.raises(TraceError) as err:
        parse_trace_file(f)
    assert "not a Kineto/Chrome trace" in str(err.value) and fragment in str(err.value)


def test_odd_header_and_args_load_instead_of_failing(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 1, "dur": 2,
         "args": {"Input Dims": [[None, 4]], "Input type": ["float"]}},  # a dimension that is not a number
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 4, "dur": 2},
    ]
    doc = {"deviceProperties": [{"name": None}, {"name": "A100"}], "distributedInfo": {"rank": 0}, "traceEvents": events}
    frame, meta = parse_trace_file(_write(tmp_path / "rank0.json", msgspec.json.encode(doc)))
    assert meta["device_name"] == "A100"
    assert frame.filter(pl.col("name") == "c10d::allreduce_")["arg_nelems"].to_list() == [[None]]


def test_a_parser_crash_names_the_file(tmp_path, monkeypatch):
    import profiler.cache as cache_module

    def boom(path):
        raise RuntimeError("unexpected shape")

    monkeypatch.setattr(cache_module, "parse_trace_file", boom)
    f = shutil.copy(GPU_NCCL / "rank0.json.gz", tmp_path / "rank0.json.gz")
    with pytest.raises(TraceError) as err:
        load_traces(f, cache=False)
    assert "rank0.json.gz" in str(err.value) and "RuntimeError: unexpected shape" in str(err.value)


def test_a_file_named_twice_or_linked_is_read_once_with_a_note(tmp_path, monkeypatch):
    """Read twice, a file was its own duplicate rank: refused, with a hint (--rank-from-filename)
    that could not help. The same path twice, a symlinked folder, a hard link: one file, read once."""
    from tests.conftest import REPO

    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    sample = REPO / "traces" / "sample-ddp-2r"
    once = load_traces(sample, progress=False)
    twice = load_traces([sample, sample], progress=False)
    assert not twice.problems and twice.ranks["rank"].to_list() == once.ranks["rank"].to_list() == [0, 1]
    assert twice.notes == [f"2 files named again (the same path twice, or a link to a file already named), each read "
                           f"once: {sample / 'rank0.json.gz'} named twice, ..."]
    (tmp_path / "link").symlink_to(sample)
    linked = load_traces([sample / "rank1.json.gz", tmp_path / "link" / "rank1.json.gz"], progress=False)
    assert not linked.problems and linked.ranks["rank"].to_list() == [1]
    assert linked.notes == [f"{tmp_path / 'link' / 'rank1.json.gz'} is {sample / 'rank1.json.gz'} (a link to the same "
                            f"file): read once"]
    hard = tmp_path / "hard"
    hard.mkdir()
    shutil.copy(sample / "rank0.json.gz", hard / "rank0.json.gz")
    (hard / "rank1.json.gz").hardlink_to(hard / "rank0.json.gz")
    got = load_traces(hard, progress=False)
    assert not got.problems and got.ranks["rank"].to_list() == [0] and "(a link to the same file): read once" in got.notes[0]


def test_an_unusable_cache_dir_is_said_and_the_fallback_named(tmp_path, monkeypatch):
    from profiler.cache import cache_dir
    from tests.conftest import REPO

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(not_a_folder))
    got = load_traces(REPO / "traces" / "sample-ddp-2r", progress=False)
    assert not got.problems and got.ranks["rank"].to_list() == [0, 1]
    assert got.notes == [f"$PTPROF_CACHE_DIR ({not_a_folder}) is not a folder this user can write: the parse cache is "
                         f"{cache_dir()}"]
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "fine"))
    assert load_traces(REPO / "traces" / "sample-ddp-2r", progress=False).notes == []


def test_none_usable_counts_the_files_of_other_problems():
    # 3 shown in full, then the 3 commonest kinds of the rest, then how many files are left
    from profiler.load import _none_usable

    problems = [TraceError(Path(f"/x/rank{r}.json"), f"rank {r}: {why}")
                for r, why in enumerate(["empty file"] * 5 + ["not JSON"] * 3 + ["cut short"] * 2 + ["odd"] * 2 + ["bad"])]
    text = str(_none_usable(problems))
    assert text.startswith("no usable traces: /x/rank0.json: rank 0: empty file; /x/rank1.json: rank 1: empty file; ")
    assert text.endswith("; and 10 more files (3 x not JSON; 2 x empty file; 2 x cut short; 3 with other problems)")


def test_files_a_folder_holds_but_never_reads_are_said(tmp_path, monkeypatch):
    """A memory-timeline export or a renamed rank beside the traces was dropped without a word:
    a user counting on it as a rank saw one rank fewer. Said once per folder, the rest counted; a
    file named on its own says nothing of its neighbours; run.json and hidden files are the layout's."""
    from tests.conftest import REPO

    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "runs" / "run"
    shutil.copytree(REPO / "traces" / "sample-ddp-2r", run)
    for name in ("export_memory_timeline.raw.gz", "rank2.json.gz.bak", "snapshot.pickle", "zz.txt", ".hidden"):
        (run / name).write_bytes(b"x")
    got = load_traces(run, progress=False)
    assert not got.problems and got.ranks["rank"].to_list() == [0, 1]
    assert got.notes == [f"{run}: not read, not named like a trace (*.json, *.json.gz): export_memory_timeline.raw.gz, "
                         f"rank2.json.gz.bak, snapshot.pickle and 1 more"]
    assert load_traces(run / "rank0.json.gz", progress=False).notes == []
    # ptprof's own report saved in the run folder (`--json run/report.json`) failed the next load
    # as a trace that was not one (exit 2; `ptprof project` refused the run): left out, and said.
    (run / "report.json").write_text('{\n "schema": "ptprof.report/1",\n "findings": []}')
    (run / "notmine.json").write_text('{"schema": "other/1"}')  # a JSON of someone else's: still read, and refused
    again = load_traces(run, progress=False)
    assert again.ranks["rank"].to_list() == [0, 1] and [str(p) for p in again.problems] == [
        f"{run / 'notmine.json'}: not a Kineto/Chrome trace: a JSON dict without a traceEvents list (keys: schema)"]
    assert again.notes[1] == f"{run}: not read, ptprof's own output (a report, projection, plan or saved cluster): report.json"
    (run / "notmine.json").unlink()
    (run / "report.json").unlink()
    # A folder of run folders: each run folder's own files are said, the parent's README is not.
    (tmp_path / "runs" / "README.md").write_text("runs")
    assert load_traces(tmp_path / "runs", progress=False).notes == got.notes


def test_many_ranks_without_process_groups_before_a_run_with_them(tmp_path, monkeypatch):
    """100 foreign ranks (no pg_config) named before a ptprof run (with it): the ranks frame took
    its column types from the first 100 rows, typed pg_config Null and met the run's text: a
    polars traceback (trial). Every row now types the columns."""
    import json

    from tests.conftest import REPO

    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    big = tmp_path / "big"
    big.mkdir()
    for r in range(100):
        (big / f"rank{r}.json").write_text(json.dumps({
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 100},
            "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1e6,
                             "dur": 1000}, {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                            "ts": 1e6 + 10, "dur": 500}]}))
    sample = REPO / "traces" / "sample-ddp-2r"
    t = load_traces([big, sample], progress=False)
    assert t.ranks.height == 102 and t.ranks["pg_config"].dtype == pl.String
    assert t.ranks["pg_config"].null_count() == 100 and "pg_size" in t.ranks["pg_config"][100]


def test_a_saved_cluster_in_a_run_folder_is_no_trace_and_loads_back(tmp_path, monkeypatch):
    """`project RUN --save-cluster RUN/c.json` wrote a JSON without ptprof's mark: the next analyze
    read it as a trace and exited 2 (review). It carries "schema": "ptprof.cluster/1" now, is left
    out with a note, and loads back as a cluster; a folder holding only such files says so."""
    from profiler.cli_whatif import project_main
    from profiler.cluster import load_cluster
    from tests.conftest import REPO

    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    shutil.copytree(REPO / "traces" / "sample-ddp-2r", run)
    assert project_main([str(run), "--cluster", str(run), "--save-cluster", str(run / "c.json")]) == 0
    t = load_traces(run, progress=False)
    assert not t.problems and f"{run}: not read, ptprof's own output (a report, projection, plan or saved cluster): c.json" in t.notes
    assert load_cluster(str(run / "c.json")).name == "measured:run"
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(run / "c.json", alone / "c.json")
    with pytest.raises(TraceError, match=r"no trace files here .*; c\.json: ptprof's own output, no trace$"):
        load_traces(alone, progress=False)

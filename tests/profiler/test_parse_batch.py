"""Several files parsed as one frame (profiler/parse_batch.py, cache.load_many_safe): each file's
frame and header exactly as `parse_trace_file` alone makes them, and anything odd left to it.

The hand-made files share pids, tids, names and categories with each other (a row deciding on
another file's would show), and each has what a file is counted by: dropped events of every kind,
instants, thread names, collectives' shapes, a category no rule knows, MTIA and ROCm activity.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from profiler import parse
from profiler.cache import Parsed, load_many_safe, load_one_safe
from profiler.errors import TraceError
from profiler.parse import parse_trace_file
from profiler.parse_batch import parse_trace_files
from tests.conftest import REPO, SHARED_TRACES

needs_c = pytest.mark.skipif(parse._kineto is None, reason="the C parser is not built")

REAL = [REPO / "traces" / "sample-1f1b-2r" / "rank0.json.gz", REPO / "traces" / "sample-ddp-2r" / "rank1.json.gz",
        SHARED_TRACES / "single" / "cpu_gloo_rank34_of_300.json.gz", SHARED_TRACES / "single" / "mi250_rocm_single.json.gz",
        SHARED_TRACES / "single" / "no_distributed_info.json.gz", SHARED_TRACES / "gpu_nccl_2_of_128" / "rank1.json.gz"]


def _events(k: int) -> list[dict]:
    """A file's events; k varies the values so that no two files are alike."""
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": f"main-{k}"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "pt_autograd"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000 + k, "dur": 900},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1010, "dur": 20 + k},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1050, "dur": 3, "args": {"External id": k}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 1, "tid": 1, "ts": 1100 + k, "s": "t"},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": 1200, "dur": 50 + k,
         "args": {"correlation": 7 + k}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1300, "dur": 10,
         "args": {"Collective name": "all_reduce", "In msg nelems": 4 + k, "Process Group Ranks": [0, 1, 2, 3],
                  "Input Dims": [[2, 2 + k]], "Input type": ["float"]}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 1400, "dur": 5},
        {"ph": "s", "cat": "ac2g", "name": "flow", "pid": 1, "tid": 1, "ts": 1010, "id": 1},
    ]
    ev += [{"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 1}] * (k % 3)  # no_ts
    ev += [{"ph": "X", "cat": "cpu_op", "name": "neg", "pid": 1, "tid": 1, "ts": 1, "dur": -1}] * (k % 2)  # bad_dur
    ev += [{"ph": "X", "cat": "cpu_op", "name": "nodur", "pid": 1, "tid": 1, "ts": 1}] * (k % 4)  # no_dur
    ev += [{"ph": "X", "cat": "Spans", "name": "span", "pid": "Spans", "tid": 1, "ts": 1, "dur": 1}] * k  # string_pid
    if k == 1:  # a step number past 64 bits (bad_step), a category no rule knows
        ev += [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#99999999999999999999", "pid": 1, "tid": 1,
                "ts": 1, "dur": 1},
               {"ph": "X", "cat": "weird_cat", "name": "w", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]
    if k == 2:  # MTIA's device activity, and a HIP runtime call (ROCm) in the next file
        ev += [{"ph": "X", "cat": "mtia_ccp_events", "name": "k", "pid": 0, "tid": 9, "ts": 1500, "dur": 1}]
    if k == 3:
        ev += [{"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1, "ts": 1190, "dur": 2}]
    return ev


def _write(path: Path, events: list[dict], info: dict | None = None, gz: bool = False) -> Path:
    doc = {"traceEvents": events, **({"distributedInfo": info} if info else {}),
           "deviceProperties": [{"name": f"GPU {path.stem}"}]}
    raw = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def _alone(path: Path):
    try:
        return parse_trace_file(path)
    except TraceError as e:
        return e


def _assert_same(got, alone, path) -> None:
    frame, meta = got
    assert frame.schema == alone[0].schema, path
    assert_frame_equal(frame, alone[0], check_exact=True)
    assert meta == alone[1], path
    assert list(meta) == list(alone[1]) and list(meta["dropped"]) == list(alone[1]["dropped"])


@needs_c
def test_each_file_of_a_batch_is_its_frame_alone(tmp_path):
    made = [_write(tmp_path / f"rank{k}.json", _events(k), {"rank": k, "world_size": 8}, gz=k % 2 == 0) for k in range(5)]
    paths = made[:2] + REAL + made[2:]
    got = parse_trace_files(paths)
    assert all(g is not None for g in got), [p.name for p, g in zip(paths, got) if g is None]
    for path, g in zip(paths, got):
        _assert_same(g, parse_trace_file(path), path)
    metas = {p.name: g[1] for p, g in zip(paths, got)}
    # What the hand-made files were made to hold, counted independently of the code.
    assert metas["rank1.json"]["dropped"] == {"flow": 1, "string_pid": 1, "no_ts": 1, "bad_ts": 0, "no_dur": 1,
                                              "bad_dur": 1, "bad_step": 1, "other_ph": 0}
    assert metas["rank1.json"]["unknown_categories"] == {"weird_cat": 1} and metas["rank0.json"]["unknown_categories"] == {}
    assert [metas[f"rank{k}.json"]["device_kind"] for k in range(5)] == ["cuda", "cuda", "mtia", "rocm", "cuda"]
    # 7 events every file keeps and its HIP call
    assert metas["rank3.json"]["n_events"] == 8 and metas["rank3.json"]["first_ts_us"] == 1000 + 3
    threads = dict(zip(paths, got))[made[4]][0].filter(pl.col("tid") == 1)["thread"].unique().to_list()
    assert threads == ["main-4"]  # its own thread name, not another file's for the same (pid, tid)


@needs_c
def test_odd_files_in_a_batch_are_left_to_the_parser_alone(tmp_path):
    good = [_write(tmp_path / f"good{k}.json", _events(k), {"rank": k}) for k in range(3)]
    odd = {
        "not_json": tmp_path / "not_json.json",
        "only_meta": _write(tmp_path / "only_meta.json", _events(0)[:2]),
        "bad_rank": _write(tmp_path / "bad_rank.json", _events(0), {"rank": -1}),
        "all_dropped": _write(tmp_path / "all_dropped.json", _events(0)[:2] + [  # events, none usable: refused alone
            {"ph": "X", "cat": "Spans", "name": "s", "pid": "Spans", "tid": 1, "ts": 1, "dur": 1}]),
        "declined": _write(tmp_path / "declined.json",  # an int past int64: msgspec's parse (the C parser declines)
                           _events(0) + [{"ph": "X", "cat": "kernel", "name": "g", "pid": 0, "tid": 7, "ts": 1, "dur": 1,
                                          "args": {"correlation": 99999999999999999999}}]),
        "long_name": _write(tmp_path / "long_name.json",  # near the text limit: checked alone (it is under it)
                            _events(0) + [{"ph": "X", "cat": "cpu_op", "name": "n" * 300_000, "pid": 1, "tid": 1, "ts": 1, "dur": 1}]),
        "missing": tmp_path / "missing.json",
    }
    odd["not_json"].write_bytes(gzip.compress(b"{"))
    paths = [good[0], odd["not_json"], odd["only_meta"], good[1], odd["bad_rank"], odd["declined"], odd["long_name"],
             odd["all_dropped"], odd["missing"], good[2]]
    got = parse_trace_files(paths)
    assert [g is None for g in got] == [p not in good for p in paths]
    for path, g in zip(paths, got):
        if g is not None:
            _assert_same(g, parse_trace_file(path), path)
    # Through the cache: every file what it is alone, its error naming it.
    for c in ("c1", "c2"):
        (tmp_path / c).mkdir()
    many = load_many_safe(paths, tmp_path / "c1", [None] * len(paths))
    for path, m in zip(paths, many):
        one = load_one_safe(path, tmp_path / "c2")
        assert type(m) is type(one), path
        if isinstance(one, TraceError):
            assert (m.path, m.problem) == (one.path, one.problem) and str(m.path) == str(path)
        else:
            assert isinstance(m, Parsed) and m.meta == one.meta and m.parquet.startswith(str(tmp_path / "c1"))
            assert_frame_equal(pl.read_parquet(m.parquet), pl.read_parquet(one.parquet), check_exact=True)
    assert sum(isinstance(m, TraceError) for m in many) == 5  # not JSON, only metadata, rank -1, all dropped, missing
    # A second load serves every good file's entry, as load_one_safe would.
    again = load_many_safe(paths, tmp_path / "c1", [None] * len(paths))
    assert [a.parquet for a in again if isinstance(a, Parsed)] == [m.parquet for m in many if isinstance(m, Parsed)]
    assert all(a.fresh is None for a in again if isinstance(a, Parsed))


def test_the_pure_parser_setting_parses_every_file_alone(tmp_path, monkeypatch):
    paths = [_write(tmp_path / f"rank{k}.json", _events(k), {"rank": k}) for k in range(2)]
    monkeypatch.setenv(parse.PURE_PARSER_ENV, "1")
    assert parse_trace_files(paths) == [None, None]


@needs_c
def test_a_failing_joined_parse_leaves_every_file_alone(tmp_path, monkeypatch):
    import profiler.parse_batch as parse_batch

    paths = [_write(tmp_path / f"rank{k}.json", _events(k), {"rank": k}) for k in range(3)]

    def odd(frame):
        raise ValueError("odd rows")

    monkeypatch.setattr(parse_batch, "_per_file", odd)
    assert parse_trace_files(paths) == [None, None, None]
    (tmp_path / "c").mkdir()
    got = load_many_safe(paths, tmp_path / "c", [None] * 3)  # each parsed alone instead: all there
    assert [m.meta for m in got] == [parse_trace_file(p)[1] for p in paths]

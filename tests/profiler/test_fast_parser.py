"""The C parser (profiler/_kineto.c) against the msgspec parser: the same frame, or it declines.

The msgspec parser is the reference here (it is the one the other loader tests and the HTA
agreement tests were written against); the C parser must give exactly its frame and header on
every real trace we have, on hand-made quirks, and on randomly corrupted traces, where both must
also fail with the same message.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import msgspec
import pytest
from polars.testing import assert_frame_equal

from profiler import TraceError
from profiler import parse
from profiler.damaged import read_bytes
from profiler.parse import parse_trace_file
from tests.conftest import REPO, SHARED_TRACES

REAL = sorted(p for p in SHARED_TRACES.rglob("*.json.gz")) + sorted((REPO / "traces").glob("sample-*/rank*.json.gz"))

needs_c = pytest.mark.skipif(parse._kineto is None, reason="the C parser is not built (see test_the_c_parser_is_built)")


def _outcome(path: Path, *, fast: bool):
    try:
        return parse_trace_file(path, fast=fast)
    except TraceError as e:
        return str(e)


def _assert_same(path: Path):
    pure, fast = _outcome(path, fast=False), _outcome(path, fast=True)
    if isinstance(pure, str) or isinstance(fast, str):
        assert fast == pure
        return
    assert_frame_equal(fast[0], pure[0], categorical_as_str=True)
    assert fast[1] == pure[1]


def _c_parses(path: Path) -> bool:
    """True when the C parser takes the file itself (False: it declines, msgspec parses it)."""
    try:
        return parse._fast_parse(read_bytes(path)) is not None
    except TraceError:  # an empty or unreadable file never reaches a parser
        return False


def _write(tmp_path: Path, doc, name: str = "rank0.json") -> Path:
    f = tmp_path / name
    f.write_bytes(doc if isinstance(doc, bytes) else msgspec.json.encode(doc))
    return f


def test_the_c_parser_is_built():
    # CI installs with `pip install -e .`, which compiles it; a silent build failure would leave
    # every load on the slow parser, so it is checked, not skipped.
    assert parse._kineto is not None, "profiler._kineto is not built: reinstall with a C compiler (gcc) present"


@needs_c
@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_same_frame_as_msgspec_on_real_traces(path):
    assert _c_parses(path), "the C parser declined a real trace"
    _assert_same(path)


QUIRKS = [
    # numeric-string pid, ROCm's hex stream, string External id, float and exponent times
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "12", "tid": 3, "ts": 1.5, "dur": 2},
    {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 12, "tid": 3, "ts": 2e0, "dur": 1.25e-1,
     "args": {"stream": "0x0", "correlation": 7, "External id": "5"}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1700000000123456.789, "dur": 0.001,
     "args": {"correlation": 7, "stream": 7, "device": 0, "grid": [1, 2, 3]}},
    # Kineto's string pseudo-process (dropped) and instant events in both spellings
    {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 0, "dur": 9},
    {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 12, "s": "t"},
    {"ph": "I", "name": "mark2", "pid": 1, "tid": 1, "ts": 13},
    # collectives: shapes of several nestings, ranks as list and as text, typed args
    {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 12, "tid": 3, "ts": 4, "dur": 1,
     "args": {"Input Dims": [[[2, 3], [4]], []], "Input type": ["TensorList", "Scalar"], "Process Group Ranks": [0, 1]}},
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 12, "tid": 3, "ts": 5, "dur": 1,
     "args": {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024.0, "dtype": "Float",
              "Process Group Name": "0", "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
              "Group size": 2, "Input Dims": [[1024]], "Input type": ["float"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 12, "tid": 3, "ts": 6, "dur": 1,
     "args": {"Input Dims": [[3]], "Input type": ["float"]}},  # not communication: no shapes kept
    # memory events, copies, booleans and nulls where numbers go
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 12, "tid": 3, "ts": 7, "s": "t",
     "args": {"Bytes": -512, "Total Allocated": 4096, "Total Reserved": 8192, "Addr": 94000000000000,
              "Device Type": 1, "Device Id": 0}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 8, "dur": 1,
     "args": {"bytes": 4096, "correlation": True, "stream": None, "Device Id": 3000000000}},
    # text with escapes and non-ASCII, empty strings, nested unknown args
    {"ph": "X", "cat": "cpu_op", "name": "void f<\"x\\\\y\">(\u00e9\u4e2d\U0001F600)\n", "pid": 12, "tid": 3, "ts": 9, "dur": 1,
     "args": {"nested": {"a": [1, {"b": [None, True, False, -0.0, 1e308]}]}, "": ""}},
    {"ph": "X", "cat": "", "name": "", "pid": 12, "tid": 3, "ts": 10, "dur": 0, "args": None},
    {"ph": "X", "cat": "", "name": "null dur", "pid": 12, "tid": 3, "ts": 10, "dur": None},  # no_dur: dropped, counted
    # dropped kinds: other ph, no ts, flows, metadata (thread names, float tid)
    {"ph": "B", "name": "begin", "pid": 12, "tid": 3, "ts": 5},
    {"ph": "X", "name": "no time", "pid": 12, "tid": 3},
    {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 10, "cat": "fwdbwd", "name": "fwdbwd"},
    {"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 11, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"},
    {"ph": "M", "name": "thread_name", "pid": 12, "tid": 3, "args": {"name": "pt_main_thread"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7.0, "args": {"name": "stream 7 \"compute\""}},
    {"ph": "M", "name": "thread_name", "pid": "Spans", "tid": 7, "args": {"name": "ignored"}},
    {"ph": "M", "name": "process_name", "pid": 12, "tid": 0, "args": {"name": "python3"}},
    {"ph": 5, "name": "odd ph", "pid": 1, "tid": 1, "ts": 1},
    {"ph": [1], "name": "list ph", "pid": 1, "tid": 1, "ts": 1},
    {"ph": "M", "name": "thread_name", "pid": 1e30, "tid": 3, "args": {"name": "pid outside int64"}},
    {},
]


@needs_c
@pytest.mark.parametrize("form", ["object", "array", "gzip"])
def test_same_frame_on_hand_made_quirks(tmp_path, form):
    doc = {"schemaVersion": 1, "deviceProperties": [{"name": "MI250"}, {"name": None}], "distributedInfo": {"rank": 3, "world_size": 4},
           "traceEvents": QUIRKS, "traceName": "x"}
    raw = msgspec.json.encode(QUIRKS if form == "array" else doc)
    f = _write(tmp_path, gzip.compress(raw) if form == "gzip" else raw, "rank3.json.gz" if form == "gzip" else "rank3.json")
    assert _c_parses(f)
    _assert_same(f)
    frame, meta = parse_trace_file(f, fast=True)
    # a few values checked by hand, independent of both parsers
    rows = {r["name"]: r for r in frame.to_dicts()}
    assert rows["hipLaunchKernel"]["dur_us"] == 0.125 and rows["hipLaunchKernel"]["stream"] is None
    assert rows["gemm"]["ts_us"] == 1700000000123456.789 and rows["gemm"]["thread"] == 'stream 7 "compute"'
    assert rows["c10d::allreduce_"]["arg_nelems"] == [10, None] and rows["record_param_comms"]["arg_nelems"] == [1024]
    assert rows["aten::add"]["arg_nelems"] is None and rows["Memcpy HtoD"]["correlation"] == 1
    assert rows["Memcpy HtoD"]["mem_device_id"] is None  # outside int32
    assert rows["void f<\"x\\\\y\">(\u00e9\u4e2d\U0001F600)\n"]["thread"] == "pt_main_thread"
    assert meta["dropped"] == {"flow": 2, "string_pid": 1, "no_ts": 1, "bad_ts": 0, "no_dur": 1, "bad_dur": 0, "bad_step": 0,
                               "other_ph": 4}
    if form != "array":
        assert meta["distributed_info"] == {"rank": 3, "world_size": 4} and meta["device_name"] == "MI250"


# torch 1.8/1.9 Kineto: string tids, "stream <N>" on GPU activity, capitalised categories.
TORCH18 = [
    {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 5555, "tid": "5555", "ts": 10, "dur": 5},
    {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 5555, "tid": "5555", "ts": 11, "dur": 1,
     "args": {"correlation": 3, "external id": 1}},
    {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": 12, "dur": 4,
     "args": {"device": 0, "stream": 7, "correlation": 3}},
    {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 13", "ts": 17, "dur": 1},
    {"ph": "X", "cat": "Kernel", "name": "past int64", "pid": 0, "tid": "stream 99999999999999999999", "ts": 18, "dur": 1},
    {"ph": "M", "name": "thread_name", "pid": 5555, "tid": "5555", "args": {"name": "thread 5555 (python)"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": "stream 13", "args": {"name": "copy stream"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": "007", "args": {"name": "int() refuses a leading zero"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": "00", "args": {"name": "zero"}},
]


@pytest.mark.parametrize("fast", [False, True])
def test_torch18_stream_tids_are_read(tmp_path, fast):
    # Both parsers read "stream 7" as tid 7 (before, every GPU event was dropped for a null tid);
    # the C parser takes the file itself.
    f = _write(tmp_path, {"traceEvents": TORCH18})
    if fast:
        if parse._kineto is None:
            pytest.skip("the C parser is not built")
        assert _c_parses(f)
        _assert_same(f)
    frame, meta = parse_trace_file(f, fast=fast)
    rows = {r["name"]: r for r in frame.to_dicts()}
    assert (rows["gemm"]["tid"], rows["gemm"]["stream"], rows["gemm"]["device"], rows["gemm"]["kind"]) == (7, 7, "gpu", "compute")
    assert (rows["Memset (Device)"]["stream"], rows["Memset (Device)"]["kind"], rows["Memset (Device)"]["thread"]) == (13, "memory", "copy stream")
    assert rows["aten::mm"]["tid"] == 5555 and rows["aten::mm"]["thread"] == "thread 5555 (python)"
    assert rows["cudaLaunchKernel"]["kind"] == "runtime"
    assert "past int64" not in rows and meta["dropped"]["string_pid"] == 1 and meta["has_gpu"]


# Input the C parser leaves to msgspec: it must decline (not guess), and the result must not change.
DECLINED = {
    "escaped key": b'{"traceEvents": [{"p\\u0068": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1}]}',
    "float-looking string pid": b'{"traceEvents": [{"ph": "X", "name": "a", "pid": "12.0", "tid": 1, "ts": 1}]}',
    "integer past int64": b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 99999999999999999999}]}',
    "number as name": b'{"traceEvents": [{"ph": "X", "name": 5, "pid": 1, "tid": 1, "ts": 1}]}',
    "list as pid": b'{"traceEvents": [{"ph": "X", "name": "a", "pid": [1], "tid": 1, "ts": 1}]}',
    "digit string thread key": b'{"traceEvents": [{"ph": "M", "name": "thread_name", "pid": "0x1", "tid": 1, "args": {"name": "t"}}]}',
    "args not an object": b'{"traceEvents": [{"ph": "X", "name": "a", "args": "oops"}]}',
    "event not an object": b'{"traceEvents": [1, 2]}',
    "no traceEvents": b'{"hello": 1}',
    "truncated": b'{"traceEvents": [{"ph": "X", "ts": 1',
    "trailing garbage": b'{"traceEvents": []} x',
    "bad escape": b'{"traceEvents": [{"ph": "X", "name": "a\\q", "pid": 1, "tid": 1, "ts": 1}]}',
    "leading zero": b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 01, "tid": 1, "ts": 1}]}',
    "not UTF-8": b'{"traceEvents": [{"ph": "X", "name": "a\xff", "pid": 1, "tid": 1, "ts": 1}]}',
    "not UTF-8 in shapes": b'{"traceEvents": [{"ph": "X", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 1,'
                           b' "args": {"Input Dims": [[2]], "Input type": ["fl\xffoat"]}}]}',
    # UTF-16 halves that do not pair: msgspec rejects them even in values nobody reads
    "lone high surrogate, skipped": b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "args": {"foo": "\\ud800"}}]}',
    "lone low surrogate, top level": b'{"traceName": "\\udc00", "traceEvents": []}',
    "reversed pair": b'{"traceEvents": [{"ph": "B", "name": "\\udc00\\ud800"}]}',
    "high then not low": b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "args": {"Process Group Ranks": "\\ud800\\u0041"}}]}',
}


@needs_c
def test_escaped_surrogate_pairs_are_read(tmp_path):
    f = _write(tmp_path, b'{"traceEvents": [{"ph": "X", "name": "smile \\ud83d\\ude00", "pid": 1, "tid": 1, "ts": 1, "dur": 1,'
                         b' "args": {"skipped": "\\uD83D\\uDE00"}}]}')
    assert _c_parses(f)
    _assert_same(f)
    assert parse_trace_file(f)[0]["name"].cast(str).to_list() == ["smile \U0001F600"]


@needs_c
@pytest.mark.parametrize("name", list(DECLINED))
def test_declines_what_it_does_not_mimic(tmp_path, name):
    f = _write(tmp_path, DECLINED[name])
    assert not _c_parses(f)
    _assert_same(f)


@needs_c
def test_random_corruptions_give_the_same_frame_or_the_same_error(tmp_path):
    # Byte-level damage to a real trace: the C parser must neither crash nor accept what the
    # reference rejects, nor read differently what both accept.
    doc = msgspec.json.decode(gzip.decompress((SHARED_TRACES / "gpu_nccl_2_of_128" / "rank0.json.gz").read_bytes()))
    events = doc["traceEvents"]
    base = msgspec.json.encode({"distributedInfo": doc["distributedInfo"], "traceEvents": events[:: len(events) // 150]})
    rng = random.Random(20261123)
    alphabet = b'{}[]",:0123456789-+.eE\\ntrufalsx \n\xc3\x80\xa9\xff/u'
    accepted = 0
    for i in range(300):
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            op = rng.random()
            if op < 0.4:
                data[at] = rng.choice(alphabet)
            elif op < 0.7:
                del data[at]
            elif op < 0.9:
                data.insert(at, rng.choice(alphabet))
            else:
                del data[at:]
                break
        f = _write(tmp_path, bytes(data), f"rank{i}.json")
        _assert_same(f)
        accepted += _c_parses(f)
    assert accepted > 30  # many damaged bytes land in skipped values: the C parser ran on those


@needs_c
def test_special_bytes_at_every_offset_of_a_string(tmp_path):
    # The C scanner passes plain text 8 bytes at a time: an escape or a non-ASCII character at any
    # offset of that word, in strings of 0 to 17 bytes, must still be read as msgspec reads it.
    specials = ['\\"', "\\\\", "\\u00e9", "\\n", "\u00e9", "\u20ac", "\U0001F600"]
    raws = ["a" * at + sp + "b" * (n - at) for n in range(18) for sp in specials for at in range(n + 1)]
    events = ",".join(f'{{"ph": "X", "cat": "c{i % 9}", "name": "{r}", "pid": 1, "tid": 1, "ts": {i}, "dur": 1}}'
                      for i, r in enumerate(raws))
    f = _write(tmp_path, f'{{"traceEvents": [{events}]}}'.encode())
    assert _c_parses(f)
    _assert_same(f)
    frame, _ = parse_trace_file(f, fast=True)
    assert frame.sort("ts_us")["name"].cast(str).to_list() == [msgspec.json.decode(f'"{r}"'.encode()) for r in raws]


@pytest.mark.parametrize("bad", [b"\x01", b"\x1f", b"\xff", b"\xc3"], ids=["ctrl-01", "ctrl-1f", "byte-ff", "cut-utf8"])
def test_a_bad_byte_at_any_offset_is_the_same_refusal(tmp_path, bad):
    # A control byte or invalid UTF-8 inside a string: the C parser declines wherever it sits in
    # the 8-byte word, and the refusal is msgspec's, word for word.
    for at in range(10):
        name = b"a" * at + bad + b"b" * (9 - at)
        f = _write(tmp_path, b'{"traceEvents": [{"ph": "X", "name": "' + name + b'", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}')
        assert not _c_parses(f)
        assert _outcome(f, fast=True) == _outcome(f, fast=False) and "not" in _outcome(f, fast=True)


@needs_c
def test_columns_are_handed_over_without_a_copy_and_pickle_as_bytes():
    """The C parser's columns are its own buffers (no bytes copy), read in place by numpy, alive as
    long as an array over them, equal to and pickled as the bytes they hold (prescan.py pickles them)."""
    import gc
    import pickle

    import numpy as np

    events = [{"ph": "X", "name": f"op{i}", "pid": 1000 + i, "tid": 2, "ts": 7, "dur": 3} for i in range(5)]
    out = parse._kineto.parse(msgspec.json.encode({"traceEvents": events}))
    ts = out["ints"]["pid"][0]
    assert type(ts).__name__ == "Column" and len(ts) == 5 * 8
    want = np.arange(1000, 1005, dtype=np.int64).tobytes()
    assert ts == want and ts != want[:-1] and not ts != want
    arr = np.frombuffer(ts, np.int64)
    assert not arr.flags.writeable  # read-only, as bytes was
    assert memoryview(ts).readonly  # nor any other view
    back = pickle.loads(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back["ints"]["pid"][0]) is bytes and back["ints"]["pid"][0] == want
    del out, ts, back
    gc.collect()
    assert arr.tolist() == list(range(1000, 1005))  # the array keeps its memory alive
    with pytest.raises(TypeError):
        hash(arr.base)

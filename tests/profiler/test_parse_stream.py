"""The C parser fed in chunks (`_kineto.Stream`, profiler/parse_stream.py) against the same parser
given the whole file (`_kineto.parse`): the same buffers wherever the chunks are cut, or both decline.

The whole-file parser is itself checked against the msgspec parser (test_fast_parser.py); here
every cut point of hand-made documents (inside a number, a string, an escape, a UTF-8 character,
a key, between events, inside the header values) must give exactly its result, and a file that is
not plain (several gzip members, a cut gzip, a bomb) must go to the whole-file path.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import msgspec
import pytest

from profiler import TraceError, parse, parse_stream
from profiler.damaged import read_bytes
from profiler.parse import parse_trace_file
from tests.conftest import REPO, SHARED_TRACES

pytestmark = pytest.mark.skipif(parse._kineto is None, reason="the C parser is not built")

EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1234.5, "dur": 10,
     "args": {"External id": 7, "Input Dims": [[2, 3], [3, 4]]}},
    {"ph": "X", "cat": "kernel", "name": "nccl:all_reduce \u00e9\u4e2d\U0001f600", "pid": 0, "tid": "stream 7",
     "ts": 1.25e3, "dur": 2.5, "args": {"Process Group Ranks": [0, 1], "Input Dims": [[8]], "Input type": ["float"]}},
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": 1300,
     "args": {"Bytes": -512, "Total Allocated": 1024, "Addr": 94823749, "Device Type": 0, "Device Id": -1}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main \"thread\""}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 2, "ts": 1000, "dur": 9e2},
    {"ph": "f", "id": 1, "pid": 1, "tid": 2, "ts": 5},
]


def _doc(**extra) -> bytes:
    # Kineto ends its files with a 19-digit number: a cut inside it must wait for the rest.
    return msgspec.json.encode({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2},
                                "traceEvents": EVENTS, "deviceProperties": [{"name": "A100"}], **extra,
                                "baseTimeNanoseconds": 1700000000000000000})


DOCS = {
    "plain": _doc(),
    "indented": msgspec.json.format(_doc(), indent=2),
    "bare array": msgspec.json.encode(EVENTS),
    "header after events": msgspec.json.encode({"traceEvents": EVENTS[:2], "distributedInfo": {"rank": 1}}),
    "numbers last": b'{"traceEvents": [], "a": -12.5e+3, "b": 0, "c": 123456789}',
    "escapes": b'{"traceEvents": [{"ph": "X", "cat": "a\\u00e9\\n", "name": "x\\"y\\ud83d\\ude00", "pid": 1, '
               b'"tid": 1, "ts": 1, "dur": 2}]}',
    "empty events": b'{"traceEvents": []}',
    "repeated header": b'{"distributedInfo": {"rank": 0}, "traceEvents": [], "distributedInfo": {"rank": 5}}',
}
BAD = {
    "cut": _doc()[:-40],
    "trailing": _doc() + b" x",
    "no events": b'{"distributedInfo": {}}',
    "two traceEvents": b'{"traceEvents": [], "traceEvents": []}',
    "bad number": _doc().replace(b"1234.5", b"12.34.5"),
    "escaped ph": b'{"traceEvents": [{"ph": "\\u0058", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}',
    "big int": _doc().replace(b"94823749", b"948237490000000000000000"),
    "not json": b"hello",
}


def _whole(raw: bytes):
    try:
        return parse._kineto.parse(raw)
    except parse._kineto.Fallback:
        return "declined"


def _streamed(chunks: list[bytes]):
    s = parse._kineto.Stream()
    try:
        for c in chunks:
            s.feed(c)
        return s.finish()
    except parse._kineto.Fallback:
        return "declined"


@pytest.mark.parametrize("name", [*DOCS, *BAD])
def test_every_cut_in_two_gives_the_whole_result(name):
    raw = {**DOCS, **BAD}[name]
    want = _whole(raw)
    assert (want == "declined") == (name in BAD)  # the cases mean what they say
    for i in range(len(raw) + 1):
        assert _streamed([raw[:i], raw[i:]]) == want, f"cut at byte {i}: {raw[max(0, i - 20):i]!r} | {raw[i:i + 20]!r}"


@pytest.mark.parametrize("name", list(DOCS))
def test_byte_by_byte_and_random_chunks(name):
    raw = DOCS[name]
    want = _whole(raw)
    assert _streamed([raw[i:i + 1] for i in range(len(raw))]) == want
    rng = random.Random(name)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(raw)), 5))
        assert _streamed([raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]) == want


def test_values_match_what_the_json_says():
    # Independent of the C code: the header values come back as their JSON text, the strings decoded.
    got = _streamed([DOCS["indented"][:333], DOCS["indented"][333:]])
    assert msgspec.json.decode(got["distributedInfo"]) == {"rank": 0, "world_size": 2}
    assert msgspec.json.decode(got["deviceProperties"]) == [{"name": "A100"}]
    assert got["n"] == 4 and got["counts"] == {"flow": 1, "meta": 1, "other": 0}
    assert got["strings"][0] is None  # code 0: null
    assert {"nccl:all_reduce \u00e9\u4e2d\U0001f600", "aten::mm", '"main \\"thread\\""'} <= {
        s if isinstance(s, str) else s.decode() for s in got["strings"][1:]}  # escaped ones as their JSON text


def test_a_stream_declines_once_and_for_all():
    s = parse._kineto.Stream()
    with pytest.raises(parse._kineto.Fallback):
        s.feed(b'{"traceEvents": [1]')  # an event that is not an object: nothing more can mend it
        s.feed(b"]}")
        s.finish()
    with pytest.raises(parse._kineto.Fallback):
        s.finish()


def _real_files() -> list[Path]:
    small = [p for p in sorted(SHARED_TRACES.rglob("*.json.gz")) if p.stat().st_size < 3 << 20]
    return small + sorted((REPO / "traces").glob("sample-*/rank0.json.gz"))


@pytest.mark.parametrize("path", _real_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_in_small_chunks(path):
    whole = parse._fast_parse(read_bytes(path))
    for chunk in (4093, parse_stream.CHUNK_BYTES):
        assert parse_stream.scan_file(path, chunk_bytes=chunk) == whole


def test_a_plain_gzip_is_never_read_whole(tmp_path, monkeypatch):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(_doc(extra="x" * 50_000)))
    fed = []
    real = parse._kineto.Stream

    class Spy:
        def __init__(self, hint):
            self.s = real(hint)

        def feed(self, chunk):
            fed.append(len(chunk))
            self.s.feed(chunk)

        def finish(self):
            return self.s.finish()

    monkeypatch.setattr(parse._kineto, "Stream", Spy)
    monkeypatch.setattr(parse_stream, "CHUNK_BYTES", 4096)  # the file is ~60 KB of JSON
    monkeypatch.setattr(parse, "read_bytes", lambda p: pytest.fail("the whole file was read"))
    frame, meta = parse_trace_file(path)
    assert frame.height == 4 and meta["distributed_info"]["world_size"] == 2
    assert sum(fed) == len(_doc(extra="x" * 50_000)) and max(fed) <= 4096


def _gz(raw: bytes, **kw) -> bytes:
    return gzip.compress(raw, mtime=0, **kw)


ODD_GZIPS = {
    "two members": _gz(_doc()[:100]) + _gz(_doc()[100:]),
    "zero padding": _gz(_doc()) + b"\0" * 16,
    "junk after": _gz(_doc()) + b"junk",
    "cut": _gz(_doc())[:-10],
    "reserved flag": (lambda g: g[:3] + bytes([g[3] | 0x20]) + g[4:])(_gz(_doc())),
    "empty inside": _gz(b""),
}


@pytest.mark.parametrize("name", list(ODD_GZIPS))
def test_odd_gzips_go_to_the_whole_file_path(tmp_path, name):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(ODD_GZIPS[name])
    assert parse_stream.scan_file(path) is None
    # ... which reads them exactly as it did: parsed, or refused in its words.
    try:
        want = parse._fast_parse(read_bytes(path))
    except TraceError:
        return
    assert want is not None and name in ("two members", "zero padding")


def test_a_bomb_is_left_to_the_whole_file_path(tmp_path, monkeypatch):
    monkeypatch.setattr(parse_stream, "INFLATE_FLOOR_BYTES", 10_000)
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(_gz(_doc(pad=" " * 200_000)))
    assert parse_stream.scan_file(path) is None


def test_not_a_regular_file(tmp_path):
    import os

    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    assert parse_stream.scan_file(fifo) is None  # and returns at once: no writer is waited for
    with pytest.raises(TraceError, match="not a regular file"):
        parse_trace_file(fifo)


def test_the_stream_keeps_only_a_cut_unit(tmp_path):
    # What the streaming is for: bytes fed are read as they come, not kept for finish().
    raw = gzip.decompress((REPO / "traces" / "sample-fsdp-2r" / "rank0.json.gz").read_bytes())
    s = parse._kineto.Stream()
    most = 0
    for at in range(0, len(raw), 65536):
        s.feed(raw[at:at + 65536])
        most = max(most, s.pending)
    assert most < 16384  # the longest event of the file, far below a chunk
    assert s.finish() == parse._kineto.parse(raw) and s.pending == 0


def test_a_damaged_trailer_is_not_believed(tmp_path, monkeypatch):
    hints = []
    real = parse._kineto.Stream
    monkeypatch.setattr(parse._kineto, "Stream", lambda hint: hints.append(hint) or real(hint))
    good = _gz(_doc())
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(good[:-4] + b"\xff\xff\xff\xff")  # ISIZE 4 GiB - 1
    assert parse_stream.scan_file(path) is None  # its length check fails: the whole-file path words it
    assert hints == [parse_stream.MAX_HINT_RATIO * len(good)]
    with pytest.raises(TraceError, match="corrupt gzip"):
        parse_trace_file(path)
    path.write_bytes(good)
    hints.clear()
    assert parse_stream.scan_file(path) is not None and hints == [len(_doc())]  # a whole trailer: its size


def test_a_directory_leaks_no_file_descriptor(tmp_path):
    import os

    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        assert parse_stream.scan_file(tmp_path) is None
        with pytest.raises(TraceError, match="not a regular file"):
            parse_trace_file(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before

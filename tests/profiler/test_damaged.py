"""Damaged input (issue 12 B): each case ends in exit 2 and one line naming the file and the
problem, or in exit 0 with the right numbers and the dropped events counted in a warning.

The right numbers are those of the undamaged hand-made trace below, computed by hand: two steps
[0, 100) and [100, 200) µs, one CPU operator in each ([10, 30) and [110, 140)), so the window is
200 µs, compute 20 + 30 = 50 µs, idle 150 µs and each step 100 µs.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from profiler.cli import main
from profiler.errors import TraceError
from tests.conftest import REPO

CLEAN = {"window_us": 200.0, "compute_us": 50.0, "idle_us": 150.0}


def op(ts, dur, name="aten::mm", **kw) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, **kw}


def step(k, ts, dur) -> dict:
    return op(ts, dur, name=f"ProfilerStep#{k}", cat="user_annotation")


def trace(*extra: dict, info: dict | None = None, steps=(step(1, 0, 100), step(2, 100, 100))) -> dict:
    return {"distributedInfo": {"rank": 0, "world_size": 1} if info is None else info,
            "traceEvents": [*steps, op(10, 20), op(110, 30), *extra]}


def write(path: Path, doc) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def analyze(capsys, tmp_path):
    """`ptprof analyze ARGS --json` in this process: (exit status, stdout, stderr, report or None)."""
    def run(*args, report: bool = True):
        out = tmp_path / "report.json"
        out.unlink(missing_ok=True)
        code = main(["analyze", *map(str, args), *(["--json", str(out)] if report else [])])
        cap = capsys.readouterr()
        return code, cap.out, cap.err, json.loads(out.read_text()) if out.exists() else None
    return run


def refused(result, *fragments: str) -> str:
    """Exit 2 and one line on stderr holding every fragment; returns the line."""
    code, _, err, _ = result
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and all(f in lines[0] for f in fragments), err
    return lines[0]


def ranks_of(report) -> list[dict]:
    return [r for run in report["runs"] for r in run["ranks"]]


# ---- no usable events ------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [
    {"traceEvents": []},
    {"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]},
    {"traceEvents": [{"name": "a", "dur": 3}, {"ph": "X", "name": "b", "pid": 1, "tid": 1}, {"ph": "X", "ts": 1, "dur": 1}]},
], ids=["empty", "only metadata", "missing ts ph pid"])
def test_no_usable_events_is_refused(analyze, tmp_path, doc):
    f = write(tmp_path / "rank0.json", doc)
    refused(analyze(f), str(f), "no usable events")


@pytest.mark.parametrize("doc, said", [
    ({"traceEvents": []}, "no events at all"),
    ({"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]}, "only metadata: 1 ph M"),
], ids=["empty", "only metadata"])
def test_an_eventless_trace_is_worded_by_what_it_holds(analyze, tmp_path, doc, said):
    f = write(tmp_path / "rank0.json", doc)
    refused(analyze(f), str(f), said)


@pytest.mark.parametrize("name, content, said", [
    ("rank0.json", b"", "empty file"),
    ("rank0.json", b"   \n", "holds no JSON, only whitespace (4 bytes)"),
    ("rank0.json.gz", gzip.compress(b"", mtime=0), "empty file (inside the gzip)"),
    ("rank0.json.gz", gzip.compress(b" \t\r\n\n", mtime=0), "holds no JSON, only whitespace (5 bytes inside the gzip)"),
], ids=["empty", "whitespace", "empty gzip", "whitespace gzip"])
def test_a_file_without_json_is_refused_as_such_not_as_truncated(analyze, tmp_path, name, content, said):
    f = tmp_path / name
    f.write_bytes(content)
    line = refused(analyze(f), str(f), said)
    assert "truncated" not in line, line


def test_a_whitespace_file_in_a_folder_is_skipped_as_an_empty_one_is(analyze, tmp_path):
    write(tmp_path / "rank0.json", trace(info={"rank": 0, "world_size": 3}))
    (tmp_path / "rank1.json").write_bytes(b"")
    (tmp_path / "rank2.json.gz").write_bytes(gzip.compress(b"  \n", mtime=0))
    code, out, err, report = analyze(tmp_path)
    assert code == 2 and [r["rank"] for r in ranks_of(report)] == [0], err  # exit 2 as for any skipped rank
    assert err.strip().splitlines() == [
        f"ptprof analyze: skipped {tmp_path / 'rank1.json'}: rank 1: empty file",
        f"ptprof analyze: skipped {tmp_path / 'rank2.json.gz'}: rank 2: holds no JSON, only whitespace (3 bytes inside the gzip)"]
    assert report["problems"] == [line.removeprefix("ptprof analyze: skipped ") for line in err.strip().splitlines()]


# ---- impossible values: dropped, counted, the rest right ----------------------------------------


@pytest.mark.parametrize("bad, key, why", [
    (op(50, -20), "bad_dur", "negative"),
    (op(50, "NaN"), "bad_dur", "NaN"),
    (op(50, "inf"), "bad_dur", "infinite"),
    (op(50, 1e300), "bad_dur", "over a week"),
    (op(True, 5), "no_ts", "without a timestamp"),
    (op("NaN", 5), "bad_ts", "NaN, infinite"),
    (op(1e300, 5), "bad_ts", "past 2**53"),
    (op(-1, 5), "bad_ts", "negative"),
    ({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 50}, "no_dur", "without dur"),
], ids=["negative dur", "NaN string", "inf string", "dur 1e300", "ts true", "ts NaN", "ts 1e300", "ts -1", "X without dur"])
def test_impossible_values_are_dropped_and_counted(analyze, tmp_path, bad, key, why):
    code, _, err, report = analyze(write(tmp_path / "rank0.json", trace(bad)))
    assert code == 0, err
    (rank,) = ranks_of(report)
    assert {k: rank[k] for k in CLEAN} == CLEAN
    assert rank["mean_us"] == 100.0
    (warning,) = [w for w in report["warnings"] if "dropped" in w]
    assert "dropped 1 event" in warning and why in warning and "rank0.json" in warning
    expected = dict.fromkeys(["no_ts", "bad_ts", "no_dur", "bad_dur", "bad_step"], 0)
    assert report["runs"][0]["files"][0]["dropped"] == {**expected, key: 1}


def test_a_negative_profiler_step_is_dropped_not_a_negative_step_time(analyze, tmp_path):
    code, _, err, report = analyze(write(tmp_path / "rank0.json", trace(steps=(step(1, 0, -5), step(2, 100, 100)))))
    assert code == 0, err
    (rank,) = ranks_of(report)
    assert (rank["n_steps"], rank["mean_us"], rank["min_us"]) == (1, 100.0, 100.0)
    assert [s["step"] for s in report["runs"][0]["steps"]] == [2]
    assert any("dropped 1 event" in w for w in report["warnings"])


def test_a_step_number_past_64_bits_is_dropped(analyze, tmp_path):
    f = write(tmp_path / "rank0.json", trace(steps=(step(99999999999999999999, 0, 100), step(2, 100, 100))))
    code, _, err, report = analyze(f)
    assert code == 0, err
    assert [s["step"] for s in report["runs"][0]["steps"]] == [2]
    assert any("ProfilerStep#N" in w for w in report["warnings"])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_named(analyze, tmp_path, literal):
    f = write(tmp_path / "rank0.json", json.dumps(trace(op(50, 7))).replace('"dur": 7', f'"dur": {literal}'))
    refused(analyze(f), str(f), f"{literal.lstrip('-')} is not a JSON number")


# ---- ranks and steps ---------------------------------------------------------------------------


@pytest.mark.parametrize("info, fragment", [
    ({"rank": 2**40, "world_size": 2}, "distributedInfo.rank is 1099511627776"),
    ({"rank": -3, "world_size": 2}, "distributedInfo.rank is -3"),
    ({"rank": 1.7, "world_size": 2}, "distributedInfo.rank is 1.7"),
    ({"rank": 0, "world_size": 0}, "distributedInfo.world_size is 0"),
    ({"rank": 5, "world_size": 2}, "not below its world_size 2"),
    ({"rank": 0, "world_size": 2, "backend": []}, "distributedInfo.backend is a JSON list"),
    ({"rank": 0, "world_size": 2, "pg_config": {"a": 1}}, "distributedInfo.pg_config is not a list"),
    ({"rank": 0, "world_size": 2, "pg_config": [{"pg_size": -1}]}, "distributedInfo.pg_config is not a list"),
])
def test_impossible_ranks_are_refused(analyze, tmp_path, info, fragment):
    f = write(tmp_path / "t.json", trace(info=info))
    refused(analyze(f), str(f), fragment)


def test_a_rank_in_the_file_name_past_int32_is_refused(analyze, tmp_path):
    f = write(tmp_path / "rank99999999999.json", trace(info={}))
    refused(analyze(f), str(f), "rank 99999999999 is not a rank")


@pytest.mark.parametrize("args, fragment", [
    (["--trace-rank", "-7"], "--trace-rank"),
    (["--top", "-5"], "--top"),
    (["--top", "0"], "--top"),
    (["--rank", "-1"], "--rank"),
    (["--rank", str(2**40)], "--rank"),
    (["--step", str(10**20)], "--step"),
])
def test_impossible_options_are_refused(capsys, tmp_path, args, fragment):
    f = write(tmp_path / "t.json", trace(info={}))
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", str(f), *args])
    assert exit_.value.code == 2
    assert f"argument {fragment}" in capsys.readouterr().err.strip().splitlines()[-1]


# ---- run.json ----------------------------------------------------------------------------------


@pytest.mark.parametrize("manifest, fragment", [
    ("[1, 2]", "is a JSON list, not an object"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"pipeline": [1]}', "`pipeline` is [1], not an object"),
    ('{"pipeline": [' + "1, " * 30 + '1]}', "`pipeline` is a JSON list of 31, not an object"),
    ('{"ranks": 5}', "`ranks` is 5, not a list of objects"),
    ('{"world_size": "two"}', '`world_size` is "two"'),
    ('{"ranks": [{"rank": 0, "memory": {"params_bytes": "big"}}]}',
     '`ranks[0].memory.params_bytes` is "big", not a byte count (a whole number ≥ 0) or null'),
    ('{"ranks": [{"rank": 0, "memory": [5]}]}', "`ranks[0].memory` is [5], not an object of byte counts"),
    # The per-GPU peaks are a list of byte counts (CUDA runs); anything else in it is refused,
    # and a list is accepted for that field only.
    ('{"ranks": [{"rank": 0, "memory": {"max_memory_allocated_by_gpu_bytes": [1, -2]}}]}',
     "`ranks[0].memory.max_memory_allocated_by_gpu_bytes` is [1, -2], not a list of byte counts, one per GPU"),
    ('{"ranks": [{"rank": 0, "memory": {"max_memory_allocated_by_gpu_bytes": [1, "x"]}}]}',
     '`ranks[0].memory.max_memory_allocated_by_gpu_bytes` is [1, "x"]'),
    ('{"ranks": [{"rank": 0, "memory": {"grads_bytes": -5}}]}', "`ranks[0].memory.grads_bytes` is -5, not a byte count"),
    ('{"ranks": [{"rank": 0, "memory": {"params_bytes": [1]}}]}', "`ranks[0].memory.params_bytes` is [1], not a byte count"),
    ('{"pipeline": {"ideal_order": [[["F", 0]]]}}', "`pipeline.ideal_order`"),
])
def test_damaged_run_json_is_refused(analyze, tmp_path, manifest, fragment):
    run = tmp_path / "run"
    run.mkdir()
    write(run / "rank0.json", trace())
    write(run / "run.json", manifest)
    refused(analyze(run), str(run / "run.json"), fragment)


def test_run_json_fields_of_the_wrong_type_crash_no_analysis():
    # Callers that pass their own manifests (the viewer) get the field-by-field fallbacks.
    from profiler.memory import persistent_memory
    from profiler.pipeline import ideal_orders, pp_coordinates

    for bad in ({"pipeline": [1]}, {"ranks": 5}, {"hybrid": [2]}, {"hybrid": {"groups": 3}}, [1]):
        assert persistent_memory({"r": bad}).is_empty()
        assert ideal_orders({"r": bad}).is_empty()
        assert pp_coordinates(bad) is None


# ---- paths -------------------------------------------------------------------------------------


def cli_subprocess(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profiler", "analyze", *map(str, args)], capture_output=True,
                          timeout=timeout, cwd=REPO)


def test_devices_fifos_and_endless_links_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    zero = tmp_path / "rank1.json.gz"
    zero.symlink_to("/dev/zero")
    for path in ("/dev/null", fifo, zero):
        res = cli_subprocess(path, timeout=60)  # a hang is a TimeoutExpired failure
        err = res.stderr.decode()
        assert res.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert str(path) in err and "not a trace file or folder" in err


def test_a_fifo_is_never_opened_by_the_parser(tmp_path):
    from profiler.parse import parse_trace_file

    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        parse_trace_file(fifo)


def test_an_unreadable_folder_is_named(analyze, tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0)
    else:  # root reads any folder: the refusal the OS would give, given here
        real = Path.iterdir

        def iterdir(self):
            if self == folder:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)
        monkeypatch.setattr(Path, "iterdir", iterdir)
    try:
        refused(analyze(folder), str(folder), "cannot list this folder: Permission denied")
    finally:
        folder.chmod(0o755)


def test_a_name_too_long_is_named_on_one_short_line(analyze, tmp_path):
    line = refused(analyze(tmp_path / ("a" * 5000)), "File name too long")
    assert len(line) < 600 and "aaaa" in line


def test_the_empty_path_is_not_the_current_folder(analyze, tmp_path, monkeypatch):
    write(tmp_path / "rank0.json", trace())
    monkeypatch.chdir(tmp_path)
    refused(analyze(""), 'empty path ("")')


def test_a_non_utf8_file_name_loads_and_is_shown_escaped(analyze, tmp_path):
    name = os.fsdecode(os.fsencode(tmp_path) + b"/rank0\xff.json")
    write(Path(name), trace())
    code, out, err, report = analyze(name)
    assert code == 0, err
    assert "rank0\\xff.json" in out and report["runs"][0]["files"][0]["file"].endswith("rank0\\xff.json")
    assert {k: ranks_of(report)[0][k] for k in CLEAN} == CLEAN


def test_control_characters_in_names_are_printed_escaped(analyze, tmp_path):
    folder = tmp_path / "run\x1b[31mred"
    folder.mkdir()
    write(folder / "rank0\nsecond line.json", trace(op(150, 5, name="evil\x1b]0;title\x07op")))
    code, out, err, _ = analyze(folder)
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "run\\x1b[31mred" in out and "rank0\\nsecond line.json" in out and "evil\\x1b]0;title\\x07op" in out
    bad = write(folder / "rank1\nx.json", {"hello": 1})
    code, out, err, _ = analyze(bad)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "rank1\\nx.json" in err


# ---- bombs and panics --------------------------------------------------------------------------


def test_a_gzip_bomb_is_refused_before_it_fills_memory(analyze, tmp_path):
    # 100 KB of gzip holding one 100 MB event name (the issue's is 1 MB -> 1 GiB: the same rule)
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [co.compress(b'{"distributedInfo": {"rank": 0}, "traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1, "name": "')]
    parts += [co.compress(b"a" * (1 << 20)) for _ in range(100)]
    parts += [co.compress(b'"}]}'), co.flush()]
    f = tmp_path / "rank0.json.gz"
    f.write_bytes(b"".join(parts))
    refused(analyze(f), str(f), "gzip bomb", "100x")


def test_the_issues_bomb_1_mb_holding_a_1_gib_name_is_refused(analyze, tmp_path):
    # Made without compressing 1 GiB: after a full flush deflate starts afresh, so each 1 MiB block
    # of "a" compresses to the same bytes, repeated. CRC and size are the real ones.
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = b'{"distributedInfo": {"rank": 0}, "traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1, "name": "'
    tail = b'"}]}'
    block, n = b"a" * (1 << 20), 1024
    body = co.compress(head) + co.flush(zlib.Z_FULL_FLUSH)
    one = co.compress(block) + co.flush(zlib.Z_FULL_FLUSH)
    end = co.compress(tail) + co.flush()
    crc = zlib.crc32(head)
    for _ in range(n):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(tail, crc)
    size = len(head) + n * len(block) + len(tail)
    f = tmp_path / "rank0.json.gz"
    f.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + body + one * n + end
                  + crc.to_bytes(4, "little") + (size % 2**32).to_bytes(4, "little"))
    assert f.stat().st_size < 1_100_000 and size > 2**30
    refused(analyze(f), str(f), "gzip bomb")


def test_a_huge_name_is_refused(analyze, tmp_path):
    f = write(tmp_path / "rank0.json", trace(op(50, 1, name="x" * (2 << 20))))
    refused(analyze(f), str(f), "name is 2,097,152 bytes long, over the 1,048,576-byte limit")


def test_gzip_members_and_damage_still_read_as_before(tmp_path):
    from profiler.parse import parse_trace_file

    raw = json.dumps(trace()).encode()
    two = tmp_path / "rank0.json.gz"
    two.write_bytes(gzip.compress(raw[:40]) + gzip.compress(raw[40:]))  # concatenated members: one stream
    assert parse_trace_file(two)[0].height == 4
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(raw)[:-12])
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        parse_trace_file(tmp_path / "cut.json.gz")
    (tmp_path / "tail.json.gz").write_bytes(gzip.compress(raw) + b"\0junk")
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        parse_trace_file(tmp_path / "tail.json.gz")


def test_a_polars_panic_in_the_parser_names_the_file(tmp_path, monkeypatch):
    import profiler.cache as cache_module
    from polars.exceptions import PanicException

    def panic(path):
        raise PanicException("capacity overflow")

    monkeypatch.setattr(cache_module, "parse_trace_file", panic)
    f = write(tmp_path / "rank0.json", trace())
    err = cache_module.load_one_safe(f, tmp_path)
    assert isinstance(err, TraceError) and str(f) in str(err) and "PanicException: capacity overflow" in str(err)


# ---- review fixes (issue 12 B, second pass) ------------------------------------------------------


def test_an_event_without_a_name_is_kept_not_counted_as_a_bad_step(analyze, tmp_path):
    # A nameless event is no ProfilerStep#N: it stays (an idle-time-neutral instant here) and no
    # warning is given. The clean numbers are the hand-computed ones above.
    nameless = {"ph": "i", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 150}
    code, _, err, report = analyze(write(tmp_path / "rank0.json", trace(nameless)))
    assert code == 0, err
    assert {k: ranks_of(report)[0][k] for k in CLEAN} == CLEAN
    assert report["runs"][0]["files"][0]["dropped"]["bad_step"] == 0
    assert not [w for w in report["warnings"] if "dropped" in w]


def test_a_gzip_followed_by_zero_padding_reads_as_gzip_dc_does(tmp_path):
    from profiler.parse import parse_trace_file

    raw = json.dumps(trace()).encode()
    padded = gzip.compress(raw) + b"\0" * 512
    assert gzip.decompress(padded) == raw  # CPython reads it (and so does `gzip -dc`)
    (tmp_path / "rank0.json.gz").write_bytes(padded)
    assert parse_trace_file(tmp_path / "rank0.json.gz")[0].height == 4


@pytest.mark.parametrize("rank", ["\u00b2", "\u0663", "1\u0663"], ids=["superscript two", "arabic-indic three", "mixed"])
def test_a_rank_of_non_ascii_digits_is_refused(analyze, tmp_path, rank):
    f = write(tmp_path / "t.json", trace(info={"rank": rank, "world_size": 8}))
    refused(analyze(f), str(f), "distributedInfo.rank is")


FORGED = "ptprof analyze: error: FORGED"


def no_forged_line(*texts: str) -> None:
    # Text from a trace or a folder name never starts a line of its own (it could pose as ours).
    for text in texts:
        assert not [line for line in text.splitlines() if line.startswith(("FORGED", FORGED))], text


def test_a_newline_in_a_json_key_stays_in_its_one_line(analyze, tmp_path):
    f = write(tmp_path / "rank0.json", {f"a\n{FORGED}": 1})
    line = refused(analyze(f), str(f), "keys: a\\nptprof analyze: error: FORGED")
    assert line.startswith("ptprof analyze: error: ")


def test_a_newline_in_a_category_stays_in_its_warning_line(analyze, tmp_path):
    odd = op(150, 5, cat=f"weird\n{FORGED}")
    code, out, err, _ = analyze(write(tmp_path / "rank0.json", trace(odd)))
    assert code == 0, err
    no_forged_line(out, err)
    # the warning wraps at 100 columns: its continuation lines are indented, so it is read whole
    # by joining them; the newline inside stays escaped, within the one warning
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("warning: ") and "categories ptprof" in line)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    warning = " ".join(line.strip() for line in lines[start:end])
    assert "weird\\nptprof analyze: error: FORGED" in warning


def test_a_newline_in_a_folder_name_stays_in_its_warning_and_skipped_lines(analyze, tmp_path):
    folder = tmp_path / f"ctl\n{FORGED}"
    folder.mkdir()
    write(folder / "rank0.json", trace(op(50, -20), info={"rank": 0, "world_size": 2}))
    write(folder / "rank1.json", {"hello": 1})
    code, out, err, _ = analyze(folder)
    assert code == 2, err
    no_forged_line(out, err)
    (dropped,) = [line for line in out.splitlines() if line.startswith("warning:") and "dropped 1 event" in line]
    assert "ctl\\nptprof analyze: error: FORGED" in dropped
    (skipped,) = err.strip().splitlines()
    assert skipped.startswith("ptprof analyze: skipped ") and "ctl\\nptprof analyze: error: FORGED/rank1.json" in skipped


def test_trace_named_entries_that_are_not_files_are_named_not_skipped_in_silence(tmp_path):
    write(tmp_path / "rank0.json", trace(info={"rank": 0, "world_size": 3}))
    os.mkfifo(tmp_path / "rank1.json")
    (tmp_path / "rank2.json").symlink_to(tmp_path / "gone.json")
    (tmp_path / "rank3.json").symlink_to(tmp_path / "rank3.json")  # a loop: stat fails
    res = cli_subprocess(tmp_path, "--quiet", timeout=60)  # the FIFO is never opened: no hang
    lines = res.stderr.decode().strip().splitlines()
    assert res.returncode == 2 and len(lines) == 3, lines  # exit 2 as for any skipped rank; rank 0 analysed
    # each said skipped once (the line's prefix), not again at its end
    assert lines == [f"ptprof analyze: skipped {tmp_path / 'rank1.json'}: rank 1: not a regular file (a FIFO)",
                     f"ptprof analyze: skipped {tmp_path / 'rank2.json'}: rank 2: not a regular file (a link to nothing)",
                     f"ptprof analyze: skipped {tmp_path / 'rank3.json'}: rank 3: cannot open: Too many levels of symbolic links"]


@pytest.mark.parametrize("args", [["--top", "x"], ["--rank", "-1"], ["--bogus"]], ids=["not a number", "negative", "unknown"])
def test_a_bad_option_is_one_line_not_the_usage_block(capsys, tmp_path, args):
    f = write(tmp_path / "t.json", trace())
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", str(f), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ptprof analyze: error: ") and "ptprof analyze --help" in err


def test_help_is_still_the_whole_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "--help"])
    assert exit_.value.code == 0 and "usage: ptprof analyze" in capsys.readouterr().out


def test_dur_true_is_counted_as_no_dur_and_worded_so(analyze, tmp_path):
    code, _, err, report = analyze(write(tmp_path / "rank0.json", trace(op(50, True))))
    assert code == 0, err
    (warning,) = [w for w in report["warnings"] if "dropped" in w]
    assert "without dur (missing, null, boolean or not a number)" in warning


@pytest.mark.parametrize("doc, fragment", [
    ([1, 2, 3], "item 0 of the top-level list is not an event object"),
    ([op(0, 1), {"ph": "X", "args": 5}], "item 1 of the top-level list is a malformed event (at `.args`)"),
    ({"traceEvents": [op(0, 1), 7]}, "malformed event at `$.traceEvents[1]`"),
], ids=["bare list of ints", "bare list, bad args", "traceEvents"])
def test_a_malformed_event_is_named_by_where_it_is(analyze, tmp_path, doc, fragment):
    f = write(tmp_path / "rank0.json", doc)
    line = refused(analyze(f), str(f), fragment)
    assert ("traceEvents" in line) == isinstance(doc, dict)


@pytest.mark.parametrize("isal", [True, False], ids=["isal", "zlib-only"])
def test_gunzip_reads_every_member_with_or_without_isal(tmp_path, monkeypatch, isal):
    # ISA-L inflates where python-isal is installed, zlib where it is not (or where ISA-L stops
    # early): the same bytes either way, every member, zero padding read past, damage refused.
    from profiler import damaged
    from profiler.errors import TraceError

    if not isal:
        monkeypatch.setattr(damaged, "_isal_zlib", None)
    elif damaged._isal_zlib is None:
        pytest.skip("python-isal is not installed")
    parts = [b'{"traceEvents": [', b'{"ph": "X"}' * 1000, b"]}"]
    data = b"".join(gzip.compress(p) for p in parts) + b"\0" * 64
    assert damaged.gunzip(data, tmp_path / "t.json.gz") == b"".join(parts)
    with pytest.raises(TraceError, match="incorrect data check"):  # zlib's wording, with ISA-L too
        damaged.gunzip(data[:-72] + bytes([data[-72] ^ 1]) + data[-71:], tmp_path / "t.json.gz")


def test_a_bad_run_json_is_said_once_for_every_rank_that_reads_it(analyze, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(REPO / "traces" / "sample-ddp-2r", run)
    (run / "run.json").write_text("{bad")
    line = refused(analyze(run), "run.json: ranks 0, 1: unreadable run manifest: Expecting property name")
    assert line.count("unreadable run manifest") == 1, line  # it was said once a rank


def test_a_bad_run_json_beside_a_good_run_is_skipped_once_for_its_ranks(analyze, tmp_path):
    shutil.copytree(REPO / "traces" / "sample-ddp-2r", tmp_path / "good")
    shutil.copytree(REPO / "traces" / "sample-fsdp-2r", tmp_path / "bad")
    (tmp_path / "bad" / "run.json").write_text("{bad")
    code, _, err, report = analyze(tmp_path)
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert code == 2 and len(skipped) == 1 and "run.json: ranks 0, 1: unreadable run manifest" in skipped[0], err
    assert [p for p in report["problems"] if "run.json" in p] == [skipped[0].split("skipped ", 1)[1]]

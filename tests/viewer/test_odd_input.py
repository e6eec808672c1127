"""The viewer on odd runs and odd requests: every callback answers (a figure, a table or a message
saying what was refused), never an HTTP 500, and one bad run never takes the others down."""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import threading

import pytest

from tests.viewer.conftest import dash_post, data_url
from viewer import compare_data, data, figures, ids, scale_data, upload


# ---------------------------------------------------------------------------------------------
# Collectives table without cross-rank start data


@pytest.mark.parametrize("runs", [["sample-1f1b-2r", "sample-zbv-2r"], ["sample-1f1b-2r"], ["sample-ddp-2r", "sample-zbv-2r"]])
def test_collectives_table_renders_without_skew_data(store, app, runs):
    stats, skew = compare_data.collectives_frames(store.get_many(runs))
    rows = figures.build_collectives_table(stats, skew)
    assert {r["run"] for r in rows} == set(runs) and all(r["count"] > 0 for r in rows)
    pipeline_rows = [r for r in rows if r["run"] != "sample-ddp-2r"]
    assert pipeline_rows and all(r["skew_max_ms"] is None for r in pipeline_rows)  # no start data: no skew, not zero
    assert all(r["busbw_gbps"] is None for r in pipeline_rows)  # gloo's send / recv: post to wait, no bandwidth (not 0)
    res = dash_post(app, f"{ids.COMPARE_COLLECTIVES}.data", runs)
    assert res.status_code == 200, res.get_data(as_text=True)[-300:]


def test_collectives_table_from_stats_alone():
    import polars as pl

    stats = pl.DataFrame({"run": ["a", "a"], "rank": [0, 1], "collective": ["all_reduce"] * 2, "count": [2, 2],
                          "total_bytes": [8 * 2**20, 8 * 2**20], "total_us": [1000.0, 3000.0], "busbw_gbps": [1.0, 3.0]})
    (row,) = figures.build_collectives_table(stats, pl.DataFrame(schema={"run": pl.String}))
    # means over ranks: count 2, 8 MiB, 2 ms total, 1 ms each; busbw weighted by time: (1*1 + 3*3) / 4
    assert (row["count"], row["size_mib"], row["time_ms"], row["mean_ms"], row["busbw_gbps"]) == (2.0, 8.0, 2.0, 1.0, 2.5)
    assert row["skew_mean_ms"] is None
    # A rank without busbw (group size unknown) is out of the weights; a collective with none has none, not 0.
    (row,) = figures.build_collectives_table(stats.with_columns(busbw_gbps=pl.Series([None, 3.0])), pl.DataFrame(schema={"run": pl.String}))
    assert row["busbw_gbps"] == 3.0
    (row,) = figures.build_collectives_table(stats.with_columns(busbw_gbps=pl.lit(None, pl.Float64)), pl.DataFrame(schema={"run": pl.String}))
    assert row["busbw_gbps"] is None


# ---------------------------------------------------------------------------------------------
# Odd run folders: each shows its error in its own row


def _trace_folder(folder, src):
    folder.mkdir(parents=True)
    shutil.copy(src / "rank0.json.gz", folder / "rank0.json.gz")
    return folder


@pytest.fixture()
def odd_root(tmp_path, traces_root):
    """A root with one good run and one of each odd run folder; the name -> what its row must say."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    src = traces_root / "sample-ddp-2r"
    shutil.copytree(src, root / "good")
    _trace_folder(outside / "run", src)
    (root / "linked-out").symlink_to(outside / "run")  # a folder link out of the root
    for name, text in [("nested", "[" * 100_000 + "]" * 100_000), ("a-list", "[1]"), ("wrong-types", '{"pipeline": [1]}'),
                       ("not-json", "{nope")]:
        _trace_folder(root / name, src)
        (root / name / "run.json").write_text(text)
    _trace_folder(root / "fifo-manifest", src)
    os.mkfifo(root / "fifo-manifest" / "run.json")  # reading it would block forever
    _trace_folder(root / "file-link-out", src)
    (root / "file-link-out" / "rank1.json.gz").symlink_to(outside / "run" / "rank0.json.gz")
    inside = _trace_folder(root / "file-link-in", src)
    (inside / "rank1.json.gz").symlink_to(root / "good" / "rank1.json.gz")  # inside the root: fine
    return root, {"linked-out": "outside the traces root", "nested": "nested too deeply", "a-list": "expected a JSON object",
                  "wrong-types": "'pipeline' should be an object", "not-json": "run.json", "fifo-manifest": "not a regular file",
                  "file-link-out": "rank1.json.gz links to outside the traces root"}


def test_odd_run_folders_show_their_error_in_their_row(odd_root, pages):
    root, errors = odd_root
    store = data.RunStore(root)
    rows, pending = pages.runs.runs_table_rows(store)
    assert {r["run"] for r in rows} == {"good", "file-link-in", *errors}
    store.load_in_background(pending)
    assert store.wait_idle(timeout=300)
    rows = {r["run"]: r for r in pages.runs.runs_table_rows(store)[0]}
    assert rows["good"]["status"] == "ok" and rows["file-link-in"]["status"] == "ok"
    for name, error in errors.items():
        assert error in rows[name]["status"], (name, rows[name]["status"])
    assert rows["file-link-out"]["step_ms"] is None  # refused, not analysed from the file outside
    json.dumps(list(rows.values()))


def test_a_file_link_out_of_the_root_is_refused_everywhere(odd_root, pages):
    root, _ = odd_root
    store = data.RunStore(root)
    run = store.get("file-link-out")
    assert not run.ok and "links to outside" in run.error and run.traces is None
    assert "links to outside" in str(pages.compare.status_children(store, ["file-link-out"]))
    assert "links to outside" in str(pages.open.open_folder(store, "file-link-out"))
    assert store.get("file-link-in").ok


def test_a_file_link_out_in_a_sub_folder_is_refused(tmp_path, traces_root):
    """load_traces goes down into sub-folders when a run folder has no trace files of its own:
    a link out of the root there is refused too, before anything is loaded."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    _trace_folder(outside, traces_root / "sample-ddp-2r")
    (root / "run" / "sub").mkdir(parents=True)
    (root / "run" / "run.json").write_text("{}")
    (root / "run" / "sub" / "rank0.json.gz").symlink_to(outside / "rank0.json.gz")
    run = data.RunStore(root).get("run")
    assert not run.ok and run.traces is None
    assert "sub/rank0.json.gz links to outside the traces root" in run.error


def test_a_skipped_duplicate_rank_gives_no_cli_flag_in_the_viewer(tmp_path, traces_root, monkeypatch):
    """The load's duplicate-rank line suggests `--rank-from-filename`, a flag ptprof view has not
    (trial): the viewer's status leaves that advice out and keeps the rest."""
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "root" / "run"
    run.mkdir(parents=True)
    for r in (0, 1):  # both hold rank 0's trace (distributedInfo rank 0); their names say 0 and 1
        shutil.copy(traces_root / "sample-ddp-2r" / "rank0.json.gz", run / f"rank{r}.json.gz")
    d = data.RunStore(tmp_path / "root").get("run")
    assert d.ok and "--rank-from-filename" in d.analysis.problems[0]
    assert d.skipped == ["rank1.json.gz: duplicate rank 0 in run 'run' (kept: rank0.json.gz, read first); pass the files "
                         "of one run only"], d.skipped


def test_the_runs_page_answers_with_odd_folders(odd_root, app, monkeypatch):
    from viewer.pages import STORE_KEY

    root, errors = odd_root
    monkeypatch.setitem(app.server.config, STORE_KEY, data.RunStore(root))
    res = dash_post(app, f"{ids.RUNS_TABLE}.data", None, None, state=[None])
    assert res.status_code == 200, res.get_data(as_text=True)[-300:]
    body = res.get_json()["response"]
    assert {r["run"] for r in body[ids.RUNS_TABLE]["data"]} >= set(errors)
    app.server.config[STORE_KEY].wait_idle(timeout=300)


def test_wrong_types_in_run_json_are_left_out_of_the_row():
    row = data.manifest_row("r", {"paradigm": 5, "world_size": "x", "mesh": {"dp": "2", "tp": 2}, "device": ["gpu"]}, None)
    assert (row["paradigm"], row["ranks"], row["mesh"], row["device"]) == ("(foreign traces)", None, "tp=2", None)


# ---------------------------------------------------------------------------------------------
# Callback inputs: whatever the browser sends, an answer (never a 500), refusals said


COMPARE_OUTPUTS = [f"{ids.COMPARE_STATUS}.children", f"{ids.COMPARE_FINDINGS}.children", f"{ids.COMPARE_THEORY}.children",
                   f"{ids.COMPARE_BREAKDOWN}.figure", f"{ids.COMPARE_STEPS}.figure",
                   f"{ids.COMPARE_PIPELINE}.figure", f"{ids.COMPARE_MEMORY}.figure", f"{ids.COMPARE_COLLECTIVES}.data"]
BAD_RUN_IDS = [None, 5, "sample-ddp-2r", {"a": 1}, [1, 2], [None], ["sample-ddp-2r", 3], [""], ["x" * 5000], [[]]]


@pytest.mark.parametrize("run_ids", BAD_RUN_IDS, ids=repr)
def test_compare_callbacks_refuse_malformed_run_ids(app, run_ids):
    for output in [*COMPARE_OUTPUTS, f"{ids.COMPARE_TIMELINE}.figure"]:
        values = [run_ids, None, ""] if "timeline" in output else [run_ids]  # the timeline's inputs: runs, zoom, drill-down
        res = dash_post(app, output, *values)
        assert res.status_code == 200, (output, res.get_data(as_text=True)[-300:])
        if output.startswith(ids.COMPARE_STATUS) and run_ids is not None:
            assert "refused" in res.get_data(as_text=True)


def test_compare_callbacks_take_at_most_four_runs(app, store):
    many = [f"run-{i}" for i in range(200)]
    for output in COMPARE_OUTPUTS:
        res = dash_post(app, output, many)
        assert res.status_code == 200
    res = dash_post(app, f"{ids.COMPARE_STATUS}.children", many)
    assert "at most 4 runs side by side (200 sent)" in res.get_data(as_text=True)
    assert not any(k.startswith("run-") for k in store._cache)  # nothing was looked up


@pytest.mark.parametrize("relayout", [
    {"xaxis.range[0]": "abc", "xaxis.range[1]": 2}, {"xaxis.range": [None, 1]}, {"xaxis.range": "x"}, {"xaxis.range": [1, 2, 3]},
    {"xaxis.range[0]": 1}, {"xaxis.range[0]": True, "xaxis.range[1]": 3}, {"xaxis.range": [1, 1]}, [1, 2], "zoom", 7,
    {"5": 1}, {"xaxis.range[0]": 1e308, "xaxis.range[1]": -1e308}, {"xaxis.range[0]": [1], "xaxis.range[1]": {"a": 2}},
], ids=repr)
def test_timeline_takes_any_relayout(app, relayout):
    res = dash_post(app, f"{ids.COMPARE_TIMELINE}.figure", ["sample-ddp-2r"], relayout, "", changed=1)
    assert res.status_code in (200, 204), res.get_data(as_text=True)[-300:]


@pytest.mark.parametrize("view", [None, 5, "rank:", "rank:-1", "rank:99999999999999999999", "rank:" + "9" * 5000, "rank:\x1f7", "group:",
                                  "group:nope", "x:y", ["rank:1"]], ids=lambda v: repr(v)[:30])
def test_timeline_takes_any_drill_down(app, view):
    res = dash_post(app, f"{ids.COMPARE_TIMELINE}.figure", ["sample-ddp-2r"], None, view, changed=2)
    assert res.status_code == 200, res.get_data(as_text=True)[-300:]


@pytest.mark.parametrize("rank, group, said", [
    ("abc", None, "rank 'abc' is not a rank"), ("-1", None, "rank '-1' is not a rank"), ("1.5", None, "rank '1.5' is not a rank"),
    ("\u00b2", None, "rank '\\xb2' is not a rank"), ("", None, "&rank= is empty"), (["1", "2"], None, "rank '1,2' is not a rank"),
    (None, " ", "&group= is empty"), (None, "s" * 101, "is not a group name (at most 100 printable characters)"),
    (None, "stage\n1", "group 'stage\\n1' is not a group name"),
], ids=repr)
def test_a_drill_down_that_is_no_rank_or_group_says_so(pages, store, app, rank, group, said):
    # `&rank=abc` in the address showed the groups as if nothing had been asked
    view = pages.compare.initial_view(rank, group)
    fig = pages.compare.timeline_figure(store, ["sample-ddp-2r"], view=view)
    (note,) = [a.text for a in fig.layout.annotations]
    assert said in note and "a rank is a whole number from 0 (&rank=17), a group a name from the dropdown" in note, note
    assert "\n" not in note and not fig.data
    # the dropdown keeps the value (one missing from its options is reset to the groups view by the browser)
    res = dash_post(app, f"{ids.COMPARE_VIEW}.options", ["sample-ddp-2r"], state=[view])
    assert res.get_json()["response"][ids.COMPARE_VIEW]["options"][-1] == {"label": view.replace(":", " ", 1)[:46] + " (not valid)", "value": view}


def test_a_readable_drill_down_is_not_refused(pages, store):
    assert pages.compare.initial_view(" 17 ") == "rank:17" and pages.compare.initial_view(group="stage1") == "group:stage1"
    assert pages.compare.initial_view("\x1f7") == "rank:7" == pages.compare.initial_view("\x1c7\t")  # str.strip()'s blanks
    assert pages.compare.initial_view() == "" and scale_data.bad_view("") is None and scale_data.bad_view(None) is None
    fig = pages.compare.timeline_figure(store, ["sample-ddp-2r"], view="rank:1")
    assert fig.data and {y.split()[0] for t in fig.data for y in t.y} == {"r1"}
    missing = scale_data.view_options(store.get_many(["sample-ddp-2r"]), keep="rank:7")
    assert missing[-1] == {"label": "rank 7 (not in these runs)", "value": "rank:7"}
    assert [o["value"] for o in scale_data.view_options(store.get_many(["sample-ddp-2r"]), keep="rank:1")].count("rank:1") == 1


@pytest.mark.parametrize("view", [None, "", 5, ["rank:1"], {"a": 1}, "x" * 5000, "rank:" + "9" * 5000], ids=lambda v: repr(v)[:20])
def test_drill_down_options_take_any_value(app, view):
    res = dash_post(app, f"{ids.COMPARE_VIEW}.options", ["sample-ddp-2r"], state=[view])
    assert res.status_code == 200, res.get_data(as_text=True)[-300:]
    options = res.get_json()["response"][ids.COMPARE_VIEW]["options"]
    # the groups view, group "all ranks", ranks 0 and 1; then a value it does not know, kept (a string only)
    kept = view in ("x" * 5000, "rank:" + "9" * 5000)
    assert len(options) == (5 if kept else 4) and all(len(o["label"]) < 80 for o in options), options


def test_timeline_refuses_non_finite_ranges(pages):
    # NaN and Infinity are not JSON, but Python's parser (Flask's) takes them.
    for relayout in ({"xaxis.range[0]": 0, "xaxis.range[1]": float("inf")}, {"xaxis.range": [float("nan"), 2.0]}):
        assert pages.compare.visible_range(relayout) is None


def test_reversed_range_is_put_in_order(pages):
    assert pages.compare.visible_range({"xaxis.range[0]": 3, "xaxis.range[1]": 1}) == (1.0, 3.0)


@pytest.mark.parametrize("output, values", [
    (f"{ids.RUNS_COMPARE_LINK}.href", [5]), (f"{ids.RUNS_COMPARE_LINK}.href", [[1, None]]),
    (f"{ids.RUNS_COMPARE_LINK}.href", ["sample-ddp-2r"]), (f"{ids.OPEN_RESULT}.children", [1, 5]),
    (f"{ids.OPEN_RESULT}.children", [1, ["a"]]), (f"{ids.OPEN_RESULT}.children", [1, {"a": 1}]),
], ids=repr)
def test_other_callbacks_take_any_input(app, output, values):
    res = dash_post(app, output, *values)
    assert res.status_code in (200, 204), res.get_data(as_text=True)[-300:]


@pytest.mark.parametrize("contents, names", [(5, None), (["x"], [1]), ("data:x;base64,e30=", 5), ([5], ["rank0.json"]),
                                             ({"a": 1}, {"b": 2})], ids=repr)
def test_upload_callback_takes_any_input(app, traces_root, contents, names):
    before = set(traces_root.iterdir())
    res = dash_post(app, f"{ids.OPEN_RESULT}.children", contents, state=[names])
    assert res.status_code in (200, 204), res.get_data(as_text=True)[-300:]
    assert set(traces_root.iterdir()) == before


# ---------------------------------------------------------------------------------------------
# Uploads: all or nothing, memory bounded before parsing, every refusal said


def _gzip_bomb(unpacked_mib: int) -> bytes:
    """A valid trace whose one event name is `unpacked_mib` MiB of "a", as concatenated gzip
    members (gzip reads them all as one stream): the same 1 KB member for every MiB."""
    mib = gzip.compress(b"a" * 2**20)
    head = gzip.compress(b'{"traceEvents":[{"ph":"X","cat":"cpu_op","pid":1,"tid":1,"ts":0,"dur":1,"name":"')
    return head + mib * unpacked_mib + gzip.compress(b'"}]}')


def test_more_files_than_names_are_refused(tmp_path, traces_root, pages):
    store = data.RunStore(tmp_path)
    blob = data_url((traces_root / "sample-ddp-2r" / "rank0.json.gz").read_bytes())
    out = str(pages.open.open_upload(store, [blob, blob], ["rank0.json.gz"]))
    assert "Upload refused" in out and "2 files but 1 names" in out and not list(tmp_path.iterdir())


def test_duplicate_names_are_refused(tmp_path, traces_root, pages):
    store = data.RunStore(tmp_path)
    rank0, rank1 = (data_url((traces_root / "sample-ddp-2r" / f"rank{r}.json.gz").read_bytes()) for r in (0, 1))
    out = str(pages.open.open_upload(store, [rank0, rank1], ["rank0.json.gz", "rank0.json.gz"]))
    assert "Upload refused" in out and "rank0.json.gz: sent twice" in out and not list(tmp_path.iterdir())


def test_every_problem_is_named(tmp_path, pages):
    out = str(pages.open.open_upload(data.RunStore(tmp_path), [data_url(b"{}"), "junk", data_url(b"{}")],
                                     ["../x.json", "rank1.json", "rank2.txt"]))
    assert "../x.json: expected a plain file name" in out and "rank1.json: malformed upload" in out and "rank2.txt" in out


def test_a_gzip_bomb_is_refused_before_parsing_and_memory_stays_bounded(tmp_path, pages):
    """1 MB that unpacks to 1,000 MiB: refused while streaming, never held unpacked (peak RSS
    barely moves; parsing it took 5 GB and 100 s)."""
    store = data.RunStore(tmp_path)
    bomb = _gzip_bomb(1000)
    assert len(bomb) < 2 * 2**20
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = str(pages.open.open_upload(store, [data_url(bomb)], ["rank0.json.gz"]))
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert "Upload refused" in out and f"unpacks to more than {upload.MAX_UNPACKED_BYTES // 2**20} MiB" in out
    assert peak_after - peak_before < 64 * 2**20 and not list(tmp_path.iterdir())


def test_a_truncated_gzip_is_refused(tmp_path, traces_root, pages):
    blob = (traces_root / "sample-ddp-2r" / "rank0.json.gz").read_bytes()
    out = str(pages.open.open_upload(data.RunStore(tmp_path), [data_url(blob[: len(blob) // 2])], ["rank0.json.gz"]))
    assert "Upload refused" in out and "truncated" in out and not list(tmp_path.iterdir())


def test_uploads_are_parsed_in_a_child_process(tmp_path, traces_root, pages, monkeypatch):
    """The server never parses the JSON: with in-process parsing broken, the upload still loads
    (from the cache the child filled); with the child starved of memory, it is refused cleanly."""
    import profiler.cache
    import profiler.parse

    def no_parsing_here(*_a, **_k):
        raise AssertionError("parsed in the server process")

    store = data.RunStore(tmp_path)
    blob = (traces_root / "sample-fsdp-2r" / "rank1.json.gz").read_bytes()
    monkeypatch.setattr(upload, "PARSE_MEMORY_BYTES", 200 * 2**20)  # not even enough to start python + polars
    out = str(pages.open.open_upload(store, [data_url(blob)], ["rank1.json.gz"]))
    assert "Upload refused" in out and not list(tmp_path.iterdir()) and not store._cache
    monkeypatch.undo()
    monkeypatch.setattr(profiler.parse, "parse_trace_file", no_parsing_here)
    monkeypatch.setattr(profiler.cache, "parse_trace_file", no_parsing_here, raising=False)
    out = str(pages.open.open_upload(store, [data_url(blob)], ["rank1.json.gz"]))
    assert "1 of 2 ranks loaded" in out, out


def test_a_parse_timeout_leaves_no_process_behind(tmp_path, traces_root, pages, monkeypatch):
    """On a timeout the parsing child's whole process group is killed: the child and what it
    started (the loader's workers), not the child alone."""
    import sys

    import psutil

    pids = tmp_path / "pids"
    fake = tmp_path / "fake-python"  # stands in for `python -m viewer.upload`: starts a worker, hangs
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pids}.tmp\necho $$ >> {pids}.tmp\nmv {pids}.tmp {pids}\nwait\n")
    fake.chmod(0o755)
    root = tmp_path / "root"
    root.mkdir()
    store = data.RunStore(root)
    blob = (traces_root / "sample-ddp-2r" / "rank0.json.gz").read_bytes()
    monkeypatch.setattr(sys, "executable", str(fake))
    monkeypatch.setattr(upload, "PARSE_TIMEOUT_S", 2)
    out = str(pages.open.open_upload(store, [data_url(blob)], ["rank0.json.gz"]))
    monkeypatch.undo()
    assert "Upload refused" in out and "parsing took over 2 s" in out and not list(root.iterdir())
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    for _ in range(100):  # killed processes go at once; this only waits for the kernel to say so
        if not any(alive(p) for p in started):
            break
        threading.Event().wait(0.05)
    leftover = [p for p in started if alive(p)]
    for p in leftover:  # never leave the sleeper running, even when the test fails
        os.kill(p, 9)
    assert not leftover


def test_an_upload_is_refused_when_the_cache_is_unusable(tmp_path, traces_root, pages, monkeypatch):
    """The server loads an upload from the cache the child filled: with no usable cache it would
    parse the JSON itself, unbounded; refused instead, with the reason."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / f"ptprof-cache-{os.getuid()}").write_text("")  # the per-user fallback is not a folder either
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    root = tmp_path / "root"
    root.mkdir()
    store = data.RunStore(root)
    blob = (traces_root / "sample-ddp-2r" / "rank0.json.gz").read_bytes()
    out = str(pages.open.open_upload(store, [data_url(blob)], ["rank0.json.gz"]))
    assert "Upload refused" in out and "uploads need the profiler's cache" in out, out
    assert not list(root.iterdir()) and not store._cache


def test_an_upload_never_removes_another_uploads_folder(tmp_path, traces_root, monkeypatch):
    """Two uploads at once each get a folder of their own; one never removes the other's (a name
    taken from the clock once collided, and the loser's clean-up removed the winner's folder)."""
    import datetime as dt

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2026, 1, 1, 12, 0, 0, 1)

    other = tmp_path / f"{upload.UPLOAD_PREFIX}{Frozen.now().strftime('%Y%m%d-%H%M%S-%f')}"
    other.mkdir()
    shutil.copy(traces_root / "sample-ddp-2r" / "rank0.json.gz", other / "rank0.json.gz")
    monkeypatch.setattr(upload, "dt", type("dt", (), {"datetime": Frozen}), raising=False)
    store = data.RunStore(tmp_path)
    blob = (traces_root / "sample-ddp-2r" / "rank1.json.gz").read_bytes()
    try:
        run_id = upload.save_upload(store, upload.decode_upload([data_url(blob)], ["rank1.json.gz"]))
    except data.PathRefused:
        run_id = None
    assert (other / "rank0.json.gz").is_file()  # the other upload's folder is untouched
    assert run_id and run_id != other.name and store.get(run_id).ok


def test_a_partly_bad_upload_keeps_nothing(tmp_path, traces_root, pages):
    store = data.RunStore(tmp_path)
    good = data_url((traces_root / "sample-ddp-2r" / "rank0.json.gz").read_bytes())
    out = str(pages.open.open_upload(store, [good, data_url(b"[1, 2")], ["rank0.json.gz", "rank1.json"]))
    assert "Upload refused" in out and "rank1.json: rank 1: not valid JSON" in out and not list(tmp_path.iterdir())
    assert str(tmp_path) not in out  # file names, not the server's paths


# ---------------------------------------------------------------------------------------------
# Cold load: the Runs table shows at once and fills in as analyses finish


@pytest.fixture()
def cold_root(tmp_path, traces_root):
    for name in ("sample-ddp-2r", "sample-1f1b-2r"):
        shutil.copytree(traces_root / name, tmp_path / name)
    return tmp_path


def test_runs_table_shows_at_once_and_fills_in_the_background(cold_root, pages, monkeypatch):
    gate, loaders = threading.Event(), []
    real_load = data._load_run

    def held_load(*args):
        loaders.append(threading.current_thread())
        gate.wait(10)  # analyses "take long" until the test lets them finish
        return real_load(*args)

    monkeypatch.setattr(data, "_load_run", held_load)
    store = data.RunStore(cold_root)
    rows, pending = pages.runs.runs_table_rows(store)
    assert threading.current_thread() not in loaders  # the page's request analysed nothing
    assert pending == ["sample-1f1b-2r", "sample-ddp-2r"]
    by_run = {r["run"]: r for r in rows}
    assert by_run["sample-ddp-2r"]["paradigm"] == "ddp" and by_run["sample-ddp-2r"]["mesh"] == "dp=2"  # from run.json
    assert all(r["status"] == data.PENDING and r["step_ms"] is None for r in rows)
    store.load_in_background(pending)
    gate.set()
    assert store.wait_idle(timeout=300)
    rows, pending = pages.runs.runs_table_rows(store)
    assert not pending and all(r["status"] == "ok" and r["step_ms"] > 0 for r in rows)
    assert threading.current_thread() not in loaders


def test_runs_page_polls_until_every_run_is_analysed(cold_root, app, monkeypatch):
    from viewer.pages import STORE_KEY

    store = data.RunStore(cold_root)
    monkeypatch.setitem(app.server.config, STORE_KEY, store)
    first = dash_post(app, f"{ids.RUNS_TABLE}.data", None, None, state=[None]).get_json()["response"]
    assert first[ids.RUNS_POLL]["disabled"] is False and "of 2 done" in first[ids.RUNS_PROGRESS]["children"]
    assert store.wait_idle(timeout=300)
    done = dash_post(app, f"{ids.RUNS_TABLE}.data", None, 1, state=[first[ids.RUNS_DONE]["data"]], changed=1).get_json()["response"]
    assert done[ids.RUNS_POLL]["disabled"] is True and done[ids.RUNS_PROGRESS]["children"] == "2 runs."
    assert all(r["status"] == "ok" for r in done[ids.RUNS_TABLE]["data"])
    idle = dash_post(app, f"{ids.RUNS_TABLE}.data", None, 2, state=[done[ids.RUNS_DONE]["data"]], changed=1).get_json()["response"]
    assert ids.RUNS_TABLE not in idle  # nothing new: the table is left alone


def test_runs_table_columns_say_profiled_steps(pages):
    assert pages.runs.COLUMN_NAMES["steps"] == "profiled steps"


def test_an_upload_is_not_listed_until_it_is_checked(tmp_path, traces_root, pages, monkeypatch):
    store = data.RunStore(tmp_path)
    listed = []
    real_parse = upload.parse_in_child
    monkeypatch.setattr(upload, "parse_in_child", lambda folder: (listed.append(store.run_ids()), real_parse(folder))[1])
    blob = data_url((traces_root / "sample-ddp-2r" / "rank0.json.gz").read_bytes())
    assert "1 of 2 ranks loaded" in str(pages.open.open_upload(store, [blob], ["rank0.json.gz"]))
    assert listed == [[]] and len(store.run_ids()) == 1  # hidden while parsed, listed once loaded


def test_an_unreadable_folder_shows_its_error(tmp_path, traces_root, pages, monkeypatch):
    shutil.copytree(traces_root / "sample-ddp-2r", tmp_path / "good")
    (tmp_path / "locked").mkdir()
    real = data._is_run_folder

    def is_run_folder(p):
        if p.name == "locked":  # what a folder without read permission does (tests may run as root)
            raise PermissionError(13, "Permission denied", str(p))
        return real(p)

    monkeypatch.setattr(data, "_is_run_folder", is_run_folder)
    rows = {r["run"]: r for r in pages.runs.runs_table_rows(data.RunStore(tmp_path))[0]}
    assert set(rows) == {"good", "locked"} and "Permission denied" in rows["locked"]["status"]


def test_compare_says_when_it_shows_fewer_runs_than_asked(pages):
    page = str(pages.compare.layout(runs="a,b,c,d,e,a"))
    assert "Compare: a · b · c · d" in page and "first 4 of the 5 runs" in page
    assert "first 4" not in str(pages.compare.layout(runs="a,b"))

"""The data module and the pages' callbacks as plain functions: path safety, uploads, bad runs,
the cache, and what each callback returns for the sample runs."""

from __future__ import annotations

import errno
import gzip
import json
import os
import types
from pathlib import Path

import polars as pl
import pytest

from profiler import SCHEMA
from profiler.pipeline import ACTION_COLUMNS

from tests.viewer.conftest import BROKEN, data_url
from viewer import compare_data, data, upload
from viewer.__main__ import main, parse_args
from viewer.data import PathRefused, RunStore, resolve_under

TRAVERSALS = ["../", "..", "../../etc/passwd", "sample-ddp-2r/../../", "/etc/passwd", "/", "~/.ssh", "a/../../b", "\x00", ""]


# ---------------------------------------------------------------------------------------------
# Paths


@pytest.mark.parametrize("path", TRAVERSALS)
def test_paths_outside_the_root_are_refused(traces_root, path):
    if path == "~/.ssh":  # not expanded: a folder literally named "~" under the root, which does not exist
        assert resolve_under(traces_root, path).is_relative_to(traces_root)
        return
    with pytest.raises(PathRefused):
        resolve_under(traces_root, path)


def test_paths_inside_the_root_are_accepted(traces_root):
    assert resolve_under(traces_root, "sample-ddp-2r") == traces_root / "sample-ddp-2r"
    assert resolve_under(traces_root, str(traces_root / "sample-ddp-2r")) == traces_root / "sample-ddp-2r"
    assert resolve_under(traces_root, "sample-ddp-2r/../sample-fsdp-2r") == traces_root / "sample-fsdp-2r"


def test_symlinks_out_of_the_root_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret").mkdir()
    (root / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(PathRefused, match="outside"):
        resolve_under(root, "link")


@pytest.mark.parametrize("path", ["../", "/etc", "sample-ddp-2r/../..", "/"])
def test_callbacks_refuse_traversal(store, pages, path):
    assert "Refused" in str(pages.open.open_folder(store, path))
    (run,) = store.get_many([path])
    assert not run.ok and ("outside" in run.error or "empty" in run.error)
    assert "error" in str(pages.compare.status_children(store, [path]))


def test_traversal_refused_over_http(app, traces_root):
    """The open-path callback, called the way the browser calls it."""
    from viewer import ids

    client = app.server.test_client()
    client.get("/")  # first request: dash registers the callbacks
    body = {
        "output": f"{ids.OPEN_RESULT}.children@" + "a" * 32,  # allow_duplicate outputs carry a hash suffix
        "outputs": {"id": ids.OPEN_RESULT, "property": "children@" + "a" * 32},
        "inputs": [{"id": ids.OPEN_BUTTON, "property": "n_clicks", "value": 1},
                   {"id": ids.OPEN_PATH, "property": "value", "value": "../../../etc"}],
        "changedPropIds": [f"{ids.OPEN_BUTTON}.n_clicks"], "state": [],
    }
    deps = client.get("/_dash-dependencies").get_json()
    (dep,) = [d for d in deps if d["output"].startswith(f"{ids.OPEN_RESULT}.children@")]
    body["output"] = dep["output"]
    body["outputs"]["property"] = dep["output"].split(".", 1)[1]
    res = client.post("/_dash-update-component", json=body)
    assert res.status_code == 200
    assert "Refused" in res.get_data(as_text=True) and "outside the traces root" in res.get_data(as_text=True)


# ---------------------------------------------------------------------------------------------
# Runs, bad data, cache


def analysed_rows(store, pages) -> list[dict]:
    """The Runs table once the background analyses are done (what the page shows after its polls)."""
    _, pending = pages.runs.runs_table_rows(store)
    store.load_in_background(pending)
    assert store.wait_idle(timeout=300)
    rows, pending = pages.runs.runs_table_rows(store)
    assert not pending
    return rows


def test_runs_table_lists_every_run_and_shows_errors_in_place(store, pages):
    rows = {r["run"]: r for r in analysed_rows(store, pages)}
    assert set(rows) == {"sample-ddp-2r", "sample-fsdp-2r", "sample-1f1b-2r", "sample-zbv-2r", "sample-ring-2r",
                         "foreign-trace", BROKEN}
    assert rows[BROKEN]["status"] != "ok" and "gzip" in rows[BROKEN]["status"]
    assert rows["foreign-trace"]["status"] == "ok" and rows["foreign-trace"]["paradigm"] == "(foreign traces)"
    ddp = rows["sample-ddp-2r"]
    assert (ddp["paradigm"], ddp["ranks"], ddp["mesh"], ddp["steps"], ddp["status"]) == ("ddp", 2, "dp=2", 2, "ok")
    assert ddp["step_ms"] > 0 and 0 <= ddp["exposed_comm_pct"] <= 100 and ddp["peak_mib"] > 0
    assert rows["sample-1f1b-2r"]["mesh"] == "pp=2"
    json.dumps(list(rows.values()))


def test_a_broken_run_does_not_stop_the_others(store, pages):
    figs = pages.compare.timeline_figure(store, [BROKEN, "sample-ddp-2r"])
    assert figs.data and {t.xaxis for t in figs.data} == {"x"}  # the good run drawn
    status = str(pages.compare.status_children(store, [BROKEN, "sample-ddp-2r"]))
    assert "gzip" in status and "ddp, 2 ranks" in status


def test_runs_are_cached_until_their_files_change(tmp_path, traces_root):
    import shutil

    shutil.copytree(traces_root / "sample-ddp-2r", tmp_path / "run")
    store = RunStore(tmp_path)
    first = store.get("run")
    assert store.get("run") is first
    trace = tmp_path / "run" / "rank1.json.gz"
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))
    assert store.get("run") is not first and store.get("run").ok


def test_only_run_folders_are_loaded_and_cached(tmp_path):
    """The root, a group folder and made-up ids are refused before anything is loaded or cached."""
    (tmp_path / "team" / "run").mkdir(parents=True)
    (tmp_path / "team" / "run" / "rank0.json").write_text("{}")
    store = RunStore(tmp_path)
    for bad in [".", "", "team", "team/no-such-run", "no-such-run", str(tmp_path)]:
        with pytest.raises(PathRefused):
            store.get(bad)
    assert not store._cache and not store._locks
    assert store.get("team/run").run_id == "team/run" and list(store._cache) == ["team/run"]
    (made_up,) = store.get_many(["no-such-run"])
    assert not made_up.ok and "not a run folder" in made_up.error


def test_a_name_too_long_is_refused_not_a_traceback(tmp_path, pages):
    (tmp_path / "team").mkdir()
    store = RunStore(tmp_path)
    for name in ["a" * 300, "team/" + "b" * 300]:
        with pytest.raises(PathRefused, match="too long"):
            store.run_id_of(name)
        assert "Refused" in str(pages.open.open_folder(store, name))
        (run,) = store.get_many([name])
        assert not run.ok and "too long" in run.error


# ---------------------------------------------------------------------------------------------
# Uploads


def test_upload_makes_a_run(tmp_path, traces_root, pages):
    store = RunStore(tmp_path)
    blob = (traces_root / "sample-ddp-2r" / "rank0.json.gz").read_bytes()
    out = str(pages.open.open_upload(store, [data_url(blob)], ["rank0.json.gz"]))
    assert "1 of 2 ranks loaded"  # rank 0 of a 2-rank job (its trace says so) in out
    (run_id,) = store.run_ids()
    assert run_id.startswith(upload.UPLOAD_PREFIX) and store.get(run_id).ok


@pytest.mark.parametrize("name", ["../rank0.json.gz", "/tmp/rank0.json", "rank0.txt", ".hidden.json", "a/b.json", "..json.gz"])
def test_upload_names_are_checked(tmp_path, pages, name):
    store = RunStore(tmp_path)
    out = str(pages.open.open_upload(store, [data_url(b"{}")], [name]))
    assert "Upload refused" in out and not list(tmp_path.iterdir())


def test_upload_limits(tmp_path, pages, monkeypatch):
    store = RunStore(tmp_path)
    monkeypatch.setattr(upload, "MAX_UPLOAD_BYTES", 1000)
    assert "over the" in str(pages.open.open_upload(store, [data_url(b"x" * 1001)], ["rank0.json"]))
    monkeypatch.setattr(upload, "MAX_UPLOAD_BYTES", 10**6)
    monkeypatch.setattr(upload, "MAX_UNPACKED_BYTES", 10**6)
    bomb = gzip.compress(b"\0" * (5 * 10**6))  # 5 MB of zeros in a few KB
    assert len(bomb) < 10**5
    assert "unpacks to more than" in str(pages.open.open_upload(store, [data_url(bomb)], ["rank0.json.gz"]))
    assert "malformed" in str(pages.open.open_upload(store, ["data:x;base64,!!!"], ["rank0.json"]))
    assert "malformed" in str(pages.open.open_upload(store, ["not a data url"], ["rank0.json"]))
    assert not list(tmp_path.iterdir())


def test_upload_limit_counts_every_gzip_member(tmp_path, pages, monkeypatch):
    """gzip.open reads concatenated members: their sizes add up against the limit."""
    store = RunStore(tmp_path)
    monkeypatch.setattr(upload, "MAX_UPLOAD_BYTES", 10**6)
    monkeypatch.setattr(upload, "MAX_UNPACKED_BYTES", 10**6)
    member = gzip.compress(b"\0" * (6 * 10**5))  # each alone is under the limit, both are over it
    assert "unpacks to more than" in str(pages.open.open_upload(store, [data_url(member * 2)], ["rank0.json.gz"]))
    assert not list(tmp_path.iterdir())
    upload.check_unpacked_size("ok.json.gz", gzip.compress(b"{}") * 3 + b"\0" * 8)  # small members, zero padding: fine


def test_a_failed_upload_write_leaves_nothing_behind(tmp_path, pages, monkeypatch):
    store = RunStore(tmp_path)
    written = []

    def write_bytes(self, blob):
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(self)
        return Path.open(self, "wb").write(blob)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    out = str(pages.open.open_upload(store, [data_url(b"{}"), data_url(b"{}")], ["rank0.json", "rank1.json"]))
    assert written and "Upload refused" in out and os.strerror(errno.ENOSPC) in out
    assert not list(tmp_path.iterdir())  # the first file was written, then removed with its folder


def test_an_uploaded_non_trace_shows_its_error_and_is_not_kept(tmp_path, pages):
    store = RunStore(tmp_path)
    out = str(pages.open.open_upload(store, [data_url(b'{"hello": 1}')], ["rank0.json"]))
    assert "Upload refused" in out and "not a Kineto/Chrome trace" in out
    assert not list(tmp_path.iterdir()) and not store._cache  # no upload-* folder left behind


# ---------------------------------------------------------------------------------------------
# Callbacks as functions


def test_compare_link(pages):
    assert pages.runs.compare_link(["a"])[1] == "button disabled"
    assert pages.runs.compare_link(["a", "b/c"]) == ("/compare?runs=a,b/c", "button", "2 runs: a, b/c")
    assert "at most 4" in pages.runs.compare_link(list("abcde"))[2]


def test_parse_runs_and_visible_range(pages):
    c = pages.compare
    assert c.parse_runs(" a, b,a,,c,d,e") == ["a", "b", "c", "d"]
    # a comma inside a run's name (ptprof run --name bs=32,lr=1e-3) survives the link: the browser
    # decodes the query once, as Flask's parse does here (the page read "run", "x": trial)
    from urllib.parse import parse_qs, urlsplit

    from viewer.pages import compare_href

    for names in (["bs=32,lr=1e-3", "scale64"], ["a b", "50%", "c%2Cd", "e/f"]):
        href = compare_href(names)
        assert c.parse_runs(parse_qs(urlsplit(href).query)["runs"][0]) == names, href
    assert c.visible_range({"xaxis.range[0]": 1, "xaxis.range[1]": 2.5}) == (1.0, 2.5)
    assert c.visible_range({"xaxis2.range": [3, 4]}) == (3.0, 4.0)
    assert c.visible_range({"xaxis.autorange": True}) is None
    assert c.visible_range({"autosize": True}) is None


def test_compare_callbacks_on_the_samples(store, pages):
    runs = ["sample-ddp-2r", "sample-fsdp-2r", "sample-1f1b-2r", "sample-zbv-2r"]
    full = pages.compare.timeline_figure(store, runs)
    assert {t.xaxis for t in full.data} == {"x", "x2", "x3", "x4"}
    lanes = {y for t in full.data if t.xaxis == "x" for y in t.y}
    assert lanes == {"r0 main", "r0 comm", "r1 main", "r1 comm"}
    zoomed = pages.compare.timeline_figure(store, runs, {"xaxis.range[0]": 1.0, "xaxis.range[1]": 1.5})
    assert list(zoomed.layout.xaxis.range) == [1.0, 1.5]
    assert all(1.0 - 1e-9 <= b <= 1.5 for t in zoomed.data for b in t.base)
    assert any("aten::" in h for t in zoomed.data for h in t.hovertext)  # zoomed in: operator names


def test_pipeline_frames_carry_the_ideal_order(store):
    actions, ideal, summary = compare_data.pipeline_frames(store.get_many(["sample-zbv-2r", "sample-ddp-2r"]))
    # zbv, 2 ranks x 2 stages x 4 microbatches: F, I, W per stage and microbatch = 24 slots per rank.
    assert ideal.group_by("rank").len().sort("rank")["len"].to_list() == [24, 24]
    assert set(summary["run"]) == {"sample-zbv-2r"}
    # ZB-V has no closed-form bubble (profiler/pipeline.py): no textbook number, but the ideal order
    # replayed with the measured durations gives one, and the measured bubble is never below it.
    row = summary.row(0, named=True)
    assert row["theory_pct"] is None
    assert 0 < row["ideal_pct"] <= row["bubble_pct"] < 100


def test_memory_peaks_are_the_profilers(store):
    run = store.get("sample-ddp-2r")
    _, peaks = compare_data.memory_frames([run])
    want = run.analysis.memory_peaks.sort("rank", "mem_device")["peak_allocated_bytes"].to_list()
    assert peaks.sort("rank", "mem_device")["peak_allocated_bytes"].to_list() == want and peaks["peak_t_ms"].null_count() == 0


def _pipeline_run(manifest: dict | None, *, actions: pl.DataFrame | None = None, steps: pl.DataFrame | None = None,
                  events: pl.DataFrame | None = None) -> data.RunData:
    """A loaded run holding just what pipeline_frames reads (no pipeline summary measured)."""
    steps = steps if steps is not None else pl.DataFrame(schema={"run": pl.String, "rank": pl.Int32, "step": pl.Int64,
                                                                 "start_us": pl.Float64, "end_us": pl.Float64})
    run = data.RunData(run_id="pp-run", folder=Path("."), manifest=manifest,
                       traces=types.SimpleNamespace(events=events if events is not None else pl.DataFrame(schema=SCHEMA)),
                       analysis=types.SimpleNamespace(pipeline=None, steps=steps, pipeline_actions=pl.DataFrame(schema=ACTION_COLUMNS)))
    if actions is not None:
        run.pipeline_actions = lambda: actions
    return run


def test_pipeline_ideal_order_is_on_global_ranks(tmp_path):
    """A hybrid run's ideal_order rows are pp coordinates, repeated on every pp group's global ranks."""
    manifest = {"pipeline": {"ideal_order": [[["F", 0, 0], ["B", 0, 0]], [["F", 1, 0], ["B", 1, 0]]]},
                "hybrid": {"groups": {"pp": [[0, 2], [1, 3]]}}}
    _, ideal, _ = compare_data.pipeline_frames([_pipeline_run(manifest)])
    stages = dict(ideal.group_by("rank").agg(pl.col("stage").unique().first()).iter_rows())
    assert stages == {0: 0, 1: 0, 2: 1, 3: 1}
    assert ideal.filter(pl.col("rank") == 3).sort("slot")["action"].to_list() == ["F", "B"]


@pytest.mark.parametrize("cfg, theory", [
    ({"schedule": "1f1b", "ranks": 2, "microbatches": 4, "stages_per_rank": 1}, 100 / 5),
    ({"schedule": "1f1b", "ranks": 2, "microbatches": 4}, 100 / 5),
    ({"schedule": "interleaved-1f1b", "ranks": 2, "microbatches": 4, "stages_per_rank": 2}, 100 / 9),
    ({"schedule": "zbv", "ranks": 2, "microbatches": 4, "stages_per_rank": 2}, None),  # no closed form
    ({"schedule": "1f1b", "ranks": 2, "microbatches": 4, "stages_per_rank": "two"}, None),
    ({"schedule": "1f1b", "ranks": "2", "microbatches": 4}, "no row"),
    ({"schedule": "1f1b", "ranks": 2, "microbatches": 0}, "no row"),
    ({"schedule": "1f1b", "ranks": True, "microbatches": 4}, "no row"),
])
def test_pipeline_theory_from_run_json_when_nothing_was_measured(cfg, theory):
    _, _, summary = compare_data.pipeline_frames([_pipeline_run({"pipeline": cfg})])
    if theory == "no row":
        assert summary.is_empty()
        return
    (row,) = summary.to_dicts()
    assert row["bubble_pct"] is None and row["theory_pct"] == (pytest.approx(theory) if theory is not None else None)


def test_pipeline_actions_are_picked_by_their_step():
    """Rank 1's steps run later than rank 0's: its step-1 action inside rank 0's last step window stays out."""
    steps = pl.DataFrame({"run": ["r"] * 4, "rank": [0, 0, 1, 1], "step": [1, 2, 1, 2], "start_us": [0.0, 100.0, 0.0, 150.0],
                          "end_us": [100.0, 200.0, 150.0, 250.0]}, schema_overrides={"rank": pl.Int32})
    actions = pl.DataFrame({"run": ["r"] * 3, "rank": [0, 1, 1], "step": [2, 1, 2], "action": ["F", "B", "F"], "stage": [0, 1, 1],
                            "microbatch": [0, 3, 0], "slot": [0, 7, 0], "start_us": [100.0, 120.0, 160.0],
                            "end_us": [110.0, 140.0, 170.0], "dur_us": [10.0] * 3}).cast(ACTION_COLUMNS)
    acts, _, _ = compare_data.pipeline_frames([_pipeline_run(None, actions=actions, steps=steps)])
    assert acts.sort("rank").select("rank", "action", "start_ms").rows() == [(0, "F", 0.0), (1, "F", 0.06)]


def test_pipeline_actions_follow_run_json_span_format(tmp_path):
    # A run folder named pp-run whose run.json has another run_id and its own span format.
    spans = [("ProfilerStep#1", 0.0, 100.0), ("pp F s0 mb0", 10.0, 10.0), ("pp B s0 mb0", 30.0, 20.0), ("ptprof/pp/F s0 mb1", 60.0, 5.0)]
    folder = tmp_path / "pp-run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"run_id": "from-run-json", "pipeline": {"span_format": "pp {kind} s{stage} mb{microbatch}"}}))
    (folder / "rank0.json").write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": t, "dur": d} for n, t, d in spans]}))
    run = RunStore(tmp_path).get("pp-run")
    assert run.pipeline_actions().select("run", "action", "microbatch", "step").rows() == [("pp-run", "F", 0, 1), ("pp-run", "B", 0, 1)]


def test_cli_args():
    args = parse_args(["view"])
    assert (args.traces, args.host, args.port) == ("traces", "127.0.0.1", 8050)
    assert parse_args(["--port", "9000", "--traces", "x"]).port == 9000
    assert main(["view", "--traces", "/no/such/folder"]) == 2


def test_a_port_in_use_is_one_line_before_anything_serves(tmp_path, capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["view", "--traces", str(tmp_path), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err
    assert main(["view", "--traces", str(tmp_path), "--port", "70000"]) == 2
    assert "is not a port" in capsys.readouterr().err


def test_ptprof_view_hands_over_to_the_viewer():
    from tests.conftest import ptprof

    res = ptprof("view", "--help", timeout=60)
    assert res.returncode == 0 and "--traces DIR" in res.stdout and "127.0.0.1" in res.stdout

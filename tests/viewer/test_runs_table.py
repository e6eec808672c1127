"""The Runs table shows what identifies a run and its problem: long run names and statuses wrap
instead of ending in an ellipsis, paths in a status are relative to the run's folder (the file
name first, not the server's traces root), and a very long status is cut in its cell with the
whole text in its tooltip, so no row grows huge."""

from __future__ import annotations

import shutil
from pathlib import Path

from dash import dash_table

from viewer import data

BAD_FILE = "rank1-worker-host-a100-node-07.1717171717171.pt.trace.json"


def _table(component) -> dash_table.DataTable | None:
    if isinstance(component, dash_table.DataTable):
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if child is not None and not isinstance(child, str) and (found := _table(child)) is not None:
            return found
    return None


def test_run_and_status_columns_wrap_instead_of_hiding_their_end(pages):
    table = _table(pages.runs.layout())
    wrapped = {s["if"]["column_id"]: s for s in getattr(table, "style_cell_conditional", None) or [] if "column_id" in s.get("if", {})}
    for column in ("run", "status"):
        style = {**table.style_cell, **wrapped.get(column, {})}
        assert style.get("whiteSpace") == "normal" and style.get("height") == "auto", (column, style)
        assert style.get("overflowWrap") == "anywhere", (column, style)  # a path with no spaces breaks too


def test_a_broken_trace_reads_file_name_first(tmp_path, traces_root, pages):
    broken = tmp_path / "broken-run"
    broken.mkdir()
    shutil.copy(traces_root / "sample-ddp-2r" / "run.json", broken / "run.json")
    (broken / BAD_FILE).write_text('{"traceEvents": [')  # truncated JSON
    store = data.RunStore(tmp_path)
    _, pending = pages.runs.runs_table_rows(store)
    store.load_in_background(pending)
    assert store.wait_idle(timeout=300)
    rows = {r["run"]: r for r in pages.runs.runs_table_rows(store)[0]}
    status = rows["broken-run"]["status"]
    assert status.startswith(BAD_FILE) and "JSON" in status, status
    assert str(tmp_path) not in status
    # The same error where Compare and Open show it: the run's own, not only its row's.
    (run,) = store.get_many(["broken-run"])
    assert run.error.startswith(BAD_FILE) and str(tmp_path) not in run.error
    shown, tips = pages.runs.table_cells(list(rows.values()))
    assert (shown, tips) == ([rows["broken-run"]], [{}])  # short enough: all of it in the cell, no tooltip


def test_a_long_status_is_cut_in_its_cell_and_whole_in_its_tooltip(pages):
    runs = pages.runs
    problems = "; ".join(f"rank{i}-worker.pt.trace.json: rank {i}: not valid JSON (truncated?)" for i in range(1000))
    status = f"1000 file(s) skipped: {problems}"
    rows = [{"run": "many", "status": status, "id": "many"}, {"run": "fine", "status": "ok", "id": "fine"},
            {"run": "new", "status": None, "id": "new"}]
    shown, tips = runs.table_cells(rows)
    assert len(shown[0]["status"]) <= runs.STATUS_CELL_CHARS and shown[0]["status"].endswith("…")
    assert shown[0]["status"].startswith("1000 file(s) skipped: rank0-worker.pt.trace.json: rank 0: not valid JSON")
    tip = tips[0]["status"]["value"]
    assert tip.startswith(status[:runs.STATUS_CELL_CHARS]) and len(tip) <= runs.STATUS_TIP_CHARS
    assert shown[1:] == rows[1:] and tips[1:] == [{}, {}]
    assert rows[0]["status"] == status  # the rows themselves are left whole


def test_only_paths_that_start_with_the_run_folder_are_shortened(pages):
    rel = data.relative_paths
    folder = Path("/x/run")
    assert rel("/x/run/a.json: bad; 2 skipped: '/x/run/b.json' (/x/run/c.json)", folder) == "a.json: bad; 2 skipped: 'b.json' (c.json)"
    assert rel("/backup/x/run/a.json: bad", folder) == "/backup/x/run/a.json: bad"  # another path that holds it
    assert rel("/x/run2/a.json: bad", folder) == "/x/run2/a.json: bad"  # a sibling folder
    assert rel("no traces in /x/run", folder) == "no traces in /x/run" and rel(None, folder) is None


def test_the_status_stands_beside_the_run_name(pages):
    # Last, it was off-screen at 1,500 px: a run that skipped a file looked like any other.
    table = _table(pages.runs.layout())
    assert [c["id"] for c in table.columns][:2] == ["run", "status"]


def test_compare_and_open_name_the_files_a_run_skipped(tmp_path, traces_root, pages):
    # The Runs table said "1 file(s) skipped"; Compare and Open showed the other ranks' numbers
    # with nothing to say one was missing.
    run = tmp_path / "half-run"
    shutil.copytree(traces_root / "sample-ddp-2r", run)
    (run / "rank1.json.gz").unlink()
    (run / BAD_FILE).write_text('{"traceEvents": [')  # truncated JSON
    store = data.RunStore(tmp_path)
    (loaded,) = store.get_many(["half-run"])
    assert loaded.ok and loaded.analysis.ranks.height == 1
    lines = [c for c in pages.compare.status_children(store, ["half-run"]) if "skipped" in str(c)]
    assert len(lines) == 1, pages.compare.status_children(store, ["half-run"])
    text = lines[0].children
    assert text.startswith(f"half-run: 1 file(s) skipped, their ranks left out of every number and figure: {BAD_FILE}"), text
    assert "JSON" in text and str(tmp_path) not in text and lines[0].className == "error"
    # The Runs table's status names it the same way.
    (row,) = [r for r in pages.runs.runs_table_rows(store)[0] if r["run"] == "half-run"]
    assert row["status"].startswith(f"1 file(s) skipped: {BAD_FILE}"), row["status"]
    # Its line says how many of its ranks loaded (it said "2 ranks" above "1 rank(s) loaded").
    assert "half-run: ddp, 1 of 2 ranks (dp=2)" in str(pages.compare.status_children(store, ["half-run"]))
    opened = str(pages.open.open_folder(store, "half-run"))
    assert "half-run: 1 of 2 ranks loaded." in opened and f"1 file(s) skipped, their ranks left out of every number and figure: {BAD_FILE}" in opened
    # A run that skipped nothing has no such line.
    shutil.copytree(traces_root / "sample-ddp-2r", tmp_path / "whole-run")
    assert "skipped" not in str(pages.compare.status_children(store, ["whole-run"]))
    assert "skipped" not in str(pages.open.open_folder(store, "whole-run"))
    assert "whole-run: 2 ranks loaded." in str(pages.open.open_folder(store, "whole-run"))
    assert "whole-run: ddp, 2 ranks (dp=2)" in str(pages.compare.status_children(store, ["whole-run"]))


def test_a_long_skipped_files_line_is_cut_with_the_whole_text_in_its_tooltip(pages):
    from types import SimpleNamespace

    from viewer.pages import STATUS_CELL_CHARS, STATUS_TIP_CHARS, skipped_files_line

    problems = [f"rank{i}-worker.pt.trace.json: rank {i}: not valid JSON (truncated?)" for i in range(1000)]
    run = SimpleNamespace(run_id="many", skipped=problems)
    line = skipped_files_line(run)
    assert len(line.children) <= STATUS_CELL_CHARS and line.children.endswith("…")
    assert line.children.startswith("many: 1000 file(s) skipped, their ranks left out of every number and figure: rank0-worker")
    assert len(line.title) <= STATUS_TIP_CHARS and line.title.startswith(line.children[:-1])
    assert skipped_files_line(SimpleNamespace(run_id="x", skipped=[])) is None
    # A run id of a long folder path is cut, so the files still show within the line's cut.
    long = skipped_files_line(SimpleNamespace(run_id="deep/" * 100 + "run", skipped=problems))
    assert "rank0-worker.pt.trace.json" in long.children and len(long.children) <= STATUS_CELL_CHARS


def test_a_folder_of_some_of_a_jobs_ranks_says_how_many_of_them():
    from tests.conftest import SHARED_TRACES

    store = data.RunStore(SHARED_TRACES)  # gpu_nccl_2_of_128: ranks 0 and 1 of a 128-rank job, no run.json
    (run,) = store.get_many(["gpu_nccl_2_of_128"])
    assert run.ok and not run.skipped and data.ranks_loaded(run) == "2 of 128 ranks"

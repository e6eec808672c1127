"""The viewer's pages; each registers itself with `dash.register_page` when imported (by create_app)."""

from __future__ import annotations

import dash
from dash import html

from profiler.textfmt import truncate
from viewer.data import RunData, RunStore

STORE_KEY = "PTPROF_RUN_STORE"
MAX_COMPARE = 4  # runs side by side: the Runs page's limit on ticks, the Compare page's on ids
MAX_RUN_ID_CHARS = 1000  # a run id is a folder path under the root; longer is no id of ours
FONT = "system-ui, -apple-system, Segoe UI, sans-serif"  # of the pages' tables
# A run's status or its skipped files: cut past STATUS_CELL_CHARS where shown (a run skipping
# 1,000 files), the whole text (up to STATUS_TIP_CHARS) in the tooltip.
STATUS_CELL_CHARS = 200
STATUS_TIP_CHARS = 800


def skipped_files_line(run: RunData):
    """A line saying which files a loaded run skipped (their ranks are in none of its numbers),
    or None where it skipped none (or did not load: its error says why)."""
    if not run.skipped:
        return None
    # The run's id cut at its start (a long folder path ends in its name), so the files show within the cut.
    text = (f"{truncate(run.run_id, 60, tail=True)}: {len(run.skipped)} file(s) skipped, their ranks left out of every number and "
            "figure: " + "; ".join(run.skipped))
    return html.Div(truncate(text, STATUS_CELL_CHARS), title=truncate(text, STATUS_TIP_CHARS), className="error")


def current_store() -> RunStore:
    """The RunStore of the app serving this callback (create_app puts it in the Flask config)."""
    return dash.get_app().server.config[STORE_KEY]


def compare_href(run_ids: list[str]) -> str:
    """The Compare page of these runs. Each id is quoted on its own, then the list: the browser
    hands the page the query decoded once, so a comma inside a run's name (`ptprof run --name
    bs=32,lr=1e-3`) arrives as %2C and only the separators as commas (compare.parse_runs)."""
    from urllib.parse import quote

    return "/compare?runs=" + quote(",".join(quote(r, safe="/-_.") for r in run_ids), safe=",/-_.")


def run_id_list(value, limit: int | None = MAX_COMPARE) -> list[str]:
    """Run ids as a callback received them (from the browser: anything), checked: a list of
    non-empty strings, duplicates dropped, at most `limit`. ValueError saying what is wrong."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"refused: run ids must be a list, not {type(value).__name__}")
    bad = [v for v in value if not isinstance(v, str) or not v.strip() or len(v) > MAX_RUN_ID_CHARS]
    if bad:
        raise ValueError(f"refused: {len(bad)} run id(s) are not folder names, e.g. {str(bad[0])[:60]!r}")
    ids = list(dict.fromkeys(value))
    if limit is not None and len(ids) > limit:
        raise ValueError(f"refused: at most {limit} runs side by side ({len(ids)} sent)")
    return ids

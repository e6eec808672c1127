"""The viewer's pages; each registers itself with `dash.register_page` when imported (by create_app)."""

from __future__ import annotations

import dash

from viewer.data import RunStore

STORE_KEY = "PTPROF_RUN_STORE"
MAX_COMPARE = 4  # runs side by side: the Runs page's limit on ticks, the Compare page's on ids
FONT = "system-ui, -apple-system, Segoe UI, sans-serif"  # of the pages' tables


def current_store() -> RunStore:
    """The RunStore of the app serving this callback (create_app puts it in the Flask config)."""
    return dash.get_app().server.config[STORE_KEY]


def compare_href(run_ids: list[str]) -> str:
    from urllib.parse import quote

    return "/compare?runs=" + quote(",".join(run_ids), safe=",/-_.")

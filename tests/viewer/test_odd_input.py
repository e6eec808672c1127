"""The viewer on odd runs and odd requests: every callback answers (a figure, a table or a message
saying what was refused), never an HTTP 500, and one bad run never takes the others down."""

from __future__ import annotations

import pytest

from tests.viewer.conftest import dash_post
from viewer import data, figures, ids


# ---------------------------------------------------------------------------------------------
# Collectives table without cross-rank start data


@pytest.mark.parametrize("runs", [["sample-1f1b-2r", "sample-zbv-2r"], ["sample-1f1b-2r"], ["sample-ddp-2r", "sample-zbv-2r"]])
def test_collectives_table_renders_without_skew_data(store, app, runs):
    stats, skew = data.collectives_frames(store.get_many(runs))
    rows = figures.build_collectives_table(stats, skew)
    assert {r["run"] for r in rows} == set(runs) and all(r["count"] > 0 for r in rows)
    pipeline_rows = [r for r in rows if r["run"] != "sample-ddp-2r"]
    assert pipeline_rows and all(r["skew_max_ms"] is None for r in pipeline_rows)  # no start data: no skew, not zero
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

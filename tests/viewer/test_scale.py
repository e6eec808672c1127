"""Compare at scale (viewer/scale.py, scale_figures.py): a 64-rank run built from copies of a
shipped sample rank drawn as groups: payload that does not grow with ranks, bands against values
worked out from the per-rank frames, the slow rank named, the drill-down showing only its rank."""

from __future__ import annotations

import os

import numpy as np
import plotly.io as pio
import polars as pl
import pytest

from tests.viewer.scale_runs import make_run
from viewer import scale, scale_data
from viewer.data import RunStore

SLOW_RANK = 40  # stage2 (ranks 32-47 of 64 with pp=4); not among the small run's 20


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    make_run(root / "big", 64, pp=4, slow={SLOW_RANK: 1.5})
    small = root / "small"
    small.mkdir()
    for r in range(20):  # the same bytes: parsed once, analysed again under small's run.json
        os.link(root / "big" / f"rank{r}.json.gz", small / f"rank{r}.json.gz")
    (small / "run.json").write_text((root / "big" / "run.json").read_text().replace('"world_size": 64', '"world_size": 20')
                                    .replace('"dp": 16', '"dp": 5'))
    flat = root / "flat"  # 20 ranks, no pipeline: one group "all ranks", drawn as bands even when drilled into
    flat.mkdir()
    for r in range(20):
        os.link(root / "big" / f"rank{r}.json.gz", flat / f"rank{r}.json.gz")
    (flat / "run.json").write_text((root / "big" / "run.json").read_text().replace('"world_size": 64', '"world_size": 20')
                                   .replace('"pp": 4, "dp": 16', '"dp": 20'))
    return RunStore(root)


def _payload(store, pages, run_ids) -> dict[str, int]:
    c = pages.compare
    out = {"timeline": c.timeline_figure(store, run_ids), "breakdown": c.breakdown_figure(store, run_ids),
           "steps": c.steps_figure(store, run_ids), "pipeline": c.pipeline_figure(store, run_ids),
           "memory": c.memory_figures(store, run_ids), "collectives": c.collectives_rows(store, run_ids)}
    sizes = {}
    for k, v in out.items():
        for i, fig in enumerate(v if isinstance(v, tuple) else (v,)):
            sizes[f"{k}{i}"] = len(pio.to_json(fig)) if hasattr(fig, "to_plotly_json") else len(str(fig))
    return sizes


def test_compare_at_64_ranks(big, pages):
    # One test over the one built run (under xdist each worker running a test of it would build it again).
    _payload_does_not_grow_with_ranks_and_no_events_are_held(big, pages)
    _band_matches_the_per_rank_frames(big)
    _the_slow_rank_is_named(big, pages)
    _drill_down_shows_exactly_that_rank(big, pages)
    _bands_say_a_zoom_past_the_ranks_bins_and_runs_without_the_group(big, pages)


def _payload_does_not_grow_with_ranks_and_no_events_are_held(big, pages):
    d = big.get("big")
    assert d.ok, d.error
    assert d.at_scale and d.n_ranks == 64 and big.get("small").n_ranks == 20
    many, few = _payload(big, pages, ["big"]), _payload(big, pages, ["small"])
    # 64 vs 20 ranks: the same figures, within a small factor (one value per rank in the step-time box)
    assert sum(many.values()) < 1.25 * sum(few.values()), (many, few)
    assert sum(many.values()) < 1_000_000
    # every card came from summaries: no rank's events were read, let alone the whole run's
    assert "events" not in d._derived and "events" not in d.traces._memo


def test_groups_are_pipeline_stages():
    g = scale.rank_groups(list(range(8)), {"world_size": 8, "mesh": {"pp": 2, "dp": 4}})
    assert g.filter(pl.col("group") == "stage1")["rank"].to_list() == [4, 5, 6, 7]
    hybrid = {"world_size": 4, "mesh": {"pp": 2, "dp": 2}, "hybrid": {"groups": {"pp": [[0, 2], [1, 3]]}}}
    assert scale.rank_groups([0, 1, 2, 3], hybrid).filter(pl.col("group") == "stage1")["rank"].to_list() == [2, 3]
    assert set(scale.rank_groups([0, 1, 2], {"mesh": {"dp": 3}})["group"]) == {"all ranks"}


def test_band_counts_ranks_without_activity_as_idle():
    # 4 ranks of one group, 1 ms bins from t=0; rank 0 half busy in bin 0, rank 1 fully; ranks 2 and 3 idle.
    act = pl.DataFrame({"run": ["r", "r", "r"], "rank": [0, 1, 1], "lane": ["main"] * 3, "lane_key": [0] * 3,
                        "category": ["compute"] * 3, "t0_us": [0.0] * 3, "bin_us": [1000.0] * 3, "bin": [0, 0, 1],
                        "busy": [0.5, 1.0, 0.25]})
    groups = scale.rank_groups([0, 1, 2, 3], None)
    one = scale.activity_bands(act, groups, 0.0, (0.0, 1.0), n=1)
    assert one.select("median", "lo", "hi").row(0) == (0.25, 0.0, 1.0)  # of 0.5, 1, 0, 0
    # two common bins of 1 ms: bin 1 only rank 1 (0.25); one common bin of 2 ms: rank 0 0.25, rank 1 0.625
    two = scale.activity_bands(act, groups, 0.0, (0.0, 2.0), n=2).filter(pl.col("bin") == 1)
    assert two.select("median", "lo", "hi").row(0) == (0.0, 0.0, 0.25)
    wide = scale.activity_bands(act, groups, 0.0, (0.0, 2.0), n=1)
    assert wide.select("median", "lo", "hi").row(0) == pytest.approx((0.125, 0.0, 0.625))
    # a common bin straddling two of the rank's bins: [0.5, 1.5) ms of rank 1 = 0.5 x 1.0 + 0.5 x 0.25
    mid = scale.activity_bands(act.filter(pl.col("rank") == 1), scale.rank_groups([1], None), 0.0, (0.5, 1.5), n=1)
    assert mid["hi"][0] == pytest.approx(0.625)


def _band_matches_the_per_rank_frames(big):
    d = big.get("big")
    x_range = d.activity_extent()
    bands = d.activity_bands(x_range)
    n = scale.BAND_BINS
    w = (x_range[1] - x_range[0]) / n
    origin = d.origin_us()
    act = d.analysis.activity
    stage1 = list(range(16, 32))  # float64 µs since the epoch lose ~1e-3 µs: shares agree to 1e-4
    for lane, cat in [("main", "compute"), ("comm", "comm")]:
        row = bands.filter((pl.col("group") == "stage1") & (pl.col("lane") == lane) & (pl.col("category") == cat))
        for b in (row["bin"][len(row) // 3], row["bin"][len(row) // 2]):
            lo_ms, hi_ms = x_range[0] + b * w, x_range[0] + (b + 1) * w
            shares = []
            for r in stage1:  # each rank's bins overlapping the common bin, by hand
                rows = act.filter((pl.col("rank") == r) & (pl.col("lane") == lane) & (pl.col("category") == cat))
                s = 0.0
                for t0, bw, k, busy in rows.select("t0_us", "bin_us", "bin", "busy").iter_rows():
                    a, e = (t0 + k * bw - origin) / 1e3, (t0 + (k + 1) * bw - origin) / 1e3
                    s += busy * max(0.0, min(e, hi_ms) - max(a, lo_ms))
                shares.append(min(1.0, s / w))
            got = row.filter(pl.col("bin") == b).row(0, named=True)
            assert got["median"] == pytest.approx(np.median(shares), abs=1e-4)
            assert got["lo"] == pytest.approx(min(shares), abs=1e-4) and got["hi"] == pytest.approx(max(shares), abs=1e-4)
    # the breakdown card's band: median, min, max of each rank's idle share in the group
    bd = scale_data.breakdown_bands([d]).filter(pl.col("group") == "stage1").row(0, named=True)
    idle = (d.analysis.breakdown.filter(pl.col("rank").is_in(stage1)).select(100 * pl.col("idle_us") / pl.col("window_us")))
    vals = idle.to_series().to_numpy()
    assert (bd["idle_pct_median"], bd["idle_pct_lo"], bd["idle_pct_hi"]) == pytest.approx((np.median(vals), vals.min(), vals.max()))


def _the_slow_rank_is_named(big, pages):
    d = big.get("big")
    o = d.outliers()
    assert o.filter(pl.col("metric") == "step time")["rank"].to_list() == [SLOW_RANK]
    assert o.filter(pl.col("rank") == SLOW_RANK)["group"][0] == "stage2"
    fig = pages.compare.timeline_figure(big, ["big"])
    assert f"r{SLOW_RANK} (stage2): step time" in fig.layout.annotations[0].text
    assert "no outlier ranks" in pages.compare.timeline_figure(big, ["small"]).layout.annotations[0].text


def _drill_down_shows_exactly_that_rank(big, pages):
    d = big.get("big")
    fig = pages.compare.timeline_figure(big, ["big"], view=f"rank:{SLOW_RANK}")
    labels = {y for t in fig.data for y in t.y}
    assert labels and all(lab.startswith(f"r{SLOW_RANK} ") for lab in labels), labels
    assert {f"r{SLOW_RANK} main", f"r{SLOW_RANK} comm"} <= labels
    assert "events" not in d.traces._memo  # one rank's file read, not the run's events
    # drilled into a rank only one run has: the other run is said, not silently dropped, and each
    # subplot says what it shows
    both = pages.compare.timeline_figure(big, ["big", "small"], view=f"rank:{SLOW_RANK}")
    assert both.layout.title.text == f"run small has no rank {SLOW_RANK}: nothing drawn for it"
    assert [a.text for a in both.layout.annotations] == [f"big: rank {SLOW_RANK}"]
    assert pages.compare.timeline_figure(big, ["big", "small"], view="rank:3").layout.title.text is None
    group = pages.compare.timeline_figure(big, ["big"], view="group:stage2")  # 16 ranks: their own lanes
    assert {y.split()[0] for t in group.data for y in t.y} == {f"r{r}" for r in range(32, 48)}
    assert pages.compare.initial_view(rank="17") == "rank:17" and pages.compare.initial_view(group="stage1") == "group:stage1"
    # a rank or group in none of the runs says so (it read "no timeline events")
    for view, said in (("rank:999", "rank 999 is not in these runs"), ("group:stage9", "no group stage9 in these runs")):
        fig = pages.compare.timeline_figure(big, ["big", "small"], view=view)
        text = " ".join(a.text for a in fig.layout.annotations)
        assert said in text, text
    assert "groups: stage0, stage1, stage2, stage3" in " ".join(
        a.text for a in pages.compare.timeline_figure(big, ["big"], view="group:stage9").layout.annotations)
    # the dropdown counts a group's ranks per run, not the runs' sum: big has 16 per stage, small 5
    labels = [o["label"] for o in scale_data.view_options([big.get("big"), big.get("small")])]
    assert "group stage0 (big 16, small 5 ranks)" in labels, labels
    assert "group stage1 (16 ranks)" in [o["label"] for o in scale_data.view_options([big.get("big")])]


def _bands_say_a_zoom_past_the_ranks_bins_and_runs_without_the_group(big, pages):
    """Zoomed finer than the ranks' own bins the band is flat within each: it said nothing, and a
    user zoomed on looking for detail that is not there. A group drill-down drawn as bands left a
    run without the group out unsaid (the per-rank lanes said it)."""
    flat = big.get("flat")
    assert flat.ok and flat.groups()["group"].unique().to_list() == ["all ranks"]
    act = flat.analysis.activity
    bin_ms = act["bin_us"].min() / 1e3  # each rank's window / 1,000, made by the profiler's map
    x0 = float((act["t0_us"].min() - flat.origin_us()) / 1e3)

    def title(width_ms, runs=("flat",), view=None):
        relayout = {"xaxis.range[0]": x0, "xaxis.range[1]": x0 + width_ms}
        return pages.compare.timeline_figure(big, list(runs), relayout, view=view).layout.title.text

    assert title(500 * bin_ms) is None  # 400 common bins wider than the rank's: no note
    fine = title(100 * bin_ms)
    assert fine is not None and fine.startswith("zoomed finer than the ranks' own bins (") and "pick a rank" in fine, fine
    assert title(500 * bin_ms, ("flat", "big"), "group:all ranks") == "run big has no group all ranks: nothing drawn for it"
    both = title(100 * bin_ms, ("flat", "big"), "group:all ranks")
    assert both.startswith("run big has no group all ranks: nothing drawn for it; zoomed finer than run "), both

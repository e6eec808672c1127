"""The Compare page's frames when some run has more than viewer.scale.SCALE_RANKS ranks: every
run drawn as groups (docs/viewer.md, "Many ranks"), from the per-rank summaries only; the
drill-down reads the picked ranks' own events (RunData.rank_timeline). Split from viewer/data.py
at this seam: data.py loads and caches runs, this module reduces them for the cards at scale."""

from __future__ import annotations

import polars as pl

from viewer import aggregate, scale
from viewer.compare_data import _concat, _ok
from viewer.data import RunData


def any_at_scale(runs: list[RunData]) -> bool:
    return any(d.at_scale for d in _ok(runs))


# What a drill-down value may hold: a rank is a whole number (0 or more); a group name is what the
# viewer names groups ("stage3", "all ranks"): up to MAX_GROUP_NAME printable characters.
MAX_GROUP_NAME = 100
ACCEPTED = "a rank is a whole number from 0 (&rank=17), a group a name from the dropdown (&group=stage1)"


def parse_view(view: str | None) -> tuple[str, str | int] | None:
    """The drill-down asked for: ("rank", 17) from "rank:17", ("group", "stage1") from
    "group:stage1"; None for the groups view and for anything else (the browser may send anything:
    bad_view says what is wrong with it)."""
    if not isinstance(view, str) or ":" not in view:
        return None
    kind, _, value = view.partition(":")
    # "²".isdigit() too; past 10 digits no rank (Int32), and int() refuses over 4,300 digits
    if kind == "rank" and value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 10:
        return "rank", int(value.strip())  # int() strips less than str.strip() (not "\x1f")
    if kind == "group" and value.strip() and len(value.strip()) <= MAX_GROUP_NAME and value.strip().isprintable():
        return "group", value.strip()
    return None


def bad_view(view: str | None) -> str | None:
    """Why a drill-down value cannot be read ("rank:abc", "rank:-1", "group:" from the URL), one
    line naming the value and what is accepted; None for the groups view ("", None) and for a
    readable one (parse_view), whether or not the runs have that rank or group (missing_view)."""
    if view is None or view == "" or parse_view(view) is not None:
        return None
    if not isinstance(view, str) or view.partition(":")[0] not in ("rank", "group") or ":" not in view:
        return f"drill-down {_shown(view)} is not a rank or a group: {ACCEPTED}"
    kind, _, value = view.partition(":")
    if not value.strip():
        return f"&{kind}= is empty: {ACCEPTED}"
    if kind == "rank":
        return f"rank {_shown(value)} is not a rank: {ACCEPTED}"
    return f"group {_shown(value)} is not a group name (at most {MAX_GROUP_NAME} printable characters): {ACCEPTED}"


def _shown(value) -> str:
    """A value from the browser, quoted and cut to 40 characters, so the message stays one line."""
    text = repr(value) if not isinstance(value, str) else "'" + value.encode("unicode_escape").decode("ascii") + "'"
    return text if len(text) <= 40 else text[:39] + "…'"


def view_options(runs: list[RunData], keep: str | None = None) -> list[dict]:
    """The drill-down dropdown's options: every group, then every rank, of the runs that loaded;
    then `keep` (the value the URL asked for) when it is none of them, labelled with what is wrong:
    the dropdown would otherwise reset a value missing from its options to the groups view, and
    the timeline would hide why (`&rank=999`, `&rank=abc`)."""
    groups: dict[str, dict[str, int]] = {}  # group -> {run id: its ranks in that run}
    ranks = set()
    ok = _ok(runs)
    for d in ok:
        for g, n in d.groups().group_by("group", "group_key").agg(pl.len()).sort("group_key").select("group", "len").iter_rows():
            groups.setdefault(g, {})[d.run_id] = n
        ranks |= set(d.analysis.ranks["rank"].to_list())
    opts = [{"label": "all ranks, by group (median, min–max)", "value": ""}]
    opts += [{"label": f"group {g} ({_group_size(per_run, len(ok))})", "value": f"group:{g}"} for g, per_run in groups.items()]
    opts += [{"label": f"rank {r}", "value": f"rank:{r}"} for r in sorted(ranks)]
    if isinstance(keep, str) and keep and keep not in {o["value"] for o in opts}:
        why = "not valid" if bad_view(keep) else "not in these runs"
        opts.append({"label": f"{keep.replace(':', ' ', 1)[:46]} ({why})", "value": keep})
    return opts


def _group_size(per_run: dict[str, int], n_runs: int) -> str:
    """A group's size as each run has it: "16 ranks", "16 ranks in each run", or "a 16, b 12 ranks"."""
    sizes = set(per_run.values())
    if len(sizes) == 1 and (n_runs == 1 or len(per_run) == n_runs):
        return f"{sizes.pop()} ranks" + (" in each run" if n_runs > 1 else "")
    return ", ".join(f"{run} {n}" for run, n in per_run.items()) + " ranks"


def missing_view(runs: list[RunData], view: tuple[str, str | int] | None) -> str | None:
    """Why a drill-down shows nothing: the rank or group is in none of the runs (None when it is in some)."""
    ok = _ok(runs)
    if view is None or not ok or any(drill_ranks(d, view) for d in ok):
        return None
    kind, value = view
    if kind == "rank":
        return f"rank {value} is not in these runs (pick a rank in the dropdown above)"
    known = sorted({g for d in ok for g in d.groups()["group"].unique().to_list()})
    return f"no group {value} in these runs (groups: {', '.join(known)})"


def view_label(view: tuple[str, str | int]) -> str:
    """"rank 17", "group stage1": what a drill-down shows, for the timeline's titles."""
    return f"{view[0]} {view[1]}"


def absent_note(runs: list[RunData], view: tuple[str, str | int] | None) -> str | None:
    """The runs a drill-down draws nothing for, said (they would drop out of the timeline unseen):
    "run small has no rank 40: nothing drawn for it"; None where every run has the rank or group."""
    if view is None:
        return None
    absent = [d.run_id for d in _ok(runs) if not drill_ranks(d, view)]
    if not absent:
        return None
    if len(absent) == 1:
        return f"run {absent[0]} has no {view_label(view)}: nothing drawn for it"
    return f"runs {', '.join(absent)} have no {view_label(view)}: nothing drawn for them"


def drill_ranks(d: RunData, view: tuple[str, str | int]) -> list[int]:
    """The ranks of run `d` a drill-down shows."""
    kind, value = view
    if kind == "rank":
        return [value] if value in set(d.analysis.ranks["rank"].to_list()) else []
    return d.groups().filter(pl.col("group") == value)["rank"].to_list()


def scale_timeline(runs: list[RunData], x_range: tuple[float, float] | None, view: tuple | None):
    """What the timeline draws when some run is at scale: ("segments", frame) of per-rank lanes
    (a rank, or a group of at most SCALE_RANKS ranks: their own events only), or ("bands",
    (bands, outliers, n_ranks)) of the groups (all, or the one asked for when it is larger)."""
    ok = _ok(runs)
    if view is not None:
        picked = {d.run_id: drill_ranks(d, view) for d in ok}
        if all(len(r) <= scale.SCALE_RANKS for r in picked.values()):
            parts = [d.rank_timeline(picked[d.run_id]) for d in ok if picked[d.run_id]]
            parts = [p for p in parts if p[0].height]
            if not parts:
                return "segments", pl.DataFrame(schema={"run": pl.String})
            if x_range is None:
                spans = [aggregate.extent(iv) for iv, _ in parts]
                x_range = (min(s[0] for s in spans), max(s[1] for s in spans))
            return "segments", _concat([aggregate.visible_timeline(iv, m, x_range) for iv, m in parts])
    groups = [view[1]] if view is not None and view[0] == "group" else None
    whole = x_range is None
    if whole:
        spans = [d.activity_extent() for d in ok if d.analysis.activity.height]
        x_range = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0.0, 1.0)
    bands = _concat([d.activity_bands(x_range, groups, keep=whole) for d in ok])
    return "bands", (bands, _concat([d.outliers() for d in ok]), {d.run_id: d.n_ranks for d in ok})


def band_note(runs: list[RunData], x_range: tuple[float, float] | None, view: tuple | None) -> str | None:
    """The line over the bands: the runs a group drill-down draws nothing for (absent_note), and,
    once a zoom's common bins (x_range / BAND_BINS) are finer than a run's own per-rank bins
    (window / activity.N_BINS), that the band is spread evenly within those: it shows no more
    detail however far one zooms, and only the drill-down into a rank or a small group does."""
    notes = [n for n in [absent_note(runs, view)] if n]
    if x_range is not None:
        w_us = (x_range[1] - x_range[0]) / scale.BAND_BINS * 1e3
        coarse = {d.run_id: b for d in _ok(runs) if (b := d.finest_bin_us()) is not None and w_us < b}
        if coarse:
            run, b = max(coarse.items(), key=lambda kv: kv[1])
            which = f"run {run}'s" if len(_ok(runs)) > 1 else "the ranks'"
            notes.append(f"zoomed finer than {which} own bins ({_ms(b)} each): the band is even within each; pick a rank "
                         f"in the dropdown above for its events")
    return "; ".join(notes) or None


def _ms(us: float) -> str:
    return f"{us / 1e3:.3g} ms" if us >= 1e3 else f"{us:.3g} µs"


def breakdown_bands(runs: list[RunData]) -> pl.DataFrame:
    from viewer.figures import BREAKDOWN_PARTS
    from viewer.scale_figures import breakdown_pct

    cols = [col.replace("_us", "_pct") for col, _, _ in BREAKDOWN_PARTS]
    return _concat([d._once("breakdown_bands", lambda d=d: scale.band_over_ranks(breakdown_pct(d.relabel(d.analysis.breakdown)), d.groups(), cols))
                    for d in _ok(runs) if d.analysis.breakdown.height])


def group_metrics(runs: list[RunData]) -> tuple[pl.DataFrame, dict[str, pl.DataFrame], pl.DataFrame]:
    """(per-rank metrics, groups per run, outliers) for the step-time card at scale."""
    ok = _ok(runs)
    return _concat([d.rank_metrics() for d in ok]), {d.run_id: d.groups() for d in ok}, _concat([d.outliers() for d in ok])


def memory_bands(runs: list[RunData]) -> pl.DataFrame:
    """Memory over time per group from the per-rank memory curves (≤ 64 buckets per rank), never events."""
    return _concat([d._once("memory_bands", lambda d=d: scale.memory_bands(d.relabel(d.analysis.memory_curve), d.groups(), d.origin_us()))
                    for d in _ok(runs) if d.analysis.memory_curve.height])


def persistent_bands(runs: list[RunData]) -> pl.DataFrame:
    from viewer.figures import PERSISTENT_PARTS

    out = []
    for d in _ok(runs):
        p = d.relabel(d.analysis.persistent_memory)
        if p is None or p.is_empty():
            continue
        cols = [c for c, _, _ in PERSISTENT_PARTS if c in p.columns]
        out.append(d._once("persistent_bands", lambda: scale.band_over_ranks(p.with_columns(pl.col(cols).cast(pl.Float64)), d.groups(), cols)))
    return _concat(out)

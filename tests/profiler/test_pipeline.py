"""Pipeline analysis: span parsing, the schedule replay and bubbles on hand-made frames, then a real
2-rank 1F1B run."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import load_traces, pipeline_actions, pipeline_grid, pipeline_summary, simulate_order, temporal_breakdown, theory_bubble_pct
from profiler.pipeline import ideal_orders, schedule_theory_pct, span_pattern, zero_bubble_h1_pct
from tests.profiler.conftest import make_events, step

ONE_F_ONE_B = [  # run.json ideal_order of 1F1B, 2 ranks, 2 microbatches
    [["F", 0, 0], ["F", 0, 1], ["B", 0, 0], ["B", 0, 1]],
    [["F", 1, 0], ["B", 1, 0], ["F", 1, 1], ["B", 1, 1]],
]
RUNS = {"r": {"pipeline": {"schedule": "1f1b", "ranks": 2, "microbatches": 2, "stages_per_rank": 1, "loss_stage": 1,
                           "span_format": "ptprof/pp/{kind} s{stage} mb{microbatch}", "ideal_order": ONE_F_ONE_B}}}


def act(kind: str, stage: int, mb: int, ts: float, dur: float) -> dict:
    return dict(name=f"ptprof/pp/{kind} s{stage} mb{mb}", kind="annotation", cat="user_annotation", ts_us=ts, dur_us=dur)


def one_f_one_b(offset: float = 0.0) -> pl.DataFrame:
    """Two ranks, one step [0, 100) of 1F1B with m = 2, communication gaps between actions.

    rank 0: F0 [0,10)  F1 [12,22)  B0 [45,65)  B1 [80,95)                  busy 55
    rank 1: F0 [12,22) L0 [22,27)  B0 [27,42)  F1 [47,57) L1 [57,62) B1 [62,77)  busy 60
    """
    o = offset
    r0 = [step(1, o, 100), act("F", 0, 0, o, 10), act("F", 0, 1, o + 12, 10), act("B", 0, 0, o + 45, 20), act("B", 0, 1, o + 80, 15)]
    r1 = [step(1, o, 100), act("F", 1, 0, o + 12, 10), act("L", 1, 0, o + 22, 5), act("B", 1, 0, o + 27, 15),
          act("F", 1, 1, o + 47, 10), act("L", 1, 1, o + 57, 5), act("B", 1, 1, o + 62, 15)]
    return pl.concat([make_events(r0, rank=0), make_events(r1, rank=1)])


def test_span_pattern_follows_the_runners_format():
    names = pl.Series(["ptprof/pp/F s1 mb3", "ptprof/pp/L s12 mb0", "ptprof/pp/F1", "ptprof/forward", "ptprof/pp/X s1 mb3"])
    parsed = names.str.extract_groups(span_pattern()).struct.unnest()
    assert parsed.rows() == [("F", "1", "3"), ("L", "12", "0"), (None, None, None), (None, None, None), (None, None, None)]
    with pytest.raises(ValueError, match="microbatch"):
        span_pattern("pp/{kind}{stage}")


def test_actions_grid_and_slots():
    a = pipeline_actions(one_f_one_b())
    assert a.filter(pl.col("rank") == 1)["action"].to_list() == ["F", "L", "B", "F", "L", "B"]
    assert a.filter(pl.col("rank") == 1)["slot"].to_list() == [0, None, 1, 2, None, 3]  # L has no slot
    assert set(a["step"]) == {1}
    grid = pipeline_grid(a)
    assert grid["order"].to_list() == ["F0 F1 B0 B1", "F0 B0 F1 B1"]
    assert grid["n_actions"].to_list() == [4, 4]


def test_measured_theory_and_ideal_bubbles_by_hand():
    s = pipeline_summary(pipeline_actions(one_f_one_b()), RUNS).sort("rank")
    # window: first start 0 to last end 95 (rank 0's B1), across ranks
    assert s["window_us"].to_list() == [95, 95]
    assert s["busy_us"].to_list() == [55, 60]
    assert s["bubble_pct"].to_list() == pytest.approx([100 * 40 / 95, 100 * 35 / 95])
    assert s["theory_pct"].to_list() == pytest.approx([100 / 3, 100 / 3])  # (p-1)/(m+p-1) = 1/3
    # Ideal replay with the measured durations (L folded into rank 1's F: 15 each):
    # r0 F0 [0,10) F1 [10,20); r1 F0 [10,25) B0 [25,40); r0 B0 [40,60); r1 F1 [40,55) B1 [55,70);
    # r0 B1 [70,85). Makespan 85: rank 0 busy 55, rank 1 busy 60.
    assert s["ideal_pct"].to_list() == pytest.approx([100 * 30 / 85, 100 * 25 / 85])
    assert s["order_matches"].to_list() == [True, True]
    assert s["order_source"].to_list() == ["run.json", "run.json"]
    assert (s["bubble_pct"] >= s["ideal_pct"]).all()


def test_bubble_split_with_a_slow_last_stage_by_hand():
    # 1F1B, p = 2, m = 2. Stage 0: F 1, B 2; stage 1 three times slower: F 3, B 6. Every message
    # between the ranks takes 1 µs.
    #   rank 0: F0 [0,1)  F1 [1,2)  B0 [12,14)  B1 [21,23)           busy 6
    #   rank 1: F0 [2,5)  B0 [5,11) F1 [11,14)  B1 [14,20)           busy 18
    # Window [0, 23): 2 x 23 = 46 rank-µs, 24 busy, 22 idle.
    # Uniform replay (F 2, B 4 everywhere): makespan 18, busy 12 + 12, bubble 1/3 = (p-1)/(m+p-1):
    #   idle per unit of work 1/2, x 24 measured busy = 12 rank-µs of schedule bubble.
    # Replay with the measured durations, free messages: r0 F0 [0,1) F1 [1,2); r1 F0 [1,4)
    #   B0 [4,10) F1 [10,13) B1 [13,19); r0 B0 [10,12) B1 [19,21). Makespan 21: 42 - 24 = 18 idle,
    #   18 - 12 = 6 of stage imbalance. The 22 - 18 = 4 left waited on messages.
    rows0 = [step(1, 0, 30), act("F", 0, 0, 0, 1), act("F", 0, 1, 1, 1), act("B", 0, 0, 12, 2), act("B", 0, 1, 21, 2)]
    rows1 = [step(1, 0, 30), act("F", 1, 0, 2, 3), act("B", 1, 0, 5, 6), act("F", 1, 1, 11, 3), act("B", 1, 1, 14, 6)]
    events = pl.concat([make_events(rows0, rank=0), make_events(rows1, rank=1)])
    s = pipeline_summary(pipeline_actions(events), RUNS).sort("rank")
    assert s["ideal_pct"].to_list() == pytest.approx([100 * 15 / 21, 100 * 3 / 21])
    for col, rank_us in [("pipeline_bubble_pct", 22), ("schedule_bubble_pct", 12), ("imbalance_pct", 6), ("comm_wait_pct", 4)]:
        assert s[col].to_list() == pytest.approx([100 * rank_us / 46] * 2), col
    assert s["slowest_stage"].to_list() == [1, 1]
    assert s["slowest_stage_ratio"].to_list() == pytest.approx([18 / 12] * 2)  # 18 µs of 24 over 2 stages


def test_bubble_split_caps_a_negative_imbalance():
    # one_f_one_b: 115 busy of 2 x 95 = 190 rank-µs. Uniform (F 12.5, B 16.25): bubble 1/3, so
    # 115 / 2 = 57.5 idle of schedule; the measured durations replay to 2 x 85 - 115 = 55 idle,
    # less than uniform: no imbalance, and the remaining 75 - 57.5 = 17.5 is communication wait.
    s = pipeline_summary(pipeline_actions(one_f_one_b()), RUNS)
    got = s.select("pipeline_bubble_pct", "schedule_bubble_pct", "imbalance_pct", "comm_wait_pct").unique().rows()
    assert got == [pytest.approx((100 * 75 / 190, 100 * 57.5 / 190, 0.0, 100 * 17.5 / 190))]
    assert s["slowest_stage"].to_list() == [1, 1]  # 60 µs (L folded in) against stage 0's 55


def test_order_that_differs_from_the_ideal_is_flagged():
    swapped = [list(ONE_F_ONE_B[0]), [ONE_F_ONE_B[1][i] for i in (0, 2, 1, 3)]]  # rank 1 as GPipe
    runs = {"r": {"pipeline": {**RUNS["r"]["pipeline"], "ideal_order": swapped}}}
    s = pipeline_summary(pipeline_actions(one_f_one_b()), runs).sort("rank")
    assert s["order_matches"].to_list() == [True, False]


def test_without_run_json_the_measured_order_is_replayed():
    s = pipeline_summary(pipeline_actions(one_f_one_b()), {"r": None}).sort("rank")
    assert s["order_source"].to_list() == ["measured", "measured"]
    assert s["ideal_pct"].to_list() == pytest.approx([100 * 30 / 85, 100 * 25 / 85])  # same order as run.json here
    assert s["theory_pct"].to_list() == [None, None]  # schedule unknown
    assert s["pp_ranks"].to_list() == [2, 2] and s["microbatches"].to_list() == [2, 2]


def test_steps_are_separate_windows():
    two = pl.concat([one_f_one_b(0), one_f_one_b(200).with_columns(
        name=pl.col("name").cast(pl.String).str.replace("ProfilerStep#1", "ProfilerStep#2").cast(pl.Categorical))])
    s = pipeline_summary(pipeline_actions(two), RUNS)
    assert s.group_by("step").agg(pl.col("window_us").first()).sort("step").rows() == [(1, 95.0), (2, 95.0)]
    assert s.height == 4


def test_hybrid_runs_map_global_ranks_to_their_pp_group():
    # dp = 2, pp = 2: pp groups [0, 2] and [1, 3] (global ranks by pp coordinate). Replica 1 is
    # replica 0's 1F1B delayed by 50 µs, so both have the 95 µs window of the hand-made run above:
    # a window across all four ranks (145 µs) or rank numbers taken as coordinates would differ.
    base, replica = one_f_one_b(), one_f_one_b(50)  # each rank's ProfilerStep#1 starts with its actions
    to_global = {0: (0, 1), 1: (2, 3)}  # pp coordinate -> its global rank in replica 0 / replica 1
    events = pl.concat([
        base.with_columns(rank=pl.col("rank").replace_strict({c: g[0] for c, g in to_global.items()}, return_dtype=pl.Int32)),
        replica.with_columns(rank=pl.col("rank").replace_strict({c: g[1] for c, g in to_global.items()}, return_dtype=pl.Int32)),
    ])
    runs = {"r": {**RUNS["r"], "hybrid": {"dims": ["dp", "pp", "tp"], "shape": [2, 2, 1],
                                          "groups": {"pp": [[0, 2], [1, 3]], "dp": [[0, 1], [2, 3]], "tp": [[0], [1], [2], [3]]}}}}
    s = pipeline_summary(pipeline_actions(events), runs).sort("rank")
    assert s["rank"].to_list() == [0, 1, 2, 3]
    assert s["window_us"].to_list() == [95, 95, 95, 95]
    # global ranks 0, 1 are pp coordinate 0 (busy 55), ranks 2, 3 coordinate 1 (busy 60)
    assert s["busy_us"].to_list() == [55, 55, 60, 60]
    assert s["ideal_pct"].to_list() == pytest.approx([100 * 30 / 85, 100 * 30 / 85, 100 * 25 / 85, 100 * 25 / 85])
    assert s["order_matches"].to_list() == [True] * 4
    ideal = ideal_orders(runs)
    assert ideal.filter(pl.col("rank") == 3)["action"].to_list() == ["F", "B", "F", "B"]  # coordinate 1's order
    assert ideal.filter(pl.col("rank") == 1)["action"].to_list() == ["F", "F", "B", "B"]


def test_no_actions_is_none():
    ev = make_events([step(1, 0, 10), dict(name="aten::mm", kind="op", ts_us=1, dur_us=2)])
    assert pipeline_actions(ev).is_empty()
    assert pipeline_summary(pipeline_actions(ev), {}) is None


def test_simulate_1f1b_gives_the_textbook_bubble():
    # F = 1, B = 2 everywhere: p = 2, m = 2 -> makespan (m + p - 1)(F + B) = 9, bubble 1/3 per rank
    order = [[tuple(a) for a in rank] for rank in ONE_F_ONE_B]
    busy, makespan = simulate_order(order, {a: (1.0 if a[0] == "F" else 2.0) for r in order for a in r}, last_stage=1)
    assert (busy, makespan) == ([6.0, 6.0], 9.0)


def test_simulate_zero_bubble_waits_for_inputs_and_detects_deadlock():
    # ZB-H1 shape, p = 2, m = 1: r0 F I W, r1 F I W; W needs its own I, I of stage 0 needs stage 1's I.
    order = [[("F", 0, 0), ("I", 0, 0), ("W", 0, 0)], [("F", 1, 0), ("I", 1, 0), ("W", 1, 0)]]
    busy, makespan = simulate_order(order, {a: 1.0 for r in order for a in r}, last_stage=1)
    # r0 F [0,1); r1 F [1,2) I [2,3) W [3,4); r0 I [3,4) W [4,5)
    assert (busy, makespan) == ([3.0, 3.0], 5.0)
    stuck = [[("B", 0, 0), ("F", 0, 0)], [("F", 1, 0), ("B", 1, 0)]]  # B before its own F
    assert simulate_order(stuck, {a: 1.0 for r in stuck for a in r}, last_stage=1) is None


def test_theory_formulas():
    assert theory_bubble_pct(4, 8) == pytest.approx(100 * 3 / 11)
    assert theory_bubble_pct(2, 4, 2) == pytest.approx(100 * 1 / 9)  # interleaved: (p-1)/(v*m+p-1)
    assert zero_bubble_h1_pct(2, 4, 1.0, 1.0, 1.0) == pytest.approx(100 * 1 / 13)  # (p-1)F / (3mF + (p-1)F)
    assert schedule_theory_pct("gpipe", 2, 4, 1, {}) == pytest.approx(20.0)
    assert schedule_theory_pct("interleaved-1f1b", 2, 4, 2, {}) == pytest.approx(100 / 9)
    assert schedule_theory_pct("zbv", 2, 4, 2, {"F": 1, "I": 1, "W": 1}) is None


def test_ideal_orders_frame():
    o = ideal_orders(RUNS)
    assert o.height == 8
    assert o.filter(pl.col("rank") == 1).sort("slot")["action"].to_list() == ["F", "B", "F", "B"]


@pytest.mark.multirank
def test_real_1f1b_run(runs):
    run = runs("1f1b", 2)
    traces = load_traces(run)
    cfg = traces.runs[run.name]["pipeline"]
    m, last = cfg["microbatches"], cfg["loss_stage"]
    actions = pipeline_actions(traces.events, runs=traces.runs).filter(pl.col("step").is_not_null())
    counts = actions.group_by("step", "stage", "action").len()
    n_steps = actions["step"].n_unique()
    assert n_steps == 2
    for stage in range(cfg["num_stages"]):
        for kind in ("F", "B"):
            assert counts.filter((pl.col("stage") == stage) & (pl.col("action") == kind))["len"].to_list() == [m] * n_steps
    assert set(actions.filter(pl.col("action") == "L")["stage"]) == {last}
    assert actions.filter(pl.col("action").is_in(["I", "W"])).is_empty()
    # each stage's actions run on the rank run.json places it on
    placed = actions.select("stage", "rank").unique().sort("stage")
    assert placed["rank"].to_list() == cfg["stage_to_rank"]

    s = pipeline_summary(actions, traces.runs)
    assert s.height == 2 * n_steps
    assert s["order_matches"].all()
    assert s["theory_pct"].to_list() == pytest.approx([theory_bubble_pct(2, m)] * s.height)
    assert ((s["bubble_pct"] > 0) & (s["bubble_pct"] < 100)).all()
    # replaying the same durations under only the pipeline's dependencies can only start earlier
    assert (s["bubble_pct"] >= s["ideal_pct"] - 1e-6).all(), s
    # the split: parts of the pipeline's bubble, which is the mean of its ranks' bubbles
    split = s.select("schedule_bubble_pct", "imbalance_pct", "comm_wait_pct")
    assert (split.min_horizontal() >= 0).all()
    assert ((split.sum_horizontal() - s["pipeline_bubble_pct"]).abs() < 1e-6).all()
    mean = s.group_by("step").agg(pl.col("bubble_pct").mean(), pl.col("pipeline_bubble_pct").first())
    assert mean["bubble_pct"].to_list() == pytest.approx(mean["pipeline_bubble_pct"].to_list())

    # gloo puts send/recv spans on the main thread; its operators are still compute
    b = temporal_breakdown(traces.events)
    assert (b["compute_us"] > 0).all() and (b["comm_us"] > 0).all()
    total = b["compute_us"] + b["non_compute_us"] + b["idle_us"]
    assert ((total - b["window_us"]).abs() < 1e-3).all()


@pytest.mark.multirank
def test_real_hybrid_run_has_one_pipeline_per_pp_group(runs):
    # The 3D run of tests/runners/test_hybrid.py (dp = pp = tp = 2), reused within a session.
    run = runs("hybrid", 8, "--dp", "2", "--pp", "2", "--tp", "2")
    traces = load_traces(run)
    manifest = traces.runs[run.name]
    groups = manifest["hybrid"]["groups"]["pp"]  # global ranks by pp coordinate
    actions = pipeline_actions(traces.events, runs=traces.runs).filter(pl.col("step").is_not_null())
    # every rank at pp coordinate c runs stage c (one stage per rank)
    placed = dict(actions.group_by("rank").agg(pl.col("stage").unique()).select("rank", pl.col("stage").list.first()).iter_rows())
    assert placed == {g: c for group in groups for c, g in enumerate(group)}
    s = pipeline_summary(actions, traces.runs)
    n_steps = s["step"].n_unique()
    assert s.height == 8 * n_steps
    assert s["order_matches"].all() and s["pp_ranks"].unique().to_list() == [2]
    assert (s["bubble_pct"] >= s["ideal_pct"] - 1e-6).all()
    # one window per pipeline replica and step, shared by that group's ranks only
    for group in groups:
        per_step = s.filter(pl.col("rank").is_in(group)).group_by("step").agg(pl.col("window_us").n_unique())
        assert (per_step["window_us"] == 1).all()
    assert s.group_by("step").agg(pl.col("window_us").n_unique())["window_us"].max() > 1


def pipedream_step_order(stage: int, ranks: int, m: int) -> list[tuple[str, int, int]]:
    """One steady-state step of PipeDream's 1F1B on `stage`: F(i), B(i-w), U(i-w); w = P-1-s."""
    w = ranks - 1 - stage
    return [a for i in range(m) for a in (("F", stage, i), ("B", stage, i - w), ("U", stage, i - w))]


def test_stream_replay_of_pipedream_has_no_bubble_with_uniform_stages():
    # F 1, B 2, U 0.5 on every stage: the steady state runs back to back, period M x 3.5 on each
    # rank, so the replay's bubble is 0 (where 1F1B's flush has (p-1)/(m+p-1)).
    from profiler.pipeline import replay_bubble, stream_replay

    p, m = 4, 8
    order = [pipedream_step_order(s, p, m) for s in range(p)]
    dur = {a: {"F": 1.0, "B": 2.0, "U": 0.5}[a[0]] for acts in order for a in acts}
    busy, period = stream_replay(order, dur, last_stage=p - 1, microbatches=m)
    assert busy == [m * 3.5] * p and period == pytest.approx(m * 3.5)
    assert replay_bubble((busy, period)) == pytest.approx(0.0)
    assert schedule_theory_pct("pipedream", p, m, 1, {}) == 0.0
    # One stage twice as slow sets the pace: the others idle for the difference.
    slow = {a: d * (2 if a[1] == 2 else 1) for a, d in dur.items()}
    busy, period = stream_replay(order, slow, last_stage=p - 1, microbatches=m)
    assert period == pytest.approx(2 * m * 3.5) and busy[2] == pytest.approx(period)
    # Without carried-in microbatches (a previous step's, negative) the step alone deadlocks.
    assert simulate_order(order, dur, last_stage=p - 1) is None
    assert simulate_order(order, dur, last_stage=p - 1, carried_in=True) is not None

"""Findings rules: each on hand-made frames with hand-computed sentences, silent below its threshold,
ranked by score; then on real runs; and docs/findings.md names every rule and threshold."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import polars as pl
import pytest

import profiler.findings as F
from profiler import load_traces
from profiler.alphabeta import FIT_COLUMNS, PREDICT_COLUMNS
from profiler.collectives import COLUMNS as COLL_COLUMNS
from profiler.exposed import EXPOSED_COLUMNS
from profiler.findings import FINDING_COLUMNS, findings
from profiler.pipeline import ACTION_COLUMNS, SUMMARY_COLUMNS
from profiler.report import analyze
from profiler.theory import CHECK_COLUMNS
from profiler.theory_memory import ACTIVATION_COLUMNS, MEMORY_COLUMNS, WHATIF_COLUMNS
from tests.conftest import REPO, SHARED_TRACES, ptprof

MIB = 2**20
BREAKDOWN = {"run": pl.String, "rank": pl.Int32, "window_us": pl.Float64, "compute_us": pl.Float64,
             "non_compute_us": pl.Float64, "idle_us": pl.Float64, "comm_us": pl.Float64, "exposed_comm_us": pl.Float64}
PERSISTENT = {"run": pl.String, "rank": pl.Int32, "params_bytes": pl.Int64, "params_at_rest_bytes": pl.Int64,
              "grads_bytes": pl.Int64, "optimizer_bytes": pl.Int64}


def frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    """A frame of `schema`'s columns; a row leaves out what it does not need (null)."""
    return pl.DataFrame([{c: r.get(c) for c in schema} for r in rows], schema=schema) if rows else pl.DataFrame(schema=schema)


def fake(runs=("A",), ranks=(0,), **frames) -> SimpleNamespace:
    """An Analysis with only the frames a test gives; every other one empty (as for a run that lacks it)."""
    empty = {
        "ranks": pl.DataFrame({"run": [r for r in runs for _ in ranks], "rank": [k for _ in runs for k in ranks]}),
        "runs": {r: None for r in runs},
        "breakdown": frame([], BREAKDOWN), "breakdown_steps": frame([], BREAKDOWN | {"step": pl.Int64}),
        "exposed": frame([], EXPOSED_COLUMNS | {"run": pl.String}),
        "collectives": frame([], {c: pl.Float64 for c in COLL_COLUMNS} | {
            "run": pl.String, "rank": pl.Int32, "step": pl.Int64, "seq": pl.Int64, "collective": pl.String,
            "algo": pl.String, "group": pl.String, "group_size": pl.Int64, "dtype": pl.String, "size_bytes": pl.Int64,
            "in_bytes": pl.Int64, "out_bytes": pl.Int64, "source": pl.String, "note": pl.String}),
        "skew": frame([], {"run": pl.String, "group": pl.String, "algo": pl.String, "seq": pl.Int64, "n_ranks": pl.UInt32,
                           "collective": pl.String, "first_start_us": pl.Float64, "spread_us": pl.Float64, "last_rank": pl.Int32}),
        "stragglers": frame([], {"run": pl.String, "group": pl.String, "rank": pl.Int32, "times_last": pl.UInt32,
                                 "mean_spread_us": pl.Float64, "share_pct": pl.Float64}),
        "pipeline": None, "pipeline_actions": frame([], ACTION_COLUMNS | {"run": pl.String}),
        "memory_peaks": frame([], {"run": pl.String, "rank": pl.Int32, "mem_device": pl.String, "peak_allocated_bytes": pl.Int64,
                                   "peak_step": pl.Int64}),
        "persistent_memory": frame([], PERSISTENT), "theory_memory": frame([], MEMORY_COLUMNS),
        "memory_whatif": frame([], WHATIF_COLUMNS), "activation": frame([], ACTIVATION_COLUMNS), "theory_check": frame([], CHECK_COLUMNS), "alpha_beta": frame([], FIT_COLUMNS),
    }
    return SimpleNamespace(**(empty | frames))


def only(rows: list[dict]) -> dict:
    assert len(rows) == 1, rows
    return rows[0]


# ---------------------------------------------------------------------------------------------
# 1. exposed communication: rank 0 has 200 of 1000 µs exposed (20 %), rank 1 100 (10 %); of rank 0's,
# all-gather in forward 150 (75 %), reduce-scatter in backward 50.

def exposed_case(exposed_0: float = 200.0, exposed_1: float = 100.0, phase: str | None = "forward") -> SimpleNamespace:
    return fake(
        ranks=(0, 1),
        breakdown=frame([{"run": "A", "rank": 0, "window_us": 1000.0, "exposed_comm_us": exposed_0},
                         {"run": "A", "rank": 1, "window_us": 1000.0, "exposed_comm_us": exposed_1}], BREAKDOWN),
        breakdown_steps=frame([{"run": "A", "rank": k, "step": 1} for k in (0, 1)], BREAKDOWN | {"step": pl.Int64}),
        exposed=frame([
            {"run": "A", "rank": 0, "step": 1, "collective": "all_gather", "phase": phase, "calls": 3, "comm_us": 300.0, "exposed_us": 150.0},
            {"run": "A", "rank": 0, "step": 1, "collective": "reduce_scatter", "phase": "backward", "calls": 2, "comm_us": 100.0,
             "exposed_us": 50.0},
        ], EXPOSED_COLUMNS | {"run": pl.String}),
    )


def test_exposed_comm_names_the_worst_rank_collective_and_phase():
    f = only(F.exposed_comm_rule(exposed_case()))
    assert (f["rule"], f["run"], f["rank"], f["score"]) == ("exposed-comm", "A", 0, 20.0)
    assert "20.0 % of rank 0's step time (200 µs of 1.00 ms over step 1)" in f["text"]
    assert "most of it is all_gather in forward: 150 µs, 75.0 % of the exposed time, in 3 calls" in f["text"]
    assert "rank 0 (the worst of 2)" in f["evidence"]
    # comm_us sums the calls' durations (overlapping calls each count): not a wall time
    assert "reduce_scatter in backward 50.0 µs exposed of 100 µs summed over its calls" in f["evidence"]
    assert "more than the window" not in f["evidence"]
    assert "forward_prefetch" in f["change"]
    # Calls in flight together (a pipeline's async sends): their summed time can pass the 1 ms window, and says so.
    case = exposed_case()
    case.exposed = case.exposed.with_columns(
        comm_us=pl.when(pl.col("collective") == "reduce_scatter").then(2500.0).otherwise(pl.col("comm_us")))
    f = only(F.exposed_comm_rule(case))
    assert ("reduce_scatter in backward 50.0 µs exposed of 2.50 ms summed over its calls (in flight together, each "
            "counted: more than the window)") in f["evidence"]


def test_ranks_that_tie_name_the_lowest_and_say_they_are_alike():
    # Two ranks with the same 20 %: neither is the worst (copies of one trace); rank 0 is named.
    f = only(F.exposed_comm_rule(exposed_case(exposed_0=200.0, exposed_1=200.0)))
    assert f["rank"] == 0 and "rank 0 (all 2 ranks alike)" in f["evidence"] and "worst" not in f["evidence"]
    assert F.worst_of(pl.Series([5.0])) == "" and F.worst_of(pl.Series([5.0, 5.05, 5.0])) == " (all 3 ranks alike)"
    assert F.worst_of(pl.Series([5.0, 6.0])) == " (the worst of 2)"


def test_exposed_comm_on_one_rank_names_no_worst():
    e = exposed_case()
    e.breakdown = e.breakdown.filter(pl.col("rank") == 0)
    f = only(F.exposed_comm_rule(e))
    assert f["evidence"].startswith("run A, rank 0, step 1;")


def test_exposed_comm_without_a_phase_says_so():
    f = only(F.exposed_comm_rule(exposed_case(phase=None)))
    assert "all_gather (phase unknown)" in f["text"]


def test_a_pipeline_runs_transfers_are_between_its_actions_not_of_unknown_phase():
    # Sends and receives of a run with pipeline action spans sit between those spans: no phase,
    # but they are known stage transfers. The same rows in a run without actions stay unknown.
    e = exposed_case(phase=None)
    e.exposed = e.exposed.with_columns(collective=pl.Series(["recv", "send"]), phase=pl.lit(None, pl.String))
    plain = only(F.exposed_comm_rule(e))
    assert "recv (phase unknown): 150 µs" in plain["text"] and "send (phase unknown) 50.0 µs" in plain["evidence"]
    e.pipeline_actions = frame([{"run": "A", "rank": 0, "step": 1, "action": "F", "stage": 0, "microbatch": 0}],
                               ACTION_COLUMNS | {"run": pl.String})
    f = only(F.exposed_comm_rule(e))
    assert "most of it is recv between pipeline actions: 150 µs" in f["text"] and "unknown" not in f["text"] + f["evidence"]
    assert "send between pipeline actions 50.0 µs exposed" in f["evidence"]
    # the rank waits for its neighbour: the bubble's change, not "post them early" (torch's schedules do)
    assert "waits for the neighbouring stage" in f["change"] and "isend/irecv" not in f["change"]
    assert "isend/irecv" in plain["change"]  # a foreign trace's sends: no pipeline known
    e.pipeline_actions = e.pipeline_actions.with_columns(run=pl.lit("B"))  # another run's actions say nothing of A
    assert "recv (phase unknown)" in only(F.exposed_comm_rule(e))["text"]


def test_all_to_all_advice_is_moe_only_for_an_expert_parallel_run():
    e = exposed_case()
    e.exposed = e.exposed.with_columns(collective=pl.Series(["all_to_all", "reduce_scatter"]))
    foreign = only(F.exposed_comm_rule(e))["change"]
    assert "capacity factor" not in foreign and "embedding" in foreign  # a TorchRec all-to-all is no MoE
    e.runs = {"A": {"paradigm": "ep"}}
    assert "capacity factor" in only(F.exposed_comm_rule(e))["change"]
    e.runs = {"A": {"paradigm": "ulysses"}}  # sequence shards to head shards around attention
    ulysses = only(F.exposed_comm_rule(e))["change"]
    assert "Ulysses" in ulysses and "capacity factor" not in ulysses


def test_a_collective_in_one_of_the_profiled_steps_is_no_per_step_cost():
    # rank 0 profiled steps 1 and 2; its exposed broadcast (DDP's bucket rebuild) ran in step 1 only
    e = exposed_case()
    e.breakdown_steps = frame([{"run": "A", "rank": k, "step": s} for k in (0, 1) for s in (1, 2)], BREAKDOWN | {"step": pl.Int64})
    e.exposed = e.exposed.with_columns(collective=pl.Series(["broadcast", "all_reduce"]))
    f = only(F.exposed_comm_rule(e))
    assert "most of it is broadcast in forward: 150 µs, 75.0 % of the exposed time, in 3 calls, only in step 1 of steps 1, 2" in f["text"]
    assert "every" not in f["change"] and "once, in step 1" in f["change"] and "--warmup" in f["change"]
    # in every profiled step it is a per-step cost: the usual advice
    e.exposed = pl.concat([e.exposed, e.exposed.with_columns(step=pl.lit(2, pl.Int64))])
    f = only(F.exposed_comm_rule(e))
    assert "only in" not in f["text"] and "broadcast_buffers=False" in f["change"]
    # missing from a step the trace was cut in (its later events lost): no one-time cost either
    # (a cut trace was told DDP rebuilds its buckets once and to profile later steps: trial)
    e.exposed = e.exposed.filter(pl.col("step") == 1)
    assert "only in step 1 of steps 1, 2" in only(F.exposed_comm_rule(e))["text"]
    e.cut_steps = frame([{"run": "A", "rank": 0, "step": 2}], {"run": pl.String, "rank": pl.Int32, "step": pl.Int64})
    f = only(F.exposed_comm_rule(e))
    assert "only in" not in f["text"] and "--warmup" not in f["change"]
    e.cut_steps = frame([{"run": "A", "rank": 1, "step": 2}], {"run": pl.String, "rank": pl.Int32, "step": pl.Int64})
    assert "only in step 1 of steps 1, 2" in only(F.exposed_comm_rule(e))["text"]  # another rank's cut says nothing


def test_exposed_comm_names_the_largest_part_when_no_collective_has_most():
    e = exposed_case()
    e.exposed = e.exposed.with_columns(exposed_us=pl.Series([90.0, 60.0]))  # 90 of 200: 45 %
    assert "; the largest part is all_gather in forward: 90.0 µs, 45.0 % of the exposed time" in only(F.exposed_comm_rule(e))["text"]


def test_exposed_comm_is_silent_below_its_threshold_and_on_nan():
    assert F.exposed_comm_rule(exposed_case(exposed_0=40.0, exposed_1=30.0)) == []  # 4 % and 3 % < 5 %
    assert F.exposed_comm_rule(fake(ranks=(0, 1), breakdown=frame(
        [{"run": "A", "rank": 0, "window_us": 1000.0, "exposed_comm_us": 40.0},
         {"run": "A", "rank": 1, "window_us": 1000.0, "exposed_comm_us": float("nan")}], BREAKDOWN))) == []


# ---------------------------------------------------------------------------------------------
# 2. pipeline: window 100 µs; rank 0 busy 60 (bubble 40 %), rank 1 busy 80 (20 %): mean 30 %.
# Textbook 1F1B p=2, m=4: 1/5 = 20 %; replay: rank 0 30 %, rank 1 20 % (mean 25 %): imbalance
# 25 - 20 = 5, communication wait 30 - 25 = 5. Slowest: rank 1, 80 / 60 = 1.33x.

def pipeline_case(bubbles=(40.0, 20.0), split: tuple | None = None, schedule: str = "1f1b", v: int = 1) -> SimpleNamespace:
    rows = []
    for rank, (bubble, ideal) in enumerate(zip(bubbles, (30.0, 20.0))):
        rows.append({"run": "A", "rank": rank, "step": 1, "schedule": schedule, "pp_ranks": 2, "microbatches": 4, "stages_per_rank": v,
                     "window_us": 100.0, "busy_us": 100.0 - bubble, "bubble_us": bubble, "bubble_pct": bubble,
                     "theory_pct": 20.0, "ideal_pct": ideal})
    p = frame(rows, SUMMARY_COLUMNS | {"run": pl.String})
    if split:  # the pipeline module's own split: % of the pipeline's rank-time, summing to pipeline_bubble_pct
        p = p.with_columns(pipeline_bubble_pct=pl.lit(sum(split)), schedule_bubble_pct=pl.lit(split[0]),
                           imbalance_pct=pl.lit(split[1]), comm_wait_pct=pl.lit(split[2]),
                           slowest_stage=pl.lit(1), slowest_stage_ratio=pl.lit(1.25))
    actions = frame([{"run": "A", "rank": r, "step": 1, "action": "F", "stage": r, "microbatch": 0} for r in (0, 1)],
                    ACTION_COLUMNS | {"run": pl.String})
    return fake(ranks=(0, 1), pipeline=p, pipeline_actions=actions)


def test_pipeline_bubble_from_theory_and_replay():
    f = only(F.pipeline_bubble_rule(pipeline_case()))
    assert (f["rule"], f["rank"], f["score"]) == ("pipeline-bubble", 1, 30.0)
    assert ("idle 30.0 % of its window (mean over 2 ranks): 20.0 % is 1f1b's own bubble (p=2, m=4), 5.00 % stage imbalance, "
            "5.00 % waiting for communication; the slowest stage is rank 1 (stage 1), busy 80.0 µs per step, 1.33× the least "
            "busy rank") in f["text"]
    assert "rank 0 40.0 %, rank 1 20.0 %" in f["evidence"]
    assert f["change"].count("; then ") == 2  # 20, 5 and 5 %: each part at BUBBLE_PART_MIN_PCT or more gets its change
    # the schedule's share is the largest: 1/5 at m=4, 1/9 at m=8
    assert f["change"].startswith("raise the microbatch count: 1f1b's textbook bubble (p−1)/(m+p−1), a share of an ideal "
                                  "pipeline's time (no imbalance, no communication), is 20.0 % at m=4, 11.1 % at m=8; or an "
                                  "interleaved (v > 1 stages per rank) or zero-bubble schedule")


def test_pipeline_bubble_on_an_interleaved_run_knows_v_and_suggests_another_schedule():
    # p=2, m=4, v=2: 1/(2·4+1) = 11.1 %; m=8: 1/17 = 5.88 %; v=3: 1/13 = 7.69 %
    f = only(F.pipeline_bubble_rule(pipeline_case(schedule="interleaved-1f1b", v=2)))
    assert "20.0 % is interleaved-1f1b's own bubble (p=2, m=4, v=2)" in f["text"]
    assert f["change"].startswith("raise the microbatch count: interleaved-1f1b's textbook bubble (p−1)/(v·m+p−1), a share "
                                  "of an ideal pipeline's time (no imbalance, no communication), is 11.1 % at m=4, 5.88 % at m=8; "
                                  "or more stages per rank: 7.69 % at v=3; or a zero-bubble schedule")
    assert "interleaved or" not in f["change"]
    zb = only(F.pipeline_bubble_rule(pipeline_case(schedule="zero-bubble")))
    assert zb["change"].startswith("raise the microbatch count; then ") and "schedule" not in zb["change"].split("; then ")[0]


def test_pipeline_bubble_uses_the_split_columns_when_there():
    f = only(F.pipeline_bubble_rule(pipeline_case(split=(10.0, 15.0, 6.0))))
    assert f["score"] == 31.0
    assert ("idle 31.0 % of its window (mean over 2 ranks): 10.0 % is 1f1b's own bubble (p=2, m=4), 15.0 % stage imbalance, "
            "6.00 % waiting for communication; the slowest stage is stage 1 (rank 1), 1.25× the mean stage's compute.") in f["text"]
    assert "move layers off stage 1" in f["change"]


def test_a_cpu_pipelines_communication_wait_is_not_blamed_on_a_link():
    # The wait is the largest part (20 of 34 %): its remedy comes first. On gloo ranks as CPU
    # processes it is a wait for the neighbour (shared cores), no link's bandwidth.
    case = pipeline_case(split=(8.0, 6.0, 20.0))
    for kinds, said, unsaid in ((["cuda", "cuda"], "fastest link", "on CPU ranks"),
                                (["cpu", "cpu"], "on CPU ranks this wait is mostly for the neighbouring rank", "fastest link"),
                                (["cpu", "cuda"], "fastest link", "on CPU ranks")):
        case.ranks = case.ranks.with_columns(device_kind=pl.Series(kinds))
        change = only(F.pipeline_bubble_rule(case))["change"]
        assert said in change and unsaid not in change, (kinds, change)


def test_pipeline_bubble_is_silent_below_its_threshold():
    assert F.pipeline_bubble_rule(pipeline_case(bubbles=(8.0, 6.0))) == []
    assert F.pipeline_bubble_rule(fake()) == []  # no pipeline


# ---------------------------------------------------------------------------------------------
# 3. persistent memory: Φ = 1 Mi fp32 parameters, AdamW, dp 2. DDP holds 4 + 4 + 8 = 16 MiB;
# ZeRO-1 4 + 4 + 4 = 12 MiB (-25 %); ZeRO-3 2 + 2 + 4 = 8 MiB (-50 %).

def memory_case(current: str = "ddp", zero1_mib: float = 12, zero2=(4, 2, 4), zero3=(2, 2, 4)) -> SimpleNamespace:
    layouts = [("ddp", 4, 4, 8), ("zero1", 4, 4, zero1_mib - 8), ("zero2", *zero2), ("zero3", *zero3)]
    whatif = frame([{"run": "A", "layout": lay, "dp": 2, "params_bytes": int(p * MIB), "grads_bytes": int(g * MIB),
                     "optimizer_bytes": int(o * MIB), "total_bytes": int((p + g + o) * MIB), "current": lay == current}
                    for lay, p, g, o in layouts], WHATIF_COLUMNS)
    pers = frame([{"run": "A", "rank": 0, "params_bytes": 4 * MIB, "params_at_rest_bytes": 4 * MIB, "grads_bytes": 4 * MIB,
                   "optimizer_bytes": 8 * MIB}], PERSISTENT)
    return fake(memory_whatif=whatif, persistent_memory=pers)


def test_persistent_memory_names_the_largest_component_and_the_next_stage(monkeypatch):
    monkeypatch.setattr("profiler.findings_memory.SMALL_STATE_BYTES", 0)  # the case's MiB stand for a real model's GiB
    f = only(F.persistent_memory_rule(memory_case()))
    # scored by what the first change (zero1: 16 -> 12 MiB) is worth, 25 %; zero3's 50 % is named after it
    assert (f["rule"], f["rank"], f["score"]) == ("persistent-memory", 0, 25.0)
    assert f["text"] == ("Optimizer state is the largest persistent memory on rank 0: 8.00 MiB of 16.0 MiB (50.0 %, run.json); "
                         "zero1, the next stage, would hold 12.0 MiB per rank (−25.0 %), zero3, the smallest, 8.00 MiB (−50.0 %).")
    assert f["change"].startswith("switch to zero1: shard optimizer state")
    # torch's ZeroRedundancyOptimizer is not DeepSpeed's ZeRO-1: all-reduce 2Φ + parameter broadcast Φ
    assert "2Φ per step in DeepSpeed's design" in f["change"] and "3Φ, 1.5× DDP" in f["change"]
    assert "; for the most memory, switch to zero3: shard parameters too" in f["change"]


def test_persistent_memory_threshold_is_on_the_largest_saving(monkeypatch):
    monkeypatch.setattr("profiler.findings_memory.SMALL_STATE_BYTES", 0)
    # On zero1 (12 MiB) torch's ZeRO-2 keeps the gathered 4 MiB beside its 1.5 MiB shard: 5.5 + 2 + 4
    # = 11.5 MiB, −0.5/12 = −4.17 % (below 10 %), while zero3 holds 8 MiB: −4/12 = −33.3 %.
    f = only(F.persistent_memory_rule(memory_case(current="zero1", zero2=(5.5, 2, 4))))
    assert f["score"] == pytest.approx(100 / 3)
    assert f["text"].endswith("; zero2, the next stage, would hold 11.5 MiB per rank (−4.17 %), zero3, the smallest, 8.00 MiB "
                              "(−33.3 %); torch's ZeRO-2 (FSDP2 reshard_after_forward=False) holds 5.50 MiB of parameters "
                              "while training, more than the textbook ZeRO-2's one replica (4.00 MiB): it keeps the gathered "
                              "parameters beside its shard.")
    assert f["change"].startswith("switch to zero3: shard parameters too")
    # every layout within 10 %: nothing (zero3 11 MiB: −8.33 %)
    assert F.persistent_memory_rule(memory_case(current="zero1", zero2=(5.5, 2, 4), zero3=(5, 2, 4))) == []


def test_persistent_memory_from_the_theory_without_run_json_sizes():
    m = memory_case()
    m.theory_memory = frame([{"run": "A", "rank": 1, "params_bytes": 4 * MIB, "grads_bytes": 4 * MIB, "optimizer_bytes": 8 * MIB,
                              "params_at_rest_bytes": 4 * MIB}], MEMORY_COLUMNS)
    m.persistent_memory = frame([], PERSISTENT)
    f = only(F.persistent_memory_rule(m))
    assert f["rank"] == 1 and "8.00 MiB of 16.0 MiB (50.0 %, theory)" in f["text"]


def test_persistent_memory_is_silent_at_the_last_stage_and_below_its_threshold():
    assert F.persistent_memory_rule(memory_case(current="zero3")) == []
    assert F.persistent_memory_rule(memory_case(zero1_mib=15.5, zero2=(4, 4, 7.5), zero3=(4, 4, 7))) == []  # −6.25 % < 10 %
    assert F.persistent_memory_rule(fake()) == []  # no run.json: no what-if


# ---------------------------------------------------------------------------------------------
# 4. stragglers: 5 collectives of group [0, 1, 2, 3], spreads 100 x 4 + 200 = 600 µs (mean 120),
# against a 4000 µs step: 15 %; rank 3 last in 4 of 5 (80 %).

def straggler_case(window: float = 4000.0, share_3: float = 80.0, times_3: int = 4, starts=(0.0, 1e3, 2e3, 3e3, 4e3),
                   group: str | None = "[0, 1, 2, 3]") -> SimpleNamespace:
    g = group
    skew = pl.DataFrame({"run": "A", "group": g, "algo": "all_reduce", "seq": range(5), "n_ranks": 4, "collective": "all_reduce",
                         "first_start_us": list(starts), "spread_us": [100.0, 100.0, 100.0, 100.0, 200.0],
                         "last_rank": [3, 3, 3, 3, 2]})
    strag = pl.DataFrame({"run": "A", "group": g, "rank": [3, 2], "times_last": [times_3, 5 - times_3],
                          "mean_spread_us": [100.0, 200.0], "share_pct": [share_3, 100 - share_3]})
    b = frame([{"run": "A", "rank": k, "window_us": window} for k in range(4)], BREAKDOWN)
    bs = frame([{"run": "A", "rank": k, "step": s, "window_us": window / 2} for k in range(4) for s in (1, 2)],
               BREAKDOWN | {"step": pl.Int64})
    return fake(ranks=range(4), skew=skew, stragglers=strag, breakdown=b, breakdown_steps=bs)


def test_straggler_named_with_its_share():
    f = only(F.straggler_rule(straggler_case()))
    assert (f["rule"], f["rank"], f["score"]) == ("straggler", 3, 15.0)
    # the 600 µs is a total over the two profiled steps (4000 µs of window)
    assert f["text"] == ("Ranks of group [0, 1, 2, 3] start their collectives 120 µs apart on average: over steps 1, 2, for 600 µs "
                         "in all at least one rank is waiting for a later one (not always the same rank), 15.0 % of the "
                         "profiled window; rank 3 is the last to start in 80.0 % of them (4 of 5).")
    assert "all_reduce #4, 200 µs, last rank 2" in f["evidence"]


def test_an_expert_parallel_straggler_is_pointed_at_its_routing():
    """An ep run's last-in rank received the most routed tokens (the theory table said 294 pairs
    against 250 sent) and was told to look at data loading (trial): its change names the routing."""
    case = straggler_case()
    case.runs = {"A": {"paradigm": "ep"}}
    f = only(F.straggler_rule(case))
    assert f["change"].startswith("in expert parallelism the last rank is often the one whose experts got the most "
                                  "tokens; balance the routing")
    # with the theory's routing notes, the rank's received pairs beside the others' (means over steps 1, 2, by hand)
    notes = [(r, st, f"routing of step {st}: 250 pairs sent, {recv} received")
             for r, st, recv in [(3, 1, 300), (3, 2, 290), (0, 1, 200), (0, 2, 210), (1, 1, 240), (1, 2, 250), (3, 9, 999)]]
    case.theory_comm = pl.DataFrame({"run": ["A"] * len(notes), "rank": [n[0] for n in notes], "step": [n[1] for n in notes],
                                     "note": [n[2] for n in notes]})
    assert only(F.straggler_rule(case))["change"].startswith(
        "in expert parallelism the last rank is often the one whose experts got the most tokens (rank 3's experts "
        "received 295 routed pairs a step, the others' 225: Predicted communication")
    del case.theory_comm
    assert f["change"].endswith("and failing that, look at what rank 3 does before its collectives that the others do not "
                                "(data loading, logging or checkpointing on that rank, a slower device or a busy host); "
                                "give it less work")
    case.runs = {"A": {"paradigm": "ddp"}}
    assert only(F.straggler_rule(case))["change"].startswith("look at what rank 3 does")


def test_skew_without_a_straggler():
    f = only(F.straggler_rule(straggler_case(share_3=60.0, times_3=3)))
    assert f["rank"] is None and "no one rank is last consistently" in f["text"]


def test_consistent_last_rank_over_too_few_collectives_is_said_not_denied():
    # rank 3 last in 3 of 5 would be 60 %; here it is last in all 3 counted but < 4 times: too few
    f = only(F.straggler_rule(straggler_case(share_3=100.0, times_3=3)))
    assert f["rank"] is None and "no one rank is last consistently" not in f["text"]
    assert "rank 3 is the last to start in 3 of 5, too few collectives (< 4) to call it a straggler" in f["text"]


def test_concurrent_collectives_wait_once():
    # the first four start together: their waits overlap, [0, 100) once, then [4000, 4200): 300 µs
    f = only(F.straggler_rule(straggler_case(window=2000.0, starts=(0.0, 0.0, 0.0, 0.0, 4e3))))
    assert "for 300 µs in all at least one rank is waiting for a later one" in f["text"]


def test_straggler_is_silent_below_its_threshold_and_without_a_group():
    assert F.straggler_rule(straggler_case(window=40000.0)) == []  # 1.5 % < 5 %
    assert F.straggler_rule(straggler_case(group=None)) == []  # unknown group: instances may not match


# ---------------------------------------------------------------------------------------------
# 5. communication volume: all-gather 1.5 MiB measured against 1 MiB predicted (above); rank 0's
# communication is 400 of 1000 µs: 40 % x (1.5 - 1) / 1.5 = 13.3 % of the step.

def volume_case(comm_us: float = 400.0) -> SimpleNamespace:
    check = frame([
        {"run": "A", "rank": 0, "quantity": "all_gather bytes", "unit": "bytes", "predicted": 1.0 * MIB, "measured": 1.5 * MIB,
         "ratio": 1.5, "verdict": "above", "note": "3Φ"},
        {"run": "A", "rank": 0, "quantity": "reduce_scatter bytes", "unit": "bytes", "predicted": 1.0 * MIB, "measured": 1.0 * MIB,
         "ratio": 1.0, "verdict": "match"},
        {"run": "A", "rank": 0, "quantity": "params_bytes", "unit": "bytes", "predicted": 1.0, "measured": 9.0, "ratio": 9.0,
         "verdict": "above"},  # memory: not this rule's
    ], CHECK_COLUMNS)
    return fake(theory_check=check, breakdown=frame([{"run": "A", "rank": 0, "window_us": 1000.0, "comm_us": comm_us}], BREAKDOWN))


def test_comm_volume_against_the_formula():
    f = only(F.comm_volume_rule(volume_case()))
    assert (f["rule"], f["rank"]) == ("comm-volume", 0) and f["score"] == pytest.approx(40 * 0.5 / 1.5)
    assert f["text"] == ("all_gather bytes on rank 0 is 1.50 MiB, 1.50× the textbook 1.00 MiB (1 of 2 communication quantities "
                         "differ; communication is 40.0 % of the step).")
    assert "3Φ" in f["evidence"]


def test_comm_volume_is_silent_below_its_threshold():
    assert F.comm_volume_rule(volume_case(comm_us=20.0)) == []  # 2 % x 1/3 = 0.67 % < 1 %


# ---------------------------------------------------------------------------------------------
# 6. bandwidth (Analysis.alpha_beta_calls). Latency: α = 100 µs, β = 1 GB/s (1000 B/µs); 10
# all-reduces of 1000 B take 101 µs each (predicted 100 + 1). Achieved 10000 B / 1010 µs = 0.0099
# GB/s (0.99 % of β); α is 1000 / 1010 = 99.0 % of the predicted time; 10 x 100 µs = 10 % of the
# 10 ms step. Waiting: α = 10 µs, 10 calls of 100 000 B predicted 10 + 100 = 110 µs take 1100 µs:
# 1e6 B / 11 000 µs = 0.0909 GB/s (9.09 %); α 100 / 1100 = 9.09 % of the prediction; 10 x 990 µs
# = 9.90 ms beyond the fit, 9.90 % of a 100 ms step.

def bandwidth_case(window: float = 10_000.0, r2: float = 0.99, alpha: float = 100.0, size: int = 1000,
                   dur: float = 101.0, n: int = 10) -> SimpleNamespace:
    fit = frame([{"run": "A", "backend": "gloo", "collective": "all_reduce", "group_size": 2, "n_calls": n, "n_sizes": 3,
                  "alpha_us": alpha, "beta_gbps": 1.0, "r2": r2}], FIT_COLUMNS)
    calls = [{"run": "A", "rank": 0, "step": 1, "seq": i, "backend": "gloo", "collective": "all_reduce", "group_size": 2,
              "size_bytes": size, "dur_us": dur, "predicted_us": alpha + size / 1000, "beta_gbps": 1.0,
              "algbw_gbps": size / dur / 1e3, "bw_vs_beta": size / dur / 1e3} for i in range(n)]
    calls.append(calls[0] | {"step": None, "seq": 99, "dur_us": 1e9})  # outside the profiled steps: left out
    steps = frame([{"run": "A", "rank": 0, "step": 1, "window_us": window}], BREAKDOWN | {"step": pl.Int64})
    return fake(alpha_beta=fit, alpha_beta_calls=frame(calls, PREDICT_COLUMNS), breakdown_steps=steps)


def test_latency_bound_collectives():
    f = only(F.bandwidth_rule(bandwidth_case()))
    assert (f["rule"], f["score"]) == ("bandwidth", pytest.approx(10.0))
    assert f["text"] == ("all_reduce on 2 ranks reaches 0.00990 GB/s over its 10 calls (all ranks), 0.990 % of its fitted β 1.00 GB/s: the "
                         "per-call latency α = 100 µs is 99.0 % of the time α + n/β predicts for them (median message 1000 B); "
                         "10 calls a step on each rank, on average, × α are 1.00 ms, 10.0 % of its step.")
    assert "fewer, larger messages" in f["change"] and "bucket_cap_mb" in f["change"]  # an all-reduce
    # an all-to-all has no DDP bucket nor FSDP unit to grow (trial)
    case = bandwidth_case()
    case.alpha_beta = case.alpha_beta.with_columns(collective=pl.lit("all_to_all"))
    case.alpha_beta_calls = case.alpha_beta_calls.with_columns(collective=pl.lit("all_to_all"))
    change = only(F.bandwidth_rule(case))["change"]
    assert "batch several calls into one" in change and "bucket" not in change and "FSDP" not in change


def test_slow_collectives_with_a_small_alpha_are_waiting_not_latency():
    f = only(F.bandwidth_rule(bandwidth_case(window=100_000.0, alpha=10.0, size=100_000, dur=1100.0)))
    assert f["score"] == pytest.approx(9.9)
    assert f["text"] == ("all_reduce on 2 ranks reaches 0.0909 GB/s over its 10 calls (all ranks), 9.09 % of its fitted β 1.00 GB/s, while "
                         "α + n/β predicts 1.10 ms for them and they take 11.0 ms (10.0×); α is only 9.09 % of the prediction, "
                         "so the gap is waiting (for a later rank, or for a link shared with other traffic), not latency: "
                         "9.90 ms beyond the fit over all ranks and steps, 9.90 % of each rank's step, on average.")
    assert "straggler" in f["change"] and "larger messages" not in f["change"]


def test_bandwidth_is_silent_below_its_threshold_and_on_a_poor_fit():
    assert F.bandwidth_rule(bandwidth_case(window=100_000.0)) == []  # 1 % < 5 %
    assert F.bandwidth_rule(bandwidth_case(r2=0.5)) == []
    # 10 calls of 1 MB in 1001 µs: 99.9 % of β, nothing lost
    assert F.bandwidth_rule(bandwidth_case(alpha=1.0, size=1_000_000, dur=1001.0)) == []


# ---------------------------------------------------------------------------------------------
# Counts in a finding's sentences are printed with thousands separators ("2,020 calls"), as
# fmt_count prints them in the tables.

def test_exposed_comm_counts_calls_with_thousands_separators():
    e = exposed_case()
    e.exposed = e.exposed.with_columns(calls=pl.Series([2020, 2]))
    assert "75.0 % of the exposed time, in 2,020 calls" in only(F.exposed_comm_rule(e))["text"]


def test_bandwidth_counts_calls_with_thousands_separators():
    # bandwidth_case's latency case with 1200 calls, the window 120x: still 1200 x 100 µs = 10 % of the step
    f = only(F.bandwidth_rule(bandwidth_case(window=1_200_000.0, n=1200)))
    assert f["text"].startswith("all_reduce on 2 ranks reaches 0.00990 GB/s over its 1,200 calls (all ranks),")
    assert "1,200 calls a step on each rank, on average, × α are 120 ms, 10.0 % of its step" in f["text"]
    assert "1,200 calls in the profiled steps" in f["evidence"] and "over 1,200 calls of 3 sizes" in f["evidence"]


def test_straggler_counts_collectives_with_thousands_separators():
    # straggler_case's 5 collectives 250 times over (1,250, 5 ms apart): 250 x 600 µs against a 1 s window, 15 %;
    # rank 3 last in 1,000 of 1,250 (80 %)
    e = straggler_case(window=1e6, times_3=1000)
    e.skew = pl.concat([e.skew.with_columns(seq=pl.col("seq") + 5 * k, first_start_us=pl.col("first_start_us") + 5e3 * k)
                        for k in range(250)])
    e.stragglers = e.stragglers.with_columns(times_last=pl.Series([1000, 250], dtype=pl.UInt32))
    f = only(F.straggler_rule(e))
    assert f["score"] == pytest.approx(15.0) and "rank 3 is the last to start in 80.0 % of them (1,000 of 1,250)" in f["text"]
    assert f["evidence"].startswith("run A, group [0, 1, 2, 3], 1,250 collectives;")


# ---------------------------------------------------------------------------------------------
# 7. activation share: a 100 MiB CUDA peak beside 4 + 4 + 8 = 16 MiB of persistent state: 84 %
# (Analysis.activation, theory_memory.activation_peak's frame).

def activation_case(peak_mib: int = 100, device: str = "cuda:0", persistent_mib: int | None = 16) -> SimpleNamespace:
    p = None if persistent_mib is None else persistent_mib * MIB
    act = None if p is None else max(0, peak_mib * MIB - p)
    row = {"run": "A", "rank": 0, "mem_device": device, "peak_allocated_bytes": peak_mib * MIB, "persistent_bytes": p,
           "footprint_bytes": None if p is None else peak_mib * MIB, "activation_bytes": act,
           "activation_pct": None if p is None else 100 * act / (peak_mib * MIB),
           "basis": "device counter (includes everything): activation = peak − persistent"}
    return fake(activation=frame([row], ACTIVATION_COLUMNS))


def test_activation_share_of_the_peak():
    f = only(F.activation_memory_rule(activation_case()))
    assert (f["rule"], f["rank"], f["score"]) == ("activation-memory", 0, 84.0)
    assert f["text"] == ("Activations and temporaries are 84.0 % of rank 0's memory at its peak (84.0 MiB of 100 MiB on "
                         "cuda:0; parameters, gradients and optimizer state hold 16.0 MiB).")
    assert "device counter" in f["evidence"] and "checkpointing" in f["change"]


def test_activation_share_is_silent_without_theory_and_below_its_threshold():
    assert F.activation_memory_rule(activation_case(persistent_mib=None)) == []  # no run.json dims: no share
    assert F.activation_memory_rule(activation_case(peak_mib=30)) == []  # 14 / 30 = 46.7 % < 50 %
    assert F.activation_memory_rule(activation_case(peak_mib=10)) == []  # below the persistent bytes: 0, nothing said


# ---------------------------------------------------------------------------------------------
# 8. comparison: A's step 1000 µs (compute 600, idle 100, all-reduce exposed in backward 250,
# other non-compute 50); B's 2000 µs (compute 700, idle 200, all-gather in forward 800,
# reduce-scatter in backward 200, other 100). Difference +1000: all-gather +800 = 80 %.

def compare_case(order=("A", "B"), b_scale: float | None = None) -> SimpleNamespace:
    """b_scale: B is A with every time scaled by it (instead of the case above)."""
    a = {"run": "A", "rank": 0, "step": 1, "window_us": 1000.0, "compute_us": 600.0, "idle_us": 100.0, "non_compute_us": 300.0,
         "exposed_comm_us": 250.0}
    b = {"run": "B", "rank": 0, "step": 1, "window_us": 2000.0, "compute_us": 700.0, "idle_us": 200.0, "non_compute_us": 1100.0,
         "exposed_comm_us": 1000.0}
    a_exp = {"run": "A", "rank": 0, "step": 1, "collective": "all_reduce", "phase": "backward", "exposed_us": 250.0}
    b_exp = [{"run": "B", "rank": 0, "step": 1, "collective": "all_gather", "phase": "forward", "exposed_us": 800.0},
             {"run": "B", "rank": 0, "step": 1, "collective": "reduce_scatter", "phase": "backward", "exposed_us": 200.0}]
    if b_scale:
        b = {k: v * b_scale if k.endswith("_us") else v for k, v in a.items()} | {"run": "B"}
        b_exp = [a_exp | {"run": "B", "exposed_us": 250.0 * b_scale}]
    c = fake(runs=order, breakdown_steps=frame([a, b], BREAKDOWN | {"step": pl.Int64}),
             exposed=frame([a_exp, *b_exp], EXPOSED_COLUMNS | {"run": pl.String}))
    c.runs = {r: RUN_JSON for r in order}
    return c


RUN_JSON = {"model": {"vocab_size": 256, "d_model": 64, "n_layers": 2, "seq_len": 32, "n_params": 133760}, "global_batch_size": 8}


def test_comparison_only_between_runs_of_one_model_and_at_most_two():
    c = compare_case()
    c.runs = {"A": RUN_JSON, "B": RUN_JSON | {"model": RUN_JSON["model"] | {"d_model": 128}}}
    assert F.comparison_rule(c) == []  # another model
    c.runs = {"A": RUN_JSON, "B": RUN_JSON | {"model": RUN_JSON["model"] | {"n_params": 232320}}}
    assert F.comparison_rule(c) == []  # the same dims with MoE experts (ep-2's 232,320 parameters)
    c.runs = {"A": RUN_JSON, "B": RUN_JSON | {"global_batch_size": 16}}
    assert F.comparison_rule(c) == []  # another global batch
    c.runs = {"A": None, "B": None}
    assert F.comparison_rule(c) == []  # no run.json (foreign traces): nothing said
    # four runs of one model, B, C, D each slower than A (2, 3, 4 ms): three comparisons, the two largest kept
    c = compare_case()
    rows = c.breakdown_steps.to_dicts()
    extra = [rows[1] | {"run": r, "window_us": w, "non_compute_us": w - 900.0} for r, w in (("C", 3000.0), ("D", 4000.0))]
    c.breakdown_steps = frame(rows + extra, BREAKDOWN | {"step": pl.Int64})
    c.ranks = pl.DataFrame({"run": ["A", "B", "C", "D"], "rank": [0, 0, 0, 0]})
    c.runs = {r: RUN_JSON for r in "ABCD"}
    out = F.comparison_rule(c)
    assert [r["score"] for r in out] == [75.0, pytest.approx(200 / 3)]  # D: 3/4, C: 2/3; B's 50 % left out
    assert [r["text"].split("'s")[0] for r in out] == ["D", "C"]


def test_comparison_names_the_main_cause():
    f = only(F.comparison_rule(compare_case()))
    assert (f["rule"], f["run"], f["rank"], f["score"]) == ("comparison", None, None, 50.0)
    assert f["text"] == "B's step is 2.00× A's (2.00 ms vs 1.00 ms); 80.0 % of the difference is all_gather exposed in forward (+800 µs)."
    assert f["evidence"] == ("mean per rank and step, B minus A: all_gather exposed in forward +800 µs, all_reduce exposed in "
                             "backward −250 µs, reduce_scatter exposed in backward +200 µs, compute +100 µs")
    assert "forward_prefetch" in f["change"]
    # B first: the same finding, B still the slower one
    g = only(F.comparison_rule(compare_case(order=("B", "A"))))
    assert g["text"] == f["text"] and g["evidence"] == f["evidence"]


def test_comparison_when_one_part_outgrows_the_difference():
    # B: compute 0, idle 100, the same exposed collectives as above (1000), other 100: a 1200 µs step
    c = compare_case()
    steps = frame([
        {"run": "A", "rank": 0, "step": 1, "window_us": 1000.0, "compute_us": 600.0, "idle_us": 100.0, "non_compute_us": 300.0,
         "exposed_comm_us": 250.0},
        {"run": "B", "rank": 0, "step": 1, "window_us": 1200.0, "compute_us": 0.0, "idle_us": 100.0, "non_compute_us": 1100.0,
         "exposed_comm_us": 1000.0},
    ], BREAKDOWN | {"step": pl.Int64})
    c.breakdown_steps = steps
    # deltas: compute -600, idle 0, all_reduce -250, all_gather +800, reduce_scatter +200, other +50: +200 in all
    f = only(F.comparison_rule(c))
    assert f["text"] == ("B's step is 1.20× A's (1.20 ms vs 1.00 ms); all_gather exposed in forward adds 800 µs, more than the "
                         "whole difference (200 µs; other parts take less time).")


def test_comparison_is_silent_for_close_runs_and_one_run():
    assert "B's step is 1.06× A's" in only(F.comparison_rule(compare_case(b_scale=1.06)))["text"]  # 5.66 % of B's step
    assert F.comparison_rule(compare_case(b_scale=1.04)) == []  # 3.85 % < 5 %
    assert F.comparison_rule(exposed_case()) == []


# ---------------------------------------------------------------------------------------------
# All rules together


# 9. idle: rank 1's GPU idle 300 of 1000 µs (30 %), rank 0's 100 (10 %); a gloo rank's idle is no device's

def idle_case(idle_1: float = 300.0, device: str = "gpu") -> SimpleNamespace:
    b = frame([{"run": "A", "rank": 0, "window_us": 1000.0, "idle_us": 100.0},
               {"run": "A", "rank": 1, "window_us": 1000.0, "idle_us": idle_1}], BREAKDOWN).with_columns(device=pl.lit(device))
    top = pl.DataFrame({"run": "A", "rank": [1, 1], "name": ["DataLoader.__next__", "aten::copy_"],
                        "count": [2, 5], "self_us": [250.0, 20.0], "total_us": [260.0, 20.0]})
    return fake(ranks=(0, 1), breakdown=b, top_operators=top)


def test_idle_gpu_names_the_rank_and_the_host_work():
    f = only(F.idle_rule(idle_case()))
    assert (f["rule"], f["rank"], f["score"]) == ("idle", 1, 30.0)
    assert f["text"] == ("The GPU of rank 1 has nothing to run for 30.0 % of its profiled window (300 µs of 1.00 ms): "
                         "the step waits on the host.")
    assert f["evidence"] == ("run A, rank 1 (the worst of 2); top CPU operators by self time: DataLoader.__next__ 250 µs, "
                             "aten::copy_ 20.0 µs")
    assert "DataLoader workers" in f["change"]


def test_idle_of_a_device_active_in_part_of_its_steps_counts_the_rest_as_the_hosts():
    # rank 1's GPU: a 1 ms window with 300 µs idle, inside 4 ms of steps (report.late_devices): the
    # 3 ms outside the window are the host's too, (3000 + 300) / 4000 = 82.5 %
    case = idle_case()
    case.late_devices = pl.DataFrame({"run": ["A"], "rank": [1], "span_us": [4000.0]})
    f = only(F.idle_rule(case))
    assert (f["rank"], f["score"]) == (1, 82.5)
    assert f["text"] == ("The GPU of rank 1 has nothing to run for 82.5 % of its profiled steps (3.30 ms of 4.00 ms: "
                         "3.00 ms before its first work or after its last, 300 µs between): the step waits on the host.")


def test_idle_names_an_mtia_device_as_such():
    case = idle_case()
    case.ranks = case.ranks.with_columns(device_kind=pl.lit("mtia"))
    f = only(F.idle_rule(case))
    assert f["text"].startswith("The MTIA device of rank 1 has nothing to run for 30.0 % of its profiled window")


def test_idle_is_silent_below_its_threshold_and_on_cpu_ranks():
    assert F.idle_rule(idle_case(idle_1=140.0)) == []  # 14 % < 15 %
    assert F.idle_rule(idle_case(device="cpu")) == []  # gloo ranks: no device to starve


def test_findings_are_ranked_by_score_and_follow_the_schema():
    a = pipeline_case()  # 30
    m, e = memory_case(), exposed_case()  # 25 (zero1's saving, the first change), 20
    a = SimpleNamespace(**(vars(a) | {"memory_whatif": m.memory_whatif, "persistent_memory": m.persistent_memory,
                                      "breakdown": e.breakdown, "breakdown_steps": e.breakdown_steps, "exposed": e.exposed}))
    out = findings(a)
    assert out.columns == list(FINDING_COLUMNS) and out.schema == pl.Schema(FINDING_COLUMNS)
    assert out["rule"].to_list() == ["pipeline-bubble", "persistent-memory", "exposed-comm"]
    assert out["score"].to_list() == [30.0, 25.0, 20.0]


def test_no_input_no_findings():
    out = findings(fake())
    assert out.is_empty() and out.columns == list(FINDING_COLUMNS)


def test_no_finding_holds_a_non_finite_number():
    cases = [exposed_case(), exposed_case(phase=None), pipeline_case(), pipeline_case(split=(10.0, 15.0, 6.0)), memory_case(),
             straggler_case(), volume_case(), bandwidth_case(), activation_case(), compare_case()]
    out = pl.concat([findings(c) for c in cases])
    assert out.height == len(cases)
    text = " ".join(out.select("text", "evidence", "change").to_numpy().ravel())
    assert not re.search(r"\b(nan|inf|None|null)\b", text, re.IGNORECASE)


def test_docs_name_every_rule_and_threshold():
    doc = (REPO / "docs" / "findings.md").read_text()
    for rule in F.RULES:
        assert f"`{rule}`" in doc, rule
    for name, value in vars(F).items():
        if re.fullmatch(r"[A-Z][A-Z0-9_]+_(PCT|TIMES|FRACTION|R2|FINDINGS)", name):
            assert f"`{name}` = {value:g}" in " ".join(doc.split()), name


# ---------------------------------------------------------------------------------------------
# Foreign traces and real runs


@pytest.mark.parametrize("path", [SHARED_TRACES / "gpu_nccl_2_of_128", SHARED_TRACES / "single" / "cpu_gloo_rank34_of_300.json.gz",
                                  SHARED_TRACES / "single" / "v100_nccl_memory_rank1.json.gz"])
def test_foreign_traces_give_findings_without_crashing(path):
    out = analyze(load_traces([path])).findings
    assert out.columns == list(FINDING_COLUMNS)
    assert all(math.isfinite(s) and 0 <= s <= 100 for s in out["score"])


@pytest.mark.multirank
def test_exposed_comm_on_fsdp(runs, monkeypatch):
    monkeypatch.setattr(F, "EXPOSED_COMM_MIN_PCT", 0.0)  # fire whatever the timing
    a = analyze(load_traces(runs("fsdp", 2)))
    f = only([r for r in findings(a).to_dicts() if r["rule"] == "exposed-comm"])
    b = a.breakdown.with_columns(share=100 * pl.col("exposed_comm_us") / pl.col("window_us")).sort("share", descending=True)
    assert f["rank"] == b["rank"][0] and f["score"] == pytest.approx(b["share"][0])
    # the (collective, phase) with the most exposed time, computed here from the exposed frame;
    # "most of it" when it holds half or more, else "the largest part" (timing decides which)
    by = (a.exposed.filter(pl.col("rank") == f["rank"]).group_by("collective", "phase").agg(pl.col("exposed_us").sum())
          .sort("exposed_us", descending=True))
    top, phase = by["collective"][0], by["phase"][0]
    assert top in ("all_gather", "reduce_scatter")
    assert re.search(rf"(most of it|the largest part) is {top} in {phase}: ", f["text"]), f["text"]


@pytest.mark.multirank
def test_straggler_on_a_ddp_run_with_a_slow_rank(tmp_path):
    # rank 1 sleeps 150 ms before every step's forward (the harness's PTPROF_FAULT test hook), so it
    # starts each step's gradient all-reduce last: 4 profiled steps, rank 1 last in at least those 4.
    # Warmup 2: step 1 also has DDP's one-time broadcasts, the first of which absorbs the wait.
    res = ptprof("run", "ddp", "--gpus", "2", "--steps", "6", "--warmup", "2", "--active", "4", "--out", str(tmp_path),
                 "--name", "slow", "--timeout", "120", env={"PTPROF_FAULT": "slow@1:150"})
    assert res.returncode == 0, res.stderr
    a = analyze(load_traces(tmp_path / "slow"))
    f = only([r for r in findings(a).to_dicts() if r["rule"] == "straggler"])
    assert f["rank"] == 1
    last, of = map(int, re.search(r"rank 1 is the last to start in [\d.]+ % of them \((\d+) of (\d+)\)", f["text"]).groups())
    assert last >= 4 and last / of >= F.STRAGGLER_MIN_SHARE_PCT / 100
    # each wait is about the sleep: 4 x ~150 ms over 4 steps of at least 150 ms each
    assert f["score"] >= F.SKEW_MIN_PCT


@pytest.mark.multirank
def test_activation_memory_on_an_fsdp_run_with_profile_memory(runs):
    # the CPU counter sees only what each step allocates: on fsdp the gathered parameters and gradients
    # are re-allocated, the rest of the peak is activations (docs/theory.md, "Activation share")
    a = analyze(load_traces(runs("fsdp", 2, "--profile-memory")))
    act = a.activation.sort("activation_pct", descending=True).row(0, named=True)
    assert 0 < act["activation_bytes"] < act["footprint_bytes"]
    # allocation sizes do not depend on timing: ~60 % on this tiny model (samples: 60.7-62.5 %)
    assert act["activation_pct"] >= F.ACTIVATION_MIN_PCT
    f = only([r for r in findings(a).to_dicts() if r["rule"] == "activation-memory"])
    assert f["rank"] == act["rank"] and f["score"] == pytest.approx(act["activation_pct"])


@pytest.mark.multirank
def test_persistent_memory_on_ddp(runs):
    # The ZeRO table for this run's own model (fp32 AdamW: 4 + 4 + 8 bytes per parameter, dp 2),
    # computed here from run.json's parameter count, beside the memory run.json measured.
    a = analyze(load_traces(runs("ddp", 2)))
    run = a.ranks["run"][0]
    phi = a.runs[run]["model"]["n_params"] * 4
    table = [("ddp", phi, phi, 2 * phi), ("zero1", phi, phi, phi), ("zero2", phi, phi // 2, phi), ("zero3", phi // 2, phi // 2, phi)]
    whatif = frame([{"run": run, "layout": lay, "dp": 2, "params_bytes": p, "grads_bytes": g, "optimizer_bytes": o,
                     "total_bytes": p + g + o, "current": lay == "ddp"} for lay, p, g, o in table], WHATIF_COLUMNS)
    f = only(F.persistent_memory_rule(dataclasses.replace(a, memory_whatif=whatif)))
    # scored by the first change, zero1: Φ of 4Φ saved (zero3's 2Φ of 4Φ, 50 %, is named after it)
    assert f["score"] == pytest.approx(25.0)
    mem = a.runs[run]["ranks"][0]["memory"]
    assert mem["optimizer_bytes"] > mem["params_bytes"]  # AdamW's two moments
    assert f["text"].startswith("Optimizer state is the largest persistent memory") and "zero1, the next stage, would hold" in f["text"]


@pytest.mark.multirank
def test_persistent_memory_on_ddp_from_the_memory_theory(runs):
    a = analyze(load_traces(runs("ddp", 2)))
    f = only([r for r in findings(a).to_dicts() if r["rule"] == "persistent-memory"])
    cur = a.memory_whatif.filter(pl.col("current"))
    z1 = a.memory_whatif.filter(pl.col("layout") == "zero1")
    assert cur["layout"][0] == "ddp"
    # zero1 at 2 ranks halves AdamW's 8 B/param of ddp's 16: 25 % (torch's whole-tensor partition and
    # the step scalars leave the fuller rank 24.7 %)
    assert f["score"] == pytest.approx(25.0, abs=0.5)
    assert f"zero1, the next stage, would hold {F.bytes_text(z1['total_bytes'][0])}" in f["text"]
    # a test-sized model (a few MiB): said to limit nothing, the change made conditional
    assert f["change"].startswith("if memory limits the model or the batch: switch to zero1")
    assert "memory limits nothing here: the shares carry to a larger model" in f["text"]


@pytest.mark.multirank
def test_comparison_on_ddp_and_fsdp(runs, monkeypatch):
    monkeypatch.setattr(F, "COMPARE_MIN_PCT", 0.0)
    a = analyze(load_traces([runs("ddp", 2), runs("fsdp", 2)]))
    f = only([r for r in findings(a).to_dicts() if r["rule"] == "comparison"])
    step = a.breakdown_steps.group_by("run").agg(pl.col("window_us").mean()).sort("window_us", descending=True)
    slow, fast = step["run"].cast(pl.String).to_list()
    assert f["text"].startswith(f"{slow}'s step is {F.num(step['window_us'][0] / step['window_us'][1])}× {fast}'s")
    assert f["score"] == pytest.approx(100 * (step["window_us"][0] - step["window_us"][1]) / step["window_us"][0])


@pytest.mark.multirank
def test_pipeline_bubble_on_an_unbalanced_1f1b(runs, monkeypatch):
    # 1F1B over 2 ranks, the last stage holding 7 of tiny8's 8 blocks: the bubble is mostly stage
    # imbalance, and the slowest stage is stage 1 on rank 1.
    monkeypatch.setattr(F, "BUBBLE_MIN_PCT", 0.0)  # fire whatever the timing
    a = analyze(load_traces(runs("1f1b", 2, "--model", "tiny8", "--microbatches", "4", "--stage-layers", "1,7")))
    f = only([r for r in findings(a).to_dicts() if r["rule"] == "pipeline-bubble"])
    assert f["rank"] == 1 and "the slowest stage is stage 1 (rank 1)" in f["text"]
    imbalance = a.pipeline["imbalance_pct"].mean()
    assert f"{F.pct(imbalance)} stage imbalance" in f["text"]
    # the imbalance (well over BUBBLE_PART_MIN_PCT with 7 blocks against 1) gets its change, whatever
    # else the shared CPUs add in communication wait
    assert "move layers off stage 1" in f["change"]


def test_numbers_in_human_units():
    from profiler.findings_text import bytes_text, collective_change, ms, num, pct, steps_text

    assert [num(x) for x in (0.0123456, 1.23456, 12.3456, 123.456, 1234.5)] == ["0.0123", "1.23", "12.3", "123", "1234"]
    assert (pct(92.04), ms(875.0), ms(8751.8), ms(1.5e6)) == ("92.0 %", "875 µs", "8.75 ms", "1.50 s")
    assert (bytes_text(800), bytes_text(1536), bytes_text(3 * MIB), bytes_text(2**31)) == ("800 B", "1.50 KiB", "3.00 MiB", "2.00 GiB")
    assert (steps_text([2]), steps_text([1, 2]), steps_text([5, 3, 4]), steps_text([1, 3, 4])) == (
        "step 2", "steps 1, 2", "steps 3–5", "steps 1, 3, 4")
    assert steps_text([-1]) == "the profiled window (no ProfilerStep)"  # not "step -1" (trial)
    # by collective and phase, then by collective, then a generic one; recv is a pipeline transfer like send
    assert "forward_prefetch" in collective_change("all_gather", "forward")
    assert collective_change("recv", None) == collective_change("send", "backward")
    assert collective_change("barrier", None) == collective_change(None, None)


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf")])
def test_missing_or_impossible_numbers_give_no_finding(bad):
    # every float (and every byte count, null) of every hand-made case replaced: nothing to say, and no crash
    cases = [exposed_case(), pipeline_case(), pipeline_case(split=(10.0, 15.0, 6.0)), memory_case(), straggler_case(),
             volume_case(), bandwidth_case(), activation_case(), compare_case()]
    for case in cases:
        spoilt = {k: (v.with_columns(pl.col(pl.Float64).fill_null(0.0) * 0 + pl.lit(bad, pl.Float64),
                                     pl.col("^.*_bytes$").cast(pl.Int64) * pl.lit(None, pl.Int64))
                      if isinstance(v, pl.DataFrame) else v) for k, v in vars(case).items()}
        assert findings(SimpleNamespace(**spoilt)).is_empty(), case


def test_pipeline_transfers_keep_their_words_in_the_one_time_change_and_in_comparisons():
    from profiler.findings_compare import _cause_change
    from profiler.findings_text import one_time_change

    assert "this send between pipeline actions is no per-step cost" in one_time_change("send", None, pipeline=True)
    assert "this send (phase unknown) is no per-step cost" in one_time_change("send", None)
    # A comparison's cause is phase_text's words: any but "in <phase>" is no phase, and the change is the kind's.
    assert "neighbouring stage" in _cause_change("recv exposed between pipeline actions", "1f1b")
    assert "isend/irecv" in _cause_change("recv exposed (phase unknown)", None)
    assert "forward_prefetch" in _cause_change("all_gather exposed in forward", "fsdp")


def test_a_zero_bubble_pipeline_is_not_told_to_use_a_zero_bubble_schedule():
    from profiler.findings_text import collective_change

    for paradigm in ("zbv", "zero-bubble", "dualpipev"):
        change = collective_change("recv", None, paradigm, pipeline=True)
        assert "more microbatches cut it" in change and "or a zero-bubble schedule" not in change, change
        assert f"{paradigm} is a zero-bubble schedule already" in change
    for paradigm in ("1f1b", "gpipe", None):
        assert "more microbatches or a zero-bubble schedule cut it" in collective_change("send", None, paradigm, pipeline=True)


def test_the_schedule_a_pipeline_ran_decides_over_the_paradigm():
    from profiler.findings_text import collective_change

    # a hybrid run (paradigm "hybrid") whose pipeline ran zbv: no zero-bubble schedule to advise
    assert "hybrid" not in collective_change("recv", None, "hybrid", True, schedule="zbv")
    assert "zbv is a zero-bubble schedule already" in collective_change("recv", None, "hybrid", True, schedule="zbv")
    assert "or a zero-bubble schedule" in collective_change("recv", None, "hybrid", True, schedule="1f1b")


def test_exposed_comm_advice_fits_the_paradigm_and_the_message_size():
    """A tp+sp run's LayerNorm-gradient all-reduces (256 B) were told to tune DDP buckets, an ep
    run's 24 B router all-reduces to use async TP (trial): tiny messages are latency and waiting,
    a tp run has no DDP, fsdp's gradients are reduce-scattered."""
    from profiler.findings_text import SMALL_MESSAGE_BYTES, collective_change

    ddp = collective_change("all_reduce", "backward", "ddp", size_bytes=25 << 20)
    assert "bucket_cap_mb" in ddp and ddp == collective_change("all_reduce", "optimizer", None, size_bytes=None)
    tiny = collective_change("all_reduce", "optimizer", "ddp", size_bytes=256)
    assert tiny.startswith("each call moves only 256 B (median), so its time is latency and the wait for the slowest rank")
    # a tp+sp run's optimizer all-reduces: the cause the theory table gives, AdamW on Partial gradients (trial)
    sp = collective_change("all_reduce", "optimizer", "tp", size_bytes=256, sp=True)
    assert "AdamW (foreach=False) all-reduces each one on each of its 3 uses" in sp and "Replicate once" in sp
    # without --sp nothing is Partial there: no such cause named (review)
    assert "AdamW" not in collective_change("all_reduce", "optimizer", "tp", size_bytes=256)
    ep = collective_change("all_reduce", "forward", "ep", size_bytes=24)
    assert ep.startswith("each call moves only 24 B") and "make fewer such calls" in ep and "flat buffer" not in ep
    assert "flat buffer" in tiny  # gradients (optimizer phase) can wait for one buffer
    # the paradigm's own collectives keep their advice whatever their size: ep's dispatch, ring's blocks
    assert "capacity factor" in collective_change("all_to_all", "forward", "ep", size_bytes=512)
    assert "K/V block" in collective_change("recv", "forward", "ring", size_bytes=512)
    assert "each call moves only 512 B" in collective_change("send", "forward", None, size_bytes=512)  # no pipeline
    at_edge = collective_change("all_reduce", "backward", "ddp", size_bytes=SMALL_MESSAGE_BYTES)  # 64 KiB: bytes count
    assert "bucket_cap_mb" in at_edge
    tp = collective_change("all_reduce", "backward", "tp", size_bytes=4 << 20)
    assert "tensor-parallel all-reduces" in tp and "bucket" not in tp
    assert "bucket" not in collective_change("all_reduce", "backward", "fsdp", size_bytes=4 << 20)
    # a pipeline's small sends keep their own advice (a receive waits for the neighbouring stage)
    assert "neighbouring stage" in collective_change("recv", None, "1f1b", pipeline=True, size_bytes=512)
    # ptprof's ep runner all-reduces the shared gradients in one call after backward, without DDP (trial)
    ep_grads = collective_change("all_reduce", "backward", "ep", size_bytes=4 << 20)
    assert "wrap them in DDP" in ep_grads and "bucket_cap_mb" not in ep_grads


def test_bandwidth_of_a_group_the_trace_does_not_size_says_so():
    """gloo records no group size: the finding read "all_gather on None ranks" (trial, hybrid run)."""
    case = bandwidth_case()
    case.alpha_beta = case.alpha_beta.with_columns(group_size=pl.lit(None, pl.Int64))
    case.alpha_beta_calls = case.alpha_beta_calls.with_columns(group_size=pl.lit(None, pl.Int64))
    f = only(F.bandwidth_rule(case))
    assert f["text"].startswith("all_reduce on a group of unknown size reaches 0.00990 GB/s")
    assert "group size unknown (not in the trace): 10 calls" in f["evidence"] and "None" not in f["text"] + f["evidence"]


def test_persistent_memory_of_a_small_model_says_memory_limits_nothing():
    """A 2 MiB model was told to switch to zero1 as if memory were short (trial): under 1 GiB a rank
    the finding says the shares carry to a larger model, and its change is conditional."""
    f = only(F.persistent_memory_rule(memory_case()))
    assert f["score"] == 25.0  # the same saving, the same place among the findings
    assert f["text"].endswith("(−50.0 %); at 16.0 MiB a rank, memory limits nothing here: the shares carry to a larger "
                              "model of this layout, where they decide what fits.")
    assert f["change"].startswith("if memory limits the model or the batch: switch to zero1: shard optimizer state")


def test_from_torchs_zero2_the_next_stage_is_one_flag():
    """A hybrid run beside a pipeline already uses fully_shard (reshard_after_forward=False): told to
    "switch to fsdp (fully_shard)" (trial), it is told the flag."""
    from profiler.findings_text import switch_change

    assert switch_change("fsdp", "zero2").startswith("switch to fsdp: fully_shard(reshard_after_forward=True) frees")
    assert switch_change("fsdp", "ddp").startswith("switch to fsdp: shard parameters too")
    assert switch_change("zero1", "ddp") == switch_change("zero1")


# ---------------------------------------------------------------------------------------------
# outlier: a rank far from its group's median (profiler/outliers.py, the viewer's rule)

def outlier_case(step_ms: list[float], idle_pct: list[float], manifest: dict | None = None) -> SimpleNamespace:
    n = len(step_ms)
    steps = frame([{"run": "A", "rank": r, "step": s, "dur_us": 1e3 * step_ms[r]} for r in range(n) for s in (1, 2)],
                  {"run": pl.String, "rank": pl.Int32, "step": pl.Int64, "dur_us": pl.Float64})
    bd = frame([{"run": "A", "rank": r, "window_us": 1000.0, "idle_us": 10.0 * idle_pct[r]} for r in range(n)], BREAKDOWN)
    case = fake(ranks=tuple(range(n)), steps=steps, breakdown=bd)
    case.runs = {"A": manifest}
    return case


def test_a_rank_far_from_its_groups_median_is_named():
    """The viewer named rank 5 (idle 41 % vs median 67.5 % of 64 ranks) and `ptprof analyze` did not
    (trial). Idle shares 50, 50, 50, 50, 51, 20 %: median 50, MAD 0, so the scale is the 1-point
    floor and the threshold 3 points: rank 5 (30 points off) is one, rank 4 (1 point) is not."""
    f = only(F.outlier_rule(outlier_case([10.0] * 6, [50, 50, 50, 50, 51, 20])))
    assert (f["rule"], f["rank"], f["score"]) == ("outlier", 5, pytest.approx(30.0))
    assert f["text"] == ("Rank 5 stands out among the run's 6 ranks: it is idle 20.0 % of its window against its group's "
                         "median 50.0 % (−30.0 points).")
    assert "r5 (all ranks): idle share 20.0 % vs median 50.0 %" in f["evidence"] and "&rank=5" in f["change"]
    assert F.outlier_rule(outlier_case([10.0] * 6, [50.0] * 6)) == []  # identical ranks: none
    assert F.outlier_rule(outlier_case([10.0, 30.0], [50.0, 10.0])) == []  # two ranks: never


def test_outliers_are_judged_within_their_pipeline_stage():
    """Stages do different work: stage1's 20 ms against stage0's 10 ms is no outlier; rank 5's 26 ms
    against its stage's median 20 ms (MAD 0, floor 1 % = 0.2 ms, threshold 0.6 ms) is, +30 %."""
    pp = {"world_size": 6, "pipeline": {"ranks": 2}}
    f = only(F.outlier_rule(outlier_case([10, 10, 10, 20, 20, 26], [50.0] * 6, pp)))
    # scored as a share of time: the 6 ms the others wait, of the job's 26 ms step
    assert (f["rank"], f["score"]) == (5, pytest.approx(100 * 6 / 26))
    assert f["text"] == ("Rank 5 stands out among the 3 ranks of pipeline stage1: its mean step takes 26.0 ms against its "
                         "group's median 20.0 ms (+30.0 %).")
    assert F.outlier_rule(outlier_case([10, 10, 10, 20, 20, 20], [50.0] * 6, pp)) == []
    # a rank whose trace was cut short, or whose GPU started late, is an artefact, said by a warning:
    # not named here (review)
    for attr in ("cut_steps", "late_devices"):
        case = outlier_case([10, 10, 10, 20, 20, 26], [50.0] * 6, pp)
        setattr(case, attr, frame([{"run": "A", "rank": 5}], {"run": pl.String, "rank": pl.Int32}))
        assert F.outlier_rule(case) == [], attr


def test_a_small_state_with_a_large_measured_peak_is_no_small_model():
    """Persistent state of 16 MiB beside a measured peak of 40 GiB (long-sequence activations):
    memory may well limit it, so no 'memory limits nothing here' (review)."""
    case = memory_case()
    case.memory_peaks = frame([{"run": "A", "rank": 0, "mem_device": "cuda:0", "peak_allocated_bytes": 40 << 30,
                                "peak_step": 1}], {"run": pl.String, "rank": pl.Int32, "mem_device": pl.String,
                                                   "peak_allocated_bytes": pl.Int64, "peak_step": pl.Int64})
    f = only(F.persistent_memory_rule(case))
    assert "limits nothing" not in f["text"] and f["change"].startswith("switch to zero1")


def test_latency_share_counts_calls_per_rank_and_step():
    """An ep run's 24 calls (2 ranks x 3 steps) read "24 calls × α are 6.68 % of each rank's step",
    where 24 × α is 41 % of a step (trial): the sentence gives the calls of one rank's step.
    Here 8 calls over 2 ranks x 2 steps of 1 ms: 2 a step on each rank, × 100 µs = 200 µs, 20 %."""
    case = bandwidth_case(window=1_000.0, n=8)
    case.breakdown_steps = frame([{"run": "A", "rank": r, "step": s, "window_us": 1_000.0} for r in (0, 1) for s in (1, 2)],
                                 BREAKDOWN | {"step": pl.Int64})
    f = only(F.bandwidth_rule(case))
    assert f["score"] == pytest.approx(20.0)
    assert "over its 8 calls (all ranks)" in f["text"]
    assert f["text"].endswith("2 calls a step on each rank, on average, × α are 200 µs, 20.0 % of its step.")


def test_a_pipeline_with_ranks_missing_gets_no_bubble_finding_and_the_findings_say_so():
    """One rank's file of a 2-rank gpipe run: "0 % is the schedule's own bubble (p=1, m=4) ... the
    slowest stage is stage 0, 1.00×", the missing rank said 120 lines later (trial)."""
    from profiler.text import _findings

    case = pipeline_case()
    assert only(F.pipeline_bubble_rule(case))  # both ranks: the finding
    from profiler.findings_base import incomplete_runs

    one = case.ranks.filter(pl.col("rank") == 0).with_columns(world_size=pl.lit(2, pl.Int64))
    case.missing_ranks = incomplete_runs(one)
    assert case.missing_ranks == {"A": (1, 2)}
    # ranks 0, 1, 2, 7 of a world of 4 still miss rank 3 (as report.missing_rank_warnings says)
    four = pl.DataFrame({"run": ["B"] * 4, "rank": [0, 1, 2, 7], "world_size": [4] * 4})
    assert incomplete_runs(four) == {"B": (3, 4)}
    case.pipeline = case.pipeline.filter(pl.col("rank") == 0)
    assert F.pipeline_bubble_rule(case) == []
    case.findings = pl.DataFrame({"rule": ["x"], "text": ["something"]})
    lines = _findings(case, ["A"], full=False)
    assert " ".join(x.strip() for x in lines[1:3]) == ("(run A: 1 of 2 ranks loaded, no pipeline finding: cross-rank findings "
                                                       "cover the loaded ranks only; the warnings at the end name the missing ranks)")
    case.missing_ranks = {}  # the whole world, or --rank R (which selects ranks): no note
    assert "ranks loaded" not in "\n".join(_findings(case, ["A"], full=False))


def test_a_selected_rank_is_no_missing_rank():
    """`--rank 0` on a whole 2-rank pipeline read "1 of 2 ranks loaded, no pipeline finding" (review)."""
    from profiler import analyze, load_traces
    from tests.conftest import REPO

    traces = load_traces([REPO / "traces" / "sample-1f1b-2r"], progress=False)
    assert analyze(traces, rank=0).missing_ranks == {}
    assert analyze(traces).missing_ranks == {}

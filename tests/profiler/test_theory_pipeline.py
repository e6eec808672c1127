"""pipeline_p2p_rows on hand-written run.json manifests: which boundaries a rank crosses, how many
messages, how many bytes (golden values worked out by hand from b, s, h and the placement)."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import load_traces
from profiler.collectives import collectives
from profiler.theory import COMM_COLUMNS, predict_comm
from profiler.theory_pipeline import pipeline_p2p_rows


def manifest(stage_to_rank, *, m=4, b=2, s=32, h=64, paradigm="1f1b", **extra) -> dict:
    ranks = len(set(stage_to_rank))
    return {
        "paradigm": paradigm, "world_size": ranks,
        "model": {"seq_len": s, "d_model": h, "n_layers": 8},
        "pipeline": {"schedule": paradigm, "ranks": ranks, "microbatches": m, "microbatch_size": b,
                     "stages_per_rank": len(stage_to_rank) // ranks, "stage_to_rank": stage_to_rank},
        **extra,
    }


def by_kind(rows) -> dict[tuple[str, str], tuple[int, int, float]]:
    return {(r["phase"], r["collective"]): (r["calls"], r["bytes"], r["traffic_bytes"]) for r in rows}


MSG = 2 * 32 * 64 * 4  # b·s·h·4 bytes: one fp32 microbatch activation = 16384


def test_1f1b_two_ranks():
    m = manifest([0, 1])
    # Rank 0 (stage 0): sends 4 activations, receives 4 gradients; rank 1 the mirror image.
    assert by_kind(pipeline_p2p_rows(m, 0)) == {("forward", "send"): (4, 4 * MSG, 4 * MSG), ("backward", "recv"): (4, 4 * MSG, 0.0)}
    assert by_kind(pipeline_p2p_rows(m, 1)) == {("forward", "recv"): (4, 4 * MSG, 0.0), ("backward", "send"): (4, 4 * MSG, 4 * MSG)}
    row = pipeline_p2p_rows(m, 0)[0]
    assert (row["dim"], row["group_size"], row["phi"]) == ("pp", 2, None)


def test_middle_stage_of_four_does_all_four():
    m = manifest([0, 1, 2, 3], m=8)
    assert by_kind(pipeline_p2p_rows(m, 1)) == {k: (8, 8 * MSG, 8 * MSG if k[1] == "send" else 0.0) for k in
                                                 [("forward", "send"), ("forward", "recv"), ("backward", "send"), ("backward", "recv")]}


def test_interleaved_counts_every_boundary():
    # Stages 0..3 on ranks 0,1,0,1: rank 0 holds 0 and 2, sends forward 0->1 and 2->3 (2 x M),
    # receives 1->2 forward (M); backward sends 2->1 (M), receives 1->0 and 3->2 (2 x M).
    rows = by_kind(pipeline_p2p_rows(manifest([0, 1, 0, 1], paradigm="interleaved-1f1b"), 0))
    assert {k: v[0] for k, v in rows.items()} == {("forward", "send"): 8, ("forward", "recv"): 4,
                                                  ("backward", "send"): 4, ("backward", "recv"): 8}


def test_v_shape_turn_is_local():
    # zbv at 2 ranks: stages 0,1,2,3 on ranks 0,1,1,0; 1->2 stays on rank 1.
    m = manifest([0, 1, 1, 0], paradigm="zbv")
    for rank in (0, 1):
        assert {k: v[0] for k, v in by_kind(pipeline_p2p_rows(m, rank)).items()} == {
            ("forward", "send"): 4, ("forward", "recv"): 4, ("backward", "send"): 4, ("backward", "recv"): 4}


def test_hybrid_pp_coordinate_and_sequence_shard():
    # dp2 pp2 tp2: rank = (dp*2 + pp)*2 + tp; pp groups pair ranks 2 apart. With sp, s/tp.
    groups = [[0, 2], [1, 3], [4, 6], [5, 7]]
    hybrid = {"dims": ["dp", "pp", "tp"], "shape": [2, 2, 2], "groups": {"pp": groups}, "sp": True}
    m = manifest([0, 1], b=1, paradigm="hybrid", hybrid=hybrid)
    m["world_size"] = 8
    msg = 1 * 16 * 64 * 4
    assert by_kind(pipeline_p2p_rows(m, 6)) == {("forward", "recv"): (4, 4 * msg, 0.0), ("backward", "send"): (4, 4 * msg, 4 * msg)}
    assert by_kind(pipeline_p2p_rows(m, 5))[("forward", "send")] == (4, 4 * msg, 4 * msg)
    assert pipeline_p2p_rows(m, 6)[0]["group_size"] == 2
    assert pipeline_p2p_rows({**m, "hybrid": {**hybrid, "sp": False}}, 6)[0]["bytes"] == 4 * 2 * msg
    # the formula names what it plugs in: s/T under sp (it read m·b·s·h beside s/T's 16: trial)
    assert pipeline_p2p_rows(m, 6)[0]["formula"].startswith("m·b·(s/T)·h·dtype per boundary = 4·1·16·64·4 = ")
    assert pipeline_p2p_rows({**m, "hybrid": {**hybrid, "sp": False}}, 6)[0]["formula"].startswith(
        "m·b·s·h·dtype per boundary = 4·1·32·64·4 = ")


def test_dtype_and_refusals():
    assert pipeline_p2p_rows(manifest([0, 1]) | {"model": {"seq_len": 32, "d_model": 64, "dtype": "bfloat16"}}, 0)[0][
        "bytes"] == 4 * MSG // 2
    # what `ptprof run` writes: the parameters' one dtype (activations have it: no autocast)
    written = manifest([0, 1]) | {"model": {"seq_len": 32, "d_model": 64, "param_dtypes": {"bfloat16": 100}}}
    assert pipeline_p2p_rows(written, 0)[0]["bytes"] == 4 * MSG // 2
    assert pipeline_p2p_rows({"paradigm": "ddp", "model": {}}, 0) == []
    assert pipeline_p2p_rows(None, 0) == []
    broken = manifest([0, 1])
    broken["pipeline"]["microbatch_size"] = "2"
    assert pipeline_p2p_rows(broken, 0) == []
    assert pipeline_p2p_rows(manifest([0, 1]), 5) == []  # not a pipeline rank
    unknown = manifest([0, 1])
    unknown["model"]["dtype"] = "quantized_q7"  # no width we know: nothing rather than a guess
    assert pipeline_p2p_rows(unknown, 0) == []


def test_predict_comm_has_pipeline_rows():
    frame = predict_comm({"a": manifest([0, 1]), "b": None, "c": {"paradigm": "ddp"}})
    assert frame.schema == pl.Schema(COMM_COLUMNS)
    totals = frame.filter(pl.col("run") == "a").group_by("run", "rank", "collective").agg(pl.col("bytes").sum()).sort("rank", "collective")
    assert totals.rows() == [("a", 0, "recv", 4 * MSG), ("a", 0, "send", 4 * MSG), ("a", 1, "recv", 4 * MSG), ("a", 1, "send", 4 * MSG)]


# --- measured on real runs: every schedule at 2 and 4 gloo ranks (the runs of
# tests/runners/test_pipeline.py: tiny8, 2 x ranks microbatches, global batch 8).
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv", "dualpipev"]
V_SHAPED = {"zbv", "dualpipev"}
STAGES_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2, "zero-bubble": 1, "zbv": 2, "dualpipev": 2}


def expected_messages(schedule: str, ranks: int, rank: int) -> int:
    """Messages rank sends per step (= receives): M per stage boundary it owns a side of that
    crosses to another rank, forward and backward. Placement: looped s -> s % P, V-shaped down
    the ranks and back up (stages P-1 and P share the last rank: a local hand-over)."""
    n = ranks * STAGES_PER_RANK[schedule]
    place = [s if s < ranks else 2 * ranks - 1 - s for s in range(n)] if schedule in V_SHAPED else [s % ranks for s in range(n)]
    crossing = [s for s in range(n - 1) if place[s] != place[s + 1]]  # boundary s -> s+1 over the network
    # a crossing boundary makes its lower side send an activation and its upper side a gradient
    mine = sum((place[s] == rank) + (place[s + 1] == rank) for s in crossing)
    return 2 * ranks * mine  # M = 2 x ranks microbatches


# Every schedule at 4 ranks too (interior stages: a send and a receive each way). These are the
# runs of tests/runners/test_pipeline.py's loss parity (same `runs` key), which the multirank session
# makes anyway: the checks here launch nothing of their own.
@pytest.mark.multirank
@pytest.mark.parametrize("schedule, ranks", [(s, r) for r in (2, 4) for s in SCHEDULES])
def test_measured_p2p_bytes_equal_the_theory(runs, schedule, ranks):
    run = runs(schedule, ranks, "--model", "tiny8", "--microbatches", str(2 * ranks))
    traces = load_traces(run)
    b = 8 // (2 * ranks)  # global batch 8 in 2 x ranks microbatches
    message = b * 32 * 64 * 4  # b·s·h fp32: one microbatch's activation (or its gradient)
    measured = (
        collectives(traces.events, traces.ranks)
        .filter(pl.col("collective").is_in(["send", "recv"]) & pl.col("step").is_not_null())
        .group_by("rank", "step", "collective")
        .agg(calls=pl.len(), bytes=pl.col("size_bytes").sum(), sizes=pl.col("size_bytes").unique())
    )
    manifest = traces.runs[run.name]
    assert measured["step"].n_unique() == 2
    for rank in range(ranks):
        want = expected_messages(schedule, ranks, rank)
        theory = pipeline_p2p_rows(manifest, rank)
        for kind in ("send", "recv"):
            got = measured.filter((pl.col("rank") == rank) & (pl.col("collective") == kind))
            assert got["calls"].to_list() == [want, want], (rank, kind)
            assert got["bytes"].to_list() == [want * message] * 2, (rank, kind)
            assert got["sizes"].to_list() == [[message]] * 2
            assert sum(r["calls"] for r in theory if r["collective"] == kind) == want
            assert sum(r["bytes"] for r in theory if r["collective"] == kind) == want * message


@pytest.mark.multirank
def test_measured_p2p_bytes_of_a_hybrid_pp_dimension(runs):
    # dp2 x pp2 x tp2 (tests/runners/test_hybrid.py's run), 1F1B, 4 microbatches per replica: each
    # replica's batch 8 / 2 = 4 rows, b = 1. Without sp every tp rank sends the full activation,
    # 1·32·64·4 B, to the same tp rank of the next stage: 4 sends and 4 receives per step.
    run = runs("hybrid", 8, "--dp", "2", "--pp", "2", "--tp", "2")
    traces = load_traces(run)
    message = 1 * 32 * 64 * 4
    measured = (
        collectives(traces.events, traces.ranks)
        .filter(pl.col("collective").is_in(["send", "recv"]) & pl.col("step").is_not_null())
        .group_by("rank", "step", "collective")
        .agg(calls=pl.len(), bytes=pl.col("size_bytes").sum())
    )
    # (gloo's spans do not name their process group; with dp, pp and tp groups the measured rows
    # have none, so only the theory's group_size is checked here.)
    assert measured.height == 8 * 2 * 2  # every rank sends and receives in both profiled steps
    assert set(measured["calls"]) == {4} and set(measured["bytes"]) == {4 * message}
    manifest = traces.runs[run.name]
    for rank in range(8):
        theory = pipeline_p2p_rows(manifest, rank)
        assert {(r["collective"], r["calls"], r["bytes"], r["group_size"]) for r in theory} == {
            ("send", 4, 4 * message, 2), ("recv", 4, 4 * message, 2)}


def test_absurd_numbers_are_refused_not_overflowed():
    huge = manifest([0, 1], m=2**40, b=2**20)  # 2^40 · 2^20 · 32 · 64 · 4 bytes: beyond Int64
    assert pipeline_p2p_rows(huge, 0) == []
    assert predict_comm({"a": huge}).is_empty()
    assert predict_comm({"a": {**manifest([0, 1]), "world_size": 10**15}}).is_empty()  # no loop over 10^15 ranks

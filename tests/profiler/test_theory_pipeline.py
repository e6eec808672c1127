"""pipeline_p2p_rows on hand-written run.json manifests: which boundaries a rank crosses, how many
messages, how many bytes (golden values worked out by hand from b, s, h and the placement)."""

from __future__ import annotations

import polars as pl

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


def test_dtype_and_refusals():
    assert pipeline_p2p_rows(manifest([0, 1]) | {"model": {"seq_len": 32, "d_model": 64, "dtype": "bfloat16"}}, 0)[0][
        "bytes"] == 4 * MSG // 2
    assert pipeline_p2p_rows({"paradigm": "ddp", "model": {}}, 0) == []
    assert pipeline_p2p_rows(None, 0) == []
    broken = manifest([0, 1])
    broken["pipeline"]["microbatch_size"] = "2"
    assert pipeline_p2p_rows(broken, 0) == []
    assert pipeline_p2p_rows(manifest([0, 1]), 5) == []  # not a pipeline rank
    unknown = manifest([0, 1])
    unknown["model"]["dtype"] = "float8_e4m3fn"  # no width we know: nothing rather than a guess
    assert pipeline_p2p_rows(unknown, 0) == []


def test_predict_comm_has_pipeline_rows():
    frame = predict_comm({"a": manifest([0, 1]), "b": None, "c": {"paradigm": "ddp"}})
    assert frame.schema == pl.Schema(COMM_COLUMNS)
    totals = frame.filter(pl.col("run") == "a").group_by("run", "rank", "collective").agg(pl.col("bytes").sum()).sort("rank", "collective")
    assert totals.rows() == [("a", 0, "recv", 4 * MSG), ("a", 0, "send", 4 * MSG), ("a", 1, "recv", 4 * MSG), ("a", 1, "send", 4 * MSG)]

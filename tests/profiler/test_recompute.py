"""Recomputation (--recompute) in the profiler: theory rows with phase "recompute" hand-computed from
tiny's dims, the predicted compute and activation saving, the findings on hand-made frames, and the
communication check on real recompute runs."""

from __future__ import annotations

import polars as pl
import pytest

import profiler.findings as F
from profiler import load_traces
from profiler.recompute import RECOMPUTE_COLUMNS
from profiler.report import analyze
from profiler.theory import predict_comm
from profiler.theory_memory import ACTIVATION_COLUMNS
from profiler.theory_recompute import activation_drop, recompute_compute
from tests.profiler.test_findings import BREAKDOWN, fake, frame, only
from tests.runners.test_ep import NO_DROP

# tiny (runners/options.py MODEL_PRESETS): vocab 256, d_model 64, 2 layers, 4 heads, seq 32, batch 8.
V, H, L, HEADS, S, B = 256, 64, 2, 4, 32, 8
TINY = {"preset": "tiny", "n_params": 133_760, "vocab_size": V, "d_model": H, "n_layers": L, "n_heads": HEADS,
        "seq_len": S, "mlp_ratio": 4, "param_dtypes": {"float32": 133_760}}
RECOMPUTE = {"granularity": "block", "span": "ptprof/recompute"}


def manifest(paradigm: str, world: int = 2, recompute: bool = True, **options) -> dict:
    local = B if paradigm == "tp" else B // world
    return {"paradigm": paradigm, "world_size": world, "ranks": [{"rank": r} for r in range(world)],
            "mesh": {"tp" if paradigm == "tp" else "dp": world}, "model": TINY, "global_batch_size": B,
            "local_batch_size": local, "options": {"recompute": recompute, **options},
            "recompute": RECOMPUTE if recompute else None}


def recompute_rows(m: dict) -> list[tuple]:
    comm = predict_comm({"A": m}).filter((pl.col("rank") == 0) & (pl.col("phase") == "recompute"))
    return sorted(comm.select("collective", "calls", "bytes").iter_rows())


def test_tp_recompute_rows_are_the_block_forward_collectives_again():
    act = B * S * H * 4  # one activation message: b·s·h·4 = 65,536 B
    assert recompute_rows(manifest("tp")) == [("all_reduce", 2 * L, 2 * L * act)]  # wo and down, per layer
    # --sp: the all-gathers before attention and MLP and the reduce-scatters after; not the head's all-gather
    assert recompute_rows(manifest("tp", sp=True)) == [("all_gather", 2 * L, 2 * L * act),
                                                       ("reduce_scatter", 2 * L, 2 * L * act)]
    assert recompute_rows(manifest("tp", recompute=False)) == []
    # data parallel and FSDP: nothing inside a block (FSDP gathers in a hook outside the checkpointed body)
    assert recompute_rows(manifest("ddp")) == recompute_rows(manifest("fsdp")) == []


def test_recompute_compute_is_the_blocks_share_of_the_forward():
    blocks = L * (8 * H * H + 16 * H * H + 4 * S * H)  # q,k,v,o 8h², MLP 16h², scores + weighted sum 4sh
    head = 2 * H * V
    got = recompute_compute(manifest("ddp"))
    assert got["recompute_over_forward"] == pytest.approx(blocks / (blocks + head))  # 0.867
    assert got["recompute_over_step"] == pytest.approx(blocks / (3 * (blocks + head)))  # 0.289: Korthikanti's ~1/3


def test_activation_drop_keeps_block_inputs_and_one_block():
    b = B // 2
    a_block = b * S * (16 * H + HEADS + 4) * 4  # 528,384 B
    d = activation_drop(manifest("ddp"))
    assert (d["block_bytes"], d["without_bytes"]) == (a_block, L * a_block)
    assert d["with_bytes"] == L * b * S * H * 4 + a_block - b * S * H * 4
    assert d["drop_bytes"] == (L - 1) * (a_block - b * S * H * 4) == 495_616
    assert activation_drop(manifest("tp")) is None  # not predicted for sharded activations


# ---------------------------------------------------------------------------------------------
# Findings on hand-made frames: run A recomputes (4 ms per step on rank 1 against a 10 ms forward,
# step 40 ms), run B is the same ddp job without it.

def recompute_case(peaks=(3 * 2**20, 2 * 2**20), compute=(20_000.0, 24_000.0), forward_comm_us=0.0) -> object:
    # compute: (B, A) compute per rank and step; forward_comm_us: A's forward collective waits
    rc = frame([{"run": "A", "rank": r, "step": s, "device": "cpu", "recompute_spans": 2, "forward_us": 10_000.0,
                 "recompute_us": 3000.0 + 1000 * r, "backward_us": 20_000.0, "predicted_over_forward": 0.867,
                 "forward_comm_us": forward_comm_us, "recompute_comm_us": 0.0}
                for r in (0, 1) for s in (1, 2)], RECOMPUTE_COLUMNS)
    steps = frame([{"run": run, "rank": r, "step": s, "window_us": w, "compute_us": c}
                   for run, w, c in (("A", 40_000.0, compute[1]), ("B", 32_000.0, compute[0]))
                   for r in (0, 1) for s in (1, 2)], BREAKDOWN | {"step": pl.Int64})
    mem = frame([{"run": run, "rank": 0, "mem_device": "cpu", "peak_allocated_bytes": p}
                 for run, p in zip("BA", peaks)],
                {"run": pl.String, "rank": pl.Int32, "mem_device": pl.String, "peak_allocated_bytes": pl.Int64})
    a = fake(runs=("B", "A"), ranks=(0, 1), recompute=rc, breakdown_steps=steps, memory_peaks=mem)
    a.runs = {"A": manifest("ddp"), "B": manifest("ddp", recompute=False)}
    return a


def test_recompute_finding_names_its_share_of_the_step_and_what_it_saves():
    f = only(F.recompute_rule(recompute_case()))
    assert (f["rule"], f["run"], f["rank"], f["score"]) == ("recompute", "A", 1, 10.0)  # 4 of 40 ms
    assert f["text"] == ("Recomputation (--recompute) takes 10.0 % of the step on rank 1: 4.00 ms per step, 0.400× its "
                         "forward's compute (forward 10.0 ms; predicted ≈ 0.867×, one more forward of the blocks); it saves about 484 KiB "
                         "of activations per rank (predicted: (L−1)·(A_block − b·s·h·4), A_block = b·s·(16h + heads + "
                         "4)·4 = 528,384 B).")
    assert "drop --recompute to win back about 10.0 %" in f["change"]


def test_recompute_comparison_says_the_peak_dropped_and_the_measured_compute_change():
    f = only(F.recompute_comparison_rule(recompute_case()))
    assert (f["rule"], f["run"], f["score"]) == ("recompute-comparison", None, pytest.approx(100 / 3))
    assert f["text"] == ("With --recompute (A) the memory peak dropped by 1.00 MiB against B (3.00 MiB → 2.00 MiB, "
                         "−33.3 %; predicted −484 KiB of saved activations); the recomputation takes 3.50 ms per step, "
                         "0.350× its forward's compute (forward 10.0 ms; predicted ≈ 0.867×, one more forward of the "
                         "blocks); measured compute 20.0 ms → 24.0 ms per step (+20.0 %); step 32.0 ms → 40.0 ms (+25.0 %).")
    # compute fell (noise): said as measured, and the time comparison called inconclusive, never "grew"
    fell = only(F.recompute_comparison_rule(recompute_case(compute=(20_000.0, 15_000.0))))["text"]
    assert "measured compute 20.0 ms → 15.0 ms per step (−25.0 %), less: " in fell and "inconclusive" in fell
    assert "grew" not in fell
    # compute grew far more than the recomputation (20 ms against 3.5 ms): inconclusive too
    jumped = only(F.recompute_comparison_rule(recompute_case(compute=(20_000.0, 40_000.0))))["text"]
    assert "(+100 %), more than twice the recomputation: " in jumped and "inconclusive" in jumped
    # runs that differ in more than --recompute (tp --sp against tp --recompute) are not paired
    sp = recompute_case()
    sp.runs["B"] = manifest("ddp", recompute=False, sp=True)
    assert F.recompute_comparison_rule(sp) == []
    # not comparable: another model, or both recomputing
    other = recompute_case()
    other.runs["B"] = manifest("ddp", recompute=False) | {"global_batch_size": 16}
    assert F.recompute_comparison_rule(other) == []
    both = recompute_case()
    both.runs["B"] = manifest("ddp")
    assert F.recompute_comparison_rule(both) == []


def test_the_ratio_is_on_compute_time_and_not_comparable_where_the_forward_gathers_parameters():
    # A's forward waits 5 ms of its 10 ms on collectives: rank 1's 4 ms recomputation is 0.8× its 5 ms of compute
    a = recompute_case(forward_comm_us=5000.0)
    f = only(F.recompute_rule(a))
    assert "4.00 ms per step, 0.800× its forward's compute (forward 10.0 ms, 5.00 ms of it compute, the rest collective waits" in f["text"]
    assert "not comparable" not in f["text"]
    # a forward that all-gathers activations or logits (tp, sp: theory's dim tp) is comparable ...
    gathers = {"run": ["A"], "rank": [0], "collective": ["all_gather"], "phase": ["forward"]}
    a.theory_comm = pl.DataFrame(gathers | {"dim": ["tp"]})
    assert "not comparable" not in only(F.recompute_rule(a))["text"]
    # ... one that all-gathers parameters (fsdp: dim dp) does work the recomputation does not repeat
    a.theory_comm = pl.DataFrame(gathers | {"dim": ["dp"]})
    assert "not comparable with the prediction: the forward also all-gathers parameters" in only(F.recompute_rule(a))["text"]
    assert "not comparable" in only(F.recompute_comparison_rule(a))["text"]


def test_with_compute_takes_the_exposed_communication_of_each_phase():
    from profiler.exposed import EXPOSED_COLUMNS
    from profiler.recompute import with_compute

    rc = frame([{"run": "A", "rank": 0, "step": 1, "forward_us": 10_000.0, "recompute_us": 4000.0}], RECOMPUTE_COLUMNS)
    ex = frame([{"run": "A", "rank": 0, "step": 1, "collective": c, "phase": p, "exposed_us": e}
                for c, p, e in (("broadcast", "forward", 2000.0), ("all_gather", "forward", 3000.0),
                                ("all_reduce", "recompute", 1000.0), ("all_reduce", "backward", 7000.0))],
               EXPOSED_COLUMNS | {"run": pl.String})
    got = with_compute(rc, ex).row(0, named=True)
    assert (got["forward_comm_us"], got["recompute_comm_us"]) == (5000.0, 1000.0)
    assert got["recompute_over_forward"] == pytest.approx((4000 - 1000) / (10_000 - 5000))


def test_activation_rule_does_not_suggest_recompute_when_it_is_on():
    row = {"run": "A", "rank": 0, "mem_device": "cuda:0", "peak_allocated_bytes": 100, "persistent_bytes": 20,
           "footprint_bytes": 100, "activation_bytes": 80, "activation_pct": 80.0, "basis": "device counter"}
    a = fake(activation=frame([row], ACTIVATION_COLUMNS))
    a.runs = {"A": manifest("ddp", recompute=False)}
    assert "recompute activations in backward" in only(F.activation_memory_rule(a))["change"]
    a.runs = {"A": manifest("ddp")}
    f = only(F.activation_memory_rule(a))
    assert "recompute" not in f["change"] and f["text"].endswith("activation checkpointing is on (--recompute).")


# ---------------------------------------------------------------------------------------------
# Real runs: theory still says "match" with the recomputed collectives


@pytest.mark.multirank
@pytest.mark.parametrize("paradigm, flags", [("tp", ()), ("ep", NO_DROP), ("fsdp", ("--profile-memory",)),
                                             ("ddp", ("--profile-memory",))])
def test_theory_check_matches_on_recompute_runs(runs, paradigm, flags):
    a = analyze(load_traces(runs(paradigm, 2, *flags, "--recompute")))
    bad = a.theory_check.filter(pl.col("verdict") != "match")
    assert bad.is_empty(), bad.select("rank", "quantity", "predicted", "measured", "verdict").rows()
    measured = a.collectives.filter(pl.col("phase") == "recompute")
    predicted = a.theory_comm.filter(pl.col("phase") == "recompute")
    # per rank and step, the recomputed collectives' bytes are the predicted ones
    if paradigm in ("tp", "ep"):
        assert measured.height and predicted.height
        for rank in (0, 1):
            for step in (1, 2):
                got = measured.filter((pl.col("rank") == rank) & (pl.col("step") == step))["size_bytes"].sum()
                want = predicted.filter((pl.col("rank") == rank) & (pl.col("step").is_null() | (pl.col("step") == step)))
                assert got == want["bytes"].sum()
    else:
        assert measured.is_empty() and predicted.is_empty()
    # the activation rows state theory's saved activations with and without recompute (ddp: b = 4)
    notes = set(a.activation["note"])
    if paradigm == "ddp":
        assert notes == {"--recompute: predicted saved activations 561,152 B per rank instead of 1,056,768 B "
                         "(−495,616 B: (L−1)·(A_block − b·s·h·4), A_block = b·s·(16h + heads + 4)·4 = 528,384 B)"}


def test_exposed_collectives_of_the_recomputed_forward_get_recompute_advice():
    from profiler.findings_text import RECOMPUTE_CHANGE, collective_change

    assert collective_change("all_reduce", "recompute", "tp") == RECOMPUTE_CHANGE
    assert collective_change("all_to_all", "recompute", "ep") == RECOMPUTE_CHANGE
    assert collective_change("all_reduce", "backward", "tp") != RECOMPUTE_CHANGE

"""Persistent-memory theory: the ZeRO table, FSDP2's padding, ZeroRedundancyOptimizer's partition,
the activation share of a peak, and (multirank) the theory against what real runs measured.

Golden numbers are computed here by hand from the model's dims and the textbook formulas.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from profiler.memory import persistent_memory
from profiler.theory_params import Dtypes, run_dtypes
from profiler.theory_memory import (
    ACTIVATION_COLUMNS, MEMORY_COLUMNS, WHATIF_COLUMNS, activation_peak, layout_bytes, memory_check,
    memory_notes, memory_whatif, predict_memory, zero1_partition, zero_table,
)

# tiny: vocab 256, d 64, 2 layers, seq 32. By hand: 2 embeddings-sized matrices (tok_emb, head)
# V·d each, pos_emb S·d, per block 12d² (4 attention d×d + MLP 2·4d·d) + 4d (two LayerNorms),
# final LayerNorm 2d.
V, D, L, S = 256, 64, 2, 32
BLOCK = 12 * D * D + 4 * D
TINY = 2 * V * D + S * D + L * BLOCK + 2 * D  # 133 760
N_TENSORS = 2 + 10 * L + 3  # embeddings, 10 per block, norm weight + bias and head: 25


def manifest(paradigm="ddp", world=2, mesh=None, **extra) -> dict:
    """A hand-written run.json for the tiny model."""
    return {"paradigm": paradigm, "world_size": world, "mesh": mesh or {"dp": world},
            "model": {"n_params": TINY, "vocab_size": V, "d_model": D, "n_layers": L, "n_heads": 4, "seq_len": S},
            "options": {"experts": None}, "pipeline": None, **extra}


def test_zero_paper_table_7_5b_on_64_gpus():
    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, N = 64, K = 12 (mixed-precision Adam):
    # baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.88 GB per device.
    t = zero_table(7.5e9, 64, param_bytes=2, grad_bytes=2, optimizer_bytes=12)
    total = {k: sum(v.values()) / 1e9 for k, v in t.items()}
    assert total["ddp"] == pytest.approx(120, rel=1e-9)
    assert round(total["zero1"], 1) == 31.4
    assert round(total["zero2"], 1) == 16.6
    assert round(total["fsdp"], 2) == 1.88


def test_tiny_model_under_ddp_is_16_bytes_per_param_plus_step_scalars():
    m = predict_memory({"r": manifest()})
    assert m.schema == pl.Schema(MEMORY_COLUMNS)
    row = m.row(0, named=True)
    assert row["n_params"] == TINY
    assert (row["params_bytes"], row["grads_bytes"]) == (4 * TINY, 4 * TINY)
    assert row["optimizer_bytes"] == 8 * TINY + 4 * N_TENSORS  # exp_avg + exp_avg_sq + a float32 step each
    assert row["rule_bytes_per_param"] == 16.0
    assert "4 (param) + 4 (grad) + 4 (exp_avg) + 4 (exp_avg_sq) = 16" in row["formula"]
    assert "fp32 assumed" in row["note"]


def test_dataparallel_is_one_process_holding_what_a_ddp_rank_holds():
    # dp: world 1 (one process), mesh {"dp": 2} counts its GPUs; cuda:0 holds model + optimizer.
    m = predict_memory({"r": manifest("dp", world=1, mesh={"dp": 2})})
    assert m.height == 1
    row = m.row(0, named=True)
    assert (row["params_bytes"], row["grads_bytes"], row["optimizer_bytes"]) == (4 * TINY, 4 * TINY, 8 * TINY + 4 * N_TENSORS)


def test_mixed_precision_dtypes_give_the_2_2_12_rule():
    dt, note, why = run_dtypes({"dtypes": {"param": "bfloat16", "grad": "bfloat16", "optimizer": "float32", "master": "float32"}})
    assert (dt.per_param, dt.optimizer_per_param, note, why) == (16, 12, None, None)
    m = predict_memory({"r": manifest(dtypes={"param": "bf16", "grad": "bf16", "optimizer": "fp32", "master": "fp32"})})
    row = m.row(0, named=True)
    assert row["params_bytes"] == 2 * TINY and row["optimizer_bytes"] == 12 * TINY + 4 * N_TENSORS
    assert "2 (param) + 2 (grad) + 12" in row["formula"]
    assert run_dtypes({"model": {"dtype": "torch.bfloat16"}})[0] == Dtypes(2, 2, 2, 0)


def test_one_dtype_rule_for_every_theory():
    # communication, memory and pipeline theory read the same dtype (profiler.theory_params.run_dtypes)
    from profiler.theory import predict_comm
    from profiler.theory_pipeline import pipeline_p2p_rows

    bf16 = manifest(model={"n_params": TINY, "vocab_size": V, "d_model": D, "n_layers": L, "n_heads": 4, "seq_len": S,
                           "dtype": "bfloat16"})
    assert predict_memory({"r": bf16})["params_bytes"].to_list() == [2 * TINY] * 2
    comm = predict_comm({"r": bf16})
    assert comm.filter(pl.col("collective") == "all_reduce")["bytes"].sum() == 2 * (2 * TINY)  # Φ = 2 B x Ψ, 2 ranks
    # several parameter dtypes and no dtypes block: every theory refuses, none guesses fp32
    mixed = manifest(model={**bf16["model"], "param_dtypes": {"float32": 100, "bfloat16": TINY - 100}})
    assert predict_memory({"r": mixed}).is_empty() and predict_comm({"r": mixed}).is_empty()
    assert "parameter dtypes" in memory_notes({"r": mixed})[0]
    pipe = {"paradigm": "1f1b", "world_size": 2, "model": {"seq_len": S, "d_model": D, "n_layers": 8,
            "param_dtypes": {"float32": 1, "bfloat16": 1}}, "pipeline": {"microbatches": 4, "microbatch_size": 2,
            "stage_to_rank": [0, 1]}}
    assert pipeline_p2p_rows(pipe, 0) == []


def test_memory_refuses_a_fractional_mlp_ratio_and_a_table_that_misses_n_params():
    odd = manifest(model={"n_params": TINY, "vocab_size": V, "d_model": D, "n_layers": L, "n_heads": 4, "seq_len": S,
                          "mlp_ratio": 2.5})
    wrong = manifest(model={"n_params": TINY + 1, "vocab_size": V, "d_model": D, "n_layers": L, "n_heads": 4, "seq_len": S})
    assert predict_memory({"odd": odd, "wrong": wrong}).is_empty()
    notes = memory_notes({"odd": odd, "wrong": wrong})
    assert "mlp_ratio 2.5" in notes[0] and "does not match run.json n_params" in notes[1]


def test_fsdp2_pads_dim0_to_a_multiple_of_n():
    # A 10x3 tensor over 4 ranks: torch.chunk makes chunks of ceil(10/4) = 3 rows: 3, 3, 3, 1.
    # Every rank stores 3 rows (padded), the all-gather output is 12 rows; rank 3 steps 1 row.
    fp32 = Dtypes()
    r3 = layout_bytes([(10, 3)], "fsdp", 4, 3, fp32)
    assert r3["params_bytes"] == r3["params_at_rest_bytes"] == 9 * 4
    assert r3["grads_bytes"] == 9 * 4
    assert r3["optimizer_bytes"] == 2 * 3 * 4 + 4
    assert r3["n_params"] == 3
    z2 = layout_bytes([(10, 3)], "zero2", 4, 0, fp32)
    assert z2["params_bytes"] == (9 + 36) * 4 and z2["params_at_rest_bytes"] == 9 * 4
    # 5 rows over 4: torch.chunk gives 2, 2, 1 and FSDP2 adds an empty chunk for rank 3.
    assert layout_bytes([(5,)], "fsdp", 4, 3, fp32)["n_params"] == 0
    assert layout_bytes([(5,)], "fsdp", 4, 2, fp32)["n_params"] == 1


def test_zero1_partition_is_greedy_largest_first():
    # sizes 1, 5, 3, 3 over 2 ranks: 5 -> r0, 3 -> r1, 3 -> r1, 1 -> r0: 6 elements each.
    assert zero1_partition([1, 5, 3, 3], 2) == [[1, 0], [2, 3]]
    b = layout_bytes([(1,), (5,), (3,), (3,)], "zero1", 2, 1, Dtypes())
    assert b["optimizer_bytes"] == 6 * 8 + 2 * 4 and b["params_bytes"] == 12 * 4


def test_tensor_parallel_and_pipeline_shards_by_hand():
    # tp 2: attention and MLP matrices and the head halve; embeddings and LayerNorms stay whole.
    tp = predict_memory({"t": manifest("tp", 2, {"tp": 2})}).row(0, named=True)
    assert tp["n_params"] == V * D + S * D + L * (6 * D * D + 4 * D) + 2 * D + V * D // 2
    # 1f1b over 2 ranks of tiny: stage 0 has embeddings + block 0, stage 1 block 1 + norm + head.
    pipe = {"stage_layers": [[0, 1], [1, 2]], "stage_to_rank": [0, 1]}
    m = predict_memory({"p": manifest("1f1b", 2, {"pp": 2}, pipeline=pipe)}).sort("rank")
    assert m["n_params"].to_list() == [V * D + S * D + BLOCK, BLOCK + 2 * D + V * D]


def test_whatif_names_the_current_layout_and_what_each_stage_saves():
    w = memory_whatif({"r": manifest("zero1", 4)})
    assert w.schema == pl.Schema(WHATIF_COLUMNS)
    by = {r["layout"]: r for r in w.iter_rows(named=True)}
    assert [k for k, r in by.items() if r["current"]] == ["zero1"]
    assert by["ddp"]["total_bytes"] == 16 * TINY + 4 * N_TENSORS
    # fsdp over 4 (every dim 0 divides by 4): a quarter of everything, a step scalar per tensor.
    assert by["fsdp"]["total_bytes"] == 16 * TINY // 4 + 4 * N_TENSORS
    assert by["fsdp"]["saved_bytes"] == by["zero1"]["total_bytes"] - by["fsdp"]["total_bytes"] > 0
    assert by["zero1"]["saved_bytes"] == 0
    one = memory_whatif({"t": manifest("tp", 2, {"tp": 2})})
    assert one["total_bytes"].n_unique() == 1 and "degree 1" in one["note"][0]


def test_no_model_dims_means_no_theory_not_a_crash():
    runs = {"foreign": None, "bare": {"paradigm": "ddp"}, "odd": manifest("1f1b", 2, {"pp": 2}, pipeline={
        "stage_layers": [[0, 1]], "stage_to_rank": [0, 1]}), "ep": manifest("ep", 3, {"ep": 3}, options={"experts": 4})}
    assert predict_memory(runs).is_empty()
    assert memory_whatif(runs).is_empty()
    notes = memory_notes(runs)
    assert len(notes) == 3 and "run bare: run.json has no model dims" in notes[0]
    assert "not [first, end) pairs" in notes[1] and "4 experts do not divide over 3" in notes[2]


def test_absurd_run_json_numbers_get_a_note_not_an_overflow():
    big = manifest()
    big["model"] = {**big["model"], "d_model": 2**40}
    runs = {"big": big, "world": manifest(world=2**40, mesh={"dp": 2**40}),
            "experts": manifest("ep", 2, {"ep": 2}, options={"experts": 2**40})}
    assert predict_memory(runs).is_empty() and memory_whatif(runs).is_empty()
    notes = memory_notes(runs)
    assert len(notes) == 3 and all("beyond any real model" in n or "plausible world_size" in n for n in notes), notes


def test_param_dtypes_written_by_the_runner_give_the_dtype():
    bf16 = manifest(model={"n_params": TINY, "vocab_size": V, "d_model": D, "n_layers": L, "n_heads": 4, "seq_len": S,
                           "param_dtypes": {"bfloat16": TINY}})
    got = predict_memory({"bf16": bf16}).row(0, named=True)
    assert got["note"] is None and got["params_bytes"] == 2 * TINY and got["rule_bytes_per_param"] == 8


def test_experts_count_only_for_ep():
    # run.json of older runs recorded --experts for every paradigm; only ep builds the MoE model.
    old = manifest(options={"experts": 4})
    got = predict_memory({"old": old})
    assert got["n_params"].to_list() == [TINY, TINY]


def test_memory_check_verdicts():
    pred = pl.DataFrame({"run": ["r", "r"], "rank": [0, 1], "params_bytes": [1000, 1000],
                         "params_at_rest_bytes": [1000, 1000], "grads_bytes": [1000, 1000], "optimizer_bytes": [2000, 2000]})
    meas = pl.DataFrame({"run": ["r"], "rank": [0], "params_bytes": [1009], "params_at_rest_bytes": [1011],
                         "grads_bytes": [980], "optimizer_bytes": [None]},
                        schema_overrides={"run": pl.Categorical, "rank": pl.Int32, "optimizer_bytes": pl.Int64})
    c = memory_check(pred, meas)
    v = {(r["rank"], r["quantity"]): r["verdict"] for r in c.iter_rows(named=True)}
    assert v[(0, "memory.params_bytes")] == "match"  # 0.9 % off
    assert v[(0, "memory.params_at_rest_bytes")] == "above"  # 1.1 % off
    assert v[(0, "memory.grads_bytes")] == "below"
    assert v[(0, "memory.optimizer_bytes")] == "no measurement"
    assert v[(1, "memory.params_bytes")] == "no measurement"
    assert c.filter(pl.col("verdict") == "no measurement")["ratio"].is_null().all()


def test_activation_peak_rules():
    mem = pl.DataFrame({"run": ["cuda", "cpu-ddp", "cpu-fsdp", "small"], "rank": [0, 0, 0, 0],
                        "params_bytes": [100, 100, 150, 100], "params_at_rest_bytes": [100, 100, 100, 100],
                        "grads_bytes": [100, 100, 100, 100], "optimizer_bytes": [200, 200, 200, 200]})
    peaks = pl.DataFrame({"run": ["cuda", "cuda", "cpu-ddp", "cpu-fsdp", "small", "foreign"], "rank": [0] * 6,
                          "mem_device": ["cuda:0", "cpu", "cpu", "cpu", "cuda:0", "cuda:0"],
                          "peak_allocated_bytes": [1000, 50, 300, 300, 300, 500]})
    runs = {"cuda": {"paradigm": "ddp"}, "cpu-ddp": {"paradigm": "ddp"}, "cpu-fsdp": {"paradigm": "zero2"},
            "small": {"paradigm": "ddp"}, "foreign": None}
    a = activation_peak(peaks, mem, runs)
    assert a.schema == pl.Schema(ACTIVATION_COLUMNS)
    by = {r["run"]: r for r in a.iter_rows(named=True)}
    assert len(a) == 5  # the GPU rank's host (cpu) curve is left out
    # CUDA counts everything: 1000 - (100 + 100 + 200) = 600, 60 % of the peak.
    assert (by["cuda"]["activation_bytes"], by["cuda"]["activation_pct"]) == (600, 60.0)
    # CPU, DDP: grads are buckets made before profiling; the whole peak is transient; footprint 300 + 400.
    assert by["cpu-ddp"]["activation_bytes"] == 300
    assert by["cpu-ddp"]["activation_pct"] == pytest.approx(100 * 300 / 700)
    # CPU, zero2: grads (100) and the gathered params (150 - 100) are allocated again each step.
    assert by["cpu-fsdp"]["activation_bytes"] == 150
    assert by["cpu-fsdp"]["activation_pct"] == pytest.approx(100 * 150 / (300 + 300))
    # A peak below the persistent bytes: 0, said, never negative.
    assert by["small"]["activation_bytes"] == 0 and by["small"]["activation_pct"] == 0.0 and "short" in by["small"]["note"]
    assert by["foreign"]["activation_pct"] is None and "no persistent-memory theory" in by["foreign"]["note"]


def test_activation_peak_leaves_out_what_a_device_holds_all_step():
    # A device's counter also holds what is there all along besides the model: cuBLAS's workspaces
    # (64 MiB on an H100), the batch. Its share is the floor less the model's state at rest then.
    ws = 64 << 20
    mem = pl.DataFrame({"run": ["ddp", "fsdp", "low", "off"], "rank": [0] * 4, "params_bytes": [100, 150, 100, 150],
                        "params_at_rest_bytes": [100, 100, 100, 100], "grads_bytes": [100] * 4,
                        "optimizer_bytes": [200] * 4})
    peaks = pl.DataFrame({"run": ["ddp", "fsdp", "low", "off"], "rank": [0] * 4, "mem_device": ["cuda:0"] * 4,
                          "peak_allocated_bytes": [ws + 1000, ws + 2000, 1000, ws + 4000],
                          # ddp holds its gradient buckets at rest (100 + 100 + 200); fsdp's gradients
                          # are freed by zero_grad (100 + 200); fsdp --offload holds none of its state.
                          "floor_allocated_bytes": [ws + 400, ws + 300, 300, ws]})
    runs = {"ddp": {"paradigm": "ddp"}, "fsdp": {"paradigm": "fsdp"}, "low": {"paradigm": "ddp"},
            "off": {"paradigm": "fsdp", "offload": {"state_device": "cpu"}}}
    by = {r["run"]: r for r in activation_peak(peaks, mem, runs).iter_rows(named=True)}
    # ddp: (ws + 1000) - 400 persistent - ws other = 600, of the whole peak.
    assert (by["ddp"]["other_bytes"], by["ddp"]["activation_bytes"]) == (ws, 600)
    assert by["ddp"]["activation_pct"] == pytest.approx(100 * 600 / (ws + 1000))
    # fsdp: persistent 150 + 100 + 200 = 450; other = (ws + 300) - 300 at rest = ws; 2000 - 450 = 1550.
    assert (by["fsdp"]["persistent_bytes"], by["fsdp"]["other_bytes"], by["fsdp"]["activation_bytes"]) == (450, ws, 1550)
    # A floor below the state at rest leaves nothing other, never a negative.
    assert (by["low"]["other_bytes"], by["low"]["activation_bytes"]) == (0, 600)
    # --offload: the floor is all other; the gathered units are in the 4000 above it.
    assert (by["off"]["persistent_bytes"], by["off"]["other_bytes"], by["off"]["activation_bytes"]) == (0, ws, 4000)
    assert all("lowest level" in r["basis"] for r in by.values())


def test_ulysses_keeps_its_gradients_in_ddps_buckets_like_ddp():
    # runners/ulysses.py wraps its model in DDP (gradient_as_bucket_view): its gradients are held
    # at rest, in the floor on a device and never re-allocated on CPU. Same numbers, same answer as ddp.
    ws = 64 << 20
    mem = pl.DataFrame({"run": ["ddp", "ulysses", "ddp-cpu", "ulysses-cpu"], "rank": [0] * 4, "params_bytes": [100] * 4,
                        "params_at_rest_bytes": [100] * 4, "grads_bytes": [100] * 4, "optimizer_bytes": [200] * 4})
    peaks = pl.DataFrame({"run": ["ddp", "ulysses", "ddp-cpu", "ulysses-cpu"], "rank": [0] * 4,
                          "mem_device": ["cuda:0", "cuda:0", "cpu", "cpu"], "peak_allocated_bytes": [ws + 1000, ws + 1000, 300, 300],
                          "floor_allocated_bytes": [ws + 400, ws + 400, 0, 0]})
    runs = {"ddp": {"paradigm": "ddp"}, "ulysses": {"paradigm": "ulysses"},
            "ddp-cpu": {"paradigm": "ddp"}, "ulysses-cpu": {"paradigm": "ulysses"}}
    by = {r["run"]: r for r in activation_peak(peaks, mem, runs).iter_rows(named=True)}
    # Device: (ws + 1000) − 400 − ws = 600 (the gradients not subtracted twice: 500 before the fix).
    assert by["ulysses"]["activation_bytes"] == by["ddp"]["activation_bytes"] == 600
    # CPU: nothing is re-allocated each step: the whole 300 B peak (200 before the fix).
    assert by["ulysses-cpu"]["activation_bytes"] == by["ddp-cpu"]["activation_bytes"] == 300


def test_activation_peak_leaves_out_pipedreams_stashed_weights():
    # pipedream stage 0 holds 2 stashed copies of its 100 B of weights (predicted 200 B): persistent
    # on a device, and on CPU re-allocated by each profiled forward, so not activations in either.
    mem = pl.DataFrame({"run": ["gpu", "cpu"], "rank": [0, 0], "params_bytes": [100, 100],
                        "params_at_rest_bytes": [100, 100], "grads_bytes": [100, 100], "optimizer_bytes": [200, 200],
                        "stashed_params_bytes": [200, 200]})
    peaks = pl.DataFrame({"run": ["gpu", "cpu"], "rank": [0, 0], "mem_device": ["cuda:0", "cpu"],
                          "peak_allocated_bytes": [1000, 500]})
    runs = {"gpu": {"paradigm": "pipedream"}, "cpu": {"paradigm": "pipedream"}}
    by = {r["run"]: r for r in activation_peak(peaks, mem, runs).iter_rows(named=True)}
    # Device: 1000 - (100 + 100 + 200 + 200) = 400.
    assert (by["gpu"]["persistent_bytes"], by["gpu"]["activation_bytes"], by["gpu"]["activation_pct"]) == (600, 400, 40.0)
    # CPU: grads (100) and stashes (200) allocated again each step: 500 - 300 = 200; footprint 500 + 300 before.
    assert (by["cpu"]["activation_bytes"], by["cpu"]["footprint_bytes"]) == (200, 800)
    assert all("stashed weights" in r["basis"] for r in by.values())


def test_offloaded_state_is_host_memory_not_the_gpus():
    # fsdp --offload: run.json says the state is on the CPU. The bytes are fsdp's (run.json measures
    # the host tensors), but the report says where they are, and a GPU peak holds none of them.
    offload = {"policy": "CPUOffloadPolicy", "state_device": "cpu", "pin_memory": True}
    runs = {"off": manifest("fsdp", offload=offload), "plain": manifest("fsdp", offload=None),
            "old": manifest("fsdp", options={"experts": None, "offload": True})}  # before the offload block
    m = {r["run"]: r for r in predict_memory(runs).filter(pl.col("rank") == 0).iter_rows(named=True)}
    assert m["off"]["total_bytes"] == m["plain"]["total_bytes"] > 0
    assert "in host memory (fsdp --offload)" in m["off"]["note"] and "host" not in (m["plain"]["note"] or "")
    notes = memory_notes(runs)
    assert [n.split(":")[0] for n in notes if "host memory" in n] == ["run off", "run old"]
    assert "the GPU holds none of them between uses" in notes[0]
    mem = predict_memory(runs).filter(pl.col("rank") == 0)
    peaks = pl.DataFrame({"run": ["off", "plain"], "rank": [0, 0], "mem_device": ["cuda:0", "cuda:0"],
                          "peak_allocated_bytes": [4 * 10**6, 4 * 10**6]})
    a = {r["run"]: r for r in activation_peak(peaks, mem, runs).iter_rows(named=True)}
    persistent = m["plain"]["total_bytes"]
    assert (a["plain"]["persistent_bytes"], a["plain"]["activation_bytes"]) == (persistent, 4 * 10**6 - persistent)
    assert (a["off"]["persistent_bytes"], a["off"]["activation_bytes"], a["off"]["activation_pct"]) == (0, 4 * 10**6, 100.0)
    assert "host memory" in a["off"]["basis"]

# ---------------------------------------------------------------------------------------------
# Real runs: the theory equals what run.json measured, within 1 %, on every rank.

EP = ("--experts", "4", "--top-k", "2", "--capacity-factor", "4")  # tests/runners/test_ep.py's NO_DROP
PIPELINE = ["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv", "dualpipev"]
RUNS = (
    [pytest.param(p, n, (), id=f"{p}-{n}") for p in ("ddp", "zero1", "zero2", "fsdp") for n in (2, 4)]
    + [pytest.param("tp", 2, (), id="tp-2"), pytest.param("tp", 2, ("--sp",), id="tp-sp-2"),
       pytest.param("ep", 2, EP, id="ep-2")]
    + [pytest.param(s, 2, ("--model", "tiny8", "--microbatches", "4"), id=f"{s}-2") for s in PIPELINE]
    + [pytest.param("1f1b", 4, ("--model", "tiny8", "--microbatches", "8"), id="1f1b-4"),
       pytest.param("hybrid", 8, ("--dp", "2", "--pp", "2", "--tp", "2"), id="hybrid-8")]
)


@pytest.mark.multirank
@pytest.mark.parametrize(("paradigm", "ranks", "flags"), RUNS)
def test_persistent_memory_matches_theory(runs, paradigm, ranks, flags):
    m = json.loads((runs(paradigm, ranks, *flags) / "run.json").read_text())
    runs_ = {"r": m}
    check = memory_check(predict_memory(runs_), persistent_memory(runs_))
    assert check.height == 4 * ranks
    assert check.filter(pl.col("verdict") != "match").is_empty(), check.filter(pl.col("verdict") != "match")
    # The model the theory rebuilt is the one torch counted.
    pred = predict_memory(runs_)
    if paradigm in ("ddp", "zero1", "zero2", "fsdp", "tp"):
        assert m["model"]["n_params"] == TINY
    if paradigm in ("ddp", "zero1"):
        assert pred["n_params"].to_list() == [TINY] * ranks
    if paradigm in ("zero2", "fsdp"):  # every dim 0 of tiny divides by 2 and 4: no padding
        assert pred["params_at_rest_bytes"].to_list() == [4 * TINY // ranks] * ranks
    if paradigm in PIPELINE:
        # Each layer lives on exactly one pipeline rank: the ranks add up to tiny8 (8 blocks).
        tiny8 = 2 * V * D + S * D + 8 * BLOCK + 2 * D
        assert pred["n_params"].sum() == m["model"]["n_params"] == tiny8


@pytest.mark.multirank
def test_report_of_an_offloaded_run_says_its_state_is_in_host_memory(runs, tmp_path):
    # An fsdp run (CPU here) relabelled as run.json records fsdp --offload on a GPU machine: the
    # text report and the JSON warnings say where the persistent state is.
    import shutil

    from profiler import analyze, load_traces
    from profiler.text import format_tables

    run = tmp_path / "off"
    shutil.copytree(runs("fsdp", 2), run)
    m = json.loads((run / "run.json").read_text())
    m["offload"] = {"policy": "CPUOffloadPolicy", "state_device": "cpu", "pin_memory": True}
    (run / "run.json").write_text(json.dumps(m))
    a = analyze(load_traces(run))
    assert sum("host memory" in w for w in a.warnings) == 1
    # the run is named by its folder ("off"), run.json's run_id being the copied run's
    assert "(run off: in host memory, fsdp --offload; the GPU holds none of it between uses)" in format_tables(a)

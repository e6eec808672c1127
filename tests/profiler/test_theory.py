"""Theory of communication: predict_comm on hand-written manifests (fast), comm_check on hand-made
frames, and on real runs the measured bytes per step of every collective kind equal to golden
values computed here by hand from the model preset's dims (never from predict_comm)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from profiler import analyze, load_traces
from profiler.theory import COMM_COLUMNS, CHECK_COLUMNS, predict_comm
from profiler.theory_check import comm_check
from profiler.theory_params import fsdp_padded_numel
from runners.options import MODEL_PRESETS
from tests.runners.reference import param_bytes

V, H, L, _HEADS, S, B = MODEL_PRESETS["tiny"]
PHI = param_bytes("tiny")  # 535,040 B: the tiny GPT's parameters in fp32
TENSORS = 2 + 10 * L + 3  # embeddings, per block 2 LayerNorms (w, b) + 4 attention + 2 MLP matrices, norm (w, b), head
ACT = B * S * H * 4  # one b·s·h activation in fp32, the whole global batch (tp: no data parallelism)
LOGITS = B * S * V * 4


def manifest(**over) -> dict:
    """A run.json of a tiny 2-rank run, as the runners write it (only the fields theory reads)."""
    m = {"paradigm": "ddp", "world_size": 2, "mesh": {"dp": 2}, "global_batch_size": B, "local_batch_size": B // 2,
         "model": {"preset": "tiny", "n_params": PHI // 4, "vocab_size": V, "d_model": H, "n_layers": L, "n_heads": 4,
                   "seq_len": S, "mlp_ratio": 4, "param_dtypes": {"float32": PHI // 4}},
         "options": {"sp": False}, "pipeline": None}
    return m | over


# ---------------------------------------------------------------------------------------------
# predict_comm on hand-written manifests


def test_ddp_all_reduces_phi_once_per_step():
    c = predict_comm({"r": manifest()})
    assert c.schema == pl.Schema(COMM_COLUMNS)
    ar = c.filter((pl.col("collective") == "all_reduce") & (pl.col("rank") == 0))
    assert ar["bytes"].to_list() == [PHI]
    assert ar["phi"].to_list() == [2.0]  # all-reduce = reduce-scatter + all-gather: 2Φ
    assert ar["traffic_bytes"].to_list() == [PHI * 2 * (2 - 1) / 2]  # ring: 2(n-1)/n of the buffer
    assert ar["phase"].to_list() == ["backward"]
    assert ar["calls"].to_list() == [1]  # 535 KB < DDP's first 1 MiB bucket
    # DDP's one-time bucket rebuild, step 1 only: (tensors + 1) and 1 bucket size, int32.
    once = c.filter((pl.col("collective") == "broadcast") & (pl.col("rank") == 0))
    assert sorted(once["bytes"].to_list()) == [4, 4 * (TENSORS + 1)]
    assert once["step"].to_list() == [1, 1]
    assert set(c["rank"]) == {0, 1}


def test_zero1_adds_a_parameter_broadcast_and_names_the_textbook():
    c = predict_comm({"r": manifest(paradigm="zero1")}).filter((pl.col("rank") == 0) & pl.col("step").is_null())
    bc = c.filter(pl.col("collective") == "broadcast")
    assert bc["bytes"].to_list() == [PHI] and bc["calls"].to_list() == [TENSORS] and bc["phase"].to_list() == ["optimizer"]
    assert c["phi"].sum() == 3.0  # torch's ZeroRedundancyOptimizer: 2Φ all-reduce + Φ broadcast
    assert "2Φ" in bc["note"][0] and "DeepSpeed" in bc["note"][0]


def test_fsdp_pads_dim0_to_a_multiple_of_n():
    # vocab 10, d 6, 1 layer, seq 3, N = 4: every dim 0 is rounded up to a multiple of 4 (torch.chunk + pad).
    dims = {"preset": None, "vocab_size": 10, "d_model": 6, "n_layers": 1, "n_heads": 2, "seq_len": 3, "mlp_ratio": 4,
            "param_dtypes": {"float32": 606}, "n_params": 10 * 6 + 3 * 6 + (4 * 6 + 4 * 36 + 2 * 144) + 2 * 6 + 10 * 6}
    m = manifest(paradigm="fsdp", world_size=4, mesh={"dp": 4}, model=dims)
    emb = 12 * 6 + 4 * 6  # tok [10→12, 6], pos [3→4, 6]
    block = 4 * 8 + 4 * (8 * 6) + 24 * 6 + 8 * 24  # LN w/b [6→8] x4, wq..wo [6→8, 6], up [24, 6], down [6→8, 24]
    head = 2 * 8 + 12 * 6  # norm w/b, head [10→12, 6]
    padded = 4 * (emb + block + head)
    c = predict_comm({"r": m}).filter(pl.col("rank") == 3)
    got = {(p, k): b for p, k, b in c.select("phase", "collective", "bytes").iter_rows()}
    assert got == {("forward", "all_gather"): padded, ("backward", "all_gather"): padded,
                   ("backward", "reduce_scatter"): padded}
    assert c.filter(pl.col("collective") == "all_gather")["calls"].to_list() == [3, 3]  # one per unit
    assert fsdp_padded_numel((5, 3), 4) == 8 * 3 and fsdp_padded_numel((8, 3), 4) == 8 * 3


def test_zero2_gathers_once():
    c = predict_comm({"r": manifest(paradigm="zero2")}).filter(pl.col("rank") == 0)
    assert c.group_by("collective").agg(pl.col("bytes").sum()).sort("collective").rows() == [
        ("all_gather", PHI), ("reduce_scatter", PHI)]
    assert c["phi"].sum() == 2.0


@pytest.mark.parametrize("sp", [False, True])
def test_tp_megatron_activations(sp):
    m = manifest(paradigm="tp", mesh={"tp": 2}, local_batch_size=B, options={"sp": sp})
    c = predict_comm({"r": m}).filter(pl.col("rank") == 1)
    by = dict(c.group_by("collective").agg(pl.col("bytes").sum()).iter_rows())
    if not sp:  # per layer 2 forward + 4 backward (Q, K, V apart), + the head's input gradient; logits gathered
        assert by == {"all_reduce": (6 * L + 1) * ACT, "all_gather": LOGITS}
    else:  # per layer 2 AG + 2 RS each way; head input AG/RS; first block's input AG; LN grads 3x in AdamW
        assert by == {"all_gather": (4 * L + 2) * ACT + LOGITS, "reduce_scatter": (4 * L + 1) * ACT,
                      "all_reduce": 3 * (4 * L + 2) * H * 4}


@pytest.mark.parametrize("sp", [False, True])
def test_tp_loss_parallel_replaces_the_logits_gather(sp):
    # torch's loss_parallel: 3 fp32 all-reduces of one number per token (max, sum of exp, the
    # target's logit) in forward instead of the b·s·V logits all-gather; nothing else changes.
    m = manifest(paradigm="tp", mesh={"tp": 2}, local_batch_size=B, options={"sp": sp, "loss_parallel": True})
    c = predict_comm({"r": m}).filter(pl.col("rank") == 1)
    by = dict(c.group_by("collective").agg(pl.col("bytes").sum()).iter_rows())
    loss = 3 * B * S * 4  # 3 x 8·32 tokens x 4 B = 3,072 B
    if not sp:
        assert by == {"all_reduce": (6 * L + 1) * ACT + loss}
    else:
        assert by == {"all_gather": (4 * L + 2) * ACT, "reduce_scatter": (4 * L + 1) * ACT,
                      "all_reduce": 3 * (4 * L + 2) * H * 4 + loss}
    row = c.filter(pl.col("formula").str.contains("row max")).to_dicts()
    assert [(r["phase"], r["calls"], r["bytes"]) for r in row] == [("forward", 3, 3072)]


def test_hybrid_sp_layernorm_gradients_with_and_without_fsdp():
    # Checked on real runs (dp2 pp1 tp2 --sp; dp1 pp2 tp2 --sp): with FSDP each sequence-parallel
    # LayerNorm gradient is all-reduced once in backward; without, AdamW all-reduces it 3 times.
    def ln_rows(dp):
        m = manifest(paradigm="hybrid", world_size=2 * dp, mesh={"dp": dp, "pp": 1, "tp": 2}, hybrid={"sp": True})
        c = predict_comm({"r": m}).filter((pl.col("rank") == 0) & (pl.col("collective") == "all_reduce"))
        return c.select("phase", "calls", "bytes").rows()
    n_ln = 4 * L + 2
    assert ln_rows(2) == [("backward", n_ln, n_ln * H * 4)]
    assert ln_rows(1) == [("optimizer", 3 * n_ln, 3 * n_ln * H * 4)]


def test_ep_all_to_all_from_per_rank_routing():
    moe = {"experts": 4, "top_k": 2, "capacity_factor": 1.25, "moe_layers": [1],
           "routing_by_rank": [[[{"layer": 1, "tokens_per_expert": [10, 20, 30, 40], "dropped": 0}]],
                               [[{"layer": 1, "tokens_per_expert": [1, 2, 3, 4], "dropped": 0}]]]}
    n_params = PHI // 4 - 2 * H * 4 * H + 4 * H + 4 * 2 * H * 4 * H  # one MLP -> router + 4 experts
    m = manifest(paradigm="ep", mesh={"ep": 2}, moe=moe,
                 model=manifest()["model"] | {"n_params": n_params, "param_dtypes": {"float32": n_params}})
    c = predict_comm({"r": m}).filter((pl.col("rank") == 0) & (pl.col("collective") == "all_to_all"))
    # rank 0 owns experts 0, 1: it sends its 100 pairs and receives 10 + 20 + 1 + 2 = 33.
    fwd = c.filter((pl.col("phase") == "forward") & (pl.col("step") == 0))["bytes"].sum()
    assert fwd == 100 * (H + 1) * 4 + 33 * H * 4
    assert c.filter(pl.col("phase") == "backward")["bytes"].sum() == 100 * H * 4 + 33 * (H + 1) * 4
    assert c.filter(pl.col("step").is_null())["bytes"].to_list() == [2 * 8]  # the split sizes, int64 x ranks


def test_ep_with_experts_that_do_not_divide_over_the_ranks_gets_no_sizes():
    moe = {"experts": 3, "top_k": 2, "capacity_factor": 1.25, "moe_layers": [1],
           "routing_by_rank": [[[{"layer": 1, "tokens_per_expert": [1, 2, 3], "dropped": 0}]]] * 2}
    n_params = PHI // 4 - 2 * H * 4 * H + 3 * H + 3 * 2 * H * 4 * H  # one MLP -> router + 3 experts
    m = manifest(paradigm="ep", mesh={"ep": 2}, moe=moe,
                 model=manifest()["model"] | {"n_params": n_params, "param_dtypes": {"float32": n_params}})
    a2a = predict_comm({"r": m}).filter(pl.col("collective") == "all_to_all")
    sized = a2a.filter(pl.col("bytes").is_not_null())
    assert sized["bytes"].to_list() == [2 * 8, 2 * 8]  # only the split sizes (int64 x ranks), per rank
    assert a2a.filter(pl.col("bytes").is_null())["note"].str.contains("3 experts do not divide over 2 ranks").all()


def test_missing_facts_give_notes_not_crashes():
    old = manifest()
    old["model"] = {k: v for k, v in old["model"].items() if k != "param_dtypes"}
    c = predict_comm({"old": old, "bare": {"paradigm": "ddp", "world_size": 2}, "foreign": None})
    assert set(c["run"]) == {"old"}
    assert all("fp32 assumed" in n for n in c["note"])
    # ep without per-rank routing (run.json before it was recorded): sizes refused, not guessed.
    ep = manifest(paradigm="ep", moe={"experts": 4, "top_k": 2, "capacity_factor": 1.25, "moe_layers": [1]})
    ep["model"] = ep["model"] | {"n_params": PHI // 4 - 2 * H * 4 * H + 4 * H + 4 * 2 * H * 4 * H}
    ep["model"]["param_dtypes"] = {"float32": ep["model"]["n_params"]}
    a2a = predict_comm({"ep": ep}).filter(pl.col("collective") == "all_to_all")
    assert a2a.filter(pl.col("bytes").is_null()).height and "routing" in a2a.filter(pl.col("bytes").is_null())["note"][0]
    # a parameter table that does not add up to n_params: no theory rather than a wrong one
    wrong = manifest()
    wrong["model"] = wrong["model"] | {"n_params": 12345}
    assert predict_comm({"w": wrong}).is_empty()
    # fields of the wrong type: nothing predicted, and the check says why
    odd_dims = manifest()
    odd_dims["model"] = odd_dims["model"] | {"mlp_ratio": "4"}
    for odd, why in [(odd_dims, "model dims"), (manifest(world_size="2"), "world_size"),
                     (manifest(ranks=[{}] * 3), "world_size"),
                     (manifest(paradigm="tp", global_batch_size=10**18, local_batch_size=10**18), "2^53")]:
        assert predict_comm({"odd": odd}).is_empty()
        c = comm_check({"odd": odd}, predict_comm({"odd": odd}), colls([(0, 1, "all_reduce", PHI)]).with_columns(
            run=pl.lit("odd").cast(pl.Categorical)))
        assert c["verdict"].to_list() == ["no theory"] and why in c["note"][0]


# ---------------------------------------------------------------------------------------------
# comm_check on hand-made frames


def colls(rows: list[tuple]) -> pl.DataFrame:
    """(rank, step, collective, size_bytes) rows as profiler.collectives would give them."""
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int64, "collective": pl.String, "size_bytes": pl.Int64},
                        orient="row").with_columns(run=pl.lit("r").cast(pl.Categorical))


def test_comm_check_verdicts():
    runs = {"r": manifest()}
    comm = predict_comm(runs).filter(pl.col("rank") == 0)
    measured = colls([(0, 1, "all_reduce", PHI), (0, 1, "broadcast", 4), (0, 1, "broadcast", 4 * (TENSORS + 1)),
                      (0, 2, "all_reduce", PHI), (0, 2, "all_gather", 100)])
    c = comm_check(runs, comm, measured)
    assert c.schema == pl.Schema(CHECK_COLUMNS)
    v = {q: (p, m, verdict) for q, p, m, verdict in c.select("quantity", "predicted", "measured", "verdict").iter_rows()}
    assert v["all_reduce bytes/step"] == (PHI, PHI, "match")
    assert v["broadcast bytes/step"] == ((4 + 4 * (TENSORS + 1)) / 2,) * 2 + ("match",)  # step 1 only, mean of 2 steps
    assert v["all_gather bytes/step"] == (0.0, 50.0, "above")
    assert v["volume / DDP's 2Φ"][:2] == (1.0, (2 * PHI + 100) / (2 * PHI))  # step 2 only: no one-time rows there
    short = comm_check(runs, comm, colls([(0, 1, "all_reduce", PHI), (0, 2, "all_reduce", PHI - 4)]))
    row = short.filter(pl.col("quantity") == "all_reduce bytes/step")
    assert row["verdict"].to_list() == ["below"] and "steps differ" in row["note"][0]


def test_comm_check_splits_a_hybrid_kind_by_dim():
    # dp2 x tp2 (no pp): FSDP all-gathers (dp) beside the logits gather (tp); the trace names no
    # group, so the check tells them apart by message size. Rank 0: tp rank 0, b = 8 / 2 = 4.
    runs = {"r": manifest(paradigm="hybrid", world_size=4, mesh={"dp": 2, "pp": 1, "tp": 2}, hybrid={"sp": False})}
    logits = (B // 2) * S * V * 4
    block = 4 * (3 * (H // 2) * H + H * (H // 2) + 2 * (4 * H) * H // 2 + 4 * H)  # tp-local wq,wk,wv / wo / up, down / LNs
    units = [4 * (V + S) * H, block, block, 4 * (2 * H + (V // 2) * H)]  # emb, 2 blocks, norm + head
    comm = predict_comm(runs).filter(pl.col("rank") == 0)
    gathers = [(0, 1, "all_gather", u) for u in units * 2] + [(0, 1, "all_gather", logits)]
    c = comm_check(runs, comm, colls(gathers)).filter(pl.col("quantity").str.starts_with("all_gather"))
    got = {q: (p, m, v) for q, p, m, v in c.select("quantity", "predicted", "measured", "verdict").iter_rows()}
    assert got == {"all_gather bytes/step": (2 * sum(units) + logits,) * 2 + ("match",),
                   "all_gather bytes/step (dp)": (2 * sum(units),) * 2 + ("match",),
                   "all_gather bytes/step (tp)": (logits, logits, "match")}
    missing = comm_check(runs, comm, colls(gathers[:-1])).filter(pl.col("quantity") == "all_gather bytes/step (tp)")
    assert missing.select("measured", "verdict").rows() == [(0.0, "below")]


def test_comm_check_without_theory_or_measurement():
    # A foreign trace: its measured bytes, no theory, and why.
    c = comm_check({"r": None}, pl.DataFrame(schema=COMM_COLUMNS), colls([(0, 5, "all_reduce", 40)]))
    assert c.select("measured", "verdict").rows() == [(40.0, "no theory")] and "run.json" in c["note"][0]
    # Theory for rank 1, no collective of rank 1 measured.
    runs = {"r": manifest()}
    c = comm_check(runs, predict_comm(runs), colls([(0, 2, "all_reduce", PHI)]))
    assert set(c.filter(pl.col("rank") == 1)["verdict"]) == {"no measurement"}


# ---------------------------------------------------------------------------------------------
# Real runs: measured bytes per step and collective kind == hand-computed golden values


def measured_per_step(run_dir) -> tuple[pl.DataFrame, dict]:
    """(rank, step, collective) -> summed size_bytes of the in-step collectives; and the analysis."""
    a = analyze(load_traces(run_dir))
    c = a.collectives.filter(pl.col("step").is_not_null())
    per = c.group_by("rank", "step", "collective").agg(pl.col("size_bytes").sum())
    return per, a


def assert_golden(run_dir, golden) -> pl.DataFrame:
    """`golden(rank, step)` -> {collective: bytes}; the measured bytes must equal it exactly, and the
    theory check must say "match" for every kind it predicts."""
    per, a = measured_per_step(run_dir)
    for rank, step in per.select("rank", "step").unique().iter_rows():
        got = dict(per.filter((pl.col("rank") == rank) & (pl.col("step") == step)).select("collective", "size_bytes").iter_rows())
        want = golden(rank, step)
        got = {k: v for k, v in got.items() if k in want or k not in ("send", "recv")}
        assert got == want, (run_dir.name, rank, step, got, want)
    # Every communication quantity (pipeline sends and receives too: profiler.theory_pipeline).
    check = a.theory_check.filter(~pl.col("quantity").str.starts_with("memory."))
    assert check.height and set(check["verdict"]) == {"match"}, check
    return check


@pytest.mark.multirank
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("paradigm", ["ddp", "zero1", "zero2", "fsdp"])
def test_data_parallel_bytes_match_theory(runs, paradigm, ranks):
    # tiny's dims (256, 32, 64, 256) divide by 2 and 4: FSDP pads nothing here (see the padding test).
    rebuild = 4 * (TENSORS + 1) + 4  # DDP's bucket rebuild in step 1: indices + 1 bucket size
    want = {
        "ddp": lambda s: {"all_reduce": PHI} | ({"broadcast": rebuild} if s == 1 else {}),
        "zero1": lambda s: {"all_reduce": PHI, "broadcast": PHI + (rebuild if s == 1 else 0)},
        "zero2": lambda s: {"all_gather": PHI, "reduce_scatter": PHI},
        "fsdp": lambda s: {"all_gather": 2 * PHI, "reduce_scatter": PHI},
    }[paradigm]
    check = assert_golden(runs(paradigm, ranks), lambda rank, step: want(step))
    ratio = check.filter(pl.col("quantity") == "volume / DDP's 2Φ")
    assert set(ratio["measured"]) == {{"ddp": 1.0, "zero1": 1.5, "zero2": 1.0, "fsdp": 1.5}[paradigm]}


@pytest.mark.multirank
def test_fsdp_padding_on_a_real_run(runs):
    # N = 3 divides none of tiny's dims: FSDP2 pads every dim 0 to ceil(d0/3)·3 rows.
    pad = lambda d0, rest=1: (-(-d0 // 3) * 3 - d0) * rest  # noqa: E731 - extra elements of one parameter
    block = 4 * pad(H) + 4 * pad(H, H) + pad(4 * H, H) + pad(H, 4 * H)  # 4 LN vectors, wq..wo, up, down
    extra = 4 * (pad(V, H) + pad(S, H) + L * block + 2 * pad(H) + pad(V, H))
    assert extra == 10576  # 2,644 padding elements in fp32
    assert_golden(runs("fsdp", 3, "--batch-size", "6"),
                  lambda rank, step: {"all_gather": 2 * (PHI + extra), "reduce_scatter": PHI + extra})


@pytest.mark.multirank
@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp_moves_one_and_a_half_times_ddp(runs, ranks):
    volume = {}
    for paradigm in ("ddp", "fsdp"):
        per, _ = measured_per_step(runs(paradigm, ranks))
        steady = per.filter(pl.col("step") == pl.col("step").max())  # DDP's last step: no bucket rebuild
        weight = pl.when(pl.col("collective") == "all_reduce").then(2).otherwise(1)
        volume[paradigm] = steady.filter(pl.col("rank") == 0).select((pl.col("size_bytes") * weight).sum()).item()
    assert volume["fsdp"] / volume["ddp"] == 1.5


# At 4 ranks only with --sp: its run shards the same column/row-parallel blocks over 4 ranks and
# adds the sharded collectives (all-gathers, reduce-scatters) whose measured size depends on N; plain
# tp's all-reduces are b·s·h at any N, in the runs and in the theory (profiler.theory._tp), so a
# plain tp run at 4 ranks (about 12 s of a CI run) would check nothing tp-sp-4 and tp-2 do not.
@pytest.mark.multirank
@pytest.mark.parametrize("ranks, sp", [(2, False), (2, True), (4, True)], ids=["tp-2", "tp-sp-2", "tp-sp-4"])
def test_tensor_parallel_bytes_match_theory(runs, ranks, sp):
    if sp:  # see test_tp_megatron_activations for the counts
        want = {"all_gather": (4 * L + 2) * ACT + LOGITS, "reduce_scatter": (4 * L + 1) * ACT,
                "all_reduce": 3 * (4 * L + 2) * H * 4}
    else:
        want = {"all_reduce": (6 * L + 1) * ACT, "all_gather": LOGITS}
    assert_golden(runs("tp", ranks, *(["--sp"] if sp else [])), lambda rank, step: want)


@pytest.mark.multirank
def test_tp_loss_parallel_bytes_match_theory(runs):
    want = {"all_reduce": (6 * L + 1) * ACT + 3 * B * S * 4}  # no all_gather: the logits stay sharded
    assert_golden(runs("tp", 2, "--loss-parallel"), lambda rank, step: want)


EP_FLAGS = ("--experts", "4", "--top-k", "2", "--capacity-factor", "4")  # tests/runners/test_ep.py NO_DROP
EP_DROPPING = ("--experts", "4", "--top-k", "2", "--capacity-factor", "0.5")


@pytest.mark.multirank
@pytest.mark.parametrize("ranks, flags", [(2, EP_FLAGS), (2, EP_DROPPING), (4, EP_FLAGS)], ids=["2", "2-dropping", "4"])
def test_expert_parallel_bytes_match_theory(runs, ranks, flags):
    run_dir = runs("ep", ranks, *flags)
    m = json.loads((run_dir / "run.json").read_text())
    experts, local = 4, 4 // ranks
    moe_params = PHI // 4 - 2 * H * 4 * H + experts * H + experts * 2 * H * 4 * H  # one MLP -> router + experts
    assert m["model"]["n_params"] == moe_params
    shared = 4 * (moe_params - experts * 2 * H * 4 * H)
    routing = m["moe"]["routing_by_rank"]  # [rank][step][layer]: kept pairs per expert (a run fact)

    def golden(rank, step):
        sent = sum(routing[rank][step][0]["tokens_per_expert"])
        recv = sum(routing[r][step][0]["tokens_per_expert"][e] for r in range(ranks)
                   for e in range(rank * local, (rank + 1) * local))
        # counts (int64 x ranks), dispatch rows carry h + 1 floats (the expert index), combine h; backward mirrored
        a2a = 8 * ranks + sent * (H + 1) * 4 + recv * H * 4 + sent * H * 4 + recv * (H + 1) * 4
        # first-choice counts (int64 x experts), probability sums and their gradient, shared gradients
        return {"all_to_all": a2a, "all_reduce": experts * 8 + 2 * experts * 4 + shared}

    assert_golden(run_dir, golden)


@pytest.mark.multirank
def test_hybrid_bytes_match_theory(runs):
    run_dir = runs("hybrid", 8, "--dp", "2", "--pp", "2", "--tp", "2")
    m = json.loads((run_dir / "run.json").read_text())
    mb = m["pipeline"]["microbatches"]
    act = (B // 2 // mb) * S * H * 4  # a microbatch of one replica's batch
    # FSDP units over dp = 2 of each stage's tp-local shards (tiny's dims divide: no padding).
    emb = 4 * (V + S) * H
    block = 4 * (3 * (H // 2) * H + H * (H // 2) + 4 * H * H // 2 * 2 + 4 * H)  # wq,wk,wv cols; wo rows; up, down; LN
    head = 4 * (2 * H + (V // 2) * H)

    def golden(rank, step):
        if (rank // 2) % 2 == 0:  # stage 0: embeddings + block 0
            return {"all_gather": emb + block, "reduce_scatter": emb + block, "all_reduce": 6 * mb * act}
        return {"all_gather": block + head + mb * (B // 2 // mb) * S * V * 4, "reduce_scatter": block + head,
                "all_reduce": 7 * mb * act}

    assert_golden(run_dir, golden)


@pytest.mark.multirank
def test_measured_phases(runs):
    a = analyze(load_traces(runs("zero1", 2)))
    c = a.collectives.filter(pl.col("step") == pl.col("step").max())
    assert set(c.filter(pl.col("collective") == "all_reduce")["phase"]) == {"backward"}
    assert set(c.filter(pl.col("collective") == "broadcast")["phase"]) == {"optimizer"}


def test_mesh_coords_follow_the_runners_order_tp_innermost():
    from profiler.theory_params import mesh_coords

    # dp2 x pp2 x tp2 (runners/hybrid.py): rank 5 = (dp 1 * 2 + pp 0) * 2 + tp 1
    assert mesh_coords(5, pp=2, tp=2) == {"dp": 1, "pp": 0, "tp": 1, "ep": 0}
    assert mesh_coords(6, pp=2, tp=2) == {"dp": 1, "pp": 1, "tp": 0, "ep": 0}
    assert mesh_coords(3, ep=4) == {"dp": 0, "pp": 0, "tp": 0, "ep": 3}

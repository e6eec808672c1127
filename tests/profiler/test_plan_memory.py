"""Memory per GPU of a layout (profiler/plan_memory.py): the bars of Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", Figure 1 (computed by the paper
from its Table 2 per-layer formulas -- a check of our accounting against the paper's, not of
predictive accuracy) as golden values, and hand-computed tiny models."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profiler.layout import Layout, ModelSpec
from profiler.plan_memory import in_flight, layer_activation_bytes, memory_per_gpu

GIB = 2**30

# Korthikanti et al. 2022, Figure 1 (parameter + optimizer memory and activation memory of the 22B,
# 175B, 530B and 1T configurations of its Table 3; activations from Table 2's formulas), GiB per GPU:
# (layers, hidden, heads, tp, pp, microbatch, v, params+optimizer, activations none, seq+selective)
FIGURE1 = {
    "22B": (48, 6144, 64, 8, 1, 4, 1, 45.56, 59.25, 9.56),
    "175B": (96, 12288, 96, 8, 8, 1, 3, 45.56, 66.84, 12.35),
    "530B": (105, 20480, 128, 8, 35, 1, 3, 31.64, 114.02, 23.08),
    "1T": (128, 25600, 160, 8, 64, 1, 1, 32.96, 131.25, 26.56),
}


def _layout(pp, mb, v, **kw):
    sched = "interleaved-1f1b" if v > 1 else "1f1b"
    return Layout(tp=8, pp=pp, microbatch=mb, microbatches=64, schedule=sched, stages_per_rank=v, **kw)


@pytest.mark.parametrize("name", FIGURE1)
def test_transformer_layer_activations_match_figure1(name):
    # The paper's per-layer formulas times the in-flight layers of the first stage (1F1B: L layers'
    # worth; interleaved: L(1 + (p-1)/(pv))), s = 2048, 2-byte activations: its Figure 1 bars.
    layers, h, a, t, p, b, v, _, none_gib, sel_gib = FIGURE1[name]
    for recompute, sp, want in (("none", False, none_gib), ("selective", True, sel_gib)):
        lay = _layout(p, b, v, recompute=recompute, sp=sp)
        held, _ = in_flight(lay, layers, 0)
        got = held * layer_activation_bytes(b, 2048, h, a, 4 * h, t, sp, recompute) / GIB
        assert got == pytest.approx(want, abs=0.01)


@pytest.mark.parametrize("name", FIGURE1)
def test_whole_model_memory_within_ten_percent_of_figure1(name):
    # memory_per_gpu adds what the paper leaves out (embedding on stage 0, logits on the last):
    # still within 10 % of Figure 1 at 18 B/param (fp16 weights, fp32 grads, fp32 Adam state).
    layers, h, a, t, p, b, v, state_gib, none_gib, sel_gib = FIGURE1[name]
    spec = ModelSpec(layers=layers, hidden=h, heads=a, ffn=4 * h, vocab=51200, seq=2048, global_batch=64 * b,
                     grad_bytes=4)
    mem = memory_per_gpu(spec, _layout(p, b, v))
    assert (mem["params"] + mem["grads"] + mem["optimizer"]) / GIB == pytest.approx(state_gib, rel=0.12)
    assert mem["activations"] / GIB == pytest.approx(none_gib, rel=0.03)
    sel = memory_per_gpu(spec, _layout(p, b, v, recompute="selective", sp=True))
    assert sel["activations"] / GIB == pytest.approx(sel_gib, rel=0.03)


def test_state_bytes_of_the_22b_layers_by_hand():
    # 22B's 48 layers on tp=8, pp=1, a vocabulary and sequence of 8 so that the layers dominate:
    # per layer 12h²/t + 4h = 1.5 · 6144² + 4 · 6144 = 56,647,680 parameters, x 48 = 2,719,088,640;
    # plus the embedding ⌈8/8⌉·h = 6,144, positions 8·h = 49,152, final norm 2h = 12,288 and head
    # 6,144: 2,719,162,368 parameters at 2 + 4 + 12 = 18 B (fp16 weights, fp32 grads, fp32 Adam)
    spec = ModelSpec(layers=48, hidden=6144, heads=64, ffn=4 * 6144, vocab=8, seq=8, global_batch=1, grad_bytes=4)
    mem = memory_per_gpu(spec, Layout(tp=8, microbatch=1, microbatches=1))
    assert mem["params"] + mem["grads"] + mem["optimizer"] == 2_719_162_368 * 18
    # the paper's 12·l·h²/t · 18 B = 45.56 GiB (Figure 1, 22B) leaves out the 4h of LayerNorms per layer
    assert (mem["params"] + mem["grads"] + mem["optimizer"]) / GIB == pytest.approx(45.56, rel=2e-3)


TINY = ModelSpec(layers=2, hidden=8, heads=2, ffn=32, vocab=16, seq=4, global_batch=2)


def test_tiny_params_grads_optimizer_by_hand():
    # per layer 4h² + 4h + 2h·ffn = 256 + 32 + 512 = 800; embedding V·h + s·h = 128 + 32 = 160;
    # final norm 2h + head V·h = 16 + 128 = 144; total 1904 (= count_params()).
    assert TINY.count_params() == 1904
    mem = memory_per_gpu(TINY, Layout(microbatches=2))
    assert (mem["params"], mem["grads"], mem["optimizer"]) == (1904 * 2, 1904 * 2, 1904 * 12)
    # ZeRO over dp=2: 1 shards the optimizer, 2 the gradients too, 3 the weights (+ 2 gathered layers)
    z = {k: memory_per_gpu(TINY, Layout(dp=2, zero=k)) for k in (1, 2, 3)}
    assert z[1]["optimizer"] == 1904 * 12 // 2 and z[1]["grads"] == 1904 * 2
    assert z[2]["grads"] == 1904 * 2 // 2
    assert z[3]["params"] == 1904 * 2 // 2 + 2 * 800 * 2


def test_tiny_activations_by_hand():
    # b=1, s=4, h=8, a=2, f=32: sbh = 32; sbh(18 + 4f/h) = 32·34 = 1088; 5as²b = 5·2·16 = 160
    assert layer_activation_bytes(1, 4, 8, 2, 32) == 1248
    # full recomputation keeps the layer input only: 2sbh = 64
    assert layer_activation_bytes(1, 4, 8, 2, 32, recompute="full") == 64
    # selective drops the attention core: 1088
    assert layer_activation_bytes(1, 4, 8, 2, 32, recompute="selective") == 1088


def test_sequence_parallel_divides_the_layernorm_and_dropout_part_by_t():
    b, s, h, a, f, t = 2, 512, 1024, 16, 4096, 4
    sbh = b * s * h
    no_sp = layer_activation_bytes(b, s, h, a, f, t, sp=False)
    with_sp = layer_activation_bytes(b, s, h, a, f, t, sp=True)
    # the 10sbh that tp alone keeps whole (layernorm inputs, masks, MLP input) is split by t
    assert no_sp - with_sp == pytest.approx(10 * sbh * (1 - 1 / t))
    # ... and with sp the whole layer is 1/t of the unsplit one: sbh(34 + 5as/h)/t
    assert with_sp == pytest.approx(sbh * (34 + 5 * a * s / h) / t)


def test_in_flight_by_schedule():
    L = 24
    assert in_flight(Layout(pp=4, microbatches=8), L, 0) == (24.0, 4)  # 1F1B stage 0: p·L/p
    assert in_flight(Layout(pp=4, microbatches=8), L, 3) == (6.0, 1)  # last stage: one microbatch
    assert in_flight(Layout(pp=4, microbatches=2), L, 0) == (12.0, 2)  # fewer microbatches than stages
    assert in_flight(Layout(pp=4, microbatches=8, schedule="gpipe"), L, 0) == (48.0, 8)
    # interleaved v=2: L(1 + (p-1)/(pv)) = 24·(1 + 3/8) = 33
    assert in_flight(Layout(pp=4, microbatches=8, schedule="interleaved-1f1b", stages_per_rank=2), L, 0)[0] == 33.0
    assert in_flight(Layout(microbatches=8), L, 0) == (24.0, 1)  # no pipeline: one at a time


def test_full_recompute_holds_inputs_plus_one_layer():
    spec = ModelSpec(layers=8, hidden=64, heads=4, ffn=256, vocab=32, seq=16, global_batch=4)
    none = memory_per_gpu(spec, Layout(microbatch=4))
    full = memory_per_gpu(spec, Layout(microbatch=4, recompute="full"))
    layer = layer_activation_bytes(4, 16, 64, 4, 256)
    extra = none["activations"] - 8 * layer  # embedding mask and logits, the same in both
    assert full["activations"] == pytest.approx(8 * 2 * 4 * 16 * 64 + layer + extra, abs=1)
    assert full["activations"] < none["activations"]


def test_memory_falls_with_sharding_and_is_never_negative():
    spec = ModelSpec(layers=4, hidden=64, heads=4, ffn=256, vocab=100, seq=32, global_batch=8, experts=4, top_k=2)
    totals = []
    for zero in (0, 1, 2, 3):
        mem = memory_per_gpu(spec, Layout(dp=4, ep=2, zero=zero, microbatch=1, microbatches=2))
        assert all(v >= 0 for v in mem.values())
        assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
        totals.append(mem["total"])
    assert totals[0] > totals[1] > totals[2]


def test_flash_attention_keeps_no_scores():
    # b=1, s=4, h=8, a=2, f=32: sbh(18 + 4f/h) = 1088 kept; the 5as²b = 160 scores are replaced by
    # the fp32 log-sum-exp per row and head, 4·a·s·b = 32
    assert layer_activation_bytes(1, 4, 8, 2, 32, flash=True) == 1088 + 32
    spec = ModelSpec(layers=4, hidden=64, heads=4, ffn=256, vocab=32, seq=256, global_batch=4)
    lay = Layout(microbatch=4)
    fused = memory_per_gpu(replace(spec, flash_attention=True), lay)
    assert fused["activations"] < memory_per_gpu(spec, lay)["activations"]

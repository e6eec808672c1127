"""The analytical step model (profiler/costmodel.py, costmodel_ops.py): hand-computed FLOPs and
roofline times, and properties that would fail if a term were wrong."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from profiler.cluster import Cluster, Link
from profiler.costmodel import BREAKDOWN_KEYS, estimate, gemm_time_s, memory_bound_time_s, microbatch_costs
from profiler.costmodel_ops import gemm_flops, layer_gemms, model_flops_per_sequence, wave_efficiency
from profiler.layout import Layout, ModelSpec

# A made-up GPU with round numbers (no SM count: no wave quantization unless named "a100").
GPU = Cluster(name="testgpu", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=1000.0, gpus_per_node=8,
              intra=Link("nvlink", 100.0, 2.0), inter=Link("ib", 10.0, 10.0),
              gemm_efficiency=0.5, hbm_efficiency=0.5, link_efficiency=0.5)
SPEC = ModelSpec(layers=8, hidden=1024, heads=16, ffn=4096, vocab=32000, seq=1024, global_batch=32)


def test_layer_flops_by_hand():
    # b=1, s=4, h=8, ffn=32, 2 heads: per token QKV 2·8·24 = 384, out 2·8·8 = 128, MLP 2·2·8·32 =
    # 1024, scores + context 2·2·4·8 = 128 -> 1664; 4 tokens: 6656.
    assert gemm_flops(layer_gemms(1, 4, 8, 2, 32)) == 6656
    # tp=2 halves every GEMM: 3328
    assert gemm_flops(layer_gemms(1, 4, 8, 2, 32, t=2)) == 3328


def test_model_flops_match_narayanan_with_ffn_4h():
    # Narayanan et al. 2021 eq. (3) without recomputation: 72·s·l·h²(1 + s/6h) + 6·s·h·V per sequence
    l, h, s, v = 4, 96, 48, 1000
    want = 72 * s * l * h * h * (1 + s / (6 * h)) + 6 * s * h * v
    assert model_flops_per_sequence(l, s, h, 8, 4 * h, v) == pytest.approx(want)


def test_gemm_time_roofline_by_hand():
    # compute-bound: 2·4096³ FLOPs at 100 TFLOP/s · 0.5 = 2.749 ms
    assert gemm_time_s(4096, 4096, 4096, GPU) == pytest.approx(2 * 4096**3 / 50e12)
    # memory-bound (m = 1): bytes 2·(1·4096 + 4096·4096 + 1·4096) at 1000 GB/s · 0.5
    assert gemm_time_s(1, 4096, 4096, GPU) == pytest.approx(2 * (4096 + 4096 * 4096 + 4096) / 500e9)
    assert memory_bound_time_s(1e9, GPU) == pytest.approx(1e9 / 500e9)
    assert gemm_time_s(0, 4096, 4096, GPU) == 0.0


def test_wave_quantization_by_hand():
    # m=256, n=128·109 on 108 SMs: 256x128 tiles 1·109 = 109 -> 2 waves of 108: useful
    # 256·13952 / (216 · 256·128) = 109/216 (128x256 tiles: 2·55 = 110, also 2 waves, the same)
    assert wave_efficiency(256, 128 * 109, 108) == pytest.approx(109 / 216)
    # a partial tile costs a whole one: m=300 -> 2 rows of 256-tiles (or 3 of 128), 108·... :
    # 300·128 / (1 wave · 108 · 32768) = 38400 / 3538944
    assert wave_efficiency(300, 128, 108) == pytest.approx(38400 / 3538944)
    # 108 tiles exactly: one full wave
    assert wave_efficiency(256 * 108, 128, 108) == pytest.approx(1.0)
    # one 256x128 tile on 108 SMs: 1/108 (one SM works)
    assert wave_efficiency(256, 128, 108) == pytest.approx(1 / 108)
    a100 = replace(GPU, name="A100 test")  # named: 108 SMs
    slow = gemm_time_s(256, 128 * 109, 8192, a100)
    assert slow == pytest.approx(2 * 256 * 128 * 109 * 8192 / (50e12 * 109 / 216))


def _est(layout, cluster=GPU, spec=SPEC):
    layout.check(spec, layout.gpus)
    return estimate(spec, layout, cluster)


def test_breakdown_sums_to_step_and_names_its_keys():
    est = _est(Layout(dp=2, tp=2, pp=2, zero=1, microbatch=2, microbatches=8, recompute="selective", sp=True))
    assert set(est.breakdown_s) == set(BREAKDOWN_KEYS)
    assert sum(est.breakdown_s.values()) == pytest.approx(est.step_s)
    assert est.memory_bytes["total"] > 0 and est.fits
    assert est.assumptions and "efficiency" in est.dominant


def test_full_recompute_adds_one_forward():
    # no tp/dp/pp: compute = m·(fwd + bwd) + head, bwd = 2·fwd for the GEMMs (same-size data and
    # weight gradients) and the memory-bound ops (BWD_MEM_FACTOR): recompute = (compute - head)/3.
    lay = Layout(microbatch=2, microbatches=16)
    none, full = _est(lay), _est(replace(lay, recompute="full"))
    c = microbatch_costs(SPEC, GPU, 2, 1, 1, False, "full", 1, 1, 1, 1)
    head = 16 * (c["head_gemm"] + c["head_mem"])
    assert full.breakdown_s["recompute"] == pytest.approx((full.breakdown_s["compute"] - head) / 3)
    assert full.breakdown_s["compute"] == pytest.approx(none.breakdown_s["compute"])
    assert none.breakdown_s["recompute"] == 0.0
    # full recompute repeats the forward's 2 tp all-reduces: 6 per layer instead of 4
    t_none = _est(Layout(tp=2, microbatch=2, microbatches=16)).breakdown_s["comm_exposed:tp"]
    t_full = _est(Layout(tp=2, microbatch=2, microbatches=16, recompute="full")).breakdown_s["comm_exposed:tp"]
    assert t_full == pytest.approx(1.5 * t_none)


def test_1f1b_bubble_is_p_minus_1_over_m_of_the_ideal():
    p, m = 4, 16
    est = _est(Layout(pp=p, microbatch=2, microbatches=m))
    ideal = est.step_s - est.breakdown_s["bubble"] - est.breakdown_s["optimizer"]  # m microbatches, no idling
    assert est.breakdown_s["bubble"] == pytest.approx((p - 1) / m * ideal)
    inter = _est(Layout(pp=p, microbatch=2, microbatches=m, schedule="interleaved-1f1b", stages_per_rank=2))
    ideal_i = inter.step_s - inter.breakdown_s["bubble"] - inter.breakdown_s["optimizer"]
    assert inter.breakdown_s["bubble"] == pytest.approx((p - 1) / (2 * m) * ideal_i)
    # ZB-H1 (Qi et al. 2023): the weight gradients W fill the bubble: (p-1)(F + B - W) = (p-1)(t_mb - 2W)
    zb = _est(Layout(pp=p, microbatch=2, microbatches=m, schedule="zero-bubble"))
    c = microbatch_costs(SPEC, GPU, 2, 1, 1, False, "none", 1, 1, 1, 1, 4)
    w = 8 / p * c["dense_gemm_w"] + c["head_w"]  # 2 layers on this stage + the head
    t_mb = ideal / m
    assert zb.breakdown_s["bubble"] == pytest.approx((p - 1) * (t_mb - 2 * w))
    assert 0 < zb.breakdown_s["bubble"] < est.breakdown_s["bubble"]


def test_tp_across_nodes_is_slower_when_the_network_is_10x_slower():
    lay = Layout(tp=8, microbatch=2, microbatches=16)
    inside = _est(lay, GPU)  # 8 GPUs per node: tp on NVLink (100 GB/s)
    # tp spans 2 nodes of 4: 4 NICs of 10 GB/s each carry the group's ring (commcost.group_link),
    # 40 GB/s against NVLink's 100: 2.5x the bandwidth term, and the NIC's larger latency
    across = _est(lay, replace(GPU, gpus_per_node=4))
    assert across.breakdown_s["comm_exposed:tp"] > 2.5 * inside.breakdown_s["comm_exposed:tp"]
    assert across.step_s > inside.step_s
    assert across.breakdown_s["compute"] == pytest.approx(inside.breakdown_s["compute"])


def test_sequence_parallel_keeps_tp_traffic():
    # sp replaces each all-reduce by an all-gather + reduce-scatter of the same traffic; only the
    # latency terms differ (2(n-1) steps either way for the pair)
    a = _est(Layout(tp=4, microbatch=2, microbatches=16)).breakdown_s["comm_exposed:tp"]
    b = _est(Layout(tp=4, microbatch=2, microbatches=16, sp=True)).breakdown_s["comm_exposed:tp"]
    assert b == pytest.approx(a, rel=1e-9)


def test_ddp_gradients_hide_under_backward_but_the_last_bucket():
    # a big backward hides all but the last 25 MB bucket's share of the all-reduce
    est = _est(Layout(dp=8, microbatch=4, microbatches=1))
    assert 0 < est.breakdown_s["comm_exposed:dp"] < 0.5 * est.breakdown_s["compute"]
    slow_net = replace(GPU, gpus_per_node=1)  # every dp peer across the 10 GB/s NIC
    assert _est(Layout(dp=8, microbatch=4, microbatches=1), slow_net).breakdown_s["comm_exposed:dp"] > \
        est.breakdown_s["comm_exposed:dp"]


def test_mfu_is_model_flops_over_step_and_peak():
    lay = Layout(dp=2, tp=2, microbatch=4, microbatches=4)
    est = _est(lay)
    flops = model_flops_per_sequence(8, 1024, 1024, 16, 4096, 32000) * 32
    assert est.mfu_pct == pytest.approx(100 * flops / (est.step_s * 4 * 100e12))
    assert 0 < est.mfu_pct < 50  # gemm_efficiency 0.5 bounds it


def test_compute_scale_scales_compute_only():
    lay = Layout(tp=2, microbatch=2, microbatches=16)
    base, scaled = _est(lay), estimate(SPEC, lay, GPU, compute_scale=2.0)
    assert scaled.breakdown_s["compute"] == pytest.approx(2 * base.breakdown_s["compute"])
    assert scaled.breakdown_s["comm_exposed:tp"] == pytest.approx(base.breakdown_s["comm_exposed:tp"])
    assert any("scaled by 2" in a for a in scaled.assumptions)
    assert any("assumed" in a for a in base.assumptions)


EDGE = ModelSpec(layers=4, hidden=64, heads=4, ffn=96, vocab=50, seq=8, global_batch=16, experts=4, top_k=2)


@pytest.mark.parametrize("layout", [
    Layout(dp=16, microbatch=1, microbatches=1, zero=3),
    Layout(dp=4, ep=4, microbatch=4, microbatches=1, zero=2),
    Layout(tp=4, pp=4, microbatch=1, microbatches=16, schedule="gpipe", recompute="full", sp=True),
    Layout(pp=4, microbatch=4, microbatches=4, schedule="interleaved-1f1b"),  # m = pp, the fewest allowed
    Layout(cp=8, dp=2, microbatch=8, microbatches=1, recompute="selective"),
    Layout(dp=2, ep=2, pp=2, tp=4, microbatch=1, microbatches=8, schedule="zero-bubble", zero=1),
])
def test_edge_layouts_give_finite_non_negative_numbers(layout):
    est = _est(layout, spec=EDGE)
    vals = [est.step_s, est.mfu_pct, *est.breakdown_s.values(), *est.memory_bytes.values()]
    assert all(math.isfinite(v) and v >= 0 for v in vals)
    assert est.step_s > 0 and sum(est.breakdown_s.values()) == pytest.approx(est.step_s)


def test_flash_attention_backward_recomputes_the_scores():
    # fused attention: no softmax bytes in HBM, backward 2.5x the core's forward (not 2x), and
    # selective recomputation has nothing left to recompute
    flash = replace(SPEC, flash_attention=True)
    plain = microbatch_costs(SPEC, GPU, 2, 1, 1, False, "selective", 1, 1, 1, 1)
    fused = microbatch_costs(flash, GPU, 2, 1, 1, False, "selective", 1, 1, 1, 1)
    assert fused["dense_gemm_b"] - plain["dense_gemm_b"] == pytest.approx(0.5 * plain["dense_attn_f"])
    assert fused["dense_mem_f"] < plain["dense_mem_f"]
    assert fused["dense_rc"] == 0.0 < plain["dense_rc"]
    lay = Layout(microbatch=2, microbatches=16)
    assert _est(lay, spec=flash).step_s < _est(lay).step_s
    assert any("flash" in a for a in _est(lay, spec=flash).assumptions)


def test_impossible_layouts_and_scales_are_refused():
    from profiler.layout import LayoutError
    with pytest.raises(LayoutError, match="heads"):
        estimate(SPEC, Layout(tp=3, microbatch=2, microbatches=16), GPU)
    with pytest.raises(LayoutError, match="global batch"):
        estimate(SPEC, Layout(microbatch=2, microbatches=3), GPU)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="compute_scale"):
            estimate(SPEC, Layout(microbatch=2, microbatches=16), GPU, compute_scale=bad)


@pytest.mark.parametrize("schedule,v", [("interleaved-1f1b", 2), ("zero-bubble", 1), ("1f1b", 1), ("gpipe", 1)])
def test_fewer_microbatches_than_stages_are_refused(schedule, v):
    # interleaved pp=4 v=2 m=1: one microbatch walks 8 chunks in turn, 4 t_mb at least, where the
    # (p-1)/v formula says 1 + 1.5 = 2.5 t_mb; ZB-H1's (p-1)(F+B-W) has no W to fill the bubble
    # with when m < p. A pipeline needs m >= pp (plan enumerates only those).
    from profiler.layout import LayoutError
    with pytest.raises(LayoutError, match=r"microbatches=1 < pp=4"):
        estimate(SPEC, Layout(pp=4, microbatch=32, microbatches=1, schedule=schedule, stages_per_rank=v), GPU)
    assert estimate(SPEC, Layout(pp=4, microbatch=8, microbatches=4, schedule=schedule, stages_per_rank=v), GPU).step_s > 0

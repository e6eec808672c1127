"""Each communication term and the optimizer time of profiler.costmodel.estimate in one small
estimate, against the α–β formulas (docs/whatif.md "Communication" and "Compute") with the numbers
written out. Cluster: 100 GB/s intra link at α = 2 µs, link_efficiency 0.8 (8e10 B/s usable),
1000 GB/s HBM at hbm_efficiency 0.8, 8 GPUs per node."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profiler.cluster import Cluster, Link
from profiler.costmodel import estimate
from profiler.layout import Layout, ModelSpec

GPU = Cluster(name="testgpu", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=1000.0, gpus_per_node=8,
              intra=Link("nvlink", 100.0, 2.0), inter=Link("ib", 10.0, 5.0),
              gemm_efficiency=0.8, hbm_efficiency=0.8, link_efficiency=0.8)
# a link so slow (0.01 GB/s) that the compute a term hides under (~1e-5 s a layer) is < 0.1 % of it
SLOW = replace(GPU, intra=Link("slow", 0.01, 2.0))
# h = 256, s = 128, 2 layers. Parameters on one GPU (tp = pp = 1): per layer 4h² + 4h = 263,168
# (attention, LayerNorms) + 2·h·ffn = 524,288 (MLP) = 787,456; x 2 = 1,574,912; embedding V·h =
# 256,000, positions s·h = 32,768, final norm 2h = 512, head V·h = 256,000: 2,120,192 in all.
SMALL = ModelSpec(layers=2, hidden=256, heads=4, ffn=1024, vocab=1000, seq=128, global_batch=8)
PARAMS = 2_120_192
LAYER = 787_456


def test_tp_all_reduces():
    # tp=2, b=2: one b·s·h activation = 2 B · 2 · 128 · 256 = 131,072 B; a ring all-reduce over 2:
    # 2 steps of 2 µs + 2·(1/2)·131,072 B / 8e10 B/s = 4e-6 + 1.6384e-6 = 5.6384e-6 s;
    # 4 per layer (2 forward, 2 backward), 2 layers, m = 4 microbatches: 32 x 5.6384e-6 s
    est = estimate(SMALL, Layout(tp=2, microbatch=2, microbatches=4), GPU)
    assert est.breakdown_s["comm_exposed:tp"] == pytest.approx(32 * 5.6384e-6, rel=1e-9)


def test_dp_gradient_all_reduce():
    # dp=2, ZeRO-0: 2,120,192 params x 2 B = 4,240,384 B of gradients, under one 25 MiB bucket, so
    # all of it is exposed; all-reduce over 2 (auto: ring and tree both 2 steps): 2 x 2 µs +
    # 2·(1/2)·4,240,384 / 8e10 = 4e-6 + 5.30048e-5 s
    est = estimate(SMALL, Layout(dp=2, microbatch=4, microbatches=1), GPU)
    assert est.breakdown_s["comm_exposed:dp"] == pytest.approx(4e-6 + PARAMS * 2 / 8e10, rel=1e-9)


def test_zero3_gathers_and_reduce_scatters_each_layer():
    # dp=2, ZeRO-3 on the slow link: all-gather of one layer's 787,456 params x 2 B over 2 ranks:
    # 1 step of 2 µs + (1/2)·1,574,912 B / 8e6 B/s = 0.098434 s = ag; its gradients'
    # reduce-scatter is the same. Per layer: gather forward (ag), gather + reduce-scatter backward
    # (2 ag), and the first layer's gather before the step (ag): 2 layers -> 2·3·ag + ag = 7 ag
    ag = 2e-6 + LAYER * 2 / 2 / 8e6
    est = estimate(SMALL, Layout(dp=2, zero=3, microbatch=4, microbatches=1), SLOW)
    assert est.breakdown_s["comm_exposed:dp"] == pytest.approx(7 * ag, rel=1e-3)


def test_cp_ring_attention_passes():
    # cp=2, b=8: K and V of the local s/cp = 64 tokens, 2 · (2 B · 8 · 64 · 256) = 524,288 B, sent
    # to the neighbour (cp - 1 = 1 time) forward and (K, V, dK, dV) twice more backward: 3 sends
    # a layer of 2 µs + 524,288 / 8e6 = 0.065538 s, 2 layers, m = 1: 6 sends (slow link)
    send = 2e-6 + 524_288 / 8e6
    est = estimate(SMALL, Layout(cp=2, microbatch=8, microbatches=1), SLOW)
    assert est.breakdown_s["comm_exposed:cp"] == pytest.approx(6 * send, rel=1e-3)


def test_ep_all_to_alls():
    # MoE, 4 experts top-2 in every block, ep=2 (dp=2), b=4: routed tokens k·b·s·h·2 B =
    # 2 · 4 · 128 · 256 · 2 = 524,288 B; an all-to-all over 2: 1 step of 2 µs + (1/2)·524,288 /
    # 8e10 = 2e-6 + 3.2768e-6 = 5.2768e-6 s; dispatch + combine forward and backward (4) x 2 layers
    moe = replace(SMALL, experts=4, top_k=2)
    est = estimate(moe, Layout(dp=2, ep=2, microbatch=4, microbatches=1), GPU)
    assert est.breakdown_s["comm_exposed:ep"] == pytest.approx(8 * 5.2768e-6, rel=1e-9)


def test_pp_sends():
    # pp=2, b=1: one b·s·h activation 2 B · 1 · 128 · 256 = 65,536 B sent forward and its gradient
    # back: 2 x (2 µs + 65,536 / 8e10 = 2.8192e-6 s) per microbatch, m = 8
    est = estimate(SMALL, Layout(pp=2, microbatch=1, microbatches=8), GPU)
    assert est.breakdown_s["comm_exposed:pp"] == pytest.approx(8 * 2 * 2.8192e-6, rel=1e-9)


def test_optimizer_streams_its_state():
    # Adam on 2,120,192 local params: read + write the 12 B of fp32 state (24 B), read the 2 B
    # gradient, write the 2 B weight: 28 B/param = 59,365,376 B at 1000 GB/s x 0.8 = 7.420672e-5 s
    est = estimate(SMALL, Layout(microbatch=8, microbatches=1), GPU)
    assert est.breakdown_s["optimizer"] == pytest.approx(PARAMS * 28 / 8e11, rel=1e-9)
    assert PARAMS * 28 / 8e11 == pytest.approx(7.420672e-5, rel=1e-9)
    # ZeRO-1 over 2 shards it: half the params, half the time
    z1 = estimate(SMALL, Layout(dp=2, zero=1, microbatch=4, microbatches=1), GPU)
    assert z1.breakdown_s["optimizer"] == pytest.approx(PARAMS / 2 * 28 / 8e11, rel=1e-9)

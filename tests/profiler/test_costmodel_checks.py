"""Specs and layouts the cost model must refuse (one LayoutError line naming the field) rather than
price with a silent wrong number, and the vocabulary padding of the vocabulary-parallel head."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profiler.cluster import Cluster, Link
from profiler.costmodel import estimate
from profiler.costmodel_ops import head_gemms
from profiler.layout import Layout, LayoutError, ModelSpec
from profiler.plan_memory import memory_per_gpu

GPU = Cluster(name="testgpu", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=1000.0, gpus_per_node=8,
              intra=Link("nvlink", 100.0, 2.0), inter=Link("ib", 10.0, 5.0))
SPEC = ModelSpec(layers=8, hidden=1024, heads=16, ffn=4096, vocab=32000, seq=1024, global_batch=32)
MOE = replace(SPEC, experts=4, top_k=2)


@pytest.mark.parametrize("spec,field", [
    (replace(MOE, moe_every=0), "moe_every 0"),  # was a ZeroDivisionError
    (replace(MOE, moe_every=-1), "moe_every -1"),  # was a negative memory
    (replace(MOE, moe_every=9), "moe_every 9 > layers 8"),
    (replace(SPEC, param_bytes=-2), "param_bytes -2"),
    (replace(SPEC, param_bytes=0), "param_bytes 0"),
    (replace(SPEC, grad_bytes=-1), "grad_bytes -1"),
    (replace(SPEC, optimizer_bytes_per_param=-12), "optimizer_bytes_per_param -12"),
    (replace(SPEC, param_bytes=float("nan")), "param_bytes nan"),
    (replace(SPEC, top_k=2), "top_k 2 without experts"),
])
def test_bad_specs_are_refused_naming_the_field(spec, field):
    with pytest.raises(LayoutError, match=field):
        estimate(spec, Layout(microbatch=2, microbatches=16), GPU)


def test_tp_that_does_not_divide_ffn_is_refused():
    # ffn 4098 over tp=4: the column-parallel MLP-up has no whole width per rank
    spec = replace(SPEC, ffn=4098)
    with pytest.raises(LayoutError, match=r"tp=4 does not divide the MLP's ffn 4098"):
        estimate(spec, Layout(tp=4, microbatch=2, microbatches=16), GPU)
    assert estimate(spec, Layout(tp=1, microbatch=2, microbatches=16), GPU).step_s > 0


def test_vocabulary_is_padded_to_tp_not_truncated():
    # V = 50 over tp = 4: ceil(50/4) = 13 rows per rank (52 padded), not 50 // 4 = 12; V = 3 over
    # tp = 4: 1 row per rank, not a zero-width GEMM
    assert head_gemms(2, 8, 64, 50, t=4)["logits"] == (16, 13, 64, 1)
    assert head_gemms(2, 8, 64, 3, t=4)["logits"] == (16, 1, 64, 1)
    assert SPEC.vocab_per_rank(3) == 10667  # 32000 / 3 = 10666.67 -> 10667
    # memory: the last stage's head holds ceil(V/t)·h weights (2 B) and fp32 logits b·s·ceil(V/t)·4
    spec = ModelSpec(layers=2, hidden=64, heads=4, ffn=256, vocab=50, seq=8, global_batch=4)
    one = memory_per_gpu(spec, Layout(tp=4, microbatch=4, microbatches=1))
    spec52 = replace(spec, vocab=52)  # the padded vocabulary: the same memory
    assert one == memory_per_gpu(spec52, Layout(tp=4, microbatch=4, microbatches=1))


@pytest.mark.parametrize("layout,msg", [
    (Layout(zero=1, microbatch=2, microbatches=16), "zero=1 with dp·cp = 1"),
    (Layout(zero=3, microbatch=2, microbatches=16), "zero=3 with dp·cp = 1"),
    (Layout(sp=True, microbatch=2, microbatches=16), "sp with tp=1"),
])
def test_layouts_that_mean_nothing_are_refused(layout, msg):
    with pytest.raises(LayoutError, match=msg):
        estimate(SPEC, layout, GPU)
    # with something to shard over / split over, the same knob is a layout
    ok = replace(layout, dp=2, microbatches=8) if layout.zero else replace(layout, tp=2)
    assert estimate(SPEC, ok, GPU).step_s > 0


def test_run_mapping_never_gives_zero_at_one_rank_or_sp_at_tp_one():
    from profiler.project import run_layout

    model = {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 50, "seq_len": 8, "mlp_ratio": 4}
    for paradigm, extra in (("zero1", {}), ("fsdp", {}), ("tp", {"sp": True})):
        manifest = {"paradigm": paradigm, "world_size": 1, "mesh": {}, "options": extra, "model": model}
        lay = run_layout(manifest, SPEC)
        assert lay.gpus == 1 and lay.zero == 0 and not lay.sp
        lay.check(SPEC)


def test_plan_never_enumerates_meaningless_layouts():
    from profiler.plan import rule_of_thumb, splits, variants

    spec = ModelSpec(layers=4, hidden=256, heads=8, ffn=1024, vocab=1000, seq=128, global_batch=8)
    for gpus in (1, 2, 8):
        for split in splits(spec, gpus):
            for group in variants(spec, split):
                for lay in group:
                    assert not (lay.zero and lay.dp * lay.cp == 1) and not (lay.sp and lay.tp == 1)
                    lay.check(spec, gpus)
        rule = rule_of_thumb(spec, gpus, GPU).layout
        assert rule is None or not (rule.zero and rule.dp == 1)


def test_activations_are_in_the_parameter_dtype():
    from profiler.costmodel_ops import gemm_pass_parts
    from profiler.plan_memory import layer_activation_bytes

    # b=1, s=4, h=8, a=2, f=32, t=1: sbh = 32, as²b = 32.
    # 2 B: sbh(18 + 4f/h) + 5as²b = 32·34 + 5·32 = 1248
    assert layer_activation_bytes(1, 4, 8, 2, 32) == 1248
    # 4 B (fp32 CPU runs): the 2-byte tensors double -- 16sbh + 4sbf + 4as²b = 512 + 512 + 128 = 1152
    # -> 2304 -- and the 1-byte masks do not: 2sbh + as²b = 64 + 32 = 96. 2304 + 96 = 2400
    assert layer_activation_bytes(1, 4, 8, 2, 32, act_bytes=4) == 2400
    # full recompute keeps the layer input: 2sbh at 2 B = 64, at 4 B = 128
    assert layer_activation_bytes(1, 4, 8, 2, 32, recompute="full", act_bytes=4) == 128
    # a memory-bound GEMM (1 x 1024) @ (1024 x 1024) reads and writes 4 B elements on an fp32 spec:
    # 4 · (1024 + 1024² + 1024) B at 1000 GB/s x 0.8 (GPU's defaults)
    fwd, _, _ = gemm_pass_parts({"x": (1, 1024, 1024, 1)}, GPU, 4)
    assert fwd == pytest.approx(4 * (1024 + 1024**2 + 1024) / (1000e9 * 0.8))
    fp32 = replace(SPEC, param_bytes=4, grad_bytes=4)
    lay = Layout(microbatch=2, microbatches=16)
    # the whole model: 2-byte tensors double, masks and the head's fp32 logits (4sbV) do not
    ratio = memory_per_gpu(fp32, lay)["activations"] / memory_per_gpu(SPEC, lay)["activations"]
    assert 1.5 < ratio < 2


def test_fits_leaves_the_hbm_reserve():
    # HBM = the layout's total + 1 GiB: it fits the raw HBM but not HBM - the default 2 GiB reserve,
    # and fits again with a 0.5 GiB reserve
    from profiler.cluster import HBM_RESERVE_GIB

    assert HBM_RESERVE_GIB == 2.0
    spec = ModelSpec(layers=24, hidden=2048, heads=16, ffn=8192, vocab=51200, seq=2048, global_batch=8)
    lay = Layout(microbatch=1, microbatches=8)
    total = memory_per_gpu(spec, lay)["total"]
    hbm_gib = (total + 1 * 2**30) / 2**30  # total + 1 GiB: fits the raw HBM, not HBM - 2 GiB
    small = replace(GPU, hbm_gib=hbm_gib)
    est = estimate(spec, lay, small)
    assert est.hbm_bytes == int(hbm_gib * 2**30) and est.usable_hbm_bytes == est.hbm_bytes - 2 * 2**30
    assert not est.fits  # fits=False: over the usable HBM
    assert estimate(spec, lay, replace(small, hbm_reserve_gib=0.5)).fits


def test_sm_count_from_the_cluster_file_first_then_the_name():
    from profiler.cluster import cluster_from_dict
    from profiler.costmodel_ops import sm_count

    # "H100 PCIe" has 114 SMs (NVIDIA H100 whitepaper), not the SXM5's 132 its name contains
    assert sm_count(replace(GPU, name="H100 PCIe")) == 114
    assert sm_count(replace(GPU, name="H100 SXM5")) == 132
    assert sm_count(replace(GPU, name="H100 PCIe", sms=100)) == 100  # the field wins
    c = cluster_from_dict({"name": "mine", "peak_tflops": 100.0, "hbm_gib": 24, "hbm_gbps": 900.0, "gpus_per_node": 4,
                           "sms": 84, "intra": {"name": "p", "bw_gbps": 25.0, "latency_us": 5.0},
                           "inter": {"name": "e", "bw_gbps": 12.5, "latency_us": 20}}, source="x")
    assert c.sms == 84 and sm_count(c) == 84


def test_moe_layer_share_is_the_same_in_memory_and_time():
    from profiler.plan_memory import stage_params

    # 8 layers, a MoE block every 3rd: 8 // 3 = 2 MoE blocks, share 2/8 (not 1/3) everywhere
    spec = replace(MOE, moe_every=3)
    assert (spec.moe_layers, spec.moe_share) == (2, 0.25)
    # expert parameters on one GPU (tp = pp = ep = 1): 2 blocks x 4 experts x 2·h·ffn = 2 x 4 x 8,388,608
    _, expert, _ = stage_params(spec, Layout(), 0)
    assert expert == 2 * 4 * 2 * 1024 * 4096


def test_microbatch_costs_cannot_be_changed_by_a_caller():
    from profiler.costmodel import microbatch_costs

    c = microbatch_costs(SPEC, GPU, 2, 1, 1, False, "none", 1, 1, 1, 1)
    with pytest.raises(TypeError):
        c["dense_gemm_f"] = 0.0
    assert microbatch_costs(SPEC, GPU, 2, 1, 1, False, "none", 1, 1, 1, 1)["dense_gemm_f"] > 0


def test_stage_param_cache_is_shared_by_layouts_of_the_same_tp_pp_ep():
    from profiler.costmodel import _stage_param_counts

    _stage_param_counts.cache_clear()
    for mb, m, rc in ((1, 32, "none"), (2, 16, "full"), (4, 8, "selective")):
        estimate(SPEC, Layout(microbatch=mb, microbatches=m, recompute=rc), GPU, detail=False)
    assert _stage_param_counts.cache_info().currsize == 1

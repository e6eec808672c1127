"""profiler.plan: the enumeration (complete, dividing; counted by hand), the pruning (never loses
the top of the exhaustive search), memory, and the rule of thumb -- first with injected cost and
memory functions whose answers are known, then with the real cost model on small G."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profiler.cluster import Cluster, Link
from profiler.layout import Estimate, Layout, ModelSpec
from profiler.plan import (MAX_GLOBAL_BATCH, R_FEW_MB, R_HBM, R_RECOMPUTE, R_TP_HEADS, R_ZERO_PP, microbatch_sizes,
                           plan, rule_of_thumb)

GIB = 2**30
NVLINK = Link("nvlink", 450.0, 3.0)
IB = Link("ib", 50.0, 10.0)


def _cluster(gpus_per_node=4, hbm_gib=80.0, inter=IB) -> Cluster:
    # no HBM reserve: the hand cases count memory in whole GiB of HBM
    return Cluster(name="test", peak_tflops=1000.0, hbm_gib=hbm_gib, hbm_gbps=3000.0, gpus_per_node=gpus_per_node,
                   intra=NVLINK, inter=inter, hbm_reserve_gib=0.0)


TINY = ModelSpec(layers=4, hidden=64, heads=4, ffn=256, vocab=128, seq=8, global_batch=4)


def _no_memory(spec, layout):
    return {"params": 0, "grads": 0, "optimizer": 0, "activations": 0, "total": 0}


def _fake_estimate(step_of):
    """An estimate_fn whose step is step_of(layout) and whose memory is zero."""
    def estimate(spec, layout, cluster):
        step = step_of(layout)
        return Estimate(layout=layout, step_s=step, breakdown_s={"compute": step}, mfu_pct=None,
                        memory_bytes={"total": 0}, hbm_bytes=cluster.hbm_bytes, fits=True)
    return estimate


RC_COST = {"none": 0.0, "selective": 0.01, "full": 0.3}


def _step(layout: Layout) -> float:
    """A made-up but strict order: distinct steps, more recompute slower, sp a little faster."""
    return (1.0 + 0.1 * layout.tp + 0.07 * layout.pp + 0.003 * layout.zero + 0.05 / layout.microbatch
            + RC_COST[layout.recompute] - 0.002 * layout.sp + 0.0001 * layout.stages_per_rank
            + 0.0003 * ("1f1b", "zero-bubble", "gpipe", "interleaved-1f1b").index(layout.schedule))


def test_enumeration_is_complete_and_divides_on_a_tiny_case():
    # G = 4 GPUs, 4 heads, 4 layers, global batch 4. Splits (dp, tp, pp): (4,1,1) (2,2,1) (2,1,2)
    # (1,4,1) (1,2,2) (1,1,4), all dividing. Layouts per split (mb | 4/dp, m = 4/(dp·mb) >= pp;
    # zero 0-3 only where dp > 1, 0-1 where pp > 1 too (no framework runs ZeRO-2/3 with a pipeline); schedules 1f1b, zero-bubble, gpipe and interleaved v | layers/pp,
    # v > 1, where pp > 1; recompute x3; sp x2 where tp > 1):
    #   (4,1,1): mb 1             x zero 4 x rc 3                   = 12
    #   (2,2,1): mb 1, 2          x zero 4 x rc 3 x sp 2            = 48
    #   (2,1,2): mb 1 (m=2)       x zero 2 x sched 4 (v=2) x rc 3   = 24 (zero 2, 3: 24 more dropped)
    #   (1,4,1): mb 1, 2, 4       x rc 3 x sp 2                     = 18
    #   (1,2,2): mb 1, 2          x sched 4 x rc 3 x sp 2           = 48
    #   (1,1,4): mb 1 (m=4)       x sched 3 (layers/pp = 1) x rc 3  =  9
    # total 159; too few microbatches: (2,1,2) mb 2: 24, (1,2,2) mb 4: 24, (1,1,4) mb 2 and 4: 18 = 66
    result = plan(TINY, 4, _cluster(), estimate_fn=_fake_estimate(_step), memory_fn=_no_memory, prune=False)
    layouts = [e.layout for e in result.ranked]
    assert len(layouts) == 159 == result.considered == len(set(layouts))
    assert result.refused == {R_FEW_MB: 66, R_ZERO_PP: 24}
    assert not any(l.pp > 1 and l.zero >= 2 for l in layouts)
    for layout in layouts:
        layout.check(TINY, 4)  # raises if it does not divide
    assert {(l.dp, l.tp, l.pp) for l in layouts} == {(4, 1, 1), (2, 2, 1), (2, 1, 2), (1, 4, 1), (1, 2, 2), (1, 1, 4)}
    # fastest first, except the near-tie band of the fastest (plan.prefer_in_band: 2 %) that leads
    fastest = min(e.step_s for e in result.ranked)
    rest = [e for e in result.ranked if e.step_s > 1.02 * fastest]
    assert [e.step_s for e in rest] == sorted(e.step_s for e in rest) and result.ranked[len(result.ranked) - len(rest):] == rest
    # 2 heads: tp = 4 no longer divides, one split fewer (the 18 layouts of (1,4,1))
    two_heads = plan(replace(TINY, hidden=64, heads=2), 4, _cluster(), estimate_fn=_fake_estimate(_step),
                     memory_fn=_no_memory, prune=False)
    assert len(two_heads.ranked) == 159 - 18 and two_heads.refused[R_TP_HEADS] == 1


def test_moe_adds_ep_dividing_dp_and_the_experts():
    # 6 experts, G = 4: splits as above; ep | dp and ep | 6: dp=4 -> ep 1, 2; dp=2 -> ep 1, 2; dp=1 -> ep 1
    moe = replace(TINY, experts=6, top_k=2)
    result = plan(moe, 4, _cluster(), estimate_fn=_fake_estimate(_step), memory_fn=_no_memory, prune=False)
    eps = {(e.layout.dp, e.layout.ep) for e in result.ranked}
    assert eps == {(4, 1), (4, 2), (2, 1), (2, 2), (1, 1)}
    # the ep=2 copies of dp=4 (12) and of dp=2 (48 + 24) come on top of the 159
    assert len(result.ranked) == 159 + 12 + 72


@pytest.mark.parametrize("sp_gain", [0.002, -0.002])  # sp faster (pruned after the probe) / slower (kept)
def test_pruning_keeps_the_exhaustive_top(sp_gain):
    def step(layout):
        return _step(layout) + 0.002 * layout.sp - sp_gain * layout.sp

    # memory: recompute none needs 3 units, selective 2, full 1; sp halves; HBM holds 2.5 units
    def memory(spec, layout):
        units = {"none": 3, "selective": 2, "full": 1}[layout.recompute] / (2 if layout.sp else 1)
        return {"total": int(units * GIB)}

    cluster = _cluster(hbm_gib=2.5)
    args = dict(estimate_fn=_fake_estimate(step), memory_fn=memory)
    full = plan(TINY, 4, cluster, prune=False, **args)
    pruned = plan(TINY, 4, cluster, **args)
    assert [e.layout for e in pruned.ranked[:10]] == [e.layout for e in full.ranked[:10]]
    assert pruned.evaluated < full.evaluated
    # nothing is lost without a count: ranked + every layout reason = the layouts considered
    layout_reasons = sum(n for k, n in pruned.refused.items() if k.startswith("layouts") and k not in (R_FEW_MB, R_ZERO_PP))
    assert len(pruned.ranked) + layout_reasons == pruned.considered == full.considered
    # recompute none never fits (3 > 2.5 units) unless sp halves it
    assert all(e.layout.recompute != "none" or e.layout.sp for e in full.ranked)
    assert pruned.refused[R_HBM] == full.refused[R_HBM] and pruned.refused[R_RECOMPUTE] > 0


def test_a_pruned_neighbour_that_is_faster_is_found_and_ranked():
    # a cost model where full recompute is (oddly) fastest: the recompute pruning would drop it,
    # the check of the top's neighbours must bring it back
    def step(layout):
        return _step(layout) - (0.5 if layout.recompute == "full" else RC_COST[layout.recompute])

    args = dict(estimate_fn=_fake_estimate(step), memory_fn=_no_memory)
    full = plan(TINY, 4, _cluster(), prune=False, **args)
    pruned = plan(TINY, 4, _cluster(), **args)
    assert full.ranked[0].layout.recompute == "full"
    assert pruned.ranked[0].layout == full.ranked[0].layout
    assert "0 faster" not in pruned.pruning_check


def _memory_by_state(bytes_per_gpu_of):
    def memory(spec, layout):
        return {"total": int(bytes_per_gpu_of(layout))}
    return memory


def test_rule_of_thumb_on_hand_cases():
    cluster = _cluster(gpus_per_node=4, hbm_gib=10.0)
    spec = replace(TINY, global_batch=16)
    # state S GiB split by tp·pp and (zero 1: optimizer 12/16 of it) by dp; activations 1 GiB per sequence
    def mem(state_gib):
        def total(layout):
            shard = state_gib / (layout.tp * layout.pp)
            state = shard * (1 - 12 / 16 + 12 / 16 / layout.dp) if layout.zero == 1 else \
                shard / layout.dp if layout.zero == 3 else shard
            return (state + 1.0 * layout.microbatch * (layout.recompute == "none")) * GIB
        return _memory_by_state(total)

    # 4 GiB of state: one GPU holds it -> DDP over 8 with the largest microbatch that fits (2 of 16/8)
    r = rule_of_thumb(spec, 8, cluster, memory_fn=mem(4.0))
    assert r.layout == Layout(dp=8, microbatch=2, microbatches=1) and "DDP" in r.why
    # 12 GiB: DDP no; ZeRO-1 over 8: 12·(1/4 + 3/4/8) = 4.125 -> ZeRO-1
    r = rule_of_thumb(spec, 8, cluster, memory_fn=mem(12.0))
    assert (r.layout.dp, r.layout.zero) == (8, 1) and "ZeRO-1" in r.why
    # 72 GiB: ZeRO-1 over 8: 72·(1/4 + 3/32) = 24.75 no; FSDP over a node of 4: 18 + 1 > 10 no;
    # -> tp = 4 (GPUs per node, divides the 4 heads); pp = 1 (dp = 2): 72/4 = 18 no, with ZeRO-1
    #    18·(1/4 + 3/8) = 11.25 no; pp = 2 (dp = 1): 72/8 = 9 + 1 (mb 1, the most microbatches) fits with zero 0
    r = rule_of_thumb(spec, 8, cluster, memory_fn=mem(72.0))
    assert (r.layout.tp, r.layout.pp, r.layout.dp, r.layout.zero, r.layout.sp) == (4, 2, 1, 0, True)
    assert r.layout.microbatch == 1 and "tp=4" in r.why and "pp=2, ZeRO-0" in r.why
    # 60 GiB: the fewest stages first, ZeRO-1 before a stage more: pp = 1 (dp = 2) zero 0: 15 no;
    # ZeRO-1: 15·(1/4 + 3/8) = 9.375, + 1 GiB a sequence without recompute > 10, selective (no
    # activations here) fits, at the largest microbatch (pp = 1): 8 of 16/2 -- not pp = 2 with zero 0
    r = rule_of_thumb(spec, 8, cluster, memory_fn=mem(60.0))
    assert (r.layout.tp, r.layout.pp, r.layout.dp, r.layout.zero, r.layout.recompute) == (4, 1, 2, 1, "selective")
    assert r.layout.microbatch == 8 and "pp=1, ZeRO-1" in r.why
    # 36 GiB: FSDP over a node of 4: 9 + 1 = 10 fits -> FSDP (zero 3) over all 8
    r = rule_of_thumb(spec, 8, cluster, memory_fn=mem(36.0))
    assert (r.layout.dp, r.layout.zero) == (8, 3) and "FSDP" in r.why
    # 1000 GiB: even tp=4 pp=4 (pp | 4 layers) with dp... 1000/16 = 62.5 > 10: none
    r = rule_of_thumb(spec, 8, cluster, memory_fn=mem(1000.0))
    assert r.layout is None and "10 GiB" in r.why


# --- with the real cost model (profiler.costmodel, profiler.plan_memory), small G ---

GPT3_XL = ModelSpec(layers=24, hidden=2048, heads=16, ffn=8192, vocab=51200, seq=2048, global_batch=8)


def _real_cluster(hbm_gib=80.0, gpus_per_node=8, inter_gbps=45.0) -> Cluster:
    return Cluster(name="test", peak_tflops=989.0, hbm_gib=hbm_gib, hbm_gbps=3350.0, gpus_per_node=gpus_per_node,
                   intra=Link("nvlink", 450.0, 3.0), inter=Link("ib", inter_gbps, 3.0))


def test_real_plan_respects_memory():
    from profiler.plan_memory import memory_per_gpu

    # 1,422,069,760 params (GPT-3 XL dims: test_cli_plan writes the count out); plain DDP keeps
    # 2 + 2 + 12 = 16 B of each: 22,753,116,160 B, over a 16 GiB GPU (17,179,869,184 B) before any
    # activation. ZeRO-1 over 8 keeps 2 + 2 + 12/8 = 5.5 B: 7,821,383,680 B.
    ddp = memory_per_gpu(GPT3_XL, Layout(dp=8, microbatch=1, microbatches=1))
    assert ddp["params"] + ddp["grads"] + ddp["optimizer"] == 22_753_116_160
    zero1 = memory_per_gpu(GPT3_XL, Layout(dp=8, zero=1, microbatch=1, microbatches=1))
    assert zero1["params"] + zero1["grads"] + zero1["optimizer"] == 7_821_383_680
    hbm = 16 * 2**30
    assert hbm == 17_179_869_184
    result = plan(GPT3_XL, 8, _real_cluster(hbm_gib=16.0))
    assert result.ranked and result.refused[R_HBM] > 0
    assert all(e.memory_bytes["total"] <= hbm and e.fits for e in result.ranked)
    # the 16 B a parameter above is said among the plan's assumptions (a trial: nothing said it)
    assert any(a.startswith("memory: mixed precision as ZeRO counts it, 2 B parameters + 2 B gradients + 12 B of Adam "
                            "state (fp32 master weights, m, v) = 16 B per parameter before sharding") for a in result.assumptions)
    shapes = {(e.layout.tp, e.layout.pp, e.layout.zero) for e in result.ranked}
    assert (1, 1, 0) not in shapes  # DDP refused for memory
    assert (1, 1, 1) in shapes  # ZeRO-1 over 8 fits (with recomputation where the activations need it)
    # control: on 40 GiB (42,949,672,960 B) DDP's 22.75 GB of state fits, and DDP is ranked
    assert (1, 1, 0) in {(e.layout.tp, e.layout.pp, e.layout.zero) for e in plan(GPT3_XL, 8, _real_cluster(40.0)).ranked}


def test_real_plan_keeps_tp_inside_a_node_when_the_inter_node_link_is_10x_slower():
    from profiler.commcost import group_link
    from profiler.layout import group_stride

    # wide layers (hidden 16384, 128 heads) on 16 GPUs, 8 per node: tp = 16 spans two nodes
    spec = ModelSpec(layers=4, hidden=16384, heads=128, ffn=65536, vocab=32000, seq=2048, global_batch=8)
    # a tp = 16 group has 8 members per node: it drives 8 NICs (commcost.group_link), so 5.625 GB/s
    # per NIC is 8 x 5.625 = 45 GB/s for the group, 10x below the 450 GB/s NVLink
    slow = _real_cluster(inter_gbps=45.0 / 8)
    same = _real_cluster(inter_gbps=450.0)  # control: between nodes as fast as inside

    def gap(result):  # how much slower the best tp = 16 layout is than #1
        best16 = next(e for e in result.ranked if e.layout.tp == 16)
        return best16.step_s / result.ranked[0].step_s - 1

    r_slow, r_same = plan(spec, 16, slow), plan(spec, 16, same)
    top = r_slow.ranked[:10]
    assert all(e.layout.tp <= 8 for e in top)
    assert all(group_link(slow, e.layout.tp, group_stride(e.layout, "tp")) is slow.intra for e in top)
    # tp = 16 over the slow link: its all-reduces cross the 45 GB/s NIC, over twice the best step;
    # with the fast link the same layouts come within half of it
    assert gap(r_slow) > 1.0 and gap(r_same) < 0.5


def test_real_rule_of_thumb_is_ddp_when_one_gpu_holds_the_model_and_is_ranked():
    # 34.7 GB for DDP (22.75 GB of state + activations of one 2048-token sequence) < 80 GiB
    result = plan(GPT3_XL, 8, _real_cluster(hbm_gib=80.0))
    assert result.rule.layout == Layout(dp=8, microbatch=1, microbatches=1) and "DDP" in result.rule.why
    assert result.rule_of_thumb is not None and 1 <= result.rule_of_thumb_rank <= len(result.ranked)
    faster = [e for e in result.ranked if e.step_s < result.rule_of_thumb.step_s]
    assert result.rule_of_thumb_rank == len(faster) + 1


@pytest.mark.parametrize("spec, gpus", [(GPT3_XL, 16), (replace(GPT3_XL, experts=8, top_k=2), 8)])
def test_real_pruning_drops_only_layouts_that_a_kept_one_beats(spec, gpus):
    # every layout the exhaustive search ranks but the pruned one does not is a recompute / sp
    # variant of a kept layout (same split, ZeRO, microbatch, schedule) that is no slower
    cluster = _real_cluster(hbm_gib=24.0)
    full, pruned = plan(spec, gpus, cluster, prune=False), plan(spec, gpus, cluster)

    def key(layout):
        return replace(layout, sp=False, recompute="none")

    kept: dict[Layout, float] = {}
    for e in pruned.ranked:
        kept[key(e.layout)] = min(kept.get(key(e.layout), float("inf")), e.step_s)
    ranked = {e.layout for e in pruned.ranked}
    dropped = [e for e in full.ranked if e.layout not in ranked]
    assert dropped and pruned.ranked[0].layout == full.ranked[0].layout
    # (a tie is allowed: under ZeRO-3 a recomputation can hide as much all-gather as it costs, to
    # the last bit of a float; it never wins)
    assert all(kept[key(e.layout)] <= e.step_s * (1 + 1e-12) for e in dropped)
    assert len(full.ranked) == len(pruned.ranked) + len(dropped)


def test_the_memory_bounds_the_search_relies_on_hold_for_the_real_memory_model():
    # plan() refuses without asking (1) every variant of a split and ZeRO stage once one variant's
    # model state (params + grads + optimizer of the stage it reports) exceeds HBM, (2) every
    # larger microbatch once one is over HBM: so in the real model every variant's total must be
    # at least any variant's state, and totals must never fall as the microbatch grows
    from profiler.layout import divisors
    from profiler.plan_memory import memory_per_gpu

    spec = replace(GPT3_XL, global_batch=64)
    dp, tp, pp = 2, 2, 4
    per_dp = spec.global_batch // dp
    mbs = [mb for mb in divisors(per_dp) if per_dp // mb >= pp]
    assert mbs == [1, 2, 4, 8]
    schedules = [("1f1b", 1), ("zero-bubble", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)]
    for zero in (0, 1, 2, 3):
        states, all_totals = set(), []
        for schedule, v in schedules:
            for rc in ("none", "selective", "full"):
                for sp in (False, True):
                    totals = []
                    for mb in mbs:
                        mem = memory_per_gpu(spec, Layout(dp=dp, tp=tp, pp=pp, zero=zero, microbatch=mb,
                                                          microbatches=per_dp // mb, schedule=schedule,
                                                          stages_per_rank=v, recompute=rc, sp=sp))
                        totals.append(mem["total"])
                        states.add(mem["params"] + mem["grads"] + mem["optimizer"])
                    assert totals == sorted(totals), (zero, schedule, v, rc, sp, totals)
                    all_totals += totals
        assert min(all_totals) >= max(states)


def test_zero2_reduce_scatters_every_microbatch():
    # ZeRO-2 keeps only its shard of the gradients, so with m > 1 each microbatch's gradients are
    # reduce-scattered (DeepSpeed's ZeRO-2). Model: 2 layers h=256, 2,120,192 params x 2 B on one
    # GPU (tests/profiler/test_costmodel_terms.py counts them); dp=2 on a 0.01 GB/s link at
    # efficiency 0.8 (8e6 B/s) and 2 µs: a reduce-scatter (or all-gather) over 2 moves half:
    # 2e-6 + 2,120,192 x 2 / 2 / 8e6 = 0.265026 s, beside which the backward (~1e-4 s) is nothing.
    # ZeRO-1, m=4: one reduce-scatter + one all-gather of the weights = 2 x 0.265026 s;
    # ZeRO-2, m=4: four reduce-scatters + the all-gather = 5 x 0.265026 s
    from profiler.costmodel import estimate

    small = ModelSpec(layers=2, hidden=256, heads=4, ffn=1024, vocab=1000, seq=128, global_batch=8)
    slow = Cluster(name="slow", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=1000.0, gpus_per_node=8,
                   intra=Link("slow", 0.01, 2.0), inter=Link("ib", 0.01, 5.0),
                   gemm_efficiency=0.8, hbm_efficiency=0.8, link_efficiency=0.8)
    coll = 2e-6 + 2_120_192 * 2 / 2 / 8e6
    z1 = estimate(small, Layout(dp=2, zero=1, microbatch=1, microbatches=4), slow)
    z2 = estimate(small, Layout(dp=2, zero=2, microbatch=1, microbatches=4), slow)
    z2_one = estimate(small, Layout(dp=2, zero=2, microbatch=4, microbatches=1), slow)
    assert z1.breakdown_s["comm_exposed:dp"] == pytest.approx(2 * coll, rel=1e-3)
    assert z2.breakdown_s["comm_exposed:dp"] == pytest.approx(5 * coll, rel=1e-3)
    assert z2_one.breakdown_s["comm_exposed:dp"] == pytest.approx(2 * coll, rel=1e-3)  # m = 1: as ZeRO-1


def test_microbatch_sizes_are_capped_and_the_global_batch_bounded():
    # divisors up to 64, then powers of two only: 3 * 2^20 -> 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64,
    # then 128, 256, ..., 2^20 (13 powers)
    expected = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64] + [2**k for k in range(7, 21)]
    assert microbatch_sizes(3 * 2**20) == expected
    assert microbatch_sizes(96) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]  # 96 is no power of two
    assert microbatch_sizes(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    with pytest.raises(ValueError, match="over the 16,777,216 sequences"):
        plan(replace(TINY, global_batch=MAX_GLOBAL_BATCH + 1), 4, _cluster())


@pytest.mark.parametrize("text, words", [
    ("", "empty"), (" , ", "empty"), ("dp=2,dp=4", "dp is given twice"), ("mb=1,microbatch=2", "microbatch is given twice"),
    ("pp=2,schedule=interleaved-1f1b", "needs v >= 2"), ("pp=2,schedule=interleaved-1f1b,v=1", "v=1 is 1f1b"),
])
def test_parse_layout_refuses_empty_repeated_and_interleaved_v1(text, words):
    from profiler.layout import LayoutError, parse_layout

    with pytest.raises(LayoutError, match=words):
        parse_layout(text)
    assert parse_layout("pp=2,schedule=interleaved-1f1b,v=2")[0].stages_per_rank == 2


def test_a_time_limit_stops_the_search_with_a_refusal():
    # The viewer bounds a search inside a web request: past the limit plan() refuses (a ValueError,
    # so callers' one-line handlers catch it) rather than returning a partial ranking as if whole.
    from profiler.cluster import load_cluster
    from profiler.plan import PlanTooLong, plan

    spec = ModelSpec(layers=8, hidden=512, heads=8, ffn=2048, vocab=1000, seq=256, global_batch=16)
    with pytest.raises(PlanTooLong) as e:
        plan(spec, 8, load_cluster("h100"), time_limit_s=0.0)
    assert isinstance(e.value, ValueError) and "deadline" in str(e.value)
    assert plan(spec, 8, load_cluster("h100"), time_limit_s=60.0).ranked  # a generous limit changes nothing


def _est(step, mem_gib, **layout):
    return Estimate(layout=Layout(**layout), step_s=step, breakdown_s={"compute": step}, mfu_pct=None,
                    memory_bytes={"total": int(mem_gib * GIB)}, hbm_bytes=80 * GIB, fits=True)


def test_near_ties_prefer_headroom_then_lower_zero_then_fewer_stages():
    from profiler.plan import prefer_in_band
    # usable HBM 80 GiB: tight above 0.9 x 80 = 72 GiB. Band: steps <= 1.00 x 1.02 = 1.02 s.
    fsdp_tight = _est(1.000, 77.0, dp=8, zero=3, microbatch=64, microbatches=1)  # fastest, but tight
    zero1 = _est(1.010, 39.0, dp=8, zero=1, microbatch=32, microbatches=2)
    ddp = _est(1.015, 40.7, dp=8, zero=0, microbatch=32, microbatches=2)
    ddp_pp = _est(1.005, 20.0, dp=4, pp=2, zero=0, microbatch=32, microbatches=4)
    slow = _est(1.030, 10.0, dp=8, zero=0, microbatch=8, microbatches=8)  # 3 % slower: outside the band
    faster_rest = _est(1.021, 70.0, dp=8, zero=3, microbatch=16, microbatches=4)  # 2.1 %: outside too
    ranked = [fsdp_tight, ddp_pp, zero1, ddp, faster_rest, slow]
    out = prefer_in_band(ranked, 80 * GIB)
    # band sorted by (tight, zero, pp): DDP pp=1, DDP pp=2, ZeRO-1, tight FSDP; the rest by step
    assert out == [ddp, ddp_pp, zero1, fsdp_tight, faster_rest, slow]
    assert prefer_in_band([], 80 * GIB) == []

"""α–β collective times and group placement (profiler/commcost.py), against times computed by
hand from the formula with the numbers written out."""

from __future__ import annotations

import math

import pytest

from profiler.cluster import Cluster, Link
from profiler.commcost import collective_s, group_link, latency_steps
from profiler.layout import group_stride, parse_layout

NVL = Link("nvlink", bw_gbps=300.0, latency_us=3.0)
IB = Link("ib", bw_gbps=25.0, latency_us=10.0)
NODE8 = Cluster(name="t", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=2000.0, gpus_per_node=8, intra=NVL, inter=IB)


def test_ring_all_reduce_100mb_over_8_gpus():
    # 2(n-1) = 14 steps of 3 us, plus 2(n-1)/n = 2*7/8 of 1e8 bytes at 3e11 B/s.
    want = 14 * 3e-6 + 2 * 7 / 8 * 1e8 / 3e11
    assert collective_s("all_reduce", 1e8, 8, NVL) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(6.2533e-4, rel=1e-4)


def test_efficiency_scales_the_bandwidth_term_only():
    want = 14 * 3e-6 + 2 * 7 / 8 * 1e8 / (3e11 * 0.5)
    assert collective_s("all_reduce", 1e8, 8, NVL, efficiency=0.5) == pytest.approx(want, rel=1e-12)


def test_tree_all_reduce_has_log_latency_terms():
    # 2*ceil(log2 8) = 6 steps instead of the ring's 14; same bandwidth term.
    bw = 2 * 7 / 8 * 1e8 / 3e11
    assert collective_s("all_reduce", 1e8, 8, NVL, algorithm="tree") == pytest.approx(6 * 3e-6 + bw, rel=1e-12)
    assert latency_steps("all_reduce", 5, "tree") == 2 * 3  # ceil(log2 5) = 3
    assert latency_steps("all_reduce", 5, "ring") == 8
    assert latency_steps("all_reduce", 64, "auto") == 12  # min(126, 12)
    assert latency_steps("all_reduce", 2, "auto") == 2  # ring 2 = tree 2
    # For a tiny message over many ranks the latency terms are the whole story: tree << ring.
    ring, tree = (collective_s("all_reduce", 8, 64, IB, algorithm=a) for a in ("ring", "tree"))
    assert ring == pytest.approx(126 * 10e-6 + 2 * 63 / 64 * 8 / 25e9)
    assert tree == pytest.approx(12 * 10e-6 + 2 * 63 / 64 * 8 / 25e9)


def test_all_gather_and_reduce_scatter():
    # n-1 = 7 steps of 3.4 us, (n-1)/n of 1 GB at 450 GB/s.
    link = Link("nvl4", 450.0, 3.4)
    want = 7 * 3.4e-6 + 7 / 8 * 1e9 / 4.5e11
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert collective_s(kind, 1e9, 8, link) == pytest.approx(want, rel=1e-12)


def test_send_and_broadcast_move_the_whole_message():
    # p2p: one α (14 us) and 10 MB at 50 GB/s.
    ndr = Link("ndr", 50.0, 14.0)
    assert collective_s("send", 1e7, 2, ndr) == pytest.approx(14e-6 + 1e7 / 5e10, rel=1e-12)
    assert collective_s("send_recv", 1e7, 2, ndr) == pytest.approx(2.14e-4, rel=1e-12)
    # broadcast over 4: 3 steps, the whole buffer.
    assert collective_s("broadcast", 1e7, 4, ndr) == pytest.approx(3 * 14e-6 + 1e7 / 5e10, rel=1e-12)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"])
def test_group_of_one_costs_nothing(kind):
    assert collective_s(kind, 1e9, 1, IB) == 0.0


def test_zero_bytes_costs_only_latency():
    assert collective_s("all_reduce", 0, 4, NVL) == pytest.approx(6 * 3e-6)


def test_placement_by_rank_order():
    layout, _ = parse_layout("dp=2,tp=8")
    # tp innermost: stride 1, 8 ranks = one 8-GPU node.
    assert group_stride(layout, "tp") == 1
    assert group_link(NODE8, 8, group_stride(layout, "tp")) is NVL
    # dp next: stride tp = 8, so its 2 ranks sit in different nodes.
    assert group_stride(layout, "dp") == 8
    assert group_link(NODE8, 2, group_stride(layout, "dp")) is IB


def test_placement_of_inner_groups_that_fit_a_node():
    layout, _ = parse_layout("dp=4,cp=2,tp=4")
    assert group_link(NODE8, 4, group_stride(layout, "tp")) is NVL  # span 4
    assert group_link(NODE8, 2, group_stride(layout, "cp")) is NVL  # stride 4, span 8
    assert group_link(NODE8, 4, group_stride(layout, "dp")) is IB  # stride 8
    pp, _ = parse_layout("pp=2,tp=4")
    assert group_link(NODE8, 2, group_stride(pp, "pp")) is NVL  # ranks 0 and 4: one node


def test_group_of_one_is_intra_and_a_straddling_span_is_inter():
    assert group_link(NODE8, 1, 64) is NVL
    # tp=3 on 8-GPU nodes: the group of ranks 6, 7, 8 crosses into the second node.
    assert group_link(NODE8, 3, 1) is IB
    # ... unless the whole job (6 GPUs) sits in one node.
    assert group_link(NODE8, 3, 1, world_size=6) is NVL
    assert group_link(NODE8, 2, 8, world_size=16) is IB


def test_a_group_across_nodes_drives_one_nic_per_member_in_each_node():
    # dp=64 (stride 1) on 8-GPU nodes: 8 members per node, one NCCL channel per NIC (tuning.cc
    # busBw = nChannels * bwInter): 8 x 25 GB/s = 200 GB/s, under NVLink's 300, NIC latency.
    link = group_link(NODE8, 64, 1)
    assert (link.bw_gbps, link.latency_us) == (200.0, 10.0)
    # a ring all-reduce of 1e8 bytes over the 64: 126 steps of 10 us + 2*63/64 * 1e8 / 2e11 s
    want = 126 * 10e-6 + 2 * 63 / 64 * 1e8 / 2e11
    assert collective_s("all_reduce", 1e8, 64, link) == pytest.approx(want, rel=1e-12)
    # stride 4 (tp=4), 4 members over 2 nodes: 2 per node -> 50 GB/s
    assert group_link(NODE8, 4, 4).bw_gbps == 50.0
    # 16 NICs of 25 would be 400 GB/s: capped by the intra link's 300 on 16-GPU nodes
    node16 = Cluster(name="t16", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=2000.0, gpus_per_node=16,
                     intra=NVL, inter=IB)
    assert group_link(node16, 32, 1).bw_gbps == 300.0
    # one member per node (stride 8): one NIC, the inter link itself
    assert group_link(NODE8, 4, 8) is IB


@pytest.mark.parametrize("kwargs,match", [
    (dict(kind="all_scatter"), "collective 'all_scatter'"),
    (dict(algorithm="butterfly"), "algorithm 'butterfly'"),
    (dict(group_size=0), "group size"),
    (dict(group_size=2.0), "group size"),
    (dict(nbytes=-1.0), "message size"),
    (dict(nbytes=math.nan), "message size"),
    (dict(nbytes=math.inf), "message size"),
    (dict(efficiency=0.0), "efficiency"),
    (dict(efficiency=1.5), "efficiency"),
    (dict(efficiency=math.nan), "efficiency"),
    (dict(link=Link("dead", 0.0, 1.0)), "bandwidth"),
    (dict(link=Link("odd", 1.0, -1.0)), "latency"),
])
def test_bad_arguments_are_refused(kwargs, match):
    args = dict(kind="all_reduce", nbytes=1e6, group_size=4, link=NVL, efficiency=1.0, algorithm="ring") | kwargs
    with pytest.raises(ValueError, match=match):
        collective_s(args.pop("kind"), args.pop("nbytes"), args.pop("group_size"), args.pop("link"), **args)


def test_a_point_to_point_mesh_gives_a_small_group_its_peer_links():
    # MI300X-like: 7 xGMI links of 64 GB/s, 448 GB/s in all, no switch (peer_gbps)
    xgmi = Link("xgmi", bw_gbps=448.0, latency_us=2.7, peer_gbps=64.0)
    mesh = Cluster(name="m", peak_tflops=100.0, hbm_gib=192.0, hbm_gbps=5300.0, gpus_per_node=8, intra=xgmi, inter=IB)
    assert group_link(mesh, 2, 1).bw_gbps == 64.0  # tp=2: (2-1) x 64
    assert group_link(mesh, 4, 1).bw_gbps == 192.0  # tp=4: 3 x 64
    assert group_link(mesh, 8, 1).bw_gbps == 448.0  # all 8: min(448, 7 x 64)
    assert group_link(mesh, 4, 2, p2p=True).bw_gbps == 64.0  # a pipeline send: one peer link
    # a tp=2 ring all-reduce of 1e8 B: 2 steps of 2.7 us + 2*1/2 * 1e8 / 64e9 s
    want = 2 * 2.7e-6 + 1e8 / 64e9
    assert collective_s("all_reduce", 1e8, 2, group_link(mesh, 2, 1)) == pytest.approx(want, rel=1e-12)
    # a switch (no peer_gbps) gives every group the whole link
    assert group_link(NODE8, 2, 1) is NVL and group_link(NODE8, 2, 4, p2p=True) is NVL


def test_mi300x_preset_is_a_mesh_and_nvswitch_presets_are_not():
    from profiler.cluster import load_cluster, preset_names

    assert load_cluster("mi300x").intra.peer_gbps == 64.0
    assert all(load_cluster(n).intra.peer_gbps is None for n in preset_names() if n != "mi300x")

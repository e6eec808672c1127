"""Ring attention: the ring core emulated in one process against torch's causal attention (forward
and gradients), then real gloo runs at 2 and 4 ranks against a single process, --recompute, the
run.json layout block, and the refusal of a sequence that does not cut into 2P chunks."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from runners.ring import zigzag_positions, zigzag_ring_attention
from tests.conftest import STEPS, ptprof
from tests.runners.reference import single_process_losses


def manifest(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_zigzag_positions_cover_the_sequence_once_and_balance_the_causal_work():
    # 32 tokens over 4 ranks: 8 chunks of 4; rank r holds chunks r and 7 - r.
    held = [zigzag_positions(32, r, 4) for r in range(4)]
    assert held[1].tolist() == [4, 5, 6, 7, 24, 25, 26, 27]
    assert sorted(torch.cat(held).tolist()) == list(range(32))
    # Visible (query, key) pairs of a causal mask: the same on every rank (the point of the zigzag).
    assert {int(sum(int(q) + 1 for q in pos)) for pos in held} == {132}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_core_equals_causal_attention_forward_and_backward(world):
    """Every rank's ring core in one process: the block "received" at step i is rank (r − i)'s
    zigzag shard of the full K and V, so gradients flow back to the full tensors as the ring's
    backward would carry them home."""
    torch.manual_seed(0)
    b, heads, s, d = 2, 3, 24, 5
    q, k, v = (torch.randn(b, heads, s, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    weight = torch.randn(b, heads, s, d, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want_grads = torch.autograd.grad((want * weight).sum(), (q, k, v))
    pos = [zigzag_positions(s, r, world) for r in range(world)]
    total = 0
    for r in range(world):
        seen = []

        def start_pass(k_held, v_held, r=r, seen=seen):
            src = (r - len(seen) - 1) % world  # the previous rank's block, then the one before
            seen.append(src)
            return lambda: (k[:, :, pos[src]], v[:, :, pos[src]])

        out = zigzag_ring_attention(q[:, :, pos[r]], k[:, :, pos[r]], v[:, :, pos[r]], r, world, start_pass, pos[r])
        assert seen == [(r - i) % world for i in range(1, world)]  # P − 1 steps, every other block once
        assert torch.allclose(out, want[:, :, pos[r]], rtol=0, atol=1e-12)
        total = total + (out * weight[:, :, pos[r]]).sum()
    for got, ref in zip(torch.autograd.grad(total, (q, k, v)), want_grads, strict=True):
        assert torch.allclose(got, ref, rtol=0, atol=1e-12)


def _ring_ranks(rank: int, world: int, store: str) -> None:
    """One gloo rank of test_ring_passes_blocks_and_gradients_between_4_processes."""
    import torch.distributed as dist

    from runners.ring import start_ring_pass

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same full q, k, v and output weights on every rank
        b, heads, s, d = 2, 3, 32, 5
        q, k, v = (torch.randn(b, heads, s, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
        weight = torch.randn(b, heads, s, d, dtype=torch.float64)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        want_grads = torch.autograd.grad((want * weight).sum(), (q, k, v))
        pos = zigzag_positions(s, rank, world)
        mine = [t.detach()[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
        out = zigzag_ring_attention(*mine, rank, world, start_ring_pass, pos)
        (out * weight[:, :, pos]).sum().backward()
        assert torch.allclose(out, want[:, :, pos], rtol=0, atol=1e-12), rank
        for name, got, ref in zip("qkv", (t.grad for t in mine), want_grads, strict=True):
            assert torch.allclose(got, ref[:, :, pos], rtol=0, atol=1e-12), (rank, f"d{name}")
    finally:
        dist.destroy_process_group()


@pytest.mark.multirank
def test_ring_passes_blocks_and_gradients_between_4_processes(tmp_path):
    """The real ring (send/recv, _PassOn's backward carrying dK, dV home to the previous rank) at
    4 gloo processes equals SDPA in float64: output and every gradient of each rank's shard. At 2
    ranks previous and next are the same rank, so a wrong direction shows only from 3 up."""
    import torch.multiprocessing as mp

    # spawn, not fork: a fork after this process's torch ran ops hangs in the children's thread pool
    mp.spawn(_ring_ranks, args=(4, str(tmp_path / "store")), nprocs=4)


@pytest.mark.multirank
@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_losses_match_single_process(runs, ranks):
    m = manifest(runs("ring", ranks))
    want = single_process_losses(steps=STEPS)
    worst = max(abs(got - ref) / abs(ref) for got, ref in zip(m["losses"], want, strict=True))
    # Measured: 8.6e-8 at 2 and 4 ranks (fp32 rounding); a wrong mask or a lost block is off by
    # 1e-4 and more (attention mistakes measured on ulysses: 4.5e-4 to 1.6e-3), far beyond 1e-6.
    assert worst < 1e-6, (m["losses"], want)
    assert m["mesh"] == {"cp": ranks}
    assert m["sequence_parallel"] == {
        "kind": "ring", "shards": ranks, "layout": "zigzag", "chunks_per_rank": 2, "chunk_len": 32 // (2 * ranks),
        "rank_chunks": [[r, 2 * ranks - 1 - r] for r in range(ranks)]}
    # Every rank reports the loss of its s/P tokens of all 8 rows.
    assert [r["loss_tokens"] for r in m["ranks"]] == [8 * 32 // ranks] * ranks


@pytest.mark.multirank
def test_ring_recompute_changes_no_loss(runs):
    plain, again = manifest(runs("ring", 2)), manifest(runs("ring", 2, "--recompute"))
    assert again["recompute"] == {"granularity": "block", "span": "ptprof/recompute"}
    for a, b in zip(plain["losses"], again["losses"], strict=True):
        assert abs(a - b) <= 1e-6 * abs(a)  # measured: equal to the last bit


@pytest.mark.parametrize("gpus, seq, chunks", [("2", "30", 4), ("3", "32", 6)])
def test_sequence_must_cut_into_two_chunks_per_rank(tmp_path, gpus, seq, chunks):
    res = ptprof("run", "ring", "--gpus", gpus, "--seq-len", seq, "--out", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip() == f"ptprof run: error: ring over {gpus} ranks needs --seq-len ({seq}) divisible by {chunks}"
    assert not any(tmp_path.iterdir())  # refused before any process started

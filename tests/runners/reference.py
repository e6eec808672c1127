"""The golden numbers for the runners: a plain single-process training loop.

It shares only the model definition and the synthetic data with the runners (that is what "same
model, same global batch" means) and none of the harness: no process group, no profiler, no
sharding. Every paradigm's global losses must match these.
"""

from __future__ import annotations

import functools

import torch

from runners.harness import synthetic_batch
from runners.model import GPT, GPTConfig, lm_loss
from runners.options import MODEL_PRESETS


def single_process_losses(
    *, model: str = "tiny", steps: int = 3, seed: int = 0, lr: float = 1e-3, moe: dict | None = None,
    aux_loss_weight: float = 0.0,
) -> list[float]:
    """LM losses per step. `moe` (n_experts, top_k, capacity_factor) builds the MoE variant, whose
    objective adds `aux_loss_weight` x the load-balancing loss (the returned loss is the LM part).

    Computed once per arguments and session: a deterministic function of them, and tiny8's three
    steps cost 2-3 s of CPU, asked for by a dozen tests."""
    return list(_losses(model, steps, seed, lr, tuple(sorted((moe or {}).items())), aux_loss_weight))


@functools.cache
def _losses(model: str, steps: int, seed: int, lr: float, moe: tuple, aux_loss_weight: float) -> tuple[float, ...]:
    vocab, d_model, n_layers, n_heads, seq_len, batch = MODEL_PRESETS[model]
    torch.manual_seed(seed)
    net = GPT(GPTConfig(vocab, d_model, n_layers, n_heads, seq_len, **dict(moe)))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        inputs, targets = synthetic_batch(step, seed=seed, batch_size=batch, seq_len=seq_len, vocab_size=vocab)
        loss = lm_loss(net(inputs), targets)
        (loss + aux_loss_weight * net.aux_loss()).backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return tuple(losses)


def param_bytes(model: str = "tiny") -> int:
    """Bytes of the full model's parameters (fp32)."""
    vocab, d_model, n_layers, n_heads, seq_len, _ = MODEL_PRESETS[model]
    return 4 * sum(p.numel() for p in GPT(GPTConfig(vocab, d_model, n_layers, n_heads, seq_len)).parameters())

"""A tiny GPT (and its MoE variant), written for clarity rather than speed.

Every runner trains this model, so its structure is what the parallel plans name:
`tok_emb`, `pos_emb`, `blocks["<i>"]` (`ln1`, `attn.{wq,wk,wv,wo}`, `ln2`, `mlp.{up,down}` or
`moe`), `norm`, `head`. Blocks live in a ModuleDict keyed by layer index so a pipeline stage can
delete the blocks it does not own and keep the others' names (and so their seeded weights).
Attention infers the local head count from `wq`'s output size, so tensor parallelism (which
shards `wq` by columns) needs no change here. Its `core` (q, k, v -> y, causal) is an attribute so
sequence/context parallel runners (Ulysses, ring attention) can replace just the attention itself,
and `GPT.forward` takes the positions of the tokens it is given (a rank's sequence shard).

With `recompute` set on a block (activation checkpointing, `ptprof run ... --recompute`), the
block keeps only its input in forward and runs its forward again inside backward, under the
`RECOMPUTE_SPAN` annotation (docs/run-layout.md).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from runners.options import MODEL_PRESETS


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    mlp_ratio: int = 4
    # MoE variant (GShard-style): an MoE FFN in every `moe_every`-th block when n_experts > 0.
    n_experts: int = 0
    top_k: int = 2
    moe_every: int = 2
    capacity_factor: float = 1.25

    @classmethod
    def from_preset(cls, name: str, seq_len: int | None = None, **overrides) -> "GPTConfig":
        vocab, d_model, n_layers, n_heads, preset_seq, _batch = MODEL_PRESETS[name]
        return cls(vocab, d_model, n_layers, n_heads, seq_len or preset_seq, **overrides)

    def is_moe_layer(self, i: int) -> bool:
        # GShard: every other FFN is MoE, starting with the second block.
        return self.n_experts > 0 and i % self.moe_every == self.moe_every - 1


# The span of a block's forward recomputed inside backward (activation checkpointing).
RECOMPUTE_SPAN = "ptprof/recompute"


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention of [b, heads, t, head_dim] tensors: the single-process core."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.core = causal_attention  # replaced by sequence/context-parallel runners
        self.head_dim = cfg.d_model // cfg.n_heads
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism wq/wk/wv hold only this rank's heads.
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = self.core(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class MoE(nn.Module):
    """Top-k gated mixture of experts with per-expert capacity (single process: all experts local).

    Tokens beyond an expert's capacity are dropped for that expert: their contribution from it is
    zero and the residual connection passes them through unchanged. The expert-parallel runner
    replaces `dispatch_and_combine` with all-to-all but keeps routing, capacity and the loss.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = cfg.n_experts, cfg.top_k, cfg.capacity_factor
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.d_model, cfg.mlp_ratio * cfg.d_model) for _ in range(cfg.n_experts))
        self.aux_loss = torch.zeros(())  # load-balancing loss of the last forward
        self.tokens_per_expert = torch.zeros(cfg.n_experts, dtype=torch.long)  # kept (token, expert) pairs
        self.dropped_tokens = 0  # (token, expert) pairs dropped by capacity in the last forward

    def capacity(self, n_tokens: int) -> int:
        return max(1, int(self.capacity_factor * n_tokens * self.top_k / self.n_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (expert index [N, k], gate weight [N, k], keep mask [N, k]) for flat tokens x [N, d].

        Capacity applies to the tokens given (a GShard group: the whole batch in one process, a
        rank's tokens under expert parallelism). Also records the load statistics behind the
        auxiliary loss and the routing counts of this forward.
        """
        probs = F.softmax(self.router(x), dim=-1)
        gate, expert = probs.topk(self.top_k, dim=-1)
        gate = gate / gate.sum(-1, keepdim=True)
        # Capacity: position of each (token, choice) among the tokens sent to the same expert, in
        # token order, first choices before second choices (as GShard).
        onehot = F.one_hot(expert.t().reshape(-1), self.n_experts)  # [k*N, E], choice-major
        position = (onehot.cumsum(0) - 1).gather(1, expert.t().reshape(-1, 1)).view(self.top_k, -1).t()
        keep = position < self.capacity(x.shape[0])
        # Load statistics: first-choice counts (no gradient) and summed router probabilities.
        self.first_choice_counts = F.one_hot(expert[:, 0], self.n_experts).sum(0).detach()
        self.prob_sums = probs.sum(0)
        self.routed_tokens = x.shape[0]
        self.aux_loss = self.load_balancing_loss(self.first_choice_counts, self.prob_sums, x.shape[0])
        self.tokens_per_expert = (onehot * keep.t().reshape(-1, 1)).sum(0).detach()  # kept pairs
        self.dropped_tokens = int((~keep).sum())
        return expert, gate, keep

    def load_balancing_loss(self, first_choice_counts, prob_sums, n_tokens: int) -> torch.Tensor:
        """Switch/GShard auxiliary loss: E * sum_e (fraction of first choices to e) * (mean prob of e)."""
        return self.n_experts * ((first_choice_counts.float() / n_tokens) * (prob_sums / n_tokens)).sum()

    def dispatch_and_combine(self, x, expert, gate, keep) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e, mlp in enumerate(self.experts):
            token, choice = torch.nonzero((expert == e) & keep, as_tuple=True)
            if token.numel():
                out.index_add_(0, token, mlp(x[token]) * gate[token, choice].unsqueeze(-1))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        return self.dispatch_and_combine(flat, *self.route(flat)).view(b, t, d)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, moe: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ffn = MoE(cfg) if moe else MLP(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.recompute = False  # activation checkpointing of this block (set by the harness)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            # Non-reentrant checkpoint: only x is saved; the body runs again when backward first
            # needs one of its activations, under RECOMPUTE_SPAN. Hooks on the block itself (FSDP's
            # all-gather) stay outside; hooks on its submodules (tensor parallel) run again.
            # Early stop off: the whole body runs again, the textbook full recomputation (one more
            # forward). torch's default stops after the last saved tensor and would skip the
            # block's tail, e.g. tensor parallelism's MLP all-reduce.
            with set_checkpoint_early_stop(False):
                return checkpoint(self.body, x, use_reentrant=False, context_fn=_recompute_contexts)
        return self.body(x)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


def _recompute_contexts():
    # (context of the first forward, context of the recomputation inside backward)
    return contextlib.nullcontext(), record_function(RECOMPUTE_SPAN)


class GPT(nn.Module):
    """Embedding, pre-norm blocks, final norm, LM head (untied, so stages and shards stay simple).

    A pipeline stage sets `tok_emb`/`pos_emb` or `norm`/`head` to None when it does not own them;
    forward then takes and returns hidden states instead of tokens/logits.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleDict({str(i): Block(cfg, cfg.is_moe_layer(i)) for i in range(cfg.n_layers)})
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens [b, t] -> logits [b, t, vocab] (or hidden states for a pipeline stage). `positions`:
        the tokens' positions in the sequence (default 0..t-1; a sequence shard passes its own)."""
        if self.tok_emb is not None:
            if positions is None:
                positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(positions)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x

    def set_recompute(self, on: bool = True) -> None:
        """Activation checkpointing per block (`--recompute`)."""
        for block in self.blocks.values():
            block.recompute = on

    def aux_loss(self) -> torch.Tensor | float:
        """Sum of the MoE load-balancing losses of the last forward (0.0 for a dense model)."""
        return sum((m.aux_loss for m in self.modules() if isinstance(m, MoE)), 0.0)


def _init_weights(module: nn.Module) -> None:
    # GPT-2 style: N(0, 0.02) for matrices and embeddings, LayerNorm at identity.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every token of the batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

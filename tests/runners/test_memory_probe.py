"""MemoryProbe in one process: it samples the first step that runs a backward, so a rank whose first
step only runs forwards (an early pipedream stage with few microbatches) still records its gradients
and optimizer state instead of null and 0 B."""

from __future__ import annotations

import torch
from torch import nn

from runners.memory_probe import MemoryProbe


def test_probe_waits_for_the_first_step_with_a_backward():
    torch.manual_seed(0)
    model = nn.Linear(8, 4, bias=False)  # 32 fp32 weights: 128 B
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    probe = MemoryProbe()

    # Step 0: a forward only (no backward, no optimizer step).
    model(torch.randn(2, 8))
    probe.after_forward(model, opt)
    probe.after_step(model, opt)
    assert probe.sampling and probe.numbers["grads_bytes"] is None

    # Step 1: forward, backward, step: sampled now, then sampling stops.
    loss = model(torch.randn(2, 8)).sum()
    probe.after_forward(model, opt)
    loss.backward()
    probe.after_backward(model)
    opt.step()
    probe.after_step(model, opt)
    assert not probe.sampling
    assert probe.numbers["params_bytes"] == 128 and probe.numbers["grads_bytes"] == 128
    # AdamW: exp_avg and exp_avg_sq of 128 B each, plus its step counter (one fp32 scalar).
    assert probe.numbers["optimizer_bytes"] == 2 * 128 + 4

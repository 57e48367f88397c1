"""The lean optimizer steps (podracer_hpc/agents/optimizer.py): clip_grads and FusedAdam on
gradients handed in give torch's clip_grad_norm_ and fused Adam's results bit for bit."""

from __future__ import annotations

import torch

from podracer_hpc.agents.optimizer import FusedAdam, clip_grads


def test_the_lean_optimizer_steps_equal_torchs_bit_for_bit():
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.Adam(n.parameters(), lr=3e-4, eps=1e-5, fused=True) for n in nets]
    lean = FusedAdam(opts[1])
    x = torch.randn(64, 5)
    for _ in range(4):
        opts[0].zero_grad(set_to_none=True)
        (nets[0](x) ** 2).sum().backward()
        torch.nn.utils.clip_grad_norm_(list(nets[0].parameters()), 0.5, foreach=True)
        opts[0].step()
        grads = list(torch.autograd.grad((nets[1](x) ** 2).sum(), list(nets[1].parameters())))
        clip_grads(grads, 0.5)
        lean.step(grads)
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    s0, s1 = (o.state_dict()["state"] for o in opts)
    assert all(torch.equal(s0[i][k], s1[i][k]) for i in s0 for k in ("step", "exp_avg", "exp_avg_sq"))
    assert float(s1[0]["step"]) == 4  # the lean path stepped (the first step goes through opt.step)

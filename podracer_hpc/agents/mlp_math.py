"""The agents' MLPs: built (:func:`mlp`), and their forward and backward passes written out with
autograd's own kernels, without a graph.

On a CPU a small network's update is mostly per-op overhead (autograd nodes, module calls), so
the agents' updates run the chain rule themselves: :func:`mlp_saved_forward` keeps each layer's
input and pre-activation, :func:`mlp_backward` turns the gradient at the output into the
parameters' gradients (SAC's and TD3's actors, PPO's actor and critic; TwinQ's ensemble has its
own). Tests compare them with autograd for every activation (tests/agents/test_offpolicy_ensemble.py,
tests/agents/test_ppo.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

ACTIVATION_FNS = {"relu": torch.relu, "tanh": torch.tanh, "elu": nn.functional.elu, "silu": nn.functional.silu}
_aten = torch.ops.aten
# the activations' backward from (gradient at the output, pre-activation z, output h): autograd's own kernels
ACTIVATION_GRADS = {
    "relu": lambda g, z, h: _aten.threshold_backward(g, h, 0.0),
    "tanh": lambda g, z, h: _aten.tanh_backward(g, h),
    "elu": lambda g, z, h: _aten.elu_backward(g, 1.0, 1.0, 1.0, True, h),
    "silu": lambda g, z, h: _aten.silu_backward(g, z),
}


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "silu": nn.SiLU}


def mlp(sizes: list[int], activation: str, out_gain: float | None = None) -> nn.Sequential:
    """An MLP of ``nn.Linear`` layers with ``activation`` between them. ``out_gain`` None keeps
    PyTorch's default initialization (as CleanRL's SAC and TD3); a number gives PPO's: orthogonal
    weights, hidden gain sqrt(2), output gain ``out_gain``, zero biases."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        if out_gain is not None:
            nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
            nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


def linears(body: nn.Sequential) -> list[nn.Linear]:
    """The ``nn.Linear`` layers of an :func:`mlp`, in order."""
    return [m for m in body if isinstance(m, nn.Linear)]


def mlp_forward(layers: list[nn.Linear], activation: str, x: torch.Tensor) -> torch.Tensor:
    """``nn.Sequential(*layers with activations)(x)`` for a 2-D ``x``, one ``addmm`` a layer
    (what ``nn.Linear`` computes, without the modules' per-call overhead)."""
    act = ACTIVATION_FNS[activation]
    last = len(layers) - 1
    for i, lin in enumerate(layers):
        x = torch.addmm(lin.bias, x, lin.weight.t())
        if i < last:
            x = act(x)
    return x


def mlp_saved_forward(
    layers: list[nn.Linear], activation: str, x: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """An :func:`mlp`'s forward keeping (output, each layer's input, each pre-activation) for
    :func:`mlp_backward` (call both under ``torch.no_grad()``, as the agents' update does)."""
    act = ACTIVATION_FNS[activation]
    inputs, pre, h = [], [], x
    last = len(layers) - 1
    for i, lin in enumerate(layers):
        inputs.append(h)
        z = torch.addmm(lin.bias, h, lin.weight.t())
        pre.append(z)
        h = act(z) if i < last else z
    return h, inputs, pre


def mlp_backward(
    layers: list[nn.Linear], activation: str, inputs: list[torch.Tensor], pre: list[torch.Tensor], g: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The gradients (weight, bias, layer by layer: the order of ``parameters()``) of an
    :func:`mlp` from ``g``, the gradient at its output, and :func:`mlp_saved_forward`'s record;
    written out as :meth:`TwinQ.backward`."""
    act_grad = ACTIVATION_GRADS[activation]
    grads: list[torch.Tensor] = [g] * (2 * len(layers))
    last = len(layers) - 1
    for i in range(last, -1, -1):
        if i < last:
            g = act_grad(g, pre[i], inputs[i + 1])
        grads[2 * i] = torch.mm(g.t(), inputs[i])
        grads[2 * i + 1] = g.sum(0)
        if i:
            g = torch.mm(g, layers[i].weight)
    return tuple(grads)

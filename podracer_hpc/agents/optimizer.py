"""The update's per-step bookkeeping, lean, for every agent (eager or compiled): gradient clipping
(:func:`clip_grads`) and Adam (:class:`FusedAdam`) on gradients handed in, through torch's own
kernels without their per-call bookkeeping: the same results as ``clip_grad_norm_`` and
``torch.optim.Adam(fused=True).step()`` bit for bit (tests/agents/test_optimizer.py)."""

from __future__ import annotations

import torch

__all__ = ["FusedAdam", "clip_grads"]


def clip_grads(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`` on gradients handed in
    (one device): its same ops (the same result bit for bit) without its grouping, scaling
    ``grads`` in place; returns the total norm."""
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


class FusedAdam:
    """One fused Adam step of ``opt`` (a fused ``torch.optim.Adam``, one parameter group) with the
    gradients given (``torch.autograd.grad``'s, in the order of ``opt``'s parameters): the kernel
    ``opt.step()`` runs (``_fused_adam_``, the same result bit for bit) with the state's lists
    gathered once, not on every step. The state stays ``opt``'s (its ``state_dict`` saves it):
    call :meth:`reset` after ``opt.load_state_dict``. The first step, and any optimizer this does
    not cover (amsgrad, maximize, capturable, a tensor lr, several groups), go through ``opt.step()``.
    The state's ``step`` tensors become views of one tensor (clone them to save them apart)."""

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt = opt
        self.params: list[torch.Tensor] = [p for g in opt.param_groups for p in g["params"]]
        self.lists: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None = None
        self.flat_step = torch.zeros(0)

    def reset(self) -> None:
        """Forget the gathered state (``opt``'s state tensors were replaced)."""
        self.lists = None

    def _lean(self) -> bool:
        opt = self.opt
        if len(opt.param_groups) != 1:
            return False
        g = opt.param_groups[0]
        return (
            bool(g.get("fused"))
            and not (g.get("amsgrad") or g.get("maximize") or g.get("capturable") or isinstance(g["lr"], torch.Tensor))
            and all(p in opt.state and "exp_avg" in opt.state[p] for p in self.params)
        )

    def step(self, grads: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> None:
        """``opt.step()`` with ``grads`` as the parameters' gradients (no ``.grad`` is left set)."""
        # the fused kernel walks a gradient's memory as its parameter's: autograd.grad does not
        # make them alike as .backward() does (a transposed view's gradient comes back transposed)
        grads = [g if g.is_contiguous() else g.contiguous() for g in grads]
        if self.lists is None:
            if not self._lean():
                for p, g in zip(self.params, grads):
                    p.grad = g
                self.opt.step()
                for p in self.params:
                    p.grad = None
                return
            states = [self.opt.state[p] for p in self.params]
            # the step counts as views of one tensor: one add_ counts them all (a _foreach_add_
            # over 0-d tensors costs several microseconds per tensor on a CPU)
            self.flat_step = torch.stack([s["step"] for s in states])
            for i, s in enumerate(states):
                s["step"] = self.flat_step[i]
            self.lists = (
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [s["step"] for s in states],
            )
        exp_avg, exp_avg_sq, steps = self.lists
        group = self.opt.param_groups[0]
        beta1, beta2 = group["betas"]
        self.flat_step.add_(1)
        torch._fused_adam_(
            self.params,
            grads,
            exp_avg,
            exp_avg_sq,
            [],
            steps,
            amsgrad=False,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )

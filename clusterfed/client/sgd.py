"""The SGD step rule every executor takes: one pure function of tensors.

`sgd_step` works on one flat vector (d,) or on stacked clients (G, d) row by row, and under
`torch.func.vmap`: it changes no tensor in place and branches only on the spec's numbers.
With `in_place=True` (the sequential loop) the same kernels run on the same values, so the
same bits come out, without two fresh parameter-sized vectors a step (13 % of a
1.66M-parameter CNN's step at batch 10, benchmarks/overhead.py).
"""

from __future__ import annotations

import torch

from clusterfed.tasks import TrainSpec


def clip_by_norm(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale each row of `grad` down to norm `max_norm` if longer (torch's clip_grad_norm_
    rule, 1e-6 included)."""
    norm = torch.linalg.vector_norm(grad, dim=-1, keepdim=True)
    return grad * (max_norm / (norm + 1e-6)).clamp(max=1.0)


def sgd_step(w: torch.Tensor, grad: torch.Tensor, velocity: torch.Tensor | None,
             spec: TrainSpec, *, prox_mu: float = 0.0, anchor: torch.Tensor | None = None,
             correction: torch.Tensor | None = None, in_place: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step of `torch.optim.SGD` on `w`: (new w, new momentum buffer).

    In torch's order: clip the gradient, add weight decay, then FedProx's proximal gradient
    prox_mu (w - anchor), fold into the momentum buffer (None before the first step); then
    SCAFFOLD's `correction`, after momentum so it moves w by exactly lr * correction.

    `in_place`: the same kernels on the same values, writing into `w` (returned as the new w;
    call it under `torch.no_grad()` if w is a leaf that requires grad), `grad` and the buffer
    (the first step's buffer is `grad` itself either way).
    """
    add = torch.Tensor.add_ if in_place else torch.Tensor.add
    mul = torch.Tensor.mul_ if in_place else torch.Tensor.mul
    if spec.clip_grad_norm:
        grad = clip_by_norm(grad, spec.clip_grad_norm)
    if spec.weight_decay:
        grad = add(grad, w, alpha=spec.weight_decay)
    if prox_mu:
        assert anchor is not None, "a proximal term needs its anchor"
        grad = add(grad, mul(w - anchor, prox_mu))
    if spec.momentum:
        velocity = grad if velocity is None else add(mul(velocity, spec.momentum), grad)
        grad = velocity
    if correction is not None:
        grad = grad + correction   # never in place: grad may be the momentum buffer
    return add(w, grad, alpha=-spec.lr), velocity

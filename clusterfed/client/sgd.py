"""The local step rules: SGD's, which every executor takes, and Adam's (sequential path);
the optimiser state they carry, and its arrays.

`sgd_step` works on one flat vector (d,) or on stacked clients (G, d) row by row, and under
`torch.func.vmap`: it changes no tensor in place and branches only on the spec's numbers.
With `in_place=True` (the sequential loop) the same kernels run on the same values, so the
same bits come out, without two fresh parameter-sized vectors a step (13 % of a
1.66M-parameter CNN's step at batch 10, benchmarks/overhead.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from clusterfed.tasks import TrainSpec


def clip_by_norm(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale each row of `grad` down to norm `max_norm` if longer (torch's clip_grad_norm_
    rule, 1e-6 included)."""
    norm = torch.linalg.vector_norm(grad, dim=-1, keepdim=True)
    return grad * (max_norm / (norm + 1e-6)).clamp(max=1.0)


def penalised_gradient(w: torch.Tensor, grad: torch.Tensor, spec: TrainSpec, prox_mu: float,
                       anchor: torch.Tensor | None, in_place: bool) -> torch.Tensor:
    """The gradient both step rules take, in torch's order: clipped, plus weight decay, plus
    FedProx's proximal gradient prox_mu (w - anchor)."""
    add = torch.Tensor.add_ if in_place else torch.Tensor.add
    if spec.clip_grad_norm:
        grad = clip_by_norm(grad, spec.clip_grad_norm)
    if spec.weight_decay:
        grad = add(grad, w, alpha=spec.weight_decay)
    if prox_mu:
        assert anchor is not None, "a proximal term needs its anchor"
        mul = torch.Tensor.mul_ if in_place else torch.Tensor.mul
        grad = add(grad, mul(w - anchor, prox_mu))
    return grad


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
    grad = penalised_gradient(w, grad, spec, prox_mu, anchor, in_place)
    if spec.momentum:
        velocity = grad if velocity is None else add(mul(velocity, spec.momentum), grad)
        grad = velocity
    if correction is not None:
        grad = grad + correction   # never in place: grad may be the momentum buffer
    return add(w, grad, alpha=-spec.lr), velocity


@dataclass(frozen=True)
class AdamMoments:
    """Adam's state after `step` steps: the first and second moment estimates."""

    step: int
    first: torch.Tensor
    second: torch.Tensor


def adam_step(w: torch.Tensor, grad: torch.Tensor, moments: AdamMoments | None,
              spec: TrainSpec, *, prox_mu: float = 0.0, anchor: torch.Tensor | None = None,
              in_place: bool = False) -> tuple[torch.Tensor, AdamMoments]:
    """One step of `torch.optim.Adam` (Kingma and Ba 2015, Alg. 1; L2 weight decay added to
    the gradient, as torch's `weight_decay`) on `w`: (new w, new moments).

    The gradient gains clipping, weight decay and a proximal pull prox_mu (w - anchor) in
    SGD's order (`sgd_step`); then
        m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,
        w <- w - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    with torch's operations in torch's order, so the same values come out. `in_place`
    writes into `w`, `grad` and the moments, as `sgd_step` does.
    """
    mul = torch.Tensor.mul_ if in_place else torch.Tensor.mul
    grad = penalised_gradient(w, grad, spec, prox_mu, anchor, in_place)
    b1, b2 = spec.adam_beta1, spec.adam_beta2
    if moments is None:
        moments = AdamMoments(0, torch.zeros_like(w), torch.zeros_like(w))
    t = moments.step + 1
    first = torch.Tensor.lerp_ if in_place else torch.Tensor.lerp
    m = first(moments.first, grad, 1 - b1)
    addcmul = torch.Tensor.addcmul_ if in_place else torch.Tensor.addcmul
    v = addcmul(mul(moments.second, b2), grad, grad.conj(), value=1 - b2)
    correction1 = 1 - b1**t
    denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(spec.adam_eps)
    addcdiv = torch.Tensor.addcdiv_ if in_place else torch.Tensor.addcdiv
    return addcdiv(w, m, denom, value=-spec.lr / correction1), AdamMoments(t, m, v)


def local_step(w: torch.Tensor, grad: torch.Tensor, state: torch.Tensor | AdamMoments | None,
               spec: TrainSpec, *, prox_mu: float = 0.0, anchor: torch.Tensor | None = None,
               correction: torch.Tensor | None = None, in_place: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | AdamMoments | None]:
    """The spec's optimiser's step: `adam_step` or `sgd_step`, with its state (None at first)."""
    if spec.optimizer == "adam":
        if correction is not None:
            raise ValueError("SCAFFOLD's control variates correct SGD steps; train.optimizer "
                             "must be sgd")
        assert state is None or isinstance(state, AdamMoments)
        return adam_step(w, grad, state, spec, prox_mu=prox_mu, anchor=anchor,
                         in_place=in_place)
    assert state is None or isinstance(state, torch.Tensor)
    return sgd_step(w, grad, state, spec, prox_mu=prox_mu, anchor=anchor,
                    correction=correction, in_place=in_place)


# What a local optimiser carries between steps: SGD's momentum buffer, Adam's moments, or
# nothing yet (None). With train.optimizer_state=kept it also carries between a client's tasks.
OptimizerState = torch.Tensor | AdamMoments | None


def state_arrays(state: OptimizerState) -> dict[str, np.ndarray]:
    """`state` as named arrays (for checkpoints and Flower's context.state); {} for None."""
    if state is None:
        return {}
    if isinstance(state, AdamMoments):
        return {"adam_step": np.array(state.step, dtype=np.int64),
                "adam_first": state.first.detach().cpu().numpy(),
                "adam_second": state.second.detach().cpu().numpy()}
    return {"momentum": state.detach().cpu().numpy()}


def state_from_arrays(arrays: Mapping[str, np.ndarray],
                      device: torch.device | None = None) -> OptimizerState:
    """The inverse of `state_arrays`, the tensors on `device`; copies, so the arrays stay
    untouched by in-place steps."""
    if not arrays:
        return None
    if "momentum" in arrays:
        return torch.tensor(np.asarray(arrays["momentum"]), device=device)
    if {"adam_step", "adam_first", "adam_second"} <= set(arrays):
        return AdamMoments(int(arrays["adam_step"]),
                           torch.tensor(np.asarray(arrays["adam_first"]), device=device),
                           torch.tensor(np.asarray(arrays["adam_second"]), device=device))
    raise ValueError(f"not an optimiser state: arrays {sorted(arrays)}")

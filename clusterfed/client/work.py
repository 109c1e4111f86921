"""The client tasks as pure functions over flat parameter vectors and local tensors."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from clusterfed.client.tasks import ClientResult, ClientTask, TaskKind, TrainSpec
from clusterfed.models.flat import FlatModel

# Targets per evaluation chunk: 1000 images, or fewer sequences when each has many tokens.
EVAL_TARGETS = 1000
# Padded targets of text sequences; cross_entropy skips them by default.
IGNORE_INDEX = -100


def scored(y: torch.Tensor) -> int:
    """Targets that count: one per sample or token, less padding (cross_entropy's ignore_index)."""
    return max(int((y != IGNORE_INDEX).sum()), 1)


def chunk_rows(y: torch.Tensor) -> int:
    """Rows per evaluation chunk, so a chunk holds about EVAL_TARGETS labels."""
    per_row = max(1, y[0].numel()) if len(y) else 1
    return max(1, EVAL_TARGETS // per_row)


def train(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
          spec: TrainSpec, generator: torch.Generator) -> tuple[torch.Tensor, float]:
    """Local mini-batch SGD from `params`; returns (new - old parameters, mean batch loss).

    Each epoch visits a fresh permutation in batches of `batch_size`, the last one partial.
    """
    n = len(y)
    batch = min(spec.batch_size, n)
    per_epoch = math.ceil(n / batch)
    w = params.detach().clone()
    velocity: torch.Tensor | None = None
    total = 0.0
    steps = spec.num_steps(n)
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(n, generator=generator)
        idx = order[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
        w.requires_grad_(True)
        loss = F.cross_entropy(model(w, x[idx]), y[idx])
        (grad,) = torch.autograd.grad(loss, w)
        w = w.detach()
        if spec.clip_grad_norm:
            grad = clip_by_norm(grad, spec.clip_grad_norm)
        if spec.weight_decay:
            grad = grad.add(w, alpha=spec.weight_decay)
        if spec.momentum:
            velocity = grad if velocity is None else velocity.mul_(spec.momentum).add_(grad)
            grad = velocity
        w.add_(grad, alpha=-spec.lr)
        total += loss.detach().item()
    return w - params, total / steps


def clip_by_norm(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale `grad` down to norm `max_norm` if it is longer (torch's clip_grad_norm_ rule)."""
    scale = max_norm / (float(grad.norm()) + 1e-6)
    return grad * scale if scale < 1.0 else grad


@torch.no_grad()
def evaluate(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
             ) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of one model on (x, y)."""
    loss_sum, correct = 0.0, 0
    rows = chunk_rows(y)
    for start in range(0, len(y), rows):
        logits = model(params, x[start:start + rows])
        target = y[start:start + rows]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    return loss_sum / scored(y), correct / scored(y)


def losses(model: FlatModel, stacked: torch.Tensor, x: torch.Tensor, y: torch.Tensor
           ) -> np.ndarray:
    """Mean loss of each of several models (rows of `stacked`) on (x, y)."""
    return np.array([evaluate(model, w, x, y)[0] for w in stacked], dtype=np.float64)


def gradient(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
             ) -> tuple[torch.Tensor, float]:
    """Full-batch gradient of the mean loss, accumulated in chunks to bound memory."""
    w = params.detach().clone().requires_grad_(True)
    total = torch.zeros_like(w)
    loss_sum = 0.0
    rows = chunk_rows(y)
    for start in range(0, len(y), rows):
        loss = F.cross_entropy(model(w, x[start:start + rows]), y[start:start + rows],
                               reduction="sum")
        (g,) = torch.autograd.grad(loss, w)
        total += g
        loss_sum += loss.detach().item()
    n = scored(y)
    return total / n, loss_sum / n


def run_task(model: FlatModel, task: ClientTask, train_xy: tuple[torch.Tensor, torch.Tensor],
             test_xy: tuple[torch.Tensor, torch.Tensor], generator: torch.Generator,
             device: torch.device | None = None) -> ClientResult:
    """Run one task on one client's data; every runtime calls this, so all agree.

    `device`: where the model and data live (default: the CPU); results come back as numpy.
    """
    x, y = train_xy
    params = torch.as_tensor(task.params, device=device)
    if task.kind is TaskKind.TRAIN:
        if task.train is None:
            raise ValueError("a train task needs a TrainSpec")
        update, loss = train(model, params, x, y, task.train, generator)
        return ClientResult(task.client, task.kind, len(y), update=update.cpu().numpy(), loss=loss,
                            meta=task.meta)
    if task.kind is TaskKind.GRADIENT:
        grad, loss = gradient(model, params, x, y)
        return ClientResult(task.client, task.kind, len(y), update=grad.cpu().numpy(), loss=loss,
                            meta=task.meta)
    stacked = params if params.dim() == 2 else params[None]
    if task.kind is TaskKind.LOSSES:
        return ClientResult(task.client, task.kind, len(y), losses=losses(model, stacked, x, y),
                            meta=task.meta)
    tx, ty = test_xy
    pairs = [evaluate(model, w, tx, ty) for w in stacked]
    return ClientResult(task.client, task.kind, len(ty),
                        losses=np.array([p[0] for p in pairs]),
                        accuracies=np.array([p[1] for p in pairs]),
                        loss=pairs[0][0], meta=task.meta)

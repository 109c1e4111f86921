"""The client tasks as pure functions over flat parameter vectors and local tensors."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from clusterfed.client.sgd import AdamMoments, OptimizerState, local_step
from clusterfed.client.signature import client_signature
from clusterfed.models.flat import FlatModel
from clusterfed.tasks import (
    ClientResult,
    ClientTask,
    LocalObjective,
    LossSpec,
    SignatureSpec,
    TaskKind,
    TrainSpec,
)

# Targets per evaluation chunk: 1000 images, or fewer sequences when each has many tokens.
EVAL_TARGETS = 1000
# Padded targets of text sequences; cross_entropy skips them by default.
IGNORE_INDEX = -100


def scored(y: torch.Tensor) -> int:
    """Targets that count: one per sample or token, less padding (cross_entropy's ignore_index)."""
    return max(int((y != IGNORE_INDEX).sum()), 1)


def per_sample_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(b,): each sample's cross-entropy, the mean over its scored tokens for sequences."""
    loss = F.cross_entropy(logits, target, reduction="none")
    if loss.dim() == 1:
        return loss
    mask = (target != IGNORE_INDEX).to(loss.dtype).flatten(1)
    return (loss.flatten(1) * mask).sum(1) / mask.sum(1).clamp(min=1)


def chunk_rows(y: torch.Tensor) -> int:
    """Rows per evaluation chunk, so a chunk holds about EVAL_TARGETS labels."""
    per_row = max(1, y[0].numel()) if len(y) else 1
    return max(1, EVAL_TARGETS // per_row)


def train(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
          spec: TrainSpec, generator: torch.Generator, objective: LocalObjective | None = None
          ) -> tuple[torch.Tensor, float]:
    """Local mini-batch SGD (or Adam: `spec.optimizer`) from `params`, the optimiser fresh;
    returns (new - old parameters, mean batch loss). See `train_with_state`."""
    update, loss, _ = train_with_state(model, params, x, y, spec, generator, objective)
    return update, loss


def train_with_state(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                     spec: TrainSpec, generator: torch.Generator,
                     objective: LocalObjective | None = None, state: OptimizerState = None
                     ) -> tuple[torch.Tensor, float, OptimizerState]:
    """Local mini-batch SGD (or Adam: `spec.optimizer`) from `params`, the optimiser starting
    from `state` (None: fresh; the tensors it holds are stepped in place); returns (new - old
    parameters, mean batch loss, the optimiser's state after the last step).

    Each epoch visits a fresh permutation in batches of `batch_size`, the last one partial.
    `objective` adds FedProx's proximal gradient mu (w - anchor) to each step's gradient (the
    anchor is `params` unless the objective names one), SCAFFOLD's correction to each step's
    direction (after momentum) and weights each sample's loss; the loss reported is the
    (weighted) data loss alone. Per-FedAvg's MAML steps are `meta_train`'s.
    """
    mu = objective.prox_mu if objective is not None else 0.0
    correction = (torch.as_tensor(objective.correction)
                  if objective is not None and objective.correction is not None else None)
    anchor = (torch.as_tensor(objective.anchor, device=params.device)
              if objective is not None and objective.anchor is not None else params)
    weights = (torch.as_tensor(objective.sample_weights, dtype=params.dtype,
                               device=params.device)
               if objective is not None and objective.sample_weights is not None else None)
    if weights is not None and len(weights) != len(y):
        raise ValueError(f"{len(weights)} sample weights for {len(y)} training samples")
    check_state(state, params)
    n = len(y)
    batch = min(spec.batch_size, n)
    per_epoch = math.ceil(n / batch)
    w = params.detach().clone().requires_grad_(True)
    total = 0.0
    steps = spec.num_steps(n)
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(n, generator=generator)
        idx = order[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
        if weights is None:
            loss = F.cross_entropy(model(w, x[idx]), y[idx])
        else:   # the mean of w_j * loss_j over the batch: an unbiased step on (1/n) sum w l
            loss = (weights[idx] * per_sample_loss(model(w, x[idx]), y[idx])).mean()
        (grad,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            _, state = local_step(w, grad, state, spec, prox_mu=mu, anchor=anchor,
                                  correction=correction, in_place=True)
        total += loss.detach().item()
    return w.detach() - params, total / steps, state


def check_state(state: OptimizerState, params: torch.Tensor) -> None:
    """Refuse a kept optimiser state made for parameters of another shape."""
    held = state.first if isinstance(state, AdamMoments) else state
    if held is not None and held.shape != params.shape:
        raise ValueError(f"the client's kept optimiser state is for {tuple(held.shape)} "
                         f"parameters, the task's are {tuple(params.shape)}")


def batch_stream(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Mini-batch indices, endlessly: each epoch a fresh permutation, the last batch partial
    (the order `train` uses)."""
    batch = min(batch_size, n)
    while True:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch):
            yield order[start:start + batch]


def loss_and_grad(model: FlatModel, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor
                  ) -> tuple[torch.Tensor, float]:
    """The gradient of the mean loss on (x, y) at `w`, and that loss."""
    w = w.detach().requires_grad_(True)
    loss = F.cross_entropy(model(w, x), y)
    (grad,) = torch.autograd.grad(loss, w)
    return grad, loss.detach().item()


def meta_gradient(model: FlatModel, w: torch.Tensor, batches: Iterator[torch.Tensor],
                  x: torch.Tensor, y: torch.Tensor, objective: LocalObjective
                  ) -> tuple[torch.Tensor, float]:
    """Per-FedAvg's stochastic gradient of F(w - alpha grad f(w)) (Fallah et al. 2020, Alg. 1).

    Batch D: w~ = w - alpha grad f(w, D). Batch D': g = grad f(w~, D'). 'fo' returns g;
    'hf' returns g - alpha d, d = [grad f(w + delta g, D'') - grad f(w - delta g, D'')] / (2 delta)
    on a third batch D'', the Hessian-free estimate of the Hessian-vector product (their Eq. 10).
    Returns the meta-gradient and the meta-objective's sample, the loss at w~ on D'.
    """
    alpha = objective.maml_alpha
    idx = next(batches)
    inner, _ = loss_and_grad(model, w, x[idx], y[idx])
    idx = next(batches)
    g, loss = loss_and_grad(model, w - alpha * inner, x[idx], y[idx])
    if objective.maml == "fo":
        return g, loss
    idx = next(batches)
    delta = objective.maml_delta
    plus, _ = loss_and_grad(model, w + delta * g, x[idx], y[idx])
    minus, _ = loss_and_grad(model, w - delta * g, x[idx], y[idx])
    return g - alpha * (plus - minus) / (2 * delta), loss


def shared_meta_step(model: FlatModel, w: torch.Tensor, batches: Iterator[torch.Tensor],
                     x: torch.Tensor, y: torch.Tensor, objective: LocalObjective,
                     spec: TrainSpec, state: OptimizerState
                     ) -> tuple[torch.Tensor, OptimizerState, float]:
    """Per-FedAvg (FO) as its PACFL authors step it (src/client/client_per_fedavg.py): one
    optimiser takes the inner step of alpha from w on D, then, from w again, the outer step of
    beta (spec.lr) on the gradient at w~ on D'; its momentum buffer runs through both. Returns
    (new w, the optimiser's state, the loss at w~ on D')."""
    idx = next(batches)
    inner, _ = loss_and_grad(model, w, x[idx], y[idx])
    tilde, state = local_step(w, inner, state, replace(spec, lr=objective.maml_alpha))
    idx = next(batches)
    g, loss = loss_and_grad(model, tilde, x[idx], y[idx])
    w, state = local_step(w, g, state, spec)
    return w, state, loss


def meta_train(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
               spec: TrainSpec, generator: torch.Generator, objective: LocalObjective
               ) -> tuple[torch.Tensor, float]:
    """Per-FedAvg's local steps, the optimiser fresh (`meta_train_with_state`)."""
    update, loss, _ = meta_train_with_state(model, params, x, y, spec, generator, objective)
    return update, loss


def meta_train_with_state(model: FlatModel, params: torch.Tensor, x: torch.Tensor,
                          y: torch.Tensor, spec: TrainSpec, generator: torch.Generator,
                          objective: LocalObjective, state: OptimizerState = None
                          ) -> tuple[torch.Tensor, float, OptimizerState]:
    """Per-FedAvg's local steps: `spec.num_steps(n)` meta steps w <- w - lr * meta-gradient.

    Each meta step draws its two ('fo') or three ('hf') batches from one stream of epochs.
    The spec's lr is the outer step beta; clipping, weight decay and momentum act on the
    meta-gradient as on a gradient in `train`. Returns (new - old parameters, the mean loss
    after the inner step, which is what Per-FedAvg minimises, and the optimiser's state from
    `state`, as in `train_with_state`).
    """
    check_state(state, params)
    batches = batch_stream(len(y), spec.batch_size, generator)
    w = params.detach().clone()
    total = 0.0
    steps = spec.num_steps(len(y))
    for _ in range(steps):
        if objective.maml_momentum == "shared":
            w, state, loss = shared_meta_step(model, w, batches, x, y, objective, spec, state)
        else:
            grad, loss = meta_gradient(model, w, batches, x, y, objective)
            w, state = local_step(w, grad, state, spec)
        total += loss
    return w - params, total / steps, state


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


@torch.no_grad()
def evaluate_mixture(model: FlatModel, stacked: torch.Tensor, weights: np.ndarray,
                     x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean loss and accuracy on (x, y) of the mixture p(y | x) = sum_m w_m softmax(f_m(x))_y
    of the models (rows of `stacked`) with weights `weights` (FedEM's and FedRC's prediction).

    Loss: -mean log p(y | x), by log-sum-exp over the models' log-softmax (in float64, so a
    model with weight 0 or a tiny probability does not underflow); accuracy: argmax_y p(y | x).
    """
    log_w = torch.log(torch.as_tensor(np.asarray(weights), dtype=torch.float64,
                                      device=stacked.device))
    loss_sum, correct = 0.0, 0
    rows = chunk_rows(y)
    for start in range(0, len(y), rows):
        target = y[start:start + rows]
        log_p = torch.stack([F.log_softmax(model(w, x[start:start + rows]).double(), dim=1)
                             for w in stacked])   # (models, batch, classes, ...)
        mixed = torch.logsumexp(log_p + log_w.view(-1, *[1] * (log_p.dim() - 1)), dim=0)
        loss_sum += float(F.nll_loss(mixed, target, reduction="sum", ignore_index=IGNORE_INDEX))
        correct += int((mixed.argmax(1) == target).sum())
    return loss_sum / scored(y), correct / scored(y)


def losses(model: FlatModel, stacked: torch.Tensor, x: torch.Tensor, y: torch.Tensor
           ) -> np.ndarray:
    """Mean loss of each of several models (rows of `stacked`) on (x, y)."""
    return np.array([evaluate(model, w, x, y)[0] for w in stacked], dtype=np.float64)


def sample_losses(model: FlatModel, stacked: torch.Tensor, x: torch.Tensor, y: torch.Tensor
                  ) -> np.ndarray:
    """(models, n): the loss of every sample under each model (rows of `stacked`), in chunks."""
    out = np.empty((len(stacked), len(y)), dtype=np.float64)
    rows = chunk_rows(y)
    with torch.no_grad():
        for m, w in enumerate(stacked):
            for start in range(0, len(y), rows):
                loss = per_sample_loss(model(w, x[start:start + rows]), y[start:start + rows])
                out[m, start:start + rows] = loss.double().cpu().numpy()
    return out


def loss_data(train_xy: tuple[torch.Tensor, torch.Tensor],
              test_xy: tuple[torch.Tensor, torch.Tensor], spec: LossSpec | None,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The data a LOSSES task scores on: training (and test) data, maybe a fixed subsample."""
    x, y = train_xy
    if spec is None:
        return x, y
    if spec.data == "train+test":
        x, y = torch.cat([x, test_xy[0]]), torch.cat([y, test_xy[1]])
    if spec.max_samples is not None and spec.max_samples < len(y):
        keep = torch.randperm(len(y), generator=generator)[:spec.max_samples].sort().values
        x, y = x[keep], y[keep]
    return x, y


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
        return train_task(model, task, train_xy, generator, device)[0]
    if task.kind is TaskKind.GRADIENT:
        grad, loss = gradient(model, params, x, y)
        return ClientResult(task.client, task.kind, len(y), update=grad.cpu().numpy(), loss=loss,
                            meta=task.meta, task_id=task.id)
    if task.kind is TaskKind.SIGNATURE:
        return signature_result(task, x, y)
    stacked = params if params.dim() == 2 else params[None]
    if task.kind is TaskKind.LOSSES:
        began = time.perf_counter()
        lx, ly = loss_data(train_xy, test_xy, task.loss, generator)
        per_sample = task.loss is not None and task.loss.per_sample
        values = (sample_losses if per_sample else losses)(model, stacked, lx, ly)
        labels = ly.cpu().numpy().astype(np.int64) if per_sample and task.loss.labels else None
        # The client's compute time, for cost reports (LCFL's M^2 evaluations); not in state.
        meta = {**task.meta, "seconds": time.perf_counter() - began}
        return ClientResult(task.client, task.kind, len(y), losses=values, labels=labels,
                            meta=meta, task_id=task.id)
    tx, ty = test_xy
    if task.mixture is not None:   # one figure: the mixture's
        pairs = [evaluate_mixture(model, stacked, task.mixture, tx, ty)]
    else:
        pairs = [evaluate(model, w, tx, ty) for w in stacked]
    return ClientResult(task.client, task.kind, len(ty),
                        losses=np.array([p[0] for p in pairs]),
                        accuracies=np.array([p[1] for p in pairs]),
                        loss=pairs[0][0], meta=task.meta, task_id=task.id)


def train_task(model: FlatModel, task: ClientTask, train_xy: tuple[torch.Tensor, torch.Tensor],
               generator: torch.Generator, device: torch.device | None = None,
               state: OptimizerState = None) -> tuple[ClientResult, OptimizerState]:
    """A TRAIN task's result, its optimiser starting from `state`, and the optimiser's state
    after it (which stays on the client: train.optimizer_state=kept hands it to the next)."""
    if task.train is None:
        raise ValueError("a train task needs a TrainSpec")
    x, y = train_xy
    params = torch.as_tensor(task.params, device=device)
    objective = task.objective
    if objective is not None and objective.maml is not None:
        update, loss, state = meta_train_with_state(model, params, x, y, task.train, generator,
                                                    objective, state)
    else:
        update, loss, state = train_with_state(model, params, x, y, task.train, generator,
                                               objective, state)
    result = ClientResult(task.client, task.kind, len(y), update=update.cpu().numpy(), loss=loss,
                          meta={**task.meta, "local_steps": task.train.num_steps(len(y))},
                          task_id=task.id)
    return result, state


def signature_result(task: ClientTask, x: torch.Tensor, y: torch.Tensor) -> ClientResult:
    """PACFL's data signature, as the task's SignatureSpec says; only U and its column labels
    leave the client."""
    spec = task.signature or SignatureSpec()
    u, labels = client_signature(
        x.cpu().numpy(), y.cpu().numpy(), p=spec.p, per_class=spec.per_class,
        center=spec.center, mean=None if spec.mean is None else list(spec.mean),
        std=None if spec.std is None else list(spec.std), svd=spec.svd, seed=spec.seed,
        budget=spec.budget)
    return ClientResult(task.client, task.kind, len(y), signature=u.astype(np.float32),
                        signature_labels=labels, meta=task.meta, task_id=task.id)

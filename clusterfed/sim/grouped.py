"""The grouped executor: a round's clients trained together as one wider model, on a CPU.

`vmap` over stacked parameters (the vectorised executor) was slower than the sequential loop
on this project's CPU. Here the K clients of a group are one model K times as wide
(`models.grouped.GroupedModel`): one grouped convolution (`groups=K`, the clients' channels
stacked, channels-last) and one batched matmul per layer, so a step costs a few large calls
instead of K rounds of small ones. Groups are sized so that the widest layer's activations
stay about `ACTIVATION_FLOATS` (measured: larger groups fall out of the cache and slow down).

Equality with the sequential executor (`client.work.train`), to float tolerance:

- each task draws its batch order from its own generator (`sampling.task_seed`) with the
  same `randperm` calls (`vectorised.batch_plan`);
- clients of one TrainSpec train together whatever their sizes: sorted by step count, a
  client that has taken all its steps leaves the group (the group is a shrinking prefix);
  a client's short last batch is padded and masked, so its loss is the mean over its batch;
- each step is `client.sgd.sgd_step` per parameter tensor (elementwise, as on the flat
  vector); gradient clipping uses each client's norm over all its tensors.

- a task's LocalObjective trains grouped too, as `client.work.train` applies it: FedProx's
  proximal pull (towards the start or a named anchor, FedSoft's), SCAFFOLD's correction and
  per-sample weights (FedEM's and FedRC's M-step), each client's vectors packed as its
  parameters are; Per-FedAvg's meta steps as `client.work.meta_train` takes them (two or
  three consecutive batches of one stream a step); the tasks of one group share mu, the meta
  step and which terms they carry.

EVALUATE and LOSSES tasks with several models (IFCA's and LCFL's losses of every model on a
client's data) run the models as one grouped model over the client's data, which the first
layer reads once. Everything else (one-model evaluations, GRADIENT tasks, Adam or a kept
optimiser state, models with batch norm, dropout or a forward of their own) runs on the
sequential path, with a logged notice.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from clusterfed.client.batched import chunk_scores
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.sgd import sgd_step
from clusterfed.client.work import IGNORE_INDEX
from clusterfed.data.federation import Federation
from clusterfed.models.flat import FlatModel
from clusterfed.models.grouped import GroupedModel, grouped_obstacle
from clusterfed.sim.vectorised import VectorisedExecutor, batch_plan, task_obstacle
from clusterfed.tasks import MAML_BATCHES, ClientResult, ClientTask, LocalObjective, TrainSpec

# Floats of the widest layer's output per group call. Measured on a 2-core EPYC (img per
# CPU second, docs/speed.md): the best group held about 1-2.5M (cfl_convnet at batch
# 128: 5 clients; cnn_femnist_tiny at batch 20: 10; fedavg_cnn at batch 10: 5).
ACTIVATION_FLOATS = 2 * 2**20


def widest_activation(model: GroupedModel, input_shape: tuple[int, ...]) -> int:
    """Floats of the widest layer output of one image through one copy."""
    widest = math.prod(input_shape)
    x = torch.zeros(1, 1, *input_shape)
    params = [torch.zeros(1, *s) for s in model.shapes]
    with torch.no_grad():
        for out in model.activations(params, x):
            widest = max(widest, out.numel())
    return widest


def group_size(widest: int, rows: int, budget: int = ACTIVATION_FLOATS) -> int:
    """Copies per call, so that copies x rows x widest stays about `budget` (at least 1)."""
    return max(1, budget // max(1, rows * widest))


def _clip(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """torch's clip_grad_norm_ rule per client (row), over all of its tensors."""
    k = len(grads[0])
    norm = torch.stack([g.reshape(k, -1).pow(2).sum(1) for g in grads]).sum(0).sqrt()
    factor = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    return [g * factor.reshape(k, *[1] * (g.dim() - 1)) for g in grads]


@dataclasses.dataclass(frozen=True)
class GroupObjective:
    """A LocalObjective's terms for the K clients of a group, each vector packed as the
    parameters are (`GroupedModel.pack`): row k is client k's.

    prox_mu: FedProx's mu, shared by the group; anchor: the proximal centre (None: each
    client's start); correction: SCAFFOLD's c - c_i; sample_weights: one weight per row of the
    group's concatenated training data; maml, maml_alpha, maml_delta: Per-FedAvg's meta step
    (`LocalObjective`), shared by the group.
    """

    prox_mu: float = 0.0
    anchor: list[torch.Tensor] | None = None
    correction: list[torch.Tensor] | None = None
    sample_weights: torch.Tensor | None = None
    maml: str | None = None
    maml_alpha: float = 0.01
    maml_delta: float = 1e-3
    maml_momentum: str = "meta"

    @property
    def batches_per_step(self) -> int:
        """Batches a local step draws: Per-FedAvg's D, D' ('fo') and D'' ('hf'); else one."""
        return 1 if self.maml is None else MAML_BATCHES[self.maml]


def objective_kind(objective: LocalObjective | None) -> tuple | None:
    """What tasks must share to train in one group: mu, the meta step and which terms they
    carry."""
    if objective is None:
        return None
    return (objective.prox_mu, objective.anchor is not None, objective.correction is not None,
            objective.sample_weights is not None, objective.maml, objective.maml_alpha,
            objective.maml_delta, objective.maml_momentum)


def _batch_losses(per: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                  weights: torch.Tensor | None) -> torch.Tensor:
    """(active,) each client's batch loss from (active, width, ...) per-token losses.

    Unweighted: the mean over the batch's scored tokens (cross_entropy's mean). Weighted: the
    mean over the batch of w_j times sample j's loss, a sequence's loss being the mean over its
    scored tokens (`client.work.per_sample_loss`).
    """
    active = len(per)
    scored = (target != IGNORE_INDEX).to(per.dtype)
    if weights is None:
        weight = valid.reshape(active, valid.shape[1], *[1] * (per.dim() - 2)) * scored
        count = weight.reshape(active, -1).sum(1)
        return (per * weight).reshape(active, -1).sum(1) / count.clamp(min=1)
    if per.dim() > 2:
        per = (per * scored).flatten(2).sum(2) / scored.flatten(2).sum(2).clamp(min=1)
    mask = valid.to(per.dtype)
    return (per * weights * mask).sum(1) / mask.sum(1).clamp(min=1)


def _batch_rows(plans: Sequence[np.ndarray], active: int, row: int, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row `row` of the first `active` clients' plans: (active, width) data rows (padding
    points at row 0) and which of them are real samples."""
    width = max(plans[i].shape[1] for i in range(active))
    index = np.full((active, width), -1, dtype=np.int64)
    for i in range(active):
        index[i, :plans[i].shape[1]] = plans[i][row]
    valid = torch.from_numpy(index >= 0).to(device)
    return torch.from_numpy(np.where(index >= 0, index, 0)).to(device), valid


def _losses_and_grads(model: GroupedModel, tensors: Sequence[torch.Tensor], x: torch.Tensor,
                      y: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor,
                      weights: torch.Tensor | None
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each client's batch loss at its packed parameters and its gradient, per tensor."""
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    logits = model(leaves, x[rows])                      # (active, width, classes, ...)
    target = y[rows]
    per = F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1), reduction="none")
    per = per.reshape(*rows.shape, *per.shape[1:])
    losses = _batch_losses(per, target, valid, None if weights is None else weights[rows])
    return losses.detach(), list(torch.autograd.grad(losses.sum(), leaves))


def train_grouped(model: GroupedModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                  plans: Sequence[np.ndarray], spec: TrainSpec,
                  objective: GroupObjective | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Local SGD of K clients at once: (K, d) updates and (K,) mean batch losses.

    `params` (K, d) starting points; `plans[k]` rows of `x`/`y` (-1: pad), one batch a row
    (`objective.batches_per_step` rows a step), in non-increasing order of length, so the
    clients still training are a prefix; `objective` the clients' local objective terms (None:
    plain SGD on the loss).
    """
    k = len(plans)
    objective = objective or GroupObjective()
    per_step = objective.batches_per_step
    steps = np.array([len(p) // per_step for p in plans])
    assert np.all(np.diff(steps) <= 0), "plans must come longest first"
    w = model.pack(params.detach())
    mu = objective.prox_mu
    anchor = objective.anchor or (model.pack(params.detach()) if mu else None)
    correction = objective.correction
    velocity: list[torch.Tensor] | None = None
    plain = dataclasses.replace(spec, clip_grad_norm=None)
    total = torch.zeros(k, dtype=torch.float64, device=params.device)

    def losses_and_grads(tensors: Sequence[torch.Tensor], row: int, active: int
                         ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        rows, valid = _batch_rows(plans, active, row, params.device)
        return _losses_and_grads(model, tensors, x, y, rows, valid, objective.sample_weights)

    for s in range(int(steps[0])):
        active = int((steps > s).sum())
        current = [t[:active] for t in w]
        before: list[torch.Tensor | None] = (
            [None] * len(current) if velocity is None else [v[:active] for v in velocity])
        if objective.maml is None:
            losses, grads = losses_and_grads(current, s, active)
        elif objective.maml_momentum == "shared":   # `client.work.shared_meta_step`
            _, inner = losses_and_grads(current, s * per_step, active)
            if spec.clip_grad_norm:
                inner = _clip(inner, spec.clip_grad_norm)
            stepped = [sgd_step(leaf.detach(), grad, v,
                                dataclasses.replace(plain, lr=objective.maml_alpha))
                       for leaf, grad, v in zip(current, inner, before, strict=True)]
            before = [v for _, v in stepped]   # the outer step continues the inner's buffer
            losses, grads = losses_and_grads([t for t, _ in stepped], s * per_step + 1, active)
        else:
            losses, grads = _meta_gradient(objective, current, s * per_step, active,
                                           losses_and_grads)
        if spec.clip_grad_norm:
            grads = _clip(grads, spec.clip_grad_norm)
        moved = []
        for j, (leaf, grad) in enumerate(zip(current, grads, strict=True)):
            new, v = sgd_step(leaf.detach(), grad, before[j], plain,
                              prox_mu=mu, anchor=None if anchor is None else anchor[j][:active],
                              correction=None if correction is None else correction[j][:active])
            w[j][:active] = new
            moved.append(v)
        if spec.momentum:
            if velocity is None:     # the first step: every client is active
                velocity = [v.clone() for v in moved]
            else:
                for j, v in enumerate(moved):
                    velocity[j][:active] = v
        total[:active] += losses.double()
    updates = model.unpack(w) - params
    return updates, total / torch.as_tensor(steps, dtype=torch.float64, device=total.device)


def _meta_gradient(objective: GroupObjective, w: list[torch.Tensor], first_row: int,
                   active: int, losses_and_grads: Callable[
                       [Sequence[torch.Tensor], int, int],
                       tuple[torch.Tensor, list[torch.Tensor]]]
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-FedAvg's meta-gradient of each client, `client.work.meta_gradient` per tensor, on
    the step's consecutive batches D, D' (and D'' for 'hf'): the loss at w~ on D' and the
    meta-gradient."""
    alpha = objective.maml_alpha
    _, inner = losses_and_grads(w, first_row, active)
    tilde = [t - alpha * g for t, g in zip(w, inner, strict=True)]
    losses, grads = losses_and_grads(tilde, first_row + 1, active)
    if objective.maml == "fo":
        return losses, grads
    delta = objective.maml_delta
    _, plus = losses_and_grads([t + delta * g for t, g in zip(w, grads, strict=True)],
                               first_row + 2, active)
    _, minus = losses_and_grads([t - delta * g for t, g in zip(w, grads, strict=True)],
                                first_row + 2, active)
    return losses, [g - alpha * (p - m) / (2 * delta)
                    for g, p, m in zip(grads, plus, minus, strict=True)]


@torch.no_grad()
def evaluate_grouped(model: GroupedModel, stacked: torch.Tensor, x: torch.Tensor,
                     y: torch.Tensor, widest: int, budget: int = ACTIVATION_FLOATS
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(losses, accuracies) of each of M models (rows of `stacked`) on one client's (x, y).

    The models go through in groups that share each chunk of the data: the first layer reads
    a chunk once for the whole group. Groups and chunks are sized so that a call holds about
    `budget` floats of the widest activation.
    """
    m = stacked.shape[0]
    n = len(y)
    loss_sum = torch.zeros(m, dtype=torch.float64, device=stacked.device)
    correct = torch.zeros(m, dtype=torch.float64, device=stacked.device)
    rows = max(1, min(n, budget // widest)) if n else 1
    per_call = group_size(widest, rows, budget)
    for first in range(0, m if n else 0, per_call):
        params = model.pack(stacked[first:first + per_call])
        g = len(params[0])
        for start in range(0, n, rows):
            target = y[start:start + rows]
            loss, hits = chunk_scores(model.forward_shared(params, x[start:start + rows]),
                                      target)
            loss_sum[first:first + g] += loss
            correct[first:first + g] += hits
    scored = float(max(int((y != IGNORE_INDEX).sum()), 1))
    return loss_sum.cpu().numpy() / scored, correct.cpu().numpy() / scored


class GroupedExecutor(VectorisedExecutor):
    """Trains a round's plain-SGD clients as grouped models; multi-model evaluations too.

    `max_clients` caps the clients per group (default: sized by `ACTIVATION_FLOATS`).
    The vectorised executor's `run` sorts the tasks; the groups and their arithmetic are
    this class's.
    """

    label = "grouped executor"

    def __init__(self, model: FlatModel, federation: Federation, seed: int,
                 transform: ParameterTransform | None = None,
                 validation_fraction: float = 0.0, device: str | torch.device = "cpu",
                 max_clients: int | None = None, notice_level: int = logging.WARNING) -> None:
        super().__init__(model, federation, seed, transform, validation_fraction, device,
                         max_clients, notice_level)
        self.obstacle = grouped_obstacle(model.module)
        if self.obstacle:
            self._notice(self.obstacle)
            return
        self.grouped = GroupedModel(model.module)
        self.widest = widest_activation(self.grouped, tuple(federation.input_shape))

    def _task_obstacle(self, task: ClientTask) -> str | None:
        return task_obstacle(dataclasses.replace(task, objective=None))

    def _group_key(self, task: ClientTask) -> tuple[TrainSpec, tuple | None]:
        """One group per spec and objective kind, whatever the clients' step counts."""
        assert task.train is not None
        return task.train, objective_kind(task.objective)

    def _chunks(self, spec: TrainSpec, members: list[int], tasks: Sequence[ClientTask]
                ) -> list[list[int]]:
        # Longest first: within a chunk, the clients still training are a prefix.
        members = sorted(members,
                         key=lambda i: -spec.num_steps(len(self.train[tasks[i].client][1])))
        size = self.max_clients or group_size(self.widest, spec.batch_size)
        return [members[start:start + size] for start in range(0, len(members), size)]

    def _train_group(self, tasks: Sequence[ClientTask], spec: TrainSpec, round_index: int,
                     step: int) -> list[ClientResult]:
        data = [self.train[t.client] for t in tasks]
        sizes = [len(y) for _, y in data]
        steps = [spec.num_steps(n) for n in sizes]
        objective = self._group_objective(tasks, sizes)
        per_step = 1 if objective is None else objective.batches_per_step
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        plans = [np.where(p >= 0, p + o, -1) for p, o in zip(
            (batch_plan(n, spec, s * per_step, self.generator(t.client, round_index, step))
             for n, s, t in zip(sizes, steps, tasks, strict=True)), offsets, strict=True)]
        x = torch.cat([x for x, _ in data])
        y = torch.cat([y for _, y in data])
        params = torch.as_tensor(np.stack([self._params(t) for t in tasks])).to(self.device)
        updates, losses = train_grouped(self.grouped, params, x, y, plans, spec, objective)
        out = []
        for t, n, s, update, loss in zip(tasks, sizes, steps, updates.cpu().numpy(),
                                         losses.tolist(), strict=True):
            if self.transform is not None:
                update = self.transform.forward(update)
            out.append(ClientResult(t.client, t.kind, n, update=update, loss=loss,
                                    meta={**t.meta, "local_steps": s}, task_id=t.id))
        return out

    def _group_objective(self, tasks: Sequence[ClientTask], sizes: Sequence[int]
                         ) -> GroupObjective | None:
        """The group's objective terms on the device, vectors in the clients' parameter space
        (the privacy transform undone, as the client runtime does)."""
        first = tasks[0].objective
        if first is None:
            return None
        objectives = [t.objective for t in tasks]

        def packed(vectors: list[np.ndarray | None]) -> list[torch.Tensor] | None:
            if vectors[0] is None:
                return None
            stacked = np.stack([self._params_of(np.asarray(v, dtype=np.float32))
                                for v in vectors])
            return self.grouped.pack(torch.as_tensor(stacked).to(self.device))

        weights = None
        if first.sample_weights is not None:
            for o, n in zip(objectives, sizes, strict=True):
                if len(o.sample_weights) != n:
                    raise ValueError(f"{len(o.sample_weights)} sample weights for {n} training "
                                     "samples")
            weights = torch.as_tensor(np.concatenate(
                [o.sample_weights for o in objectives]).astype(np.float32)).to(self.device)
        return GroupObjective(first.prox_mu, packed([o.anchor for o in objectives]),
                              packed([o.correction for o in objectives]), weights,
                              first.maml, first.maml_alpha, first.maml_delta,
                              first.maml_momentum)

    def _evaluate_many(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor
                       ) -> tuple[np.ndarray, np.ndarray]:
        return evaluate_grouped(self.grouped, w, x, y, self.widest)

"""The vectorised executor: many clients' local SGD at once, with torch.func.

The clients of a round train the same architecture, each from its own parameters on its own
data in its own batch order. Stacking their flat parameter vectors into one (G, d) matrix and
mapping the per-client gradient over it (`vmap` of `grad_and_value` of the `functional_call`
model) turns G small training loops into one loop of G-times-larger tensor operations: the
sequential executor's arithmetic, batched. That pays on a GPU; on a CPU the small loops are
already compute-bound, and the sequential executor stays the default there.

Equality with the sequential executor (`client.work.train`), to float tolerance:

- each task draws its batch order from the same generator (`sampling.task_seed`), with the
  same `randperm` calls in the same order: one per epoch started;
- clients are grouped by (train spec, number of local steps), so every client of a group takes
  the same steps; where their sizes differ, the shorter last batches are padded and masked, so
  each client's loss is still the mean over its own batch;
- every step is `client.sgd.sgd_step`, as in `train`, row by row: per client.

Models with batch-norm statistics, dropout or recurrent layers, and tasks carrying training
extras this executor does not know (any non-default field beyond the plain TrainSpec, or a
non-scalar meta value), run on the sequential path with a logged notice, as do GRADIENT
tasks, single-model evaluations and mixture evaluations. LOSSES and EVALUATE tasks with
several models run as one vmap over the models (`client.batched.evaluate_models`); a LOSSES
task's LossSpec picks its data as `client.work.loss_data` does, from the same seeded generator.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad_and_value, vmap

from clusterfed.client.batched import evaluate_models
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.sgd import sgd_step
from clusterfed.client.work import IGNORE_INDEX, loss_data
from clusterfed.data.federation import Federation
from clusterfed.models.flat import FlatModel
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.tasks import ClientResult, ClientTask, TaskKind, TrainSpec

log = logging.getLogger("clusterfed")

# What this executor knows how to run; anything else on a task is an extra it must not drop.
PLAIN_SPEC_FIELDS = frozenset({"lr", "batch_size", "epochs", "steps", "momentum",
                               "weight_decay", "clip_grad_norm", "batches_per_step"})
PLAIN_TASK_FIELDS = frozenset({"client", "kind", "params", "train", "meta", "loss", "id",
                               "own_model", "split"})
# Bytes of working memory per vmap call: all clients' parameters, gradients, velocities and
# activations together. On CUDA, a quarter of the free memory.
CPU_BUDGET_BYTES = 512 * 2**20
# Activation floats per input float and image, forward and backward (a generous estimate for
# small CNNs; it only sizes the chunks of clients).
ACTIVATION_FACTOR = 128


# --------------------------------------------------------------------------------------------
# What can be vectorised
# --------------------------------------------------------------------------------------------


def module_obstacle(module: nn.Module) -> str | None:
    """Why `module` cannot train under vmap (batch-norm statistics, dropout, RNNs), or None."""
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"layer {name or 'model'} is batch norm ({type(m).__name__})"
        if isinstance(m, nn.RNNBase):
            return f"layer {name or 'model'} is recurrent ({type(m).__name__})"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"layer {name or 'model'} is dropout (random per client)"
    if any(True for _ in module.buffers()):
        return "the model has buffers (running statistics)"
    return None


def _is_default(value: Any, f: dataclasses.Field) -> bool:
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return False
    try:
        return bool(value is default or value == default)
    except (TypeError, ValueError):   # arrays and the like: never a default
        return False


def task_obstacle(task: ClientTask) -> str | None:
    """Why `task` must run sequentially (training extras this executor does not know), or None."""
    if task.mixture is not None:   # one mixture of k models: run_task's, model after model
        return "mixture evaluations"
    for f in dataclasses.fields(task):
        if f.name not in PLAIN_TASK_FIELDS and not _is_default(getattr(task, f.name), f):
            return f"task field {f.name!r}"
    if task.train is not None:
        for f in dataclasses.fields(task.train):
            if f.name not in PLAIN_SPEC_FIELDS and not _is_default(getattr(task.train, f.name), f):
                return f"train setting {f.name!r}"
    for key, value in task.meta.items():
        if not isinstance(value, int | float | str | bool | np.integer | np.floating):
            return f"meta entry {key!r} of type {type(value).__name__}"
    if task.kind not in (TaskKind.TRAIN, TaskKind.EVALUATE, TaskKind.LOSSES):
        return f"task kind {task.kind.value}"
    if task.loss is not None and task.loss.per_sample:
        return "per-sample losses"
    return None


# --------------------------------------------------------------------------------------------
# Batch orders and the batched SGD loop
# --------------------------------------------------------------------------------------------


def batch_plan(n: int, spec: TrainSpec, steps: int, generator: torch.Generator) -> np.ndarray:
    """(steps, batch) sample positions of one client's local SGD; -1 pads a short last batch.

    The same draws as `client.work.train`: a fresh `randperm(n)` whenever an epoch starts,
    cut into batches of min(batch_size, n), the last one partial.
    """
    batch = min(spec.batch_size, n)
    per_epoch = math.ceil(n / batch)
    epochs = math.ceil(steps / per_epoch)
    plan = np.full((epochs, per_epoch * batch), -1, dtype=np.int64)
    for e in range(epochs):
        plan[e, :n] = torch.randperm(n, generator=generator).numpy()
    return plan.reshape(epochs * per_epoch, batch)[:steps]


def stacked_plan(plans: Sequence[np.ndarray], offsets: Sequence[int]
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-client plans -> (steps, G, B) rows into the concatenated data, and a 0/1 mask.

    Padding points at the client's first sample with weight 0; the mask is None when every
    batch is full (the unmasked loss is then exactly the sequential mean).
    """
    steps = plans[0].shape[0]
    width = max(p.shape[1] for p in plans)
    index = np.empty((steps, len(plans), width), dtype=np.int64)
    mask = np.zeros((steps, len(plans), width), dtype=np.float32)
    for g, (plan, offset) in enumerate(zip(plans, offsets, strict=True)):
        padded = np.full((steps, width), -1, dtype=np.int64)
        padded[:, :plan.shape[1]] = plan
        valid = padded >= 0
        index[:, g] = np.where(valid, padded, 0) + offset
        mask[:, g] = valid
    return index, (None if mask.all() else mask)


def _mean_loss(model: FlatModel) -> Callable[..., torch.Tensor]:
    def loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(w, x), y)
    return loss


def _masked_loss(model: FlatModel) -> Callable[..., torch.Tensor]:
    def loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        per = F.cross_entropy(model(w, x), y, reduction="none")      # (B,) or (B, T)
        weight = m.reshape(-1, *[1] * (per.dim() - 1)) * (y != IGNORE_INDEX)
        return (per * weight).sum() / weight.sum()
    return loss


def train_many(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
               index: torch.Tensor, mask: torch.Tensor | None, spec: TrainSpec
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Local SGD of G clients at once: (G, d) updates (new - old) and (G,) mean batch losses.

    `params` (G, d) are the starting points; `index` (steps, G, B) rows of `x`/`y` per step
    (the clients' data concatenated); `mask` (steps, G, B) marks real samples, or None.
    """
    step_fn = vmap(grad_and_value(_mean_loss(model) if mask is None else _masked_loss(model)))
    w = params.detach().clone()
    velocity: torch.Tensor | None = None
    total = torch.zeros(len(w), dtype=torch.float64, device=w.device)
    steps = index.shape[0]
    for s in range(steps):
        rows = index[s]
        args = (w, x[rows], y[rows]) if mask is None else (w, x[rows], y[rows], mask[s])
        grad, loss = step_fn(*args)
        w, velocity = sgd_step(w, grad, velocity, spec)   # row by row: per client
        total += loss.detach().double()
    return w - params, total / steps


# --------------------------------------------------------------------------------------------
# The executor
# --------------------------------------------------------------------------------------------


class VectorisedExecutor(SequentialExecutor):
    """Runs the TRAIN tasks of a round together, grouped by local steps, with vmap.

    `max_clients` caps the clients per vmap call (default: sized to a memory budget, 512 MiB
    on CPU and a quarter of the free memory on CUDA). `notice_level`: the level of the notices
    of tasks run sequentially; a warning where the user named this executor, info where `auto`
    picked it (running some tasks sequentially is then expected).
    """

    def __init__(self, model: FlatModel, federation: Federation, seed: int,
                 transform: ParameterTransform | None = None,
                 validation_fraction: float = 0.0, device: str | torch.device = "cpu",
                 max_clients: int | None = None, notice_level: int = logging.WARNING) -> None:
        super().__init__(model, federation, seed, transform, validation_fraction, device)
        self.max_clients = max_clients
        self.notice_level = notice_level
        self.obstacle = module_obstacle(model.module)
        self._noticed: set[str] = set()
        self._uploaded: tuple[np.ndarray, torch.Tensor] | None = None
        if self.obstacle:
            self._notice(self.obstacle)

    label = "vectorised executor"

    def _notice(self, reason: str) -> None:
        if reason not in self._noticed:
            self._noticed.add(reason)
            log.log(self.notice_level, "%s: %s; running those tasks sequentially", self.label,
                    reason)

    def _task_obstacle(self, task: ClientTask) -> str | None:
        """Why `task` must run on the sequential path here, or None."""
        return task_obstacle(task)

    def _group_key(self, task: ClientTask) -> tuple[TrainSpec, Any]:
        """Tasks of one key train together: here the spec and the number of local steps."""
        assert task.train is not None
        return task.train, task.train.num_steps(len(self.train[task.client][1]))

    def _chunks(self, spec: TrainSpec, members: list[int], tasks: Sequence[ClientTask]
                ) -> list[list[int]]:
        """A group's tasks (indices) in the chunks that go through one call each."""
        size = self._clients_per_call(spec)
        return [members[start:start + size] for start in range(0, len(members), size)]

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]:
        results: list[ClientResult | None] = [None] * len(tasks)
        groups: dict[tuple[TrainSpec, Any], list[int]] = {}
        sequential: list[int] = []
        for i, task in enumerate(tasks):
            reason = self.obstacle or self._task_obstacle(task)
            if reason is not None:
                self._notice(reason)
                sequential.append(i)
            elif task.kind is TaskKind.TRAIN:
                if task.train is None:
                    raise ValueError("a train task needs a TrainSpec")
                groups.setdefault(self._group_key(task), []).append(i)
            elif np.ndim(task.params) == 2 and len(task.params) > 1:
                results[i] = self._many_models(task, round_index, step)
            else:
                sequential.append(i)   # one model: nothing to vectorise over
        self._uploaded = None   # shared only within one call: arrays may change in between
        for (spec, _), members in groups.items():
            for chunk in self._chunks(spec, members, tasks):
                trained = self._train_group([tasks[i] for i in chunk], spec, round_index, step)
                for i, result in zip(chunk, trained, strict=True):
                    results[i] = result
        if sequential:
            done = SequentialExecutor.run(self, [tasks[i] for i in sequential], round_index, step)
            for i, result in zip(sequential, done, strict=True):
                results[i] = result
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _clients_per_call(self, spec: TrainSpec) -> int:
        if self.max_clients is not None:
            return max(1, self.max_clients)
        if self.device.type == "cuda":
            budget = torch.cuda.mem_get_info(self.device)[0] // 4
        else:
            budget = CPU_BUDGET_BYTES
        sample = self.train[0][0]
        per_input = int(np.prod(sample.shape[1:])) if sample.dim() > 1 else 1
        per_client = 4 * (4 * self.model.size + ACTIVATION_FACTOR * spec.batch_size * per_input)
        return max(1, int(budget // per_client))

    def _params(self, task: ClientTask) -> np.ndarray:
        return self._params_of(task.params)

    def _params_of(self, params: np.ndarray) -> np.ndarray:
        return params if self.transform is None else self.transform.inverse(params)

    def _train_group(self, tasks: Sequence[ClientTask], spec: TrainSpec, round_index: int,
                     step: int) -> list[ClientResult]:
        data = [self.train[t.client] for t in tasks]
        sizes = [len(y) for _, y in data]
        steps = spec.num_steps(sizes[0])
        plans = [batch_plan(n, spec, steps, self.generator(t.client, round_index, step))
                 for n, t in zip(sizes, tasks, strict=True)]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        index, mask = stacked_plan(plans, offsets.tolist())
        x = torch.cat([x for x, _ in data])
        y = torch.cat([y for _, y in data])
        params = torch.as_tensor(np.stack([self._params(t) for t in tasks])).to(self.device)
        updates, losses = train_many(
            self.model, params, x, y, torch.from_numpy(index).to(self.device),
            None if mask is None else torch.from_numpy(mask).to(self.device), spec)
        updates_np = updates.cpu().numpy()
        out = []
        for t, n, update, loss in zip(tasks, sizes, updates_np, losses.tolist(), strict=True):
            if self.transform is not None:
                update = self.transform.forward(update)
            out.append(ClientResult(t.client, t.kind, n, update=update, loss=loss,
                                    meta={**t.meta, "local_steps": steps}, task_id=t.id))
        return out

    def _stack(self, params: np.ndarray) -> torch.Tensor:
        """The (k, d) models on the device, uploaded once while the tasks share one array
        (LCFL sends every client the same M warm-up models)."""
        if self._uploaded is None or self._uploaded[0] is not params:
            self._uploaded = (params, torch.as_tensor(self._params_of(params)).to(self.device))
        return self._uploaded[1]

    def _evaluate_many(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(losses, accuracies) of the (k, d) models `w` on (x, y)."""
        return evaluate_models(self.model, w, x, y)

    def _many_models(self, task: ClientTask, round_index: int, step: int) -> ClientResult:
        """LOSSES (the LossSpec's data) or EVALUATE (test data) of k models, vmapped by chunks."""
        w = self._stack(task.params)
        if task.kind is TaskKind.LOSSES:
            began = time.perf_counter()
            train = self.train[task.client]
            x, y = loss_data(train, self.test[task.client], task.loss,
                             self.generator(task.client, round_index, step))
            loss, _ = self._evaluate_many(w, x, y)
            # The client's compute time, as run_task reports it (LCFL's cost figures).
            meta = {**task.meta, "seconds": time.perf_counter() - began}
            return ClientResult(task.client, task.kind, len(train[1]), losses=loss, meta=meta,
                                task_id=task.id)
        x, y = (self.test if task.split == "test" else self.validation)[task.client]
        loss, acc = self._evaluate_many(w, x, y)
        return ClientResult(task.client, task.kind, len(y), losses=loss, accuracies=acc,
                            loss=float(loss[0]), meta=task.meta, task_id=task.id)

"""The typed records that cross the seam between server logic and clients: the only door.

Server code (algorithms, the runtimes' evaluation protocols) plans `ClientTask`s; an executor
runs them wherever the clients are and answers with `ClientResult`s. Every task carries an id,
unique within its round, given by the runtime where the tasks are planned (`numbered`); its
result carries the id back, and `match_results` pairs them by it alone. An executor may answer
fewer tasks than it was given (a node that never answered), in any order.

This module is the bottom floor: numpy only, no torch, so every algorithm imports without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from clusterfed.errors import ConfigError


class TaskKind(str, Enum):
    TRAIN = "train"        # local SGD; returns the update (new - old parameters)
    EVALUATE = "evaluate"  # loss and accuracy of one or several models on the client's test data
    LOSSES = "losses"      # loss of each of several models on the client's training data
    GRADIENT = "gradient"  # full-batch gradient on the client's training data
    SIGNATURE = "signature"  # top-p left singular vectors of the client's data (PACFL)


# The local optimisers. Their state (SGD's momentum buffer, Adam's moments) starts afresh at
# every task: a round's update then depends on the round's model alone (cfl.md A14).
OPTIMIZERS = ("sgd", "adam")
# "fresh": each task's optimiser starts anew; "kept": a client's carries over between its tasks.
OPTIMIZER_STATES = ("fresh", "kept")


@dataclass(frozen=True)
class TrainSpec:
    """Local training settings. Exactly one of `epochs` and `steps` is set."""

    lr: float
    batch_size: int
    epochs: int | None = 1
    steps: int | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None   # clip each step's gradient to this L2 norm
    optimizer: str = "sgd"                # "sgd" or "adam" (torch.optim.Adam's rule)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    optimizer_state: str = "fresh"        # "fresh" or "kept" (OPTIMIZER_STATES)
    # Batches of an epoch one local step reads, for counting steps from epochs: 2 makes an
    # epoch of Per-FedAvg's two-batch meta steps one pass over the data (its PACFL authors').
    batches_per_step: int = 1

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.steps is None):
            raise ConfigError("set exactly one of train.local_epochs and train.local_steps")
        if (self.epochs or self.steps or 0) < 1:
            raise ConfigError("train.local_epochs / train.local_steps must be at least 1")
        if self.batch_size < 1:
            raise ConfigError(f"train.batch_size must be at least 1, got {self.batch_size}")
        if not isinstance(self.batches_per_step, int) or self.batches_per_step < 1:
            raise ConfigError(f"batches_per_step must be a positive integer, "
                              f"got {self.batches_per_step!r}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ConfigError(f"train.lr must be a positive number, got {self.lr}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"train.clip_grad_norm must be positive or null, "
                              f"got {self.clip_grad_norm}")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"train.momentum must be in [0, 1), got {self.momentum}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"train.optimizer must be one of {', '.join(OPTIMIZERS)}, "
                              f"got {self.optimizer!r}")
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise ConfigError(f"train.optimizer_state must be one of "
                              f"{', '.join(OPTIMIZER_STATES)}, got {self.optimizer_state!r}")
        if self.optimizer == "adam":
            if self.momentum:
                raise ConfigError("train.momentum is SGD's; Adam's moments are "
                                  "train.adam_betas")
            if not (0.0 <= self.adam_beta1 < 1.0 and 0.0 <= self.adam_beta2 < 1.0):
                raise ConfigError(f"train.adam_betas must both be in [0, 1), got "
                                  f"[{self.adam_beta1}, {self.adam_beta2}]")
            if not self.adam_eps > 0:
                raise ConfigError(f"train.adam_eps must be positive, got {self.adam_eps}")

    def num_steps(self, num_samples: int) -> int:
        if self.steps is not None:
            return self.steps
        assert self.epochs is not None
        batches = math.ceil(num_samples / min(self.batch_size, num_samples))
        return self.epochs * max(1, batches // self.batches_per_step)

    def decayed(self, decay: float, round_index: int) -> TrainSpec:
        """The spec for round `round_index` (0-based) under a per-round lr decay factor."""
        return replace(self, lr=self.lr * decay**round_index)


MAML_VARIANTS = ("fo", "hf")
# Batches one meta step reads: D, D' (first order) and D'' (Hessian-free).
MAML_BATCHES = {"fo": 2, "hf": 3}
# "meta": momentum acts on the meta-gradient alone; "shared": one optimiser takes the inner and
# the outer step, its momentum buffer carried through both (the PACFL authors' Per-FedAvg).
MAML_MOMENTA = ("meta", "shared")


@dataclass(frozen=True)
class LocalObjective:
    """What an algorithm changes in a TRAIN task's local SGD; a task without one is plain SGD.

    prox_mu: FedProx's proximal term (mu/2)||w - w_start||^2, w_start the parameters received.
    correction: SCAFFOLD's c - c_i (flat, like the parameters), added to every step's direction
        after momentum, so that it moves the weights by exactly lr * correction per step.
    maml: Per-FedAvg's meta step, 'fo' (first order) or 'hf' (Hessian-free); each local step
        is then w <- w - lr * meta-gradient with inner step size `maml_alpha`, and the
        Hessian-vector product of 'hf' is a central difference of step `maml_delta`.
        `maml_momentum` (MAML_MOMENTA): "shared" ('fo' only) takes the inner step through
        the optimiser too, so its momentum buffer carries both steps' gradients.
    anchor: the proximal term's centre instead of w_start (flat, like the parameters; FedSoft
        pulls toward a mix of cluster centres).
    sample_weights: one non-negative weight per training sample, in the client's data order
        (the order of a per-sample LOSSES result); each batch's loss is then the mean of
        w_j * loss_j (FedEM's and FedRC's responsibility-weighted M-step).
    The grouped executor trains all of these grouped; the vectorised one (vmap) runs tasks
    with an objective one by one.
    """

    prox_mu: float = 0.0
    correction: np.ndarray | None = None
    maml: str | None = None
    maml_alpha: float = 0.01
    maml_delta: float = 1e-3
    maml_momentum: str = "meta"
    anchor: np.ndarray | None = None
    sample_weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not self.prox_mu >= 0 or not math.isfinite(self.prox_mu):
            raise ConfigError(f"the proximal term mu must be >= 0, got {self.prox_mu}")
        if self.maml is not None:
            if self.maml not in MAML_VARIANTS:
                raise ConfigError(f"maml variant must be one of {MAML_VARIANTS}, "
                                  f"got {self.maml!r}")
            if self.prox_mu or self.correction is not None or self.sample_weights is not None:
                raise ConfigError("a MAML step takes no proximal term, correction or sample "
                                  "weights")
        if not self.maml_alpha > 0 or not self.maml_delta > 0:
            raise ConfigError("maml_alpha and maml_delta must be positive")
        if self.maml_momentum not in MAML_MOMENTA:
            raise ConfigError(f"maml_momentum must be one of {MAML_MOMENTA}, "
                              f"got {self.maml_momentum!r}")
        if self.maml_momentum == "shared" and self.maml != "fo":
            raise ConfigError("a shared inner and outer step is first order's (maml: fo)")
        if self.anchor is not None and not self.prox_mu:
            raise ConfigError("a proximal anchor needs a proximal term mu > 0")
        w = self.sample_weights
        if w is not None and (np.ndim(w) != 1 or not np.all(np.isfinite(w)) or np.any(w < 0)):
            raise ConfigError("sample weights are one finite weight >= 0 per training sample")

    def map_vectors(self, fn: Callable[[np.ndarray], np.ndarray]) -> LocalObjective:
        """The same objective with its parameter-space vectors mapped by `fn` (privacy)."""
        if self.correction is None and self.anchor is None:
            return self
        return replace(self, correction=None if self.correction is None else fn(self.correction),
                       anchor=None if self.anchor is None else fn(self.anchor))


@dataclass(frozen=True)
class LossSpec:
    """Which of its data a client scores models on in a LOSSES task.

    `data`: "train" (default) or "train+test" (LCFL's authors' code). `max_samples`: a random
    subsample of that many, drawn once per task from the task's seed, the same for every model.
    `per_sample`: the loss of every training sample under every model, (models, n) in the
    client's data order, instead of each model's mean (FedEM's, FedRC's and FedSoft's E-steps,
    computed by the server: the server then sees n scalars a model where the papers' clients
    keep them); `labels`: the samples' labels too (FedRC's label marginals).
    """

    data: str = "train"
    max_samples: int | None = None
    per_sample: bool = False
    labels: bool = False

    def __post_init__(self) -> None:
        if self.data not in ("train", "train+test"):
            raise ConfigError(f"loss data must be 'train' or 'train+test', got {self.data!r}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"max_samples must be positive or null, got {self.max_samples}")
        if self.per_sample and (self.data != "train" or self.max_samples is not None):
            # Per-sample figures index the training data, as a TRAIN task's sample weights do.
            raise ConfigError("per-sample losses are of all the training data: no test data, "
                              "no subsample")
        if self.labels and not self.per_sample:
            raise ConfigError("labels come with per-sample losses only")


SPLITS = ("test", "validation")
# How a client decomposes its data for a signature (`client/signature.py`).
SVD_METHODS = ("auto", "gram", "exact", "randomized")


def _floats(values: Sequence[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(float(v) for v in values)


@dataclass(frozen=True)
class SignatureSpec:
    """How a client computes its data signature in a SIGNATURE task (PACFL).

    p: singular vectors kept (per class, or of all data); per_class: one block per class;
    center: subtract the mean first; mean, std: per-channel normalisation of the raw data
    (None: none); svd: the decomposition's method; seed: its random source (randomized SVD);
    budget: the most samples decomposed (None: all).
    """

    p: int = 3
    per_class: bool = True
    center: bool = False
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    svd: str = "auto"
    seed: int = 0
    budget: int | None = None

    def __post_init__(self) -> None:
        # Lists (from a wire or a config) become tuples: the record stays hashable.
        object.__setattr__(self, "mean", _floats(self.mean))
        object.__setattr__(self, "std", _floats(self.std))
        if self.p < 1:
            raise ConfigError(f"a signature keeps at least one vector, got p={self.p}")
        if self.budget is not None and self.budget < 1:
            raise ConfigError(f"the signature budget must be positive or null, "
                              f"got {self.budget}")


@dataclass(frozen=True)
class ClientTask:
    """One unit of work for one client.

    `params` is one flat model (1-D) or several stacked (2-D: models x parameters).
    `meta` is the planner's own opaque bookkeeping (such as a cluster id), returned untouched
    (a TRAIN result adds "local_steps", the number of SGD or meta steps it took); no runtime
    reads it. What a kind needs is a typed field:
    `train` and `objective` (TRAIN): the local SGD; None objective is plain SGD on the loss.
    `own_model` (TRAIN): False when the model trained is not the client's own (one of IFCA's
    candidate sets that it does not serve): the 'local' evaluation protocols skip it.
    `loss` (LOSSES): which data; `signature` (SIGNATURE): how; `split` (EVALUATE): which data,
    'test' or 'validation' (the held-out part of the training data).
    `mixture` (EVALUATE): one weight per model row of `params` (>= 0, summing to 1): the client
    is tested with the mixture sum_m w_m softmax(f_m(x)) of the models, not each model alone,
    and answers one loss and one accuracy (FedEM's and FedRC's prediction).
    `id`: unique within the round, given by the runtime (`numbered`); -1 until then.
    """

    client: int
    kind: TaskKind
    params: np.ndarray
    train: TrainSpec | None = None
    meta: Mapping[str, int | float | str] = field(default_factory=dict)
    objective: LocalObjective | None = None
    loss: LossSpec | None = None          # LOSSES: which data (default: all training data)
    id: int = -1
    own_model: bool = True
    signature: SignatureSpec | None = None   # SIGNATURE: how (default: SignatureSpec())
    split: str = "test"
    mixture: np.ndarray | None = None     # EVALUATE: (models,) mixture weights

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ConfigError(f"an evaluation split is one of {SPLITS}, got {self.split!r}")
        if self.mixture is not None:
            check_mixture(self, np.asarray(self.mixture))


def check_mixture(task: ClientTask, weights: np.ndarray) -> None:
    """Refuse mixture weights that are not one probability per model row of an EVALUATE task."""
    if task.kind is not TaskKind.EVALUATE or np.ndim(task.params) != 2:
        raise ConfigError("mixture weights go with an EVALUATE task of stacked models (2-D)")
    if weights.shape != (len(task.params),):
        raise ConfigError(f"{weights.shape} mixture weights for {len(task.params)} models")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) \
            or abs(float(weights.sum()) - 1.0) > 1e-5:
        raise ConfigError("mixture weights are finite, >= 0 and sum to 1")


@dataclass(frozen=True)
class ClientResult:
    client: int
    kind: TaskKind
    num_samples: int
    update: np.ndarray | None = None      # TRAIN: new - old; GRADIENT: the gradient
    loss: float = float("nan")            # TRAIN: mean training loss; EVALUATE: test loss
    losses: np.ndarray | None = None      # LOSSES/EVALUATE: one loss per model
                                          # (LOSSES per_sample: (models, n), one per sample)
    labels: np.ndarray | None = None      # LOSSES with LossSpec.labels: each sample's label
    accuracies: np.ndarray | None = None  # EVALUATE: one accuracy per model
    signature: np.ndarray | None = None   # SIGNATURE: (d, c) left singular vectors
    signature_labels: np.ndarray | None = None  # SIGNATURE: each column's class (-1: all data)
    meta: Mapping[str, int | float | str] = field(default_factory=dict)
    task_id: int = -1                     # the id of the task this answers

    def is_finite(self) -> bool:
        """False when the result carries NaN or Inf (a diverged or faulty client)."""
        if self.kind is TaskKind.TRAIN and not math.isfinite(self.loss):
            return False
        arrays = [a for a in (self.update, self.losses, self.signature) if a is not None]
        return all(bool(np.isfinite(a).all()) for a in arrays)


def numbered(tasks: Sequence[ClientTask], first: int) -> list[ClientTask]:
    """`tasks` with ids first, first + 1, ... (the runtime numbers what it plans)."""
    return [replace(task, id=first + i) for i, task in enumerate(tasks)]


def match_results(tasks: Sequence[ClientTask], results: Sequence[ClientResult]
                  ) -> list[tuple[ClientTask, ClientResult]]:
    """Each result with the task it answers, by task id alone, in the tasks' order.

    Results may come in any order and fewer than the tasks (a node that did not answer): a
    task without a result is left out. A result whose id names no task, a second result for
    one task, or one of another client or kind than its task is an error.
    """
    by_id: dict[int, int] = {}
    for i, task in enumerate(tasks):
        if task.id < 0:
            raise ValueError(f"client {task.client}'s {task.kind.value} task has no id: "
                             f"number the tasks (`numbered`) before running them")
        if task.id in by_id:
            raise ValueError(f"two tasks share the id {task.id}")
        by_id[task.id] = i
    answer: dict[int, ClientResult] = {}
    for result in results:
        i = by_id.get(result.task_id)
        if i is None:
            raise ValueError(f"the {result.kind.value} result of client {result.client} "
                             f"answers task {result.task_id}, which was not sent")
        if i in answer:
            raise ValueError(f"task {result.task_id} was answered twice")
        task = tasks[i]
        if result.client != task.client or result.kind is not task.kind:
            raise ValueError(f"task {task.id} is client {task.client}'s {task.kind.value}; "
                             f"its result is client {result.client}'s {result.kind.value}")
        answer[i] = result
    return [(tasks[i], answer[i]) for i in sorted(answer)]

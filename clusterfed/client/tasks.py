"""The typed records that cross the seam between server logic and clients."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from clusterfed.errors import ConfigError


class TaskKind(str, Enum):
    TRAIN = "train"        # local SGD; returns the update (new - old parameters)
    EVALUATE = "evaluate"  # loss and accuracy of one or several models on the client's test data
    LOSSES = "losses"      # loss of each of several models on the client's training data
    GRADIENT = "gradient"  # full-batch gradient on the client's training data


@dataclass(frozen=True)
class TrainSpec:
    """Local SGD settings. Exactly one of `epochs` and `steps` is set."""

    lr: float
    batch_size: int
    epochs: int | None = 1
    steps: int | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None   # clip each step's gradient to this L2 norm

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.steps is None):
            raise ConfigError("set exactly one of train.local_epochs and train.local_steps")
        if (self.epochs or self.steps or 0) < 1:
            raise ConfigError("train.local_epochs / train.local_steps must be at least 1")
        if self.batch_size < 1:
            raise ConfigError(f"train.batch_size must be at least 1, got {self.batch_size}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ConfigError(f"train.lr must be a positive number, got {self.lr}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"train.clip_grad_norm must be positive or null, "
                              f"got {self.clip_grad_norm}")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"train.momentum must be in [0, 1), got {self.momentum}")

    def num_steps(self, num_samples: int) -> int:
        if self.steps is not None:
            return self.steps
        assert self.epochs is not None
        return self.epochs * math.ceil(num_samples / min(self.batch_size, num_samples))

    def decayed(self, decay: float, round_index: int) -> TrainSpec:
        """The spec for round `round_index` (0-based) under a per-round lr decay factor."""
        return replace(self, lr=self.lr * decay**round_index)


@dataclass(frozen=True)
class LossSpec:
    """Which of its data a client scores models on in a LOSSES task.

    `data`: "train" (default) or "train+test" (LCFL's authors' code). `max_samples`: a random
    subsample of that many, drawn once per task from the task's seed, the same for every model.
    """

    data: str = "train"
    max_samples: int | None = None

    def __post_init__(self) -> None:
        if self.data not in ("train", "train+test"):
            raise ConfigError(f"loss data must be 'train' or 'train+test', got {self.data!r}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"max_samples must be positive or null, got {self.max_samples}")


@dataclass(frozen=True)
class ClientTask:
    """One unit of work for one client.

    `params` is one flat model (1-D) or several stacked (2-D: models x parameters).
    `meta` is the algorithm's own bookkeeping (such as a cluster id), returned untouched.
    """

    client: int
    kind: TaskKind
    params: np.ndarray
    train: TrainSpec | None = None
    meta: Mapping[str, int | float | str] = field(default_factory=dict)
    loss: LossSpec | None = None          # LOSSES: which data (default: all training data)


@dataclass(frozen=True)
class ClientResult:
    client: int
    kind: TaskKind
    num_samples: int
    update: np.ndarray | None = None      # TRAIN: new - old; GRADIENT: the gradient
    loss: float = float("nan")            # TRAIN: mean training loss; EVALUATE: test loss
    losses: np.ndarray | None = None      # LOSSES/EVALUATE: one loss per model
    accuracies: np.ndarray | None = None  # EVALUATE: one accuracy per model
    meta: Mapping[str, int | float | str] = field(default_factory=dict)

    def is_finite(self) -> bool:
        """False when the result carries NaN or Inf (a diverged or faulty client)."""
        if self.kind is TaskKind.TRAIN and not math.isfinite(self.loss):
            return False
        arrays = [a for a in (self.update, self.losses) if a is not None]
        return all(bool(np.isfinite(a).all()) for a in arrays)

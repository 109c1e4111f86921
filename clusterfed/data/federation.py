"""A federation: every client's data and the true clusters. What the runtimes import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ClientData:
    """One client's materialised data: float32 inputs in [0, 1], int64 labels."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    @property
    def num_train(self) -> int:
        return len(self.train_y)


@dataclass(frozen=True)
class Federation:
    """Clients and their true clusters (what clustered methods are scored against).

    `groupings` are further true groupings of the clients by name, e.g. which corruption or
    whether noisy labels: a run also scores its clustering against each (`clustering.groupings`
    in its summary), but the clusters stay the truth.
    """

    clients: list[ClientData]
    true_clusters: np.ndarray
    n_classes: int
    input_shape: tuple[int, ...]
    info: dict[str, Any] = field(default_factory=dict)
    groupings: dict[str, np.ndarray] = field(default_factory=dict)
    # scenario.drift: from a round on, some clients hold other data (and another true cluster).
    drift: Drift | None = None

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def at_round(self, round_number: int) -> Federation:
        """The federation of round `round_number` (1-based; 0: before the first round)."""
        if self.drift is None or round_number < self.drift.round:
            return self
        return self.drift.after

    def train_sizes(self) -> np.ndarray:
        return np.array([c.num_train for c in self.clients], dtype=np.int64)


@dataclass(frozen=True)
class Drift:
    """From round `round` (1-based) on, the federation is `after`: `clients` hold new data of
    their new true cluster there; every other client's data are the same arrays."""

    round: int
    clients: tuple[int, ...]
    after: Federation

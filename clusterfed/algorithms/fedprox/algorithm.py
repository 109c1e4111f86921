"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

Each sampled client approximately minimises h_k(w) = F_k(w) + (mu/2)||w - w^t||^2 by local SGD
from the global model w^t (Algorithm 2); the server averages as FedAvg does. With mu = 0 it is
FedAvg, step for step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clusterfed.algorithms.base import ALGORITHMS, RoundContext
from clusterfed.algorithms.fedavg.algorithm import FedAvg, FedAvgState
from clusterfed.tasks import ClientTask, LocalObjective, TaskKind


@ALGORITHMS.register("fedprox")
@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg's state, aggregation and clusters; only the clients' local objective differs."""

    mu: float = 0.01             # the proximal weight; PACFL's Table 12 tries {0.01, 0.001}

    def __post_init__(self) -> None:
        if not self.mu >= 0 or not math.isfinite(self.mu):
            raise ValueError(f"mu must be a number >= 0, got {self.mu}")
        super().__post_init__()

    def plan(self, state: FedAvgState, ctx: RoundContext) -> list[ClientTask]:
        # The proximal anchor is the model each client receives: the global w^t.
        objective = LocalObjective(prox_mu=self.mu) if self.mu else None
        return [ClientTask(int(c), TaskKind.TRAIN, state.model, ctx.train, objective=objective)
                for c in ctx.sampled]

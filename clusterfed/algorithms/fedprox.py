"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

Each sampled client approximately minimises h_k(w) = F_k(w) + (mu/2)||w - w^t||^2 by local SGD
from the global model w^t (Algorithm 2); the server averages as FedAvg does. With mu = 0 it is
FedAvg, step for step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.aggregate import aggregation_weights
from clusterfed.algorithms.base import ALGORITHMS, ClusterView, RoundContext, Setup, Update
from clusterfed.algorithms.fedavg import FedAvgState, apply_updates
from clusterfed.client.tasks import ClientResult, ClientTask, LocalObjective, TaskKind


@ALGORITHMS.register("fedprox")
@dataclass(frozen=True)
class FedProx:
    mu: float = 0.01             # the proximal weight; PACFL's Table 12 tries {0.01, 0.001}
    weighting: str = "samples"   # or "uniform"
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        if not self.mu >= 0 or not math.isfinite(self.mu):
            raise ValueError(f"mu must be a number >= 0, got {self.mu}")
        aggregation_weights(np.ones(1), self.weighting)

    def init(self, setup: Setup) -> FedAvgState:
        return FedAvgState(setup.initial_params.copy(), setup.num_clients)

    def plan(self, state: FedAvgState, ctx: RoundContext) -> list[ClientTask]:
        # The proximal anchor is the model each client receives: the global w^t.
        objective = LocalObjective(prox_mu=self.mu) if self.mu else None
        return [ClientTask(int(c), TaskKind.TRAIN, state.model, ctx.train, objective=objective)
                for c in ctx.sampled]

    def update(self, state: FedAvgState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        return Update(replace(state, model=apply_updates(state.model, results, self.weighting,
                                                         self.server_lr)))

    def clusters(self, state: FedAvgState) -> ClusterView:
        return ClusterView(state.model[None], np.zeros(state.num_clients, dtype=np.int64))

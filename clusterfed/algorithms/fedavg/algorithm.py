"""FedAvg (McMahan et al., 2017): one global model, the average of the sampled clients' updates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.aggregate import Weighting, aggregation_weights, weighted_mean
from clusterfed.algorithms.base import ALGORITHMS, ClusterView, RoundContext, Setup, Update
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind


@serialisable
@dataclass(frozen=True)
class FedAvgState:
    model: np.ndarray
    num_clients: int


def apply_updates(model: np.ndarray, results: Sequence[ClientResult], weighting: Weighting,
                  server_lr: float = 1.0) -> np.ndarray:
    """w <- w + eta * sum_k (n_k / n) Delta_k over the results' updates."""
    if not results:
        return model
    weights = aggregation_weights(np.array([r.num_samples for r in results]), weighting)
    mean = weighted_mean([r.update for r in results], weights)
    return (model + server_lr * mean).astype(np.float32)


@ALGORITHMS.register("fedavg")
@dataclass(frozen=True)
class FedAvg:
    weighting: Weighting = "samples"  # or "uniform"
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        aggregation_weights(np.ones(1), self.weighting)  # validates the name

    def init(self, setup: Setup) -> FedAvgState:
        return FedAvgState(setup.initial_params.copy(), setup.num_clients)

    def plan(self, state: FedAvgState, ctx: RoundContext) -> list[ClientTask]:
        return [ClientTask(int(c), TaskKind.TRAIN, state.model, ctx.train) for c in ctx.sampled]

    def update(self, state: FedAvgState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        model = apply_updates(state.model, results, self.weighting, self.server_lr)
        return Update(replace(state, model=model))

    def clusters(self, state: FedAvgState) -> ClusterView:
        return ClusterView(state.model[None], np.zeros(state.num_clients, dtype=np.int64))

"""Local (SOLO): every client trains its own model alone; no communication of updates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.base import ALGORITHMS, ClusterView, RoundContext, Setup, Update
from clusterfed.client.tasks import ClientResult, ClientTask, TaskKind
from clusterfed.state import serialisable


@serialisable
@dataclass(frozen=True)
class LocalState:
    models: np.ndarray  # (num_clients, d): row c is client c's own model


@ALGORITHMS.register("local")
@dataclass(frozen=True)
class Local:
    def init(self, setup: Setup) -> LocalState:
        return LocalState(np.tile(setup.initial_params, (setup.num_clients, 1)))

    def plan(self, state: LocalState, ctx: RoundContext) -> list[ClientTask]:
        return [ClientTask(int(c), TaskKind.TRAIN, state.models[c], ctx.train) for c in ctx.sampled]

    def update(self, state: LocalState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        models = state.models.copy()
        for r in results:
            models[r.client] += r.update
        return Update(replace(state, models=models))

    def clusters(self, state: LocalState) -> ClusterView:
        return ClusterView(state.models, np.arange(len(state.models)))

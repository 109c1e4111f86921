"""Local (SOLO): every client trains its own model alone; no communication of updates.

By default every client trains every round, as the PACFL authors' `main_local.py` does: a
client alone has no reason to wait for the server's sampling. `clients: sampled` trains only
the round's sampled clients (a client then trains about participation x rounds times).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from clusterfed.algorithms.base import (
    ALGORITHMS,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    check_choices,
)
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind


@serialisable
@dataclass(frozen=True)
class LocalState:
    models: np.ndarray  # (num_clients, d): row c is client c's own model


@ALGORITHMS.register("local")
@dataclass(frozen=True)
class Local:
    clients: str = "all"    # who trains each round: "all" or "sampled"
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {"clients": ("all", "sampled")}

    def __post_init__(self) -> None:
        check_choices(self, self._kinds)

    def init(self, setup: Setup) -> LocalState:
        return LocalState(np.tile(setup.initial_params, (setup.num_clients, 1)))

    def plan(self, state: LocalState, ctx: RoundContext) -> list[ClientTask]:
        who = range(len(state.models)) if self.clients == "all" else ctx.sampled
        return [ClientTask(int(c), TaskKind.TRAIN, state.models[c], ctx.train) for c in who]

    def update(self, state: LocalState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        models = state.models.copy()
        for r in results:
            models[r.client] += r.update
        return Update(replace(state, models=models))

    def clusters(self, state: LocalState) -> ClusterView:
        return ClusterView(state.models, np.arange(len(state.models)))

"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", 2020), as PACFL configures it (Table 13: the last 2 layers global,
the rest local; no FedAvg pre-training).

Every client keeps its own local layers (the representation) and shares the global layers (the
head). A sampled client trains all of its model, its local layers and the current head, from
its own local layers and the server's head; it keeps the local layers and sends the head, and
the server averages the heads. A client is served, and tested, with its local layers and the
current head. A client that has not trained yet has the initial local layers.

A layer is a module with a weight of two or more dimensions (a convolution, a linear map, an
embedding, an LSTM); the parameters of norm layers join the layer before them, so ResNet-9 has
9 layers and LeNet-5 has 5, as PACFL counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.aggregate import Weighting, aggregation_weights, weighted_mean
from clusterfed.algorithms.base import ALGORITHMS, ClusterView, RoundContext, Setup, Update
from clusterfed.errors import ConfigError
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

Layout = Sequence[tuple[str, tuple[int, ...]]]


@serialisable
@dataclass(frozen=True)
class LGState:
    shared: np.ndarray   # (d,) bool: True on the global layers' coordinates
    head: np.ndarray     # the global layers' parameters, shared[...] coordinates in order
    local: np.ndarray    # (num_clients, d - head size): each client's local layers


def layer_index(layout: Layout) -> list[int]:
    """The layer of each parameter tensor (see the module docstring for what a layer is)."""
    layers: list[int] = []
    module, current = None, -1
    for name, shape in layout:
        owner = name.rpartition(".")[0]
        if current < 0 or (owner != module and len(shape) >= 2):
            current, module = current + 1, owner
        layers.append(current)
    return layers


def shared_mask(layout: Layout, global_layers: int) -> np.ndarray:
    """(d,) bool: True on the coordinates of the last `global_layers` layers."""
    layers = layer_index(layout)
    total = max(layers) + 1
    if not 1 <= global_layers <= total:
        raise ConfigError(f"lg_fedavg: global_layers must be in [1, {total}] for this model "
                          f"({total} layers), got {global_layers}")
    sizes = [int(np.prod(shape)) for _, shape in layout]
    return np.repeat(np.array(layers) >= total - global_layers, sizes)


def combine(shared: np.ndarray, head: np.ndarray, local: np.ndarray) -> np.ndarray:
    """One full flat model from the global head and one client's local layers."""
    out = np.empty(len(shared), dtype=np.float32)
    out[shared] = head
    out[~shared] = local
    return out


@ALGORITHMS.register("lg_fedavg")
@dataclass(frozen=True)
class LGFedAvg:
    global_layers: int = 2       # the top layers shared (PACFL: 2 of LeNet-5's 5, ResNet-9's 9)
    weighting: Weighting = "samples"  # head average weighted by samples, or "uniform"

    def __post_init__(self) -> None:
        if self.global_layers < 1:
            raise ValueError(f"global_layers must be at least 1, got {self.global_layers}")
        aggregation_weights(np.ones(1), self.weighting)

    def init(self, setup: Setup) -> LGState:
        if setup.layout is None:
            raise ConfigError("lg_fedavg needs the model's layer layout, which the runtime "
                              "hides under run.privacy; run it without the privacy transform")
        shared = shared_mask(setup.layout, self.global_layers)
        w = setup.initial_params
        return LGState(shared, w[shared].copy(), np.tile(w[~shared], (setup.num_clients, 1)))

    def plan(self, state: LGState, ctx: RoundContext) -> list[ClientTask]:
        return [ClientTask(int(c), TaskKind.TRAIN, combine(state.shared, state.head,
                                                           state.local[c]), ctx.train)
                for c in ctx.sampled]

    def update(self, state: LGState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        if not results:
            return Update(state)
        local = state.local.copy()
        heads = []
        for r in results:
            trained = combine(state.shared, state.head, state.local[r.client]) + r.update
            local[r.client] = trained[~state.shared]   # kept on the client, never averaged
            heads.append(trained[state.shared])
        weights = aggregation_weights(np.array([r.num_samples for r in results]), self.weighting)
        return Update(replace(state, head=weighted_mean(heads, weights), local=local))

    def clusters(self, state: LGState) -> ClusterView:
        models = np.empty((len(state.local), len(state.shared)), dtype=np.float32)
        models[:, state.shared] = state.head
        models[:, ~state.shared] = state.local
        return ClusterView(models, np.arange(len(state.local)))

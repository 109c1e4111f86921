"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020), Algorithm 1.

Server control variate c and one client control variate c_i per client (zero until the client
first trains). Client i starts from x and takes K local steps y <- y - lr (g_i(y) - c_i + c), then
    Option I:  c_i+ = g_i(x), the client's full-batch gradient at the server model, or
    Option II: c_i+ = c_i - c + (x - y_i) / (K lr)   (the default, as commonly used);
the server steps x <- x + lr_g mean_i(y_i - x) and c <- c + (1/N) sum_i (c_i+ - c_i).

In this simulation the server keeps the c_i on the clients' behalf (only for clients that have
trained: a dict, about one model's size per client seen) and sends c - c_i; in a deployment a
client keeps its own c_i and receives x and c. Per round a client receives two vectors and sends
two (y_i - x and c_i+ - c_i). With momentum the correction is added after the momentum buffer,
so each step moves the weights by exactly lr (c - c_i), the units Option II measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.aggregate import Weighting, aggregation_weights, weighted_mean
from clusterfed.algorithms.base import ALGORITHMS, ClusterView, RoundContext, Setup, Update
from clusterfed.errors import ConfigError
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, LocalObjective, TaskKind


@serialisable
@dataclass(frozen=True)
class ScaffoldState:
    model: np.ndarray                        # x
    control: np.ndarray                      # c
    client_controls: dict[int, np.ndarray]   # c_i of the clients that have trained
    num_clients: int


def option_two_control(client_control: np.ndarray, control: np.ndarray, update: np.ndarray,
                       steps: int, lr: float) -> np.ndarray:
    """c_i+ = c_i - c + (x - y_i) / (K lr), with update = y_i - x (Algorithm 1, Option II)."""
    return (client_control.astype(np.float64) - control
            - update.astype(np.float64) / (steps * lr)).astype(np.float32)


def server_step(model: np.ndarray, control: np.ndarray, updates: np.ndarray,
                control_deltas: np.ndarray, weights: np.ndarray, num_clients: int,
                server_lr: float) -> tuple[np.ndarray, np.ndarray]:
    """x + lr_g weighted-mean(Delta y), c + (1/N) sum(Delta c) (Algorithm 1, server side)."""
    new_model = model + server_lr * weighted_mean(updates, weights)
    new_control = control + control_deltas.astype(np.float64).sum(0) / num_clients
    return new_model.astype(np.float32), new_control.astype(np.float32)


@ALGORITHMS.register("scaffold")
@dataclass(frozen=True)
class Scaffold:
    option: str = "II"           # c_i+ rule: "II" (from the update) or "I" (gradient at x)
    server_lr: float = 1.0       # the paper's global step size eta_g
    weighting: Weighting = "uniform"  # the paper's mean over sampled clients, or "samples"

    def __post_init__(self) -> None:
        if self.option not in ("I", "II"):
            raise ValueError(f"option must be 'I' or 'II', got {self.option!r}")
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be positive, got {self.server_lr}")
        aggregation_weights(np.ones(1), self.weighting)

    def init(self, setup: Setup) -> ScaffoldState:
        d = len(setup.initial_params)
        return ScaffoldState(setup.initial_params.copy(), np.zeros(d, np.float32), {},
                             setup.num_clients)

    def client_control(self, state: ScaffoldState, client: int) -> np.ndarray:
        return state.client_controls.get(client, np.zeros_like(state.control))

    def plan(self, state: ScaffoldState, ctx: RoundContext) -> list[ClientTask]:
        if ctx.train.optimizer != "sgd":   # the control variates correct SGD steps (Alg. 1)
            raise ConfigError(f"scaffold corrects local SGD steps; train.optimizer is "
                              f"{ctx.train.optimizer!r}")
        tasks = []
        for c in (int(c) for c in ctx.sampled):
            correction = state.control - self.client_control(state, c)
            tasks.append(ClientTask(c, TaskKind.TRAIN, state.model, ctx.train,
                                    objective=LocalObjective(correction=correction)))
            if self.option == "I":
                tasks.append(ClientTask(c, TaskKind.GRADIENT, state.model))
        return tasks

    def update(self, state: ScaffoldState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        trained = [r for r in results if r.kind is TaskKind.TRAIN]
        gradients = {r.client: r.update for r in results if r.kind is TaskKind.GRADIENT}
        if self.option == "I":   # a client whose gradient was rejected keeps out this round
            trained = [r for r in trained if r.client in gradients]
        if not trained:
            return Update(state)
        controls = dict(state.client_controls)
        deltas = []
        for r in trained:
            old = self.client_control(state, r.client)
            if self.option == "I":
                new = gradients[r.client].astype(np.float32)
            else:
                steps = int(r.meta.get("local_steps", ctx.train.num_steps(r.num_samples)))
                new = option_two_control(old, state.control, r.update, steps, ctx.train.lr)
            deltas.append(new - old)
            controls[r.client] = new
        weights = aggregation_weights(np.array([r.num_samples for r in trained]), self.weighting)
        model, control = server_step(state.model, state.control,
                                     np.stack([r.update for r in trained]), np.stack(deltas),
                                     weights, state.num_clients, self.server_lr)
        return Update(replace(state, model=model, control=control,
                              client_controls=dict(sorted(controls.items()))),
                      metrics={"control_norm": float(np.linalg.norm(control))})

    def clusters(self, state: ScaffoldState) -> ClusterView:
        return ClusterView(state.model[None], np.zeros(state.num_clients, dtype=np.int64))

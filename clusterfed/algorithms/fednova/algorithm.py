"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020).

Clients that take more local steps move further; plain averaging then drifts toward their
objectives. FedNova normalises: client i reports its number of local steps tau_i, the server
turns its update Delta_i = -lr a_i^T G_i into the normalised d_i = Delta_i / ||a_i||_1 and steps
x <- x + tau_eff sum_i p_i d_i with tau_eff = sum_i p_i ||a_i||_1 (Section 4).
For plain SGD a_i is all ones (||a_i||_1 = tau_i); for heavy-ball momentum rho,
||a_i||_1 = sum_{k=1..tau_i} (1 - rho^k) / (1 - rho). With equal tau_i it is FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.aggregate import aggregation_weights
from clusterfed.algorithms.base import ALGORITHMS, RoundContext, Update
from clusterfed.algorithms.fedavg.algorithm import FedAvg, FedAvgState
from clusterfed.errors import ConfigError
from clusterfed.tasks import ClientResult, ClientTask


def local_step_norms(steps: np.ndarray, momentum: float) -> np.ndarray:
    """||a_i||_1 of tau_i local SGD steps with heavy-ball momentum (tau_i when it is 0)."""
    tau = np.asarray(steps, dtype=np.float64)
    if momentum == 0:
        return tau
    rho = float(momentum)
    # sum_{k=1..tau} (1 - rho^k) / (1 - rho), in closed form.
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


def normalised_average(updates: np.ndarray, norms: np.ndarray, weights: np.ndarray
                       ) -> tuple[np.ndarray, float]:
    """(tau_eff sum_i p_i Delta_i / ||a_i||_1, tau_eff) with p the normalised weights."""
    p = np.asarray(weights, dtype=np.float64)
    p = p / p.sum()
    tau_eff = float(p @ norms)
    direction = (p / norms) @ updates.astype(np.float64)
    return (tau_eff * direction).astype(np.float32), tau_eff


@ALGORITHMS.register("fednova")
@dataclass(frozen=True)
class FedNova(FedAvg):
    """FedAvg's options (p_i from `weighting`), state, plan and clusters; a normalised update."""

    def plan(self, state: FedAvgState, ctx: RoundContext) -> list[ClientTask]:
        if ctx.train.optimizer != "sgd":   # a_i is derived for (momentum) SGD steps only
            raise ConfigError(f"fednova normalises local SGD steps; train.optimizer is "
                              f"{ctx.train.optimizer!r}")
        return super().plan(state, ctx)

    def update(self, state: FedAvgState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        if not results:
            return Update(state)
        # tau_i as the client reports it; a runtime that does not report it ran the spec's.
        steps = np.array([r.meta.get("local_steps", ctx.train.num_steps(r.num_samples))
                          for r in results], dtype=np.float64)
        norms = local_step_norms(steps, ctx.train.momentum)
        weights = aggregation_weights(np.array([r.num_samples for r in results]),
                                      self.weighting)
        step, tau_eff = normalised_average(np.stack([r.update for r in results]), norms, weights)
        model = (state.model + self.server_lr * step).astype(np.float32)
        return Update(replace(state, model=model), metrics={"tau_eff": tau_eff})

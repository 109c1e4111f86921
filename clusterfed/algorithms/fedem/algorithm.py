"""FedEM: Federated Multi-Task Learning under a Mixture of Distributions (Marfoq, Neglia,
Bellet, Kameni, Vidal, NeurIPS 2021).

Each client t's distribution is a mixture of M shared components: p_t(x, y) = sum_m pi_t,m
p_m(x, y), with p_m(y | x) given by the component model theta_m. Each round k, centralised
FedEM (Algorithm 1), every sampled client t (the steps are lettered here: the paper's own
line and equation numbers could not be checked when this was written):

  E-step  (line a) q_t(z_i = m) = pi_t,m exp(-l(h_theta_m(x_i), y_i)) / sum_m' (same, m')
                   for each of its training samples i;
  M-step  (line b) pi_t,m = (1 / n_t) sum_i q_t(z_i = m);
  local   (line c) for each m, theta_m,t = LocalSolver(theta_m, weights q_t(z_i = m)): local
                   SGD on (1 / n_t) sum_i q_t(z_i = m) l(h_theta_m(x_i), y_i);
  server  (line d) theta_m = sum_t (n_t / n) theta_m,t over the round's clients.

The issue (#19) says the server averages each component with the clients' responsibilities;
Algorithm 1 (and the authors' code) weights every component by n_t / n alone. The paper's
rule is the default (`aggregation: samples`); `aggregation: responsibilities` weights
component m by n_t pi_t,m.

Deviations, and why:
- The E-step and M-step run on the server: the client reports each training sample's loss
  under each component (a per-sample LOSSES task, step 0) and the server sends back the
  responsibilities as the sample weights of the component TRAIN tasks (step 1). The
  mathematics are the same; the server sees n_t losses per component that the paper's client
  keeps.
- Prediction. The paper's client predicts with its mixture sum_m pi_t,m p(y | x, theta_m);
  `clusters()` serves each client its most probable component, argmax_m pi_t,m, which the
  evaluation protocols 'cluster' and 'local' test. The view carries pi as its mixture
  weights: `eval.protocol: mixture` tests the paper's prediction (each client computes its
  mixture on its own test data). The weights are also in each round's `fedem_weights` event.
- M from the data (`k_choice: {k: null}`, the default; the paper fixes M = 3): one model is
  trained by FedAvg for `select_round` rounds, then every client trains it once and the
  updates are clustered by the rule IFCA's `k: null` uses (`selection.clusters_of_updates`,
  FL+HC's cut, by default `silhouette_gap_width` since 2026-12-08, before it the silhouette
  rule); each cluster's model is a component, and each client's initial
  pi puts `prior_confidence` on its cluster and shares the rest evenly (`initial_pi:
  clusters`): the selection has already seen which component fits the client, and the
  E-step may still move it. `initial_pi: uniform` starts every client at 1/M (the paper).
  With M given, the components start from M independent draws of the model's init scheme
  (as the authors' code builds M learners) and pi at 1/M.

What it can see: any shift that changes a component's losses on a client's samples: concept,
feature and label shift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from clusterfed.algorithms.aggregate import (
    Weighting,
    aggregation_weights,
    cluster_fedavg,
    results_fedavg,
)
from clusterfed.algorithms.base import (
    ALGORITHMS,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    check_choices,
)
from clusterfed.algorithms.choices import NEVER, initial_models
from clusterfed.algorithms.options import UPDATES_K_CHOICE, ClusterCount
from clusterfed.algorithms.selection import clusters_of_updates
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, LocalObjective, LossSpec, TaskKind


@serialisable
@dataclass(frozen=True)
class MixtureState:
    models: np.ndarray        # (M, d) the components theta_m
    pi: np.ndarray            # (n, M) each client's mixture weights pi_t
    seen_round: np.ndarray    # (n,) the round of each client's latest E-step, -1 never
    # The round's responsibilities, for step 1: rows of the clients in `round_clients`, each
    # client's n_t samples in its data order, stacked: (sum_t n_t, M).
    q: np.ndarray
    round_clients: np.ndarray  # (m,) the clients whose responsibilities `q` holds
    round_sizes: np.ndarray    # (m,) n_t of each
    # FedRC: each client's responsibility-weighted label counts sum_j gamma_jk 1{y_j = y},
    # (n, M, C); C = 0 for FedEM.
    label_counts: np.ndarray
    selected: bool = True      # components from the data: whether M has been chosen yet


# The mathematics, as pure functions --------------------------------------------------------


def responsibilities(log_prior: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """E-step (line a): q(z_i = m) = pi_m exp(-l_mi) / sum_m' pi_m' exp(-l_m'i), (n, M).

    `log_prior` (M,) is log pi (-inf for a weight of 0), `losses` (M, n) each sample's loss
    under each component; computed by log-sum-exp, so large losses do not underflow to 0 / 0.
    """
    scores = np.asarray(log_prior, np.float64)[:, None] - np.asarray(losses, np.float64)
    top = scores.max(axis=0, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(scores - top)
    return (weights / weights.sum(axis=0, keepdims=True)).T


def mixture_weights(q: np.ndarray) -> np.ndarray:
    """M-step (line b): pi_m = (1 / n) sum_i q(z_i = m), over the (n, M) responsibilities."""
    return np.asarray(q, np.float64).mean(axis=0)


def log_weights(pi: np.ndarray) -> np.ndarray:
    """log pi, with log 0 = -inf (a component a client never draws from stays at 0)."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(pi, np.float64))


def confident_prior(labels: np.ndarray, m: int, confidence: float) -> np.ndarray:
    """(n, M): `confidence` on each client's cluster, the rest shared evenly (1/M if M = 1)."""
    if m == 1:
        return np.ones((len(labels), 1))
    out = np.full((len(labels), m), (1.0 - confidence) / (m - 1))
    out[np.arange(len(labels)), labels] = confidence
    return out


def component_weights(num_samples: np.ndarray, pi: np.ndarray, weighting: Weighting,
                      aggregation: str) -> np.ndarray:
    """(m, M): each client's weight in each component's average: w_t (its n_t by default,
    line d), times pi_t,m for `aggregation: responsibilities`."""
    base = aggregation_weights(num_samples, weighting)[:, None]
    return base * np.asarray(pi, np.float64) if aggregation == "responsibilities" else \
        np.repeat(base, pi.shape[1], axis=1)


# The algorithm ------------------------------------------------------------------------------


@ALGORITHMS.register("fedem")
@dataclass(frozen=True)
class FedEM:
    # M = k_choice.k (the old key `components`; the paper's default is 3); null: from the
    # data, by the selector on the updates of round select_round's one model (IFCA's and
    # FL+HC's `silhouette_gap_width`: the same updates, cut the same way)
    k_choice: ClusterCount = UPDATES_K_CHOICE
    select_round: int = 10              # M null: one model until this round (0-based)
    initial_pi: str = "clusters"        # M from the data: "clusters" or "uniform" (1/M)
    prior_confidence: float = 0.9       # "clusters": pi_t on the client's own cluster
    weighting: Weighting = "samples"    # w_t: n_t (Algorithm 1, line d) or "uniform"
    aggregation: str = "samples"        # "samples": w_t; "responsibilities": w_t pi_t,m
    sees: ClassVar[frozenset[str]] = frozenset({"concept", "feature", "label"})
    toy_mixture_options: ClassVar[dict[str, Any] | None] = {"rounds": 8, "select_round": 3}
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {
        "initial_pi": ("clusters", "uniform"), "aggregation": ("samples", "responsibilities")}
    _name: ClassVar[str] = "fedem"
    k_aliases: ClassVar[dict[str, str]] = {"components": "k"}   # configs before `k_choice`

    def __post_init__(self) -> None:
        check_choices(self, self._kinds)
        aggregation_weights(np.ones(1), self.weighting)
        object.__setattr__(self, "k_choice", ClusterCount.of(self.k_choice, UPDATES_K_CHOICE))
        if not isinstance(self.select_round, int) or self.select_round < 0:
            raise ValueError(f"select_round must be an integer >= 0, got {self.select_round!r}")
        if not 0.0 < self.prior_confidence <= 1.0:
            raise ValueError(f"prior_confidence must be in (0, 1], got {self.prior_confidence!r}")

    # The lifecycle

    def init(self, setup: Setup) -> MixtureState:
        n, m = setup.num_clients, self.k_choice.k or 1
        models = (setup.initial_params[None].astype(np.float32) if self.k_choice.k is None
                  else initial_models(setup, m, "random", 0.0))
        return MixtureState(models=models, pi=np.full((n, m), 1.0 / m),
                            seen_round=np.full(n, NEVER, dtype=np.int64),
                            q=np.zeros((0, m)), round_clients=np.zeros(0, dtype=np.int64),
                            round_sizes=np.zeros(0, dtype=np.int64),
                            label_counts=np.zeros((n, m, 0)),
                            selected=self.k_choice.k is not None)

    def plan(self, state: MixtureState, ctx: RoundContext) -> list[ClientTask]:
        if not state.selected:   # FedAvg of one model; every client at the selection round
            clients = ctx.sampled if ctx.round < self.select_round else \
                np.arange(len(state.pi))
            return [ClientTask(int(c), TaskKind.TRAIN, state.models[0], ctx.train,
                               {"component": 0}) for c in clients]
        if ctx.step == 0:   # E-step material: every sample's loss under every component
            spec = LossSpec(per_sample=True, labels=self._needs_labels)
            return [ClientTask(int(c), TaskKind.LOSSES, state.models, loss=spec)
                    for c in ctx.sampled]
        tasks = []   # line c: each component trained on the samples weighted by q(z_i = m)
        served = np.argmax(state.pi, axis=1)
        for c, rows in zip(state.round_clients.tolist(), _split(state), strict=True):
            for m in range(len(state.models)):
                tasks.append(ClientTask(
                    c, TaskKind.TRAIN, state.models[m], ctx.train, {"component": m},
                    objective=LocalObjective(sample_weights=rows[:, m].astype(np.float32)),
                    own_model=m == served[c]))
        return tasks

    def update(self, state: MixtureState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        if not state.selected and ctx.round < self.select_round:
            # FedAvg of the one model before M is chosen
            one = np.zeros(len(results), dtype=np.int64)
            return Update(replace(state, models=results_fedavg(state.models, results, one,
                                                               self.weighting)))
        if not state.selected:
            return self._select(state, results)
        if ctx.step == 0:
            return self._expect(state, ctx, results)
        return self._maximise(state, results)

    def clusters(self, state: MixtureState) -> ClusterView:
        # The mixture weights too: the evaluation protocol 'mixture' tests the paper's
        # prediction sum_m pi_t,m p(y | x, theta_m).
        return ClusterView(state.models, np.argmax(state.pi, axis=1).astype(np.int64),
                           weights=state.pi.copy())

    # The steps

    _needs_labels: ClassVar[bool] = False

    def _posterior(self, state: MixtureState, client: int, result: ClientResult
                   ) -> np.ndarray:
        """The (n_t, M) responsibilities of one client's samples (FedEM: line a)."""
        return responsibilities(log_weights(state.pi[client]), result.losses)

    def _with_counts(self, state: MixtureState, results: Sequence[ClientResult]
                     ) -> MixtureState:
        """The state ready for this round's E-step (FedRC sizes its label counts here)."""
        return state

    def _counted(self, state: MixtureState, clients: np.ndarray, qs: list[np.ndarray],
                 results: Sequence[ClientResult]) -> MixtureState:
        """The state after this round's E-step (FedRC records its label counts here)."""
        return state

    def _expect(self, state: MixtureState, ctx: RoundContext,
                results: Sequence[ClientResult]) -> Update:
        """Step 0: the E-step (line a) and M-step (line b) of every reporting client."""
        results = sorted(results, key=lambda x: x.client)
        state = self._with_counts(state, results)
        clients = np.array([x.client for x in results], dtype=np.int64)
        qs = [self._posterior(state, int(x.client), x) for x in results]
        pi = state.pi.copy()
        for c, q in zip(clients.tolist(), qs, strict=True):
            pi[c] = mixture_weights(q)
        seen = state.seen_round.copy()
        seen[clients] = ctx.round
        m = len(state.models)
        state = replace(state, pi=pi, seen_round=seen, round_clients=clients,
                        q=np.concatenate(qs) if qs else np.zeros((0, m)),
                        round_sizes=np.array([len(q) for q in qs], dtype=np.int64))
        state = self._counted(state, clients, qs, results)
        served = np.argmax(pi, axis=1)
        event = {"type": f"{self._name}_weights", "clients": clients.tolist(),
                 "pi": np.round(pi[clients], 6).tolist()}
        metrics = {self._name: {
            "components": m, "cluster_sizes": np.bincount(served, minlength=m).tolist(),
            "mean_top_weight": float(pi[clients].max(axis=1).mean()) if len(clients) else 1.0}}
        return Update(state, metrics, [event], round_done=False)

    def _maximise(self, state: MixtureState, results: Sequence[ClientResult]) -> Update:
        """Step 1: each component the weighted average of the clients' trained copies."""
        results = sorted(results, key=lambda x: (x.client, int(x.meta["component"])))
        if not results:
            return Update(state)
        clients = np.array([x.client for x in results])
        comps = np.array([int(x.meta["component"]) for x in results])
        weights = component_weights(np.array([x.num_samples for x in results]),
                                    state.pi[clients], self.weighting, self.aggregation)
        chosen = weights[np.arange(len(results)), comps]
        keep = chosen > 0     # a component no client weighs keeps its model
        models = state.models
        if keep.any():
            models = cluster_fedavg(models, [x.update for x, k in zip(results, keep, strict=True)
                                             if k], comps[keep], chosen[keep])
        return Update(replace(state, models=models))

    def _select(self, state: MixtureState, results: Sequence[ClientResult]) -> Update:
        """M from the data: the clusters of every client's update of the one model."""
        results = sorted(results, key=lambda x: x.client)
        if not results:
            return Update(state)
        clients = np.array([x.client for x in results], dtype=np.int64)
        weights = aggregation_weights(np.array([x.num_samples for x in results]), self.weighting)
        found = clusters_of_updates(state.models[0], np.stack([x.update for x in results]),
                                    weights, self.k_choice)
        m, n = found.num_clusters, len(state.pi)
        labels = np.zeros(n, dtype=np.int64)   # a client that did not answer: cluster 0
        labels[clients] = found.labels
        pi = (confident_prior(labels, m, self.prior_confidence)
              if self.initial_pi == "clusters" else np.full((n, m), 1.0 / m))
        state = replace(state, models=found.models, pi=pi, q=np.zeros((0, m)),
                        label_counts=np.zeros((n, m, 0)), selected=True)
        event = {"type": f"{self._name}_components_selected", "components": m,
                 "clients": clients.tolist(), "labels": found.labels.tolist(),
                 "tree": np.round(found.linkage, 8).tolist()}
        sizes = np.bincount(found.labels, minlength=m).tolist()
        return Update(state, {self._name: {"components": m, "cluster_sizes": sizes}}, [event])


def _split(state: MixtureState) -> list[np.ndarray]:
    """The round's responsibilities, one (n_t, M) block per client of `round_clients`."""
    return np.split(state.q, np.cumsum(state.round_sizes)[:-1]) if len(state.round_sizes) \
        else []


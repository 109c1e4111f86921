"""FeSEM: Federated Stochastic Expectation Maximization (Long, Xie, Shen, Zhou, Wang, Jiang,
"Multi-center federated learning: clients clustering for better personalization", World Wide
Web 2023; first as Xie et al., "Multi-center federated learning", arXiv 2005.01026, 2020).

K centres (global models) W~_1..W~_K; client i's local model W_i belongs to one centre,
r_i = k. The multi-center loss is (1/m) sum_i sum_k r_i^(k) ||W_i - W~_k||_2 (Section 4.2);
FeSEM minimises it by alternating, every round over the round's sampled clients (the
"stochastic" part):

  local update  client i starts from its centre W~_(r_i) and trains locally: W_i;
  E-step        r_i = argmin_k ||W_i - W~_k||_2 (the nearest centre in L2, ties to the lowest k);
  M-step        W~_k = sum_{i: r_i = k} w_i W_i / sum_{i: r_i = k} w_i over the round's clients;
                a centre that no client chose keeps its model.

Before the selection round (below) the one model is trained by FedAvg, weighted by local
sample counts. The paper's Algorithm 1 runs E-step, M-step, local update; here each round is
local update, E-step, M-step: the same alternation, read from the other end, so that the E-step
uses the local model the client has just sent rather than one the server would have to store
for every client (n x d) from the last round it took part. w_i is 1 (`weighting: uniform`, the
paper's centre is the plain mean of its members' models); `samples` weights by local data size
as FedAvg does.

Initialisation and K. The paper fixes K and initialises the centres at random
(`k: K, initialisation: random`: K independent draws of the model's own init scheme, as the
FlexCFL authors' FeSEM does; a client not yet assigned starts from the shared initial model).
L2 distance to K unrelated random models says little about a client's data, and a centre no
client chose never moves: measured on the benchmark's digits label swaps and rotations (seed
0, 12 rounds, k = 4), every client chose the same centre (one cluster, ARI 0).

Default (an extension; `k: null`): the federation first trains one model for `select_round`
rounds (FedAvg); at round `select_round` every client trains it once and the server clusters
those local models as K-means does (the E/M iteration run to convergence on the one round,
scikit-learn's KMeans with k-means++ seeding from the run's seed), with K the most clusters of
which every one has a mean silhouette of at least `min_silhouette` on the models' squared L2
distances (`precomputed.substantial_clusters`, as IFCA and FL+HC choose theirs), else one. The
centres are the clusters' means (the M-step) and FeSEM goes on from them. `k: K` with
`initialisation: clients` does the same with K fixed (the paper's K with a data start).

Why squared L2: it is the dissimilarity K-means minimises, and for updates of about one norm it
is proportional to the cosine distance the other defaults judge (2|u|^2 (1 - cos)), so the one
floor means the same for all. Plain L2, |u| sqrt(2 (1 - cos)), squeezes the gap between a
cluster's own and its neighbours' distances (silhouettes about 0.6 times the cosine ones): on
the benchmark's MNIST label swap its weakest group fell under 0.25 and FeSEM answered one
cluster on every seed (ARI 0; squared: 4 clusters, ARI 1.0, and one cluster on iid).

What it can see: whatever makes one round's local models from a common model differ in L2:
concept, feature and label shift.

`clusters()` serves each client its centre; a client never assigned is served the centre most
clients have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from clusterfed.algorithms.aggregate import (
    Weighting,
    aggregation_weights,
    results_fedavg,
    weighted_mean,
)
from clusterfed.algorithms.base import (
    ALGORITHMS,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    check_choices,
)
from clusterfed.algorithms.choices import NEVER, initial_models, served_clusters
from clusterfed.algorithms.options import ClusterCount
from clusterfed.clustering.kmeans import kmeans_clusters
from clusterfed.clustering.similarity import euclidean_distance_matrix
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind


@serialisable
@dataclass(frozen=True)
class FeSEMState:
    centres: np.ndarray      # (K, d); before the selection round the one global model (1, d)
    assignment: np.ndarray   # (n,) r_i, the centre of client i; -1: never assigned
    base: np.ndarray         # (d,) where a client without a centre starts its local update
    seed: int                # the run's seed, for K-means' starts
    selected: bool = True    # whether the centres exist yet (False until the selection round)


# The mathematics, as pure functions --------------------------------------------------------


def l2_distances(models: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """||W_i - W~_k||_2 for every local model (m x d) and centre (K x d): (m, K) float64."""
    out = np.empty((len(models), len(centres)))
    for k, centre in enumerate(centres):
        diff = np.asarray(models, dtype=np.float64) - np.asarray(centre, dtype=np.float64)
        out[:, k] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    return out


def e_step(distances: np.ndarray) -> np.ndarray:
    """r_i = argmin_k ||W_i - W~_k|| per row of an (m, K) distance matrix; ties: the lowest k."""
    return np.argmin(distances, axis=1).astype(np.int64)


def m_step(centres: np.ndarray, models: np.ndarray, assignment: np.ndarray,
           weights: np.ndarray) -> np.ndarray:
    """W~_k = the w-weighted mean of the local models assigned to k; others keep their centre."""
    out = np.array(centres, dtype=np.float32)
    for k in np.unique(assignment):
        members = assignment == k
        out[k] = weighted_mean(models[members], np.asarray(weights)[members])
    return out


def multi_center_loss(distances: np.ndarray, assignment: np.ndarray) -> float:
    """(1/m) sum_i ||W_i - W~_(r_i)||_2 (Section 4.2), on the distances of the E-step."""
    if not len(assignment):
        return float("nan")
    return float(distances[np.arange(len(assignment)), assignment].mean())


# The algorithm ------------------------------------------------------------------------------


@ALGORITHMS.register("fesem")
@dataclass(frozen=True)
class FeSEM:
    # K centres (k_choice.k); null: from the data, by the selector on the squared L2 between
    # the clients' models (module docstring)
    k_choice: ClusterCount = ClusterCount()
    initialisation: str = "clients"      # "clients": K-means of one round of local models;
                                         # "random": K draws of the model's init (the paper)
    select_round: int = 10               # "clients": FedAvg until this round, then K-means
    weighting: Weighting = "uniform"     # M-step weights: the paper's plain mean, or "samples"
    sees: ClassVar[frozenset[str]] = frozenset({"concept", "feature", "label"})
    toy_mixture_options: ClassVar[dict[str, Any] | None] = {"rounds": 12}
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {"initialisation": ("clients", "random")}

    def __post_init__(self) -> None:
        check_choices(self, self._kinds)
        aggregation_weights(np.ones(1), self.weighting)
        object.__setattr__(self, "k_choice", ClusterCount.of(self.k_choice))
        if self.k_choice.k is None and self.initialisation == "random":
            raise ValueError("initialisation 'random' draws k centres: give k (or use "
                             "initialisation 'clients' to find k from the data)")
        if isinstance(self.select_round, bool) or not isinstance(self.select_round, int) \
                or self.select_round < 0:
            raise ValueError(f"select_round must be an integer >= 0, got {self.select_round!r}")

    def init(self, setup: Setup) -> FeSEMState:
        first = setup.initial_params.astype(np.float32)
        assignment = np.full(setup.num_clients, NEVER, dtype=np.int64)
        if self.initialisation == "random":
            assert self.k_choice.k is not None
            if setup.draw_initial is None:
                raise ValueError("initialisation 'random' needs the runtime to draw "
                                 "initialisations (Setup.draw_initial); use 'clients'")
            return FeSEMState(initial_models(setup, self.k_choice.k, "random", 0.0), assignment,
                              first, setup.seed)
        return FeSEMState(first[None].copy(), assignment, first, setup.seed, selected=False)

    def _selecting(self, state: FeSEMState, ctx: RoundContext) -> bool:
        return not state.selected and ctx.round >= self.select_round

    def plan(self, state: FeSEMState, ctx: RoundContext) -> list[ClientTask]:
        if self._selecting(state, ctx):   # every client trains the one model once
            return [ClientTask(c, TaskKind.TRAIN, state.base, ctx.train, {"phase": "select"})
                    for c in range(len(state.assignment))]
        if not state.selected:            # FedAvg before the selection round
            return [ClientTask(int(c), TaskKind.TRAIN, state.centres[0], ctx.train)
                    for c in ctx.sampled]
        # Local update: each client starts from its centre (a new one from `base`).
        tasks = []
        for c in ctx.sampled.tolist():
            r = int(state.assignment[c])
            start = state.centres[r] if r != NEVER else state.base
            tasks.append(ClientTask(c, TaskKind.TRAIN, start, ctx.train, {"centre": r}))
        return tasks

    def update(self, state: FeSEMState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        results = sorted(results, key=lambda x: x.client)
        if self._selecting(state, ctx):
            return self._select(state, results)
        if not state.selected:
            centres = results_fedavg(state.centres, results, [0] * len(results), "samples")
            return Update(replace(state, centres=centres, base=centres[0]))
        if not results:
            return Update(state)
        clients = np.array([x.client for x in results], dtype=np.int64)
        starts = np.stack([state.centres[int(x.meta["centre"])] if int(x.meta["centre"]) != NEVER
                           else state.base for x in results])
        models = (starts + np.stack([x.update for x in results])).astype(np.float32)
        distances = l2_distances(models, state.centres)
        chosen = e_step(distances)                                        # E-step
        weights = aggregation_weights(np.array([x.num_samples for x in results]), self.weighting)
        centres = m_step(state.centres, models, chosen, weights)         # M-step
        previous = state.assignment[clients]
        assignment = state.assignment.copy()
        assignment[clients] = chosen
        k = len(centres)
        metrics = {"fesem": {
            "cluster_sizes": np.bincount(chosen, minlength=k).tolist(),
            "switched": int(np.sum((previous != NEVER) & (previous != chosen))),
            "loss": multi_center_loss(distances, chosen)}}
        event = {"type": "fesem_assignments", "clients": clients.tolist(),
                 "clusters": chosen.tolist()}
        return Update(replace(state, centres=centres, assignment=assignment), metrics, [event])

    def _select(self, state: FeSEMState, results: Sequence[ClientResult]) -> Update:
        """K-means of every client's local model from the one model (K given or chosen)."""
        if not results:
            return Update(state)
        clients = np.array([x.client for x in results], dtype=np.int64)
        updates = np.stack([x.update for x in results])
        # L2 between local models from one start is L2 between their updates (less rounding).
        # K is judged on squared L2, the dissimilarity K-means minimises (module docstring).
        labels = kmeans_clusters(updates, euclidean_distance_matrix(updates) ** 2, state.seed,
                                 self.k_choice.k, self.k_choice.choose)
        k = int(labels.max()) + 1
        models = (state.base[None] + updates).astype(np.float32)
        weights = aggregation_weights(np.array([x.num_samples for x in results]), self.weighting)
        centres = m_step(np.repeat(state.base[None], k, axis=0), models, labels, weights)
        assignment = state.assignment.copy()
        assignment[clients] = labels
        event = {"type": "fesem_assignments", "clients": clients.tolist(),
                 "clusters": labels.tolist(), "k_selected": k}
        return Update(replace(state, centres=centres, assignment=assignment, selected=True),
                      {"fesem": {"cluster_sizes": np.bincount(labels).tolist(),
                                 "k_selected": k}}, [event])

    def clusters(self, state: FeSEMState) -> ClusterView:
        return ClusterView(state.centres, served_clusters(state.assignment))

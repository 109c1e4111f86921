"""LCFL: clustered FL by the losses of clients' models on each other's data (Gu et al., 2024).

Algorithm 1, run once before federated training:
  1. warm-up: T local iterations per client without communication (`warmup="local"`, the
     paper's box), or R FedAvg rounds (`warmup="federated"`, what the published numbers used,
     spec D1); in the warm-up's last step every client trains (A15), giving w_i;
  2. every client receives every w_j and sends its half |L_i(w_j) - L_i(w_i)| of Eq. 2; the
     server adds the halves into d (lines 6-14);
  3. a clustering on d alone (k-medoids, DBSCAN or hierarchical; k given or by silhouette);
  4. FedAvg inside each cluster, from the warmed-up global model (lines 15-17); one-shot.
     Each round samples max(1, round(rho |C_c|)) clients within each cluster C_c (spec 6.9,
     the authors' code), rho being the round's participation; `cluster_sampling: global`
     trains the runtime's global sample instead.

Section V-A's ablations replace d by DiffNorm ||w_i - w_j|| or GradCos 1 - cos(g_i, g_j),
the gradients taken at the warmed-up global model (A19). Rounds count the warm-up (A10): the
clustering happens in round `warmup_rounds` (1-based), or in round 1 for a local warm-up.

Defaults (extensions, A26): k chosen from d (`precomputed.substantial_clusters`, one cluster
when no clustering is substantial; at each k, k-medoids' partition, or the average-linkage cut
of d where that scores better and moves few clients, `tree_repair`) and a 10-round federated
warm-up (the paper's runs used 5 rounds of 10 local epochs; d is only as good as the
warmed-up models). The presets pin k and the paper's warm-up.

What it can see: any shift that makes one client's model fit another client's data worse:
concept, feature and label shift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from clusterfed.algorithms.aggregate import (
    Weighting,
    aggregation_weights,
    cluster_fedavg,
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
from clusterfed.algorithms.lcfl import loss_distance as ld
from clusterfed.algorithms.options import ClusterCount
from clusterfed.clustering import precomputed as pc
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, LossSpec, TaskKind, TrainSpec

FLOAT_BYTES = 4
_WITHIN_TAG = 0x1CF1


@serialisable
@dataclass(frozen=True)
class LCFLState:
    models: np.ndarray          # (K, d): the global model (K = 1) until clustered, then clusters
    assignment: np.ndarray      # (num_clients,) index into models
    num_samples: np.ndarray     # training samples per client (Setup)
    clustered: bool = False
    warm_models: np.ndarray | None = None   # (num_clients, d) w_i, only while d is built
    warm_start: np.ndarray | None = None    # the model the warm-up's last step started from
    medoids: np.ndarray | None = None       # per cluster, its most central client in d
    seed: int = 0


def exchange_cost(metric: str, warmup: str, num_clients: int, num_params: int,
                  gradcos_from: str = "gradient") -> dict[str, int]:
    """Per client, what the clustering exchange moves beyond the warm-up's own messages.

    loss: M-1 models down, M-1 scalars up, and w_i up after a local warm-up (a federated one
    already sent it as its update); M^2 model evaluations in all (loss_eq6: M raw losses up,
    L_i(w_i) included). diffnorm, and gradcos from updates: w_i up after a local warm-up.
    gradcos from gradients: one gradient up, one evaluation each (the model is already held).
    """
    m, model_bytes = num_clients, num_params * FLOAT_BYTES
    own_up = model_bytes if warmup == "local" else 0
    if metric in ("loss", "loss_eq6"):
        scalars = m - 1 if metric == "loss" else m
        return {"model_evaluations": m * m, "bytes_down_per_client": (m - 1) * model_bytes,
                "bytes_up_per_client": own_up + scalars * FLOAT_BYTES}
    if metric == "gradcos" and gradcos_from == "gradient":
        return {"model_evaluations": m, "bytes_down_per_client": 0,
                "bytes_up_per_client": model_bytes}
    return {"model_evaluations": 0, "bytes_down_per_client": 0, "bytes_up_per_client": own_up}


def sample_within_clusters(assignment: np.ndarray, fraction: float,
                           rng: np.random.Generator) -> np.ndarray:
    """Spec 6.9: max(1, round(fraction |C_c|)) members of every cluster C_c, uniformly without
    replacement (Python's round, as the authors' code), sorted."""
    chosen = []
    for c in np.unique(assignment):
        members = np.flatnonzero(assignment == c)
        size = min(len(members), max(1, round(fraction * len(members))))
        chosen.append(members if size == len(members)
                      else rng.choice(members, size=size, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def logged_clients(num_clients: int, limit: int) -> np.ndarray:
    """The clients whose rows of d go into the event log: all, or `limit` evenly spaced."""
    if num_clients <= limit:
        return np.arange(num_clients)
    return np.unique(np.linspace(0, num_clients - 1, limit).round().astype(np.int64))


@ALGORITHMS.register("lcfl", report=".report")
@dataclass(frozen=True)
class LCFL:
    # K: k_choice.k, or (null, an extension: A26) by its selector on d, by default
    # the silhouette rule up to k_max, one cluster below min_silhouette
    k_choice: ClusterCount = ClusterCount()
    min_distance: float | None = None    # if max d is below it, keep one cluster (A26)
    tree_repair: float | None = 0.1   # automatic k: the average-linkage cut of d may replace
                                      # k-medoids' partition, moving at most this share of
                                      # the clients (at least one); null: k-medoids alone
    warmup: str = "federated"         # or "local" (Algorithm 1)
    warmup_rounds: int = 10           # federated: FedAvg rounds, the last with every client
    warmup_epochs: int | None = 10    # local: T as local epochs (A2) ...
    warmup_steps: int | None = None   # ... or as SGD steps (set warmup_epochs: null)
    warmup_full_batch: bool = False   # local: full-gradient steps, as Alg. 1 prints (A3)
    metric: str = "loss"              # Eq. 2; "diffnorm", "gradcos": Section V-A; "loss_eq6"
    gradcos_from: str = "gradient"    # full-batch gradients at the global model (A19), or
                                      # "update": the warm-up's last updates (Sattler-style)
    loss_data: str = "train"          # or "train+test" (the authors' code, D3)
    loss_samples: int | None = None   # a fixed random subsample per client (off: all data)
    clustering: str = "kmedoids"      # or "dbscan", "hierarchical"
    kmedoids_method: str = "pam"      # or "alternate" (the authors' code, A8)
    kmedoids_init: str = "build"      # or "heuristic" (the authors' code), "random"
    restarts: int = 1                 # for kmedoids_init "random"
    linkage: str = "average"          # hierarchical
    threshold: float | None = None    # hierarchical: cut at this distance instead of k
    eps: float | None = None          # DBSCAN radius; None: a fence on k-NN distances (A21)
    min_samples: int = 5              # DBSCAN
    noise: str = "nearest"            # DBSCAN noise: "nearest", "singletons", "together"
    cluster_init: str = "global"      # or "members" (A9's mean of warm-up models), "medoid"
    weighting: Weighting = "samples"  # FedAvg weights (A11); "uniform": the code's mean
    cluster_sampling: str = "within"  # or "global": the runtime's sample of all clients
    log_distance_clients: int = 1000  # rows of d written to events.jsonl (evenly spaced)
    sees: ClassVar[frozenset[str]] = frozenset({"concept", "feature", "label"})
    toy_mixture_options: ClassVar[dict[str, Any]] = {"rounds": 12}
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {
        "warmup": ("federated", "local"),
        "metric": ("loss", "diffnorm", "gradcos", "loss_eq6"),
        "gradcos_from": ("gradient", "update"),
        "loss_data": ("train", "train+test"),
        "clustering": ("kmedoids", "dbscan", "hierarchical"),
        "kmedoids_method": pc.MEDOID_METHODS, "kmedoids_init": pc.MEDOID_INITS,
        "linkage": pc.LINKAGES, "noise": pc.NOISE_RULES,
        "cluster_init": ("global", "members", "medoid"),
        "cluster_sampling": ("within", "global")}

    def __post_init__(self) -> None:
        check_choices(self, self._kinds)
        aggregation_weights(np.ones(1), self.weighting)
        object.__setattr__(self, "k_choice", ClusterCount.of(self.k_choice))
        if self.k_choice.selector != "silhouette" and (
                self.clustering == "dbscan"
                or (self.clustering == "hierarchical" and self.threshold is not None)):
            raise ValueError(f"k_choice.selector {self.k_choice.selector!r} does not apply: "
                             f"clustering {self.clustering} with its own rule chooses K")
        if self.warmup_rounds < 1:
            raise ValueError("warmup_rounds must be at least 1: d needs trained models")
        if self.warmup == "local" and (self.warmup_epochs is None) == (self.warmup_steps is None):
            raise ValueError("a local warm-up needs exactly one of warmup_epochs and warmup_steps")
        if self.loss_samples is not None and self.loss_samples < 1:
            raise ValueError("loss_samples must be a positive count or null")
        if self.clustering == "hierarchical" and self.k_choice.k is not None \
                and self.threshold is not None:
            raise ValueError("hierarchical clustering takes k or threshold, not both")
        if self.tree_repair is not None and not 0.0 <= self.tree_repair <= 1.0:
            raise ValueError(f"tree_repair must be a share in [0, 1] or null, "
                             f"got {self.tree_repair!r}")
        if self.log_distance_clients < 0:
            raise ValueError("log_distance_clients must be >= 0")

    # phases --------------------------------------------------------------------------------

    @property
    def clustering_round(self) -> int:
        """0-based round whose last step trains every client and then clusters."""
        return self.warmup_rounds - 1 if self.warmup == "federated" else 0

    def _warmup_spec(self, spec: TrainSpec) -> TrainSpec:
        if self.warmup == "federated":
            return spec
        batch = 2**62 if self.warmup_full_batch else spec.batch_size
        return replace(spec, epochs=self.warmup_epochs, steps=self.warmup_steps,
                       batch_size=batch)

    def init(self, setup: Setup) -> LCFLState:
        return LCFLState(models=setup.initial_params[None].copy(),
                         assignment=np.zeros(setup.num_clients, dtype=np.int64),
                         num_samples=np.asarray(setup.num_samples, dtype=np.int64),
                         seed=setup.seed)

    def trainers(self, state: LCFLState, ctx: RoundContext) -> np.ndarray:
        """Who trains in a clustered round: a sample within each cluster at the round's
        participation, or the runtime's global sample."""
        if self.cluster_sampling == "global":
            return ctx.sampled
        fraction = len(ctx.sampled) / len(state.assignment)
        rng = np.random.default_rng([state.seed, ctx.round, _WITHIN_TAG])
        return sample_within_clusters(state.assignment, fraction, rng)

    def plan(self, state: LCFLState, ctx: RoundContext) -> list[ClientTask]:
        everyone = range(len(state.assignment))
        if state.clustered:                                   # line 15: FedAvg per cluster
            return [ClientTask(int(c), TaskKind.TRAIN, state.models[state.assignment[c]],
                               ctx.train, {"cluster": int(state.assignment[c])})
                    for c in self.trainers(state, ctx)]
        if ctx.round < self.clustering_round:                 # federated warm-up rounds
            return [ClientTask(int(c), TaskKind.TRAIN, state.models[0], ctx.train)
                    for c in ctx.sampled]
        if state.warm_models is None:                         # lines 1-5: every client's w_i
            return [ClientTask(c, TaskKind.TRAIN, state.models[0],
                               self._warmup_spec(ctx.train)) for c in everyone]
        if self.metric in ("loss", "loss_eq6"):               # lines 6-9: one row each
            spec = LossSpec(self.loss_data, self.loss_samples)
            return [ClientTask(c, TaskKind.LOSSES, state.warm_models, loss=spec)
                    for c in everyone]
        return [ClientTask(c, TaskKind.GRADIENT, state.models[0]) for c in everyone]

    # update --------------------------------------------------------------------------------

    def update(self, state: LCFLState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        if state.clustered:
            return Update(self._cluster_fedavg(state, results))
        if ctx.round < self.clustering_round:
            return Update(self._global_fedavg(state, results))
        if state.warm_models is None:
            state = self._warmed_up(state, results)
            if self._needs_exchange:
                return Update(state, round_done=False)        # the exchange is one more step
        return self._cluster(state, results)

    @property
    def _needs_exchange(self) -> bool:
        """Whether d needs a step of client work after the warm-up (not for parameter metrics)."""
        return self.metric != "diffnorm" and not (self.metric == "gradcos"
                                                  and self.gradcos_from == "update")

    def _global_fedavg(self, state: LCFLState, results: Sequence[ClientResult]) -> LCFLState:
        if not results:
            return state
        weights = aggregation_weights(np.array([r.num_samples for r in results]), self.weighting)
        mean = weighted_mean([r.update for r in results], weights)
        return replace(state, models=(state.models + mean[None]).astype(np.float32))

    def _warmed_up(self, state: LCFLState, results: Sequence[ClientResult]) -> LCFLState:
        """Keep every w_i; a federated warm-up also averages them into the global model."""
        start = state.models[0]
        warm = np.tile(start, (len(state.assignment), 1))
        for r in results:
            warm[r.client] = start + r.update
        if self.warmup == "federated":
            state = self._global_fedavg(state, results)
        return replace(state, warm_models=warm, warm_start=start.copy())

    def _distance(self, state: LCFLState, results: Sequence[ClientResult]) -> np.ndarray:
        """d from the clients' messages; a client that sent nothing is far from everyone."""
        assert state.warm_models is not None
        m = len(state.assignment)
        if self.metric == "diffnorm":
            return ld.diffnorm_distance(state.warm_models)
        if self.metric == "gradcos":
            if self.gradcos_from == "update":
                assert state.warm_start is not None
                return ld.gradcos_distance(state.warm_models - state.warm_start)
            grads = np.zeros_like(state.warm_models)
            for r in results:
                grads[r.client] = r.update
            return ld.gradcos_distance(grads)
        if self.metric == "loss_eq6":
            lmat = np.zeros((m, m))
            for r in results:
                assert r.losses is not None
                lmat[r.client] = r.losses
            return ld.eq6_distance(lmat)
        halves = np.zeros((m, m))
        reported = np.zeros(m, dtype=bool)
        for r in results:
            assert r.losses is not None
            halves[r.client] = ld.half_row(r.losses, r.client)   # computed client-side in a
            reported[r.client] = True                             # deployment: same numbers
        d = ld.assemble(halves)
        if not reported.all():
            far = float(d.max()) * 2 + 1.0
            d[~reported] = far
            d[:, ~reported] = far
            np.fill_diagonal(d, 0.0)
        return d

    def cluster_labels(self, d: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """Line 13, C(d): labels 0..K-1 and how they were chosen."""
        info: dict[str, Any] = {}
        if self.clustering == "dbscan":
            labels = pc.dbscan(d, eps=self.eps, min_samples=self.min_samples, noise=self.noise)
        elif self.k_choice.k is not None or (self.clustering == "hierarchical"
                                             and self.threshold is not None):
            labels = self._with_k(d, self.k_choice.k)
        elif self.k_choice.selector == "silhouette":   # automatic k (A26): its scores logged
            labels, scores = pc.choose_clusters(d, lambda k: self._candidate(d, k),
                                                self.k_choice.k_max, self.k_choice.min_silhouette)
            info["silhouettes"] = {str(k): round(s, 6) for k, s in scores.items()}
        else:
            labels = self.k_choice.choose(d, lambda k: self._candidate(d, k))
            info["selector"] = self.k_choice.selector
        if self.min_distance is not None and float(d.max(initial=0.0)) < self.min_distance:
            labels = np.zeros(len(d), dtype=np.int64)   # nobody is distinguishable (A26)
        info["silhouette"] = round(pc.silhouette(d, labels), 6)
        return labels, info

    def _candidate(self, d: np.ndarray, k: int) -> np.ndarray:
        """k clusters for the automatic choice of k. k-medoids minimises the distance to the
        medoids, which a client between two groups can lower by joining the wrong one (the
        quickstart: 6.895 against the true groups' 6.935), leaving that cluster's silhouette
        under the rule's floor. So the average-linkage cut of d replaces k-medoids' partition
        where it scores better and moves few clients (`tree_repair`): a repair of misplaced
        clients. Where the two disagree widely, neither is taken as evidence of structure,
        so structureless d stays at one cluster about as often as with k-medoids alone."""
        own = self._with_k(d, k)
        if self.clustering != "kmedoids" or self.tree_repair is None:
            return own
        tree = pc.hierarchical(d, k=k, linkage_method="average")
        if pc.points_moved(own, tree) > max(1.0, self.tree_repair * len(d)):
            return own
        return pc.strongest(d, [own, tree])

    def _with_k(self, d: np.ndarray, k: int | None) -> np.ndarray:
        if self.clustering == "hierarchical":
            return pc.hierarchical(d, k=k, threshold=self.threshold if k is None else None,
                                   linkage_method=self.linkage)
        assert k is not None
        found = pc.k_medoids(d, min(k, len(d)), method=self.kmedoids_method,
                             init=self.kmedoids_init, restarts=self.restarts)
        return pc.first_appearance_labels(found.labels)

    def _cluster(self, state: LCFLState, results: Sequence[ClientResult]) -> Update:
        assert state.warm_models is not None
        m, num_params = state.warm_models.shape
        d = self._distance(state, results)
        labels, info = self.cluster_labels(d)
        clusters = int(labels.max()) + 1
        medoids = np.array([np.flatnonzero(labels == c)[d[np.ix_(labels == c, labels == c)]
                                                        .sum(axis=1).argmin()]
                            for c in range(clusters)], dtype=np.int64)
        if self.cluster_init == "global":
            models = np.repeat(state.models[:1], clusters, axis=0)
        elif self.cluster_init == "medoid":
            models = state.warm_models[medoids]
        else:
            # Each cluster's weighted mean model: FedAvg of its members' models from zero.
            zero = np.zeros((clusters, state.warm_models.shape[1]), dtype=np.float32)
            models = cluster_fedavg(zero, state.warm_models, labels, aggregation_weights(
                state.num_samples, self.weighting))
        cost = exchange_cost(self.metric, self.warmup, m, num_params, self.gradcos_from)
        seconds = [float(r.meta.get("seconds", 0.0)) for r in results]
        shown = logged_clients(m, self.log_distance_clients)
        event = {"type": "lcfl_clustering", "metric": self.metric, "clusters": clusters,
                 "labels": labels.tolist(), "medoids": medoids.tolist(), **info, **cost,
                 "client_seconds_total": round(sum(seconds), 3),
                 "client_seconds_max": round(max(seconds, default=0.0), 3),
                 "distance_clients": shown.tolist(),
                 "distance": np.round(d[np.ix_(shown, shown)], 6).tolist()}
        metrics: Mapping[str, Any] = {"lcfl": {"clusters": clusters, **cost,
                                               "silhouette": info["silhouette"]}}
        new = replace(state, models=models.astype(np.float32), assignment=labels,
                      clustered=True, warm_models=None, warm_start=None, medoids=medoids)
        return Update(new, metrics, [event])

    def _cluster_fedavg(self, state: LCFLState, results: Sequence[ClientResult]) -> LCFLState:
        clusters = [int(r.meta["cluster"]) for r in results]
        return replace(state, models=results_fedavg(state.models, results, clusters,
                                                    self.weighting))

    def clusters(self, state: LCFLState) -> ClusterView:
        return ClusterView(state.models, state.assignment)

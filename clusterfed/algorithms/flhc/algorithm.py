"""FL+HC: federated learning with hierarchical clustering of local updates (Briggs et al., 2020).

Algorithm 1 (spec 1.3):
  1. rounds 0 .. n-1: FedAvg with the run's client fraction C (identical to `fedavg`);
  2. round n, step 0, the clustering round: ALL clients train from w_n and send
     Delta w_k; agglomerative clustering of the flattened updates (metric, linkage, cut at tau);
  3. round n, step 1 and every later round: independent FedAvg inside each cluster from w_n,
     max(1, floor(C |K_c|)) of the cluster's clients per round (A5). Clusters are final.

The clustering round is an extra communication, not one of the FL rounds (A3): round n+1
(1-based) holds the clustering round and the first per-cluster round, so its evaluation is the
paper's "post-cluster" figure and the run still has `train.rounds` FedAvg rounds.

Spec choices: updates are clustered (A1; `features="weights"` clusters w_k instead); cluster
models start from w_n (A4; `reuse_clustering_updates` starts them from the members' averaged
clustering-round models and counts that round as round n+1); floor in A5 (`cluster_rounding`);
participant-normalised FedAvg weights (A14). Because tau depends on the update scale (A12), the
threshold may also be relative to the largest merge height, or a number of clusters. The
default cut is chosen from the data (`threshold_mode="k_choice"`: the tree cut into the K that
the shared `k_choice` group chooses, by default the silhouette rule, else the gap statistic); the
paper presets keep tau.

What it can see: whatever makes one round's updates from the global model differ: concept,
feature and label shift alike.
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
from clusterfed.algorithms.options import UPDATES_K_CHOICE, ClusterCount
from clusterfed.algorithms.selection import tree_cut
from clusterfed.clustering import hierarchical as hc
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

_CLUSTER_SAMPLE_TAG = 0x4C48


@serialisable
@dataclass(frozen=True)
class FLHCState:
    models: np.ndarray        # (k, d): the global model before clustering, then one per cluster
    assignment: np.ndarray    # (num_clients,) cluster index per client (all 0 before clustering)
    seed: int                 # for the per-cluster client samples
    clustered: bool = False


def clients_in_cluster(fraction: float, size: int, rounding: str = "floor") -> int:
    """m_c = max(1, floor(C |K_c|)) (spec A5), or rounded to nearest with `rounding="round"`."""
    raw = fraction * size
    count = int(np.floor(raw + 1e-9)) if rounding == "floor" else int(round(raw))
    return min(size, max(1, count))


def sample_in_cluster(seed: int, round_index: int, cluster: int, members: np.ndarray,
                      count: int) -> np.ndarray:
    """`count` of a cluster's members, uniformly without replacement: a pure function of
    (seed, round, cluster), so a resumed run draws the same clients."""
    if count >= len(members):
        return np.sort(members)
    rng = np.random.default_rng([seed, round_index, cluster, _CLUSTER_SAMPLE_TAG])
    return np.sort(rng.choice(members, size=count, replace=False))


def cluster_models(base: np.ndarray, labels: np.ndarray, updates: np.ndarray,
                   weights: np.ndarray, from_updates: bool) -> np.ndarray:
    """One model per cluster: w_n for each (paper), or w_n + the members' weighted mean update."""
    models = np.repeat(base[None], int(labels.max()) + 1, axis=0).astype(np.float32)
    return cluster_fedavg(models, updates, labels, weights) if from_updates else models


@ALGORITHMS.register("flhc", report=".report")
@dataclass(frozen=True)
class FLHC:
    rounds_before_clustering: int = 10   # n: FedAvg rounds before the clustering round
    # Default cosine / average linkage: the silhouette the default cut reads is then free of
    # the updates' norms, which differ with each client's data size (measured: on quickstart's
    # digits CNN the L2 silhouette of the true clusters was 0.25, the cosine one 0.42). The
    # paper's L2 / Ward is what its presets use.
    metric: str = "cosine"               # l1 | l2 | cosine
    linkage: str = "average"             # single | complete | average | ward (l2 only)
    # The cut. Default (`k_choice`): the tree cut into the K the `k_choice` group chooses (by
    # default `silhouette_gap_width`, `options.UPDATES_K_CHOICE`), because the paper's tau is on the
    # updates' scale (A12), which the model, the learning rate and the data set. "absolute"
    # with the paper's tau (block A: 3.0 MNIST, 10.0 FEMNIST) is what the paper presets use;
    # "silhouette" reads `threshold` as the least silhouette of every cluster of the cut (0.25,
    # the default before k_choice). None: the mode's default (k_choice reads no threshold).
    threshold: float | None = None
    # k_choice | silhouette | absolute | relative | median | clusters
    threshold_mode: str = "k_choice"
    k_choice: ClusterCount = UPDATES_K_CHOICE
    features: str = "update"             # update (A1) | weights
    reuse_clustering_updates: bool = False   # A4: clusters start from their clustering round
    participation: float | None = None   # C inside clusters; None: the run's sampled fraction
    cluster_rounding: str = "floor"      # A5: floor | round
    weighting: Weighting = "samples"     # FedAvg weights: samples | uniform
    # Every metric's distances of the clustering round in its event, so each metric x linkage
    # x tau of Tables IV/V can be cut from one run (experiments/flhc_pairings.py).
    record_distances: bool = False
    # A partition fixed in advance (one cluster index per client): the clustering round trains
    # nothing and assigns it, so a partition found by another pairing continues exactly as it
    # would have (cluster models start from w_n, A4) without the round's 100-client cost.
    partition: tuple[int, ...] | None = None
    sees: ClassVar[frozenset[str]] = frozenset({"concept", "feature", "label"})
    toy_mixture_options: ClassVar[dict[str, Any]] = {"rounds": 12}
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {
        "features": ("update", "weights"), "cluster_rounding": ("floor", "round")}

    def __post_init__(self) -> None:
        hc.check_metric_linkage(self.metric, self.linkage)
        object.__setattr__(self, "k_choice", ClusterCount.of(self.k_choice, UPDATES_K_CHOICE))
        if self.threshold_mode == "k_choice":
            if self.threshold is not None:
                raise ValueError(f"threshold_mode 'k_choice' reads no threshold (got "
                                 f"{self.threshold}): set k_choice.k or "
                                 f"k_choice.min_silhouette, or another threshold_mode")
        else:
            hc.check_threshold(self.threshold_mode, self.cut_threshold)
            # Compared by value: a config written back from a run holds the group in full.
            if self.k_choice != UPDATES_K_CHOICE:
                raise ValueError(f"k_choice is read by threshold_mode 'k_choice' only; "
                                 f"threshold_mode is {self.threshold_mode!r}")
        check_choices(self, self._kinds)
        if isinstance(self.rounds_before_clustering, bool) or \
                not isinstance(self.rounds_before_clustering, int) or \
                self.rounds_before_clustering < 0:
            raise ValueError("rounds_before_clustering must be a whole number >= 0")
        if self.participation is not None and not 0 < self.participation <= 1:
            raise ValueError("participation must be a fraction in (0, 1] or null")
        aggregation_weights(np.ones(1), self.weighting)
        if self.partition is not None:
            # YAML gives a list; a tuple keeps the dataclass hashable and frozen.
            object.__setattr__(self, "partition", tuple(int(v) for v in self.partition))
            labels = np.asarray(self.partition)
            if labels.ndim != 1 or not len(labels) or labels.min() < 0 or \
                    set(np.unique(labels)) != set(range(int(labels.max()) + 1)):
                raise ValueError("partition must list one cluster index per client, the "
                                 "indices 0..k-1 all used")
            if self.reuse_clustering_updates:
                raise ValueError("a given partition trains no clustering round: it cannot "
                                 "reuse its updates (reuse_clustering_updates)")

    @property
    def cut_threshold(self) -> float:
        """The threshold the mode reads (nan for k_choice, which reads its group)."""
        if self.threshold_mode == "k_choice":
            return float("nan")
        if self.threshold is not None:
            return float(self.threshold)
        if self.threshold_mode not in hc.DEFAULT_THRESHOLDS:
            raise ValueError(f"threshold_mode {self.threshold_mode!r} needs a threshold")
        return hc.DEFAULT_THRESHOLDS[self.threshold_mode]

    def init(self, setup: Setup) -> FLHCState:
        if self.partition is not None and len(self.partition) != setup.num_clients:
            raise ValueError(f"partition lists {len(self.partition)} clients, the federation "
                             f"has {setup.num_clients}")
        return FLHCState(setup.initial_params[None].copy(),
                         np.zeros(setup.num_clients, dtype=np.int64), setup.seed)

    # plan ------------------------------------------------------------------------------------

    def _is_clustering_round(self, state: FLHCState, ctx: RoundContext) -> bool:
        return not state.clustered and ctx.round >= self.rounds_before_clustering

    def plan(self, state: FLHCState, ctx: RoundContext) -> list[ClientTask]:
        if self._is_clustering_round(state, ctx) and self.partition is not None:
            return []
        if self._is_clustering_round(state, ctx):
            # Alg. 1 lines 6-9: every client, whatever C, trains from w_n.
            return [ClientTask(c, TaskKind.TRAIN, state.models[0], ctx.train,
                               {"phase": "clustering"}) for c in range(len(state.assignment))]
        if not state.clustered:
            # Alg. 1 line 4: ordinary FedAvg on the run's sample.
            return [ClientTask(int(c), TaskKind.TRAIN, state.models[0], ctx.train)
                    for c in ctx.sampled]
        tasks = []
        for cluster, chosen in enumerate(self.cluster_samples(state, ctx)):
            tasks += [ClientTask(int(c), TaskKind.TRAIN, state.models[cluster], ctx.train,
                                 {"cluster": cluster}) for c in chosen]
        return tasks

    def cluster_samples(self, state: FLHCState, ctx: RoundContext) -> list[np.ndarray]:
        """Alg. 1 line 14: the clients of each cluster that train this round."""
        n = len(state.assignment)
        fraction = self.participation if self.participation is not None \
            else len(ctx.sampled) / n
        out = []
        for cluster in range(len(state.models)):
            members = np.flatnonzero(state.assignment == cluster)
            count = clients_in_cluster(fraction, len(members), self.cluster_rounding)
            out.append(sample_in_cluster(state.seed, ctx.round, cluster, members, count))
        return out

    # update ----------------------------------------------------------------------------------

    def update(self, state: FLHCState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        if self._is_clustering_round(state, ctx) and self.partition is not None:
            return self._assign(state)
        if self._is_clustering_round(state, ctx):
            return self._cluster(state, results)
        if not state.clustered:   # Eq. 2
            models = results_fedavg(state.models, results, [0] * len(results), self.weighting)
            return Update(replace(state, models=models))
        trained = [r for r in results if r.meta.get("cluster") is not None]
        models = results_fedavg(state.models, trained, [int(r.meta["cluster"]) for r in trained],
                                self.weighting)   # Eq. 4
        sizes = np.bincount(state.assignment, minlength=len(models))
        metrics = {"flhc": {"trained": len(results),
                            "cluster_sizes": sizes.tolist()}}
        return Update(replace(state, models=models), metrics)

    def _tree(self, vectors: np.ndarray) -> hc.Dendrogram:
        """The dendrogram of the clustering round's vectors, cut by the threshold rule."""
        if self.threshold_mode != "k_choice":
            return hc.hierarchical_clusters(vectors, self.metric, self.linkage,
                                            self.cut_threshold, self.threshold_mode)
        return tree_cut(vectors, self.metric, self.linkage, self.k_choice)

    def _cluster(self, state: FLHCState, results: Sequence[ClientResult]) -> Update:
        """Alg. 1 lines 10-12: hierarchical clustering of the clustering round's updates."""
        results = sorted(results, key=lambda r: r.client)
        clients = np.array([r.client for r in results], dtype=np.int64)
        if len(clients) == 0:
            return Update(state, round_done=False)
        base = state.models[0]
        updates = np.stack([r.update for r in results])
        vectors = updates if self.features == "update" else updates + base[None]
        tree = self._tree(vectors)
        labels = tree.labels
        weights = aggregation_weights(np.array([r.num_samples for r in results]),
                                      self.weighting)
        models = cluster_models(base, labels, updates, weights, self.reuse_clustering_updates)
        assignment = np.full(len(state.assignment), -1, dtype=np.int64)
        assignment[clients] = labels
        missing = np.flatnonzero(assignment < 0)
        if len(missing):   # a client whose result was rejected: one more cluster, from w_n
            assignment[missing] = len(models)
            models = np.concatenate([models, base[None]])
        sizes = np.bincount(assignment, minlength=len(models))
        cut = None if np.isnan(tree.threshold) else tree.threshold
        event = {"type": "hierarchical_clustering", "metric": self.metric,
                 "linkage": self.linkage, "threshold_mode": self.threshold_mode,
                 "threshold": None if np.isnan(self.cut_threshold) else self.cut_threshold,
                 "k_choice": (None if self.threshold_mode != "k_choice" else
                              {"k": self.k_choice.k, "selector": self.k_choice.selector}),
                 "cut_height": cut,
                 "clients": clients.tolist(), "labels": labels.tolist(),
                 "tree": np.round(tree.linkage, 8).tolist(),
                 "n_clusters": len(models), "cluster_sizes": sizes.tolist(),
                 "unclustered": missing.tolist()}
        if self.record_distances:
            event["distances"] = {m: np.round(hc.to_condensed(hc.pairwise_distances(vectors, m)),
                                              8).tolist() for m in hc.METRICS}
        heights = tree.heights
        metrics = {"flhc_clustering": {"n_clusters": len(models),
                            "cluster_sizes": sizes.tolist(), "cut_height": cut,
                            "max_height": float(heights.max()) if len(heights) else 0.0,
                            "clustering_clients": len(clients)}}
        new = replace(state, models=models, assignment=assignment, clustered=True)
        # A4 counts the clustering round as the round's training; else FedAvg runs in step 1.
        return Update(new, metrics, [event], round_done=self.reuse_clustering_updates)

    def _assign(self, state: FLHCState) -> Update:
        """The given partition in place of lines 10-12; every cluster starts from w_n (A4)."""
        labels = np.asarray(self.partition, dtype=np.int64)
        k = int(labels.max()) + 1
        models = np.repeat(state.models[:1], k, axis=0)
        sizes = np.bincount(labels, minlength=k)
        event = {"type": "hierarchical_clustering", "given_partition": True,
                 "labels": labels.tolist(), "n_clusters": k, "cluster_sizes": sizes.tolist()}
        metrics = {"flhc_clustering": {"n_clusters": k, "cluster_sizes": sizes.tolist(),
                                       "clustering_clients": 0}}
        new = replace(state, models=models, assignment=labels, clustered=True)
        return Update(new, metrics, [event], round_done=False)

    def clusters(self, state: FLHCState) -> ClusterView:
        return ClusterView(state.models, state.assignment)

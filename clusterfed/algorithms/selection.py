"""The number of clusters from the data, shared by the methods whose papers fix it.

One model is trained by FedAvg for a few rounds; then every client trains it once and the
server clusters those updates as FL+HC's default does (average linkage on cosine distances),
cut into the method's `k_choice.k`, or into the K its `k_choice.selector` chooses (by
default the most clusters of which every one has a mean silhouette of at least
`min_silhouette`, else one: `precomputed.substantial_clusters`). Each cluster's model starts
from the global model plus its members' mean update. IFCA (`k: null`), FedEM and FedRC
(`components: null`) start from these clusters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clusterfed.algorithms.aggregate import cluster_fedavg
from clusterfed.algorithms.options import ClusterCount
from clusterfed.clustering import hierarchical as hc


@dataclass(frozen=True)
class UpdateClusters:
    labels: np.ndarray    # (m,) each update's cluster, 0..K-1
    models: np.ndarray    # (K, d) float32: the global model plus each cluster's mean update
    linkage: np.ndarray   # the dendrogram (scipy's linkage matrix), for the run's events

    @property
    def num_clusters(self) -> int:
        return len(self.models)


def tree_cut(vectors: np.ndarray, metric: str, linkage: str, count: ClusterCount
             ) -> hc.Dendrogram:
    """The rows of `vectors` clustered by a tree (metric, linkage) cut into `count.k`, or into
    the K its selector chooses (IFCA's start and FL+HC's `threshold_mode: k_choice`)."""
    if count.k is not None:
        return hc.hierarchical_clusters(vectors, metric, linkage, count.k, "clusters")
    return hc.chosen_clusters(vectors, metric, linkage, count.choose)


def clusters_of_updates(base: np.ndarray, updates: np.ndarray, weights: np.ndarray,
                        count: ClusterCount) -> UpdateClusters:
    """Cluster the clients' updates (m x d) of the one model `base` into at most `count.k`
    clusters, or by its selector; each cluster's model is `base` plus the `weights`-weighted
    mean of its members' updates."""
    tree = tree_cut(updates, "cosine", "average", count)
    models = cluster_fedavg(np.repeat(np.asarray(base, np.float32)[None], tree.num_clusters,
                                      axis=0), updates, tree.labels, weights)
    return UpdateClusters(tree.labels, models, tree.linkage)

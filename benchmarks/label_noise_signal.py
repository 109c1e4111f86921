"""How much label-swap signal the benchmark's `label_swap_noisy` leaves, at several noise rates.

For each noise rate and seed, IFCA runs with its defaults on the benchmark's digits cell
(`clusterfed benchmark`'s config, with `scenario.label_noise.rate` set; rate 0 is the same
cell without the overlay). Its default chooses k from one round of every client's update of
the one model trained for 10 rounds (cosine distances, average linkage, the silhouette rule
of `clustering.precomputed.substantial_clusters`, which is FL+HC's default too). This script
records those updates and prints, per run:

- the mean cosine similarity of two clients' updates, same swap group (`in`) and other groups
  (`out`), for clean-clean, clean-noisy and noisy-noisy pairs;
- each true cluster's mean silhouette under the cosine distances: the weakest must reach the
  rule's floor (`NO_STRUCTURE`, 0.25) for the true clustering to be accepted at all; and
  under L2 distances, which FeSEM's rule uses (between local models w + u_i, the distances
  between updates);
- the ARI of the average-linkage tree's 4-cluster cut (is the truth in the tree?);
- the noisy clients' mean update norm over the clean clients' (what distances between models,
  not angles between updates, see: FeSEM's K-means on local models);
- the k IFCA selected and its ARI against the swap groups after the benchmark's 40 rounds.

The noisy clients are drawn from the seed and `share` alone (not the rate): every rate, 0
included, flags the same clients.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/label_noise_signal.py \
        [--rates 0,0.1,0.2,0.3] [--seeds 0,1,2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.cluster import hierarchy
from scipy.spatial.distance import squareform
from sklearn.metrics import adjusted_rand_score, silhouette_samples

from clusterfed.clustering.precomputed import NO_STRUCTURE
from clusterfed.clustering.similarity import (
    cosine_distance_matrix,
    cosine_similarity_matrix,
    euclidean_distance_matrix,
)
from clusterfed.data import build_federation, load_dataset
from clusterfed.experiments.benchmark import cell_config
from clusterfed.sim.simulation import Simulation
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

SCENARIO = "label_swap_noisy"


class RecordingExecutor:
    """Runs tasks through `inner`; keeps the TRAIN updates of round `at`, by client."""

    def __init__(self, inner: Any, at: int) -> None:
        self.inner, self.at = inner, at
        self.updates: dict[int, np.ndarray] = {}

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]:
        results = self.inner.run(tasks, round_index, step)
        if round_index == self.at:
            self.updates.update({r.client: np.asarray(r.update) for r in results
                                 if r.kind is TaskKind.TRAIN})
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def pair_means(similarity: np.ndarray, true: np.ndarray, noisy: np.ndarray
               ) -> dict[str, float | None]:
    """Mean off-diagonal similarity of same-group (`in`) and other-group (`out`) pairs, by how
    many of the two clients are noisy."""
    same = true[:, None] == true[None, :]
    noisy_count = noisy[:, None] + noisy[None, :]
    off = ~np.eye(len(true), dtype=bool)
    out: dict[str, float | None] = {}
    for name, count in (("clean", 0), ("mixed", 1), ("noisy", 2)):
        for where, mask in (("in", same), ("out", ~same)):
            chosen = off & mask & (noisy_count == count)
            out[f"{name}_{where}"] = (round(float(similarity[chosen].mean()), 3)
                                      if chosen.any() else None)
    return out


def true_cluster_silhouettes(distance: np.ndarray, true: np.ndarray) -> list[float]:
    """Each true cluster's mean silhouette width (the rule's per-cluster score)."""
    widths = silhouette_samples(distance, true, metric="precomputed")
    return [round(float(widths[true == c].mean()), 3) for c in np.unique(true)]


def measure(rate: float, seed: int, digits: Any) -> dict[str, Any]:
    config = cell_config("digits", SCENARIO, seed, "ifca", ["run.threads=1"])
    noisy = build_federation(digits, config["scenario"], seed).groupings["label_noise"]
    if rate > 0:
        config["scenario"]["label_noise"]["rate"] = rate
    else:
        del config["scenario"]["label_noise"]
    federation = build_federation(digits, config["scenario"], seed)
    start = time.perf_counter()
    with Simulation(config, federation=federation) as sim:
        recorder = RecordingExecutor(sim.executor, sim.algorithm.select_round)
        sim.executor = recorder
        summary = sim.run()
    true = federation.true_clusters
    updates = np.stack([recorder.updates[c] for c in range(federation.num_clients)])
    distance = np.clip(cosine_distance_matrix(updates), 0.0, None)
    tree = hierarchy.linkage(squareform(distance, checks=False), method="average")
    cut = hierarchy.fcluster(tree, t=len(np.unique(true)), criterion="maxclust")
    silhouettes = true_cluster_silhouettes(distance, true)
    norms = np.linalg.norm(updates, axis=1)
    return {"rate": rate, "seed": seed,
            "cosine": pair_means(cosine_similarity_matrix(updates), true, noisy),
            "true_cluster_silhouettes": silhouettes,
            "weakest_reaches_floor": min(silhouettes) >= NO_STRUCTURE,
            "true_cluster_silhouettes_l2": true_cluster_silhouettes(
                euclidean_distance_matrix(updates), true),
            "tree_4_cut_ari": round(float(adjusted_rand_score(true, cut)), 3),
            "noisy_over_clean_norm": (round(float(norms[noisy == 1].mean()
                                                  / norms[noisy == 0].mean()), 3)),
            "ifca_clusters": summary["clustering"]["n_clusters"],
            "ifca_ari": round(summary["clustering"]["ari"], 3),
            "accuracy": round(summary["final"]["mean_accuracy"], 4),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="0,0.1,0.2,0.3")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--json", default=None, help="write the rows here too")
    args = parser.parse_args()
    digits = load_dataset("digits")
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            rows.append(measure(rate, seed, digits))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

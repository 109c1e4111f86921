"""The K selectors (clustering/selectors.py) on PACFL's proximity matrix of realistic-tier
federations: signatures only, no training. Prints each selector's ARI (clusters found), with
PACFL's own tree cut as the clustering for a given k (docs/benchmark.md, "Selectors").

    python benchmarks/pacfl_selectors.py mnist 0 rotation_k4_unequal_p30,iid_p30 \\
        --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms import ALGORITHMS
from clusterfed.algorithms.pacfl import principal_angles as pa
from clusterfed.clustering import selectors as sel
from clusterfed.experiments import benchmark as bench
from clusterfed.sim.simulation import build_federation_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("seed", type=int)
    parser.add_argument("scenarios", help="comma-separated realistic-tier scenarios")
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    pacfl = ALGORITHMS.get("pacfl")()
    for scenario in args.scenarios.split(","):
        config = bench.cell_config(args.dataset, scenario, args.seed, "pacfl",
                                   [f"data.root={args.data_dir}"])
        federation = build_federation_for(config)
        start = time.perf_counter()
        signatures = [pa.client_signature(
            c.train_x, c.train_y, p=pacfl.p, per_class=pacfl.signature == "per_class",
            center=pacfl.center, mean=pacfl.mean, std=pacfl.std, svd=pacfl.svd,
            seed=args.seed, budget=pacfl.budget)[0] for c in federation.clients]
        proximity = pa.proximity_matrix(signatures, pacfl.measure, pacfl.absolute)
        tree = pa.linkage_tree(proximity, pacfl.linkage)

        def cut(k: int, tree: np.ndarray = tree, n: int = len(proximity)) -> np.ndarray:
            return pa.cut_tree(tree, n, n_clusters=k)

        found = []
        for name in sel.SELECTORS:
            labels = sel.select(name, proximity, cut, pacfl.k_max)
            found.append(f"{name} {adjusted_rand_score(federation.true_clusters, labels):.3f} "
                         f"({len(np.unique(labels))})")
        print(f"{args.dataset} {args.seed} {scenario} K {len(np.unique(federation.true_clusters))}"
              f" | {' | '.join(found)} [{time.perf_counter() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()

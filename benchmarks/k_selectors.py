"""The K selectors (clustering/selectors.py) across methods and realistic-tier federations,
each from one run up to the method's clustering round (docs/benchmark.md, "Selectors").

Every method named here chooses K with the silhouette rule
(`precomputed.choose_clusters`) on its own clustering features: PACFL's proximity of
signatures (round 0, no training), IFCA's and FL+HC's cosine distances of every client's
update at round 10 (their average-linkage cut at each k), LCFL's loss dissimilarity after
10 FedAvg rounds (its own candidate at each k). One run a (method, scenario) records that
matrix and the method's clustering at each k = 2..k_max, then every selector chooses on the
same record, so the selectors differ in nothing else. Prints ARI (clusters found) a cell.

    nice python benchmarks/k_selectors.py mnist 0 rotation_k4_unequal_p30,iid_p30 \\
        --methods pacfl,ifca,lcfl --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering import hierarchical, precomputed
from clusterfed.clustering import selectors as sel
from clusterfed.experiments import benchmark as bench
from clusterfed.sim.simulation import build_federation_for, run_config

# The round after the one each method clusters in (0-based), at its defaults.
ROUNDS = {"pacfl": 1, "ifca": 11, "flhc": 11, "lcfl": 10}
# Where the methods' code looks `choose_clusters` up (FL+HC's cut: hierarchical).
LOOKUPS = (precomputed, hierarchical, sel)


def recorded_features(config: dict[str, Any], federation: Any
                      ) -> tuple[np.ndarray, dict[int, np.ndarray], int, np.ndarray]:
    """Run `config`; the first `choose_clusters` call's distances, candidates at each k, k_max
    and the labels it chose."""
    calls: list[tuple[np.ndarray, dict[int, np.ndarray], int, np.ndarray]] = []
    original = precomputed.choose_clusters

    def recording(d: np.ndarray, labels_for_k: Callable[[int], np.ndarray], k_max: int,
                  *args: Any, **kwargs: Any) -> Any:
        out = original(d, labels_for_k, k_max, *args, **kwargs)
        if not calls:
            top = min(k_max, len(d) - 1)
            calls.append((np.array(d), {k: np.array(labels_for_k(k)) for k in range(2, top + 1)},
                          k_max, out[0]))
        return out

    for module in LOOKUPS:
        module.choose_clusters = recording   # type: ignore[attr-defined]
    try:
        run_config(config, None, federation=federation)
    finally:
        for module in LOOKUPS:
            module.choose_clusters = original   # type: ignore[attr-defined]
    if not calls:
        raise RuntimeError("the method never chose K by the silhouette rule")
    return calls[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("seed", type=int)
    parser.add_argument("scenarios", help="comma-separated realistic-tier scenarios")
    parser.add_argument("--methods", default="pacfl,ifca,lcfl",
                        help=f"comma-separated, of {', '.join(ROUNDS)}")
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    for scenario in args.scenarios.split(","):
        federation = None
        for method in args.methods.split(","):
            config = bench.cell_config(args.dataset, scenario, args.seed, method,
                                       [f"data.root={args.data_dir}", "run.threads=1",
                                        f"train.rounds={ROUNDS[method]}",
                                        f"eval.every={ROUNDS[method] + 1}"])
            federation = federation or build_federation_for(config)
            start = time.perf_counter()
            d, candidates, k_max, chosen = recorded_features(config, federation)
            truth = federation.true_clusters[:len(d)]
            found = []
            cut = candidates.__getitem__
            for name in sel.SELECTORS:
                labels = sel.select(name, d, cut, k_max)
                found.append(f"{name} {adjusted_rand_score(truth, labels):.3f} "
                             f"({len(np.unique(labels))})")
            assert np.array_equal(sel.select("silhouette", d, cut, k_max),
                                  precomputed.first_appearance_labels(chosen))
            print(f"{args.dataset} {args.seed} {scenario} {method} K "
                  f"{len(np.unique(federation.true_clusters))} | {' | '.join(found)} "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()

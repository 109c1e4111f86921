"""The K selectors (clustering/selectors.py) across methods and realistic-tier federations,
each from one run up to the method's clustering round (docs/benchmark.md, "Selectors").

Every method named here chooses K with the silhouette rule
(`precomputed.choose_clusters`) on its own clustering features: PACFL's proximity of
signatures (round 0, no training), IFCA's and FL+HC's cosine distances of every client's
update at round 10 (their average-linkage cut at each k), LCFL's loss dissimilarity after
10 FedAvg rounds (its own candidate at each k). One run a (method, scenario) records that
matrix and the method's clustering at each k = 2..k_max, then every selector chooses on the
same record, so the selectors differ in nothing else. Prints ARI (clusters found) a cell.

    nice python benchmarks/k_selectors.py mnist,fashion_mnist 0,1,2 \\
        rotation_k4_unequal_p30,iid_p30 --methods pacfl,ifca,lcfl --data-dir ../shared/data \\
        --save runs/k-records

With several seeds it ends with a table: each selector's mean ARI over the seeds (the
clusters it found on each).

`--save DIR` keeps each record (DIR/DATASET-SEED-SCENARIO-METHOD.npz: the distances, the
candidates, k_max and the truth) and reuses the records already there, and `--load DIR`
reruns the selectors on the saved records without training, so a new rule is compared on
exactly the same matrices.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering import hierarchical, precomputed
from clusterfed.clustering import selectors as sel
from clusterfed.experiments import benchmark as bench
from clusterfed.sim.simulation import build_federation_for, run_config

# The round after the one each method clusters in (0-based), at its defaults.
ROUNDS = {"pacfl": 1, "ifca": 11, "flhc": 11, "lcfl": 10}
# The methods with the `k_choice` group run with the silhouette selector, the one that calls
# `choose_clusters` with every candidate (PACFL's default tries HDBSCAN first); the record
# is the same under any selector.
WITH_GROUP = frozenset({"pacfl", "ifca", "flhc", "lcfl"})
# Where the methods' code looks `choose_clusters` up (FL+HC's `threshold_mode: silhouette`:
# hierarchical).
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


def record_path(folder: Path, dataset: str, seed: int, scenario: str, method: str) -> Path:
    return folder / f"{dataset}-{seed}-{scenario}-{method}.npz"


def save_record(path: Path, d: np.ndarray, candidates: dict[int, np.ndarray], k_max: int,
                truth: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, d=d, k_max=k_max, truth=truth,
                        **{f"k{k}": labels for k, labels in candidates.items()})


def load_record(path: Path) -> tuple[np.ndarray, dict[int, np.ndarray], int, np.ndarray]:
    with np.load(path) as f:
        candidates = {int(name[1:]): f[name] for name in f.files if name[0] == "k"
                      and name[1:].isdigit()}
        return f["d"], candidates, int(f["k_max"]), f["truth"]


Result = tuple[float, int]     # ARI against the truth, clusters found


def scores(d: np.ndarray, candidates: dict[int, np.ndarray], k_max: int,
           truth: np.ndarray) -> dict[str, Result]:
    """Every selector's (ARI, clusters) on one record."""
    out = {}
    for name in sel.SELECTORS:
        labels = sel.select(name, d, candidates.__getitem__, k_max)
        out[name] = (float(adjusted_rand_score(truth, labels)), len(np.unique(labels)))
    return out


def print_line(cell: tuple[str, int, str, str], k: int, found: dict[str, Result],
               seconds: float) -> None:
    dataset, seed, scenario, method = cell
    text = " | ".join(f"{name} {ari:.3f} ({n})" for name, (ari, n) in found.items())
    print(f"{dataset} {seed} {scenario} {method} K {k} | {text} [{seconds:.0f} s]", flush=True)


def print_table(results: dict[tuple[str, int, str, str], tuple[int, dict[str, Result]]]
                ) -> None:
    """Mean ARI over the seeds (clusters found on each) a (dataset, scenario, method)."""
    rows: dict[tuple[str, str, str], list[tuple[int, int, dict[str, Result]]]] = {}
    for (dataset, seed, scenario, method), (k, found) in results.items():
        rows.setdefault((dataset, scenario, method), []).append((seed, k, found))
    print("\n| dataset | scenario | method | true K | seeds | "
          + " | ".join(sel.SELECTORS) + " |")
    print("| --- | --- | --- | ---: | --- | " + " | ".join("---:" for _ in sel.SELECTORS) + " |")
    for (dataset, scenario, method), runs in rows.items():
        runs.sort(key=lambda run: run[0])
        cells = []
        for name in sel.SELECTORS:
            mean = np.mean([found[name][0] for _, _, found in runs])
            counts = "/".join(str(found[name][1]) for _, _, found in runs)
            cells.append(f"{mean:.3f} ({counts})")
        seeds = ",".join(str(seed) for seed, _, _ in runs)
        print(f"| {dataset} | {scenario} | {method} | {runs[0][1]} | {seeds} | "
              + " | ".join(cells) + " |")


def record(args: argparse.Namespace, cell: tuple[str, int, str, str], federation: Any
           ) -> tuple[tuple[np.ndarray, dict[int, np.ndarray], int, np.ndarray], Any, float]:
    """The cell's record: saved (`--load`, or `--save` where it exists), else run."""
    dataset, seed, scenario, method = cell
    folder = args.load or args.save
    saved = None if folder is None else record_path(folder, dataset, seed, scenario, method)
    if saved is not None and (args.load is not None or saved.exists()):
        return load_record(saved), federation, 0.0
    overrides = [f"data.root={args.data_dir}", "run.threads=1",
                 f"train.rounds={ROUNDS[method]}", f"eval.every={ROUNDS[method] + 1}"]
    if method in WITH_GROUP:
        overrides.append("algorithm.k_choice.selector=silhouette")
    config = bench.cell_config(dataset, scenario, seed, method, overrides)
    federation = federation or build_federation_for(config)
    start = time.perf_counter()
    d, candidates, k_max, chosen = recorded_features(config, federation)
    truth = np.asarray(federation.true_clusters[:len(d)])
    assert np.array_equal(sel.select("silhouette", d, candidates.__getitem__, k_max),
                          precomputed.first_appearance_labels(chosen))
    if saved is not None:
        save_record(saved, d, candidates, k_max, truth)
    return (d, candidates, k_max, truth), federation, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", help="comma-separated")
    parser.add_argument("seeds", help="comma-separated")
    parser.add_argument("scenarios", help="comma-separated realistic-tier scenarios")
    parser.add_argument("--methods", default="pacfl,ifca,lcfl",
                        help=f"comma-separated, of {', '.join(ROUNDS)}")
    parser.add_argument("--data-dir", help="the data root (not needed with --load)")
    parser.add_argument("--save", type=Path, help="keep each record in this folder")
    parser.add_argument("--load", type=Path,
                        help="rerun the selectors on records saved here; train nothing")
    args = parser.parse_args()
    if args.load is None and args.data_dir is None:
        parser.error("--data-dir is needed unless --load names saved records")
    results = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for dataset in args.datasets.split(","):
            for scenario in args.scenarios.split(","):
                federation = None
                for method in args.methods.split(","):
                    cell = (dataset, seed, scenario, method)
                    if args.load is not None and not record_path(args.load, *cell).exists():
                        print(f"no record {record_path(args.load, *cell)}", flush=True)
                        continue
                    (d, candidates, k_max, truth), federation, seconds = record(
                        args, cell, federation)
                    found = scores(d, candidates, k_max, truth)
                    results[cell] = (len(np.unique(truth)), found)
                    print_line(cell, *results[cell], seconds)
    if len({seed for _, seed, _, _ in results}) > 1:
        print_table(results)


if __name__ == "__main__":
    main()

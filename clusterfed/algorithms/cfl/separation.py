"""CFL Fig. 3: how often Theorem 1's separation gap is positive on synthetic gradients.

The paper's setting (Section III, Fig. 3; spec cfl.md 3.4): k distributions in d = 100
dimensions whose true gradients v_l are normal and sum to zero (theta* is stationary), m = 3k
clients, and each client's gradient v_{I(i)} + X_i with X_i isotropic normal scaled to
||X_i|| = gamma ||v_{I(i)}||. The paper plots P["correct clustering"] := P[g(alpha) > 0]; the
bipartition of Algorithm 1 can be correct with g <= 0 too (spec 3.3), so both are reported.

    python -m clusterfed.algorithms.cfl.separation [--trials 200] [--seeds 0 1 2] [--json PATH]

With several seeds each cell is the mean +- std over the seeds of the per-seed probability.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clusterfed.algorithms.cfl import maths as cfl_math
from clusterfed.clustering.similarity import cosine_similarity_matrix

KS = (2, 3, 5, 10, 20)
GAMMAS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0)


def synthetic_gradients(k: int, gamma: float, rng: np.random.Generator, dim: int = 100,
                        per_distribution: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(m, dim) client gradients and their distributions, m = per_distribution * k."""
    v = rng.standard_normal((k, dim))
    v -= v.mean(axis=0)                      # sum_l v_l = 0: a stationary point (Eq. 104)
    labels = np.repeat(np.arange(k), per_distribution)
    noise = rng.standard_normal((len(labels), dim))
    scale = gamma * np.linalg.norm(v[labels], axis=1) / np.linalg.norm(noise, axis=1)
    return v[labels] + noise * scale[:, None], labels


def splits_no_distribution(labels: np.ndarray, part_a: np.ndarray) -> bool:
    """A correct bipartition keeps every distribution's clients on one side."""
    side = np.zeros(len(labels), dtype=bool)
    side[part_a] = True
    return all(len(set(side[labels == c].tolist())) == 1 for c in np.unique(labels))


def trial(k: int, gamma: float, rng: np.random.Generator) -> tuple[bool, bool]:
    """(g > 0, Algorithm 1's bipartition correct) for one draw."""
    grads, labels = synthetic_gradients(k, gamma, rng)
    similarity = cosine_similarity_matrix(grads)
    part_a, _ = cfl_math.optimal_bipartition(similarity)
    return (cfl_math.separation_gap(similarity, labels) > 0,
            splits_no_distribution(labels, part_a))


def figure3(ks: Sequence[int] = KS, gammas: Sequence[float] = GAMMAS, trials: int = 200,
            seed: int = 0) -> dict[str, dict[str, dict[str, float]]]:
    """{"gap_positive"|"correct": {k: {gamma: probability}}} over `trials` draws a cell."""
    out: dict[str, dict[str, dict[str, float]]] = {"gap_positive": {}, "correct": {}}
    for k in ks:
        for name in out:
            out[name][str(k)] = {}
        for gamma in gammas:
            rng = np.random.default_rng([seed, k, int(round(gamma * 1000))])
            draws = np.array([trial(k, gamma, rng) for _ in range(trials)])
            out["gap_positive"][str(k)][str(gamma)] = float(draws[:, 0].mean())
            out["correct"][str(k)][str(gamma)] = float(draws[:, 1].mean())
    return out


def over_seeds(tables: Sequence[dict[str, dict[str, float]]]
               ) -> dict[str, dict[str, tuple[float, float]]]:
    """{k: {gamma: (mean, sample std)}} of one quantity's per-seed tables (std 0 for one)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for k, row in tables[0].items():
        out[k] = {}
        for gamma in row:
            values = np.array([t[k][gamma] for t in tables])
            std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            out[k][gamma] = (float(values.mean()), std)
    return out


def markdown(table: dict[str, dict[str, tuple[float, float]]]) -> str:
    gammas = list(next(iter(table.values())))
    seeds = any(std for row in table.values() for _, std in row.values())

    def cell(mean: float, std: float) -> str:
        return f"{mean:.3f} ± {std:.3f}" if seeds else f"{mean:.3f}"

    lines = ["| k \\ gamma | " + " | ".join(gammas) + " |",
             "| --- |" + " ---: |" * len(gammas)]
    lines += [f"| {k} | " + " | ".join(cell(*row[g]) for g in gammas) + " |"
              for k, row in table.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = [figure3(trials=args.trials, seed=seed) for seed in args.seeds]
    print(f"{args.trials} draws a cell, seeds {', '.join(map(str, args.seeds))}\n")
    print("P[g(alpha) > 0] (the paper's 'correct clustering'):\n")
    print(markdown(over_seeds([r["gap_positive"] for r in results])))
    print("P[Algorithm 1's bipartition splits no distribution]:\n")
    print(markdown(over_seeds([r["correct"] for r in results])))
    if args.json:
        args.json.write_text(json.dumps({"trials": args.trials, "seeds": args.seeds,
                                         "per_seed": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Scale: seconds per round and peak memory with 1,000 and 10,000 clients; CFL's server time.

Rotated MNIST (4 rotations, each with its own copy of MNIST as IFCA and LCFL build it, 24
training and 4 test images per client), CFL with CFL's ConvNet, 100 clients per round, 1
local epoch at batch 10. Each client count runs in a fresh process so its peak resident
memory is its own: the federation is built, 1 warm-up round and `--rounds` timed rounds run
(no evaluation inside them), then one evaluation of every client (the run's summary).

Each client count runs once a `--split-on` rule: CFL's default, "latest", keeps every
reporting member's latest update (a row a client, d float32 each); "fresh" keeps none.
Side by side, they give what the cache costs a round and in peak memory.

CFL's server clustering time: the cosine-similarity matrix (chunked Gram matrix, Eq. 13)
and the optimal bipartition (maximum spanning tree, Algorithm 1) of m client updates of
CFL's ConvNet (5,142 parameters), for m = 1,000 and 10,000, with four planted directions;
and the round's similarity as `split_on: latest` keeps it once every member has reported:
the Gram matrix's rows of a round's 100 reporters recomputed, then the cosines.

    python benchmarks/scale.py [--clients 1000 10000] [--rounds N] [--split-on fresh latest]
                               [--clustering-only]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np
from common import machine, mnist, peak_rss_mib

from clusterfed.algorithms.cfl import maths as cfl_math
from clusterfed.clustering.similarity import cosine_from_gram, gram_matrix, update_gram
from clusterfed.data import build_federation
from clusterfed.sim.simulation import Simulation

SEED = 0
PER_ROUND, TRAIN_IMAGES, TEST_IMAGES, PARAMS = 100, 24, 4, 5142


def config(clients: int, rounds: int, split_on: str = "latest") -> dict[str, Any]:
    return {"seed": SEED, "data": {"dataset": "mnist"},
            "scenario": {"kind": "rotation", "clients": clients, "clusters": 4,
                         "replicate": True, "samples_per_client": TRAIN_IMAGES,
                         "test_samples_per_client": TEST_IMAGES},
            "model": {"name": "cfl_convnet"},
            "train": {"rounds": rounds, "participation": PER_ROUND, "local_epochs": 1,
                      "batch_size": 10, "lr": 0.05},
            "algorithm": {"name": "cfl", "split_on": split_on}, "eval": {"every": 10**9},
            "run": {"progress": False, "checkpoint_every": 0, "executor": "sequential",
                    "device": "cpu"}}


def one_run(clients: int, rounds: int, split_on: str) -> dict[str, Any]:
    """Build, run 1 + `rounds` rounds, evaluate once; in this (fresh) process."""
    start = time.perf_counter()
    dataset, _ = mnist()
    cfg = config(clients, rounds + 2, split_on)
    federation = build_federation(dataset, cfg["scenario"], SEED)
    built = time.perf_counter() - start
    stamps: list[float] = []

    def stamp(completed: int, record: Any) -> bool:
        stamps.append(time.perf_counter())
        return completed == rounds + 1

    sim = Simulation(cfg, federation=federation, callbacks=[stamp])
    summary = sim.run()
    evaluated = time.perf_counter() - stamps[-1]
    return {"clients": clients, "split_on": split_on, "build_s": built,
            "round_s": list(np.diff(stamps)), "evaluate_all_s": evaluated,
            "peak_rss_mib": peak_rss_mib(), "clusters": summary["clustering"]["n_clusters"]}


def clustering_time(m: int) -> dict[str, Any]:
    rng = np.random.default_rng(SEED)
    directions = rng.standard_normal((4, PARAMS)).astype(np.float32)
    updates = directions[np.arange(m) % 4] + 0.5 * rng.standard_normal((m, PARAMS)).astype(
        np.float32)
    start = time.perf_counter()
    gram = gram_matrix(updates)
    similarity = cosine_from_gram(gram)
    mid = time.perf_counter()
    part_a, _ = cfl_math.optimal_bipartition(similarity)
    end = time.perf_counter()
    # A round's reporters replace their rows of the cache; the rest stay.
    reporters = rng.choice(m, min(PER_ROUND, m), replace=False)
    updates[reporters] = directions[reporters % 4] + 0.5 * rng.standard_normal(
        (len(reporters), PARAMS)).astype(np.float32)
    again = time.perf_counter()
    cosine_from_gram(update_gram(gram, updates, reporters))
    done = time.perf_counter()
    return {"clients": m, "similarity_s": mid - start, "bipartition_s": end - mid,
            "latest_round_s": done - again,
            "part_sizes": [len(part_a), m - len(part_a)], "peak_rss_mib": peak_rss_mib()}


def child(kind: str, n: int, rounds: int, split_on: str = "latest") -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(n), str(rounds),
                          split_on],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after 1 warm-up)")
    parser.add_argument("--split-on", nargs="+", choices=["fresh", "latest"],
                        default=["fresh", "latest"], help="CFL's split_on rules to run")
    parser.add_argument("--clustering-only", action="store_true",
                        help="only the server clustering timings, no federated runs")
    parser.add_argument("--child", nargs=4, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, n, rounds, split_on = args.child[0], int(args.child[1]), int(args.child[2]), \
            args.child[3]
        print(json.dumps(one_run(n, rounds, split_on) if kind == "run"
                         else clustering_time(n)))
        return 0
    print("== scale: rotated MNIST with CFL, 100 clients per round ==")
    print(machine())
    print(mnist()[1])
    print(f"4 rotations (replicated data), {TRAIN_IMAGES} train + {TEST_IMAGES} test images "
          f"per client, cfl_convnet, 1 epoch at batch 10; 1 warm-up + {args.rounds} timed rounds")
    print(f"{'clients':>7} {'split_on':>8} {'build s':>8} {'s/round':>8} {'eval all s':>10} "
          f"{'peak MiB':>9} {'clusters':>8}")
    for n in [] if args.clustering_only else args.clients:
        for split_on in args.split_on:
            r = child("run", n, args.rounds, split_on)
            print(f"{n:>7} {split_on:>8} {r['build_s']:>8.1f} {np.mean(r['round_s']):>8.2f} "
                  f"{r['evaluate_all_s']:>10.2f} {r['peak_rss_mib']:>9.0f} "
                  f"{r['clusters']:>8}")
    print(f"CFL server clustering of m client updates ({PARAMS} parameters each):")
    print(f"{'m':>7} {'similarity s':>12} {'bipartition s':>13} "
          f"{'latest: 100 rows s':>18} {'peak MiB':>9}")
    for n in args.clients:
        r = child("cluster", n, 0)
        print(f"{n:>7} {r['similarity_s']:>12.2f} {r['bipartition_s']:>13.2f} "
              f"{r['latest_round_s']:>18.2f} {r['peak_rss_mib']:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Aggregation memory: the peak extra memory and the time of one per-cluster FedAvg, stacked
as before (np.stack of every update, a boolean-mask copy, a float64 copy of each cluster)
against the column blocks of `clusterfed.algorithms.aggregate` (no stacked copy), side by side.

The case is FedRC/FedEM's at the fedrc-fmnist-c paper scale, scaled down: every client trains
every one of K components, so K x n updates reach the server at once (there 3 x 300 updates of
1.66 M parameters: 6 GB of updates, 18.9 GB at peak before the blocks). Peak extra memory is
measured with tracemalloc (numpy reports its buffers to it) over the call alone; the updates
themselves, which the runtime holds either way, are not counted.

    python benchmarks/aggregation_memory.py [--clients 300] [--components 3] [--params 200000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
from common import machine

from clusterfed.algorithms.aggregate import cluster_fedavg


def stacked(models: np.ndarray, updates: list[np.ndarray], clusters: np.ndarray,
            weights: np.ndarray) -> np.ndarray:
    """The former way, kept here only to measure against."""
    vectors = np.stack(updates)
    keep = weights > 0
    vectors, clusters, weights = vectors[keep], clusters[keep], weights[keep]
    out = np.array(models, dtype=np.float32)
    for c in np.unique(clusters):
        members = clusters == c
        w = weights[members] / weights[members].sum()
        out[c] += (w @ vectors[members].astype(np.float64)).astype(np.float32)
    return out


def measure(fn: Callable[[], np.ndarray]) -> tuple[float, float, np.ndarray]:
    tracemalloc.start()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20, seconds, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--components", type=int, default=3)
    parser.add_argument("--params", type=int, default=200_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    k, n, d = args.components, args.clients, args.params
    models = rng.normal(size=(k, d)).astype(np.float32)
    updates = [rng.normal(size=d).astype(np.float32) for _ in range(k * n)]
    clusters = np.tile(np.arange(k), n)
    weights = rng.uniform(1, 200, k * n)
    held = k * n * d * 4 / 2**20
    print(f"{machine()}\n{k} components x {n} clients, {d:,} parameters: the updates hold "
          f"{held:,.0f} MiB")
    old = measure(lambda: stacked(models, updates, clusters, weights))
    new = measure(lambda: cluster_fedavg(models, updates, clusters, weights))
    print(f"{'':10s} {'peak extra MiB':>15s} {'x updates':>10s} {'seconds':>8s}")
    for name, (peak, seconds, _) in (("stacked", old), ("blocks", new)):
        print(f"{name:10s} {peak:15,.0f} {peak / held:10.2f} {seconds:8.2f}")
    print(f"same models bit for bit: {np.array_equal(old[2], new[2])}; peak ratio "
          f"stacked / blocks: {old[0] / new[0]:.0f}x")


if __name__ == "__main__":
    main()

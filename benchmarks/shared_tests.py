"""One model over clients that share test samples (`test: by_labels`), pooled and not.

PACFL tests a client on every test image of its labels (Table 1's Fashion-MNIST column: 100
clients, LeNet-5). Its `local` protocol scores, every `eval.every` rounds, each client's own
model (100 models, nothing to share) and, with `also_cluster`, the cluster models (FedAvg's one
global model over all 100 clients' test sets). The client runtime now scores each distinct test
sample once per model (`client.shared_tests`); `unpooled` is the earlier path, every client's
rows through the model (`client.batched.evaluate_clients`).

Per label fraction, both paths score (a) the global model over every client and (b) a whole
evaluation of the `local` protocol (100 own models, then the global model), in turns A B B A,
`--repeats` times, best call kept; one thread. The pool's one-off build is timed too.

    OMP_NUM_THREADS=1 PYTHONPATH=.:benchmarks python benchmarks/shared_tests.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from common import default_data_dir, machine, synthetic_mnist

from clusterfed.client.runtime import ClientRuntime
from clusterfed.data import build_federation, load_dataset
from clusterfed.errors import DataError
from clusterfed.models import FlatModel, build_model

CLIENTS = 100


def fashion_mnist() -> tuple[object, str]:
    root = default_data_dir()
    try:
        return load_dataset("fashion_mnist", root), f"data: real Fashion-MNIST from {root}"
    except DataError as err:
        return synthetic_mnist(), f"data: SYNTHETIC MNIST-shaped images ({err})"


def wall(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(dataset: object, fraction: float, repeats: int) -> dict[str, float]:
    fed = build_federation(dataset, {"kind": "label_skew", "clients": CLIENTS,
                                     "label_fraction": fraction, "test": "by_labels"}, 0)
    model = FlatModel(build_model("lenet5", fed.input_shape, fed.n_classes))
    rng = np.random.default_rng(0)
    w = model.initial_vector().numpy()
    own = [(w + 0.01 * rng.standard_normal(w.shape)).astype(np.float32) for _ in range(CLIENTS)]
    everyone = list(range(CLIENTS))
    runtimes = {"pooled": ClientRuntime(model, fed, 0), "unpooled": ClientRuntime(model, fed, 0)}
    runtimes["unpooled"]._shared = False          # the path before the pool
    build = wall(lambda: runtimes["pooled"].evaluate(w, everyone))   # builds the pool
    runtimes["unpooled"].evaluate(w, everyone)                        # warm-up
    rows = sum(len(c.test_y) for c in fed.clients)
    pool = runtimes["pooled"]._shared
    np.testing.assert_allclose(runtimes["pooled"].evaluate(w, everyone),
                               runtimes["unpooled"].evaluate(w, everyone), rtol=1e-5)

    def protocol(rt: ClientRuntime) -> None:
        for c, params in enumerate(own):
            rt.evaluate(params, [c])
        rt.evaluate(w, everyone)

    best: dict[str, float] = {}
    for r in range(2 * repeats):
        for name in ("pooled", "unpooled") if r % 2 == 0 else ("unpooled", "pooled"):
            rt = runtimes[name]
            for what, call in (("global", lambda rt=rt: rt.evaluate(w, everyone)),
                               ("protocol", lambda rt=rt: protocol(rt))):
                key = f"{what}-{name}"
                best[key] = min(best.get(key, float("inf")), wall(call))
    return {"rows": rows, "distinct": pool.size, "build_s": build, **best}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.2, 0.3])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dataset, where = fashion_mnist()
    print(machine())
    print(where)
    print(f"{'labels':>6} {'rows':>7} {'distinct':>8} {'build s':>7} | {'global model s':>22} "
          f"{'x':>5} | {'local protocol s':>22} {'x':>5}")
    print(f"{'':>6} {'':>7} {'':>8} {'':>7} | {'unpooled':>11}{'pooled':>11} {'':>5} | "
          f"{'unpooled':>11}{'pooled':>11}")
    for fraction in args.fractions:
        m = measure(dataset, fraction, args.repeats)
        print(f"{fraction:6.0%} {m['rows']:7d} {m['distinct']:8d} {m['build_s']:7.2f} | "
              f"{m['global-unpooled']:11.2f}{m['global-pooled']:11.2f} "
              f"{m['global-unpooled'] / m['global-pooled']:5.1f} | "
              f"{m['protocol-unpooled']:11.2f}{m['protocol-pooled']:11.2f} "
              f"{m['protocol-unpooled'] / m['protocol-pooled']:5.2f}", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

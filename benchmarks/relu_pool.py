"""One training step with ReLU before each max pooling (the papers' order) against after it
(what `build_model` builds: the same function bit for bit), A/B interleaved in one process.

    python benchmarks/relu_pool.py [--cases cfl_convnet:5:128 fedavg_cnn:5:10 ...] [--repeats 9]

Each case is MODEL:K:BATCH; it times the grouped executor's step over K copies and the plain
module's step on one copy's batch, one thread, best of the repeats (5 steps each).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import machine

from clusterfed.models import MODELS, FlatModel, build_model
from clusterfed.models.grouped import GroupedModel

SHAPE = (1, 28, 28)
CASES = ("cfl_convnet:5:128", "cfl_convnet:20:10", "fedavg_cnn:5:10", "fedavg_cnn:2:50",
         "lenet5:10:50", "cnn_femnist_tiny:10:20")


def steps(module: torch.nn.Module, k: int, batch: int) -> dict[str, Callable[[], object]]:
    """The grouped and the plain training step of `module` on fixed random data."""
    x = torch.rand(k, batch, *SHAPE)
    y = torch.randint(0, 10, (k, batch))
    grouped = GroupedModel(module)
    packed = grouped.pack(FlatModel(module).initial_vector().repeat(k, 1))
    params = list(module.parameters())

    def grouped_step() -> object:
        leaves = [t.detach().requires_grad_(True) for t in packed]
        loss = F.cross_entropy(grouped(leaves, x).flatten(0, 1), y.flatten())
        return torch.autograd.grad(loss, leaves)

    def plain_step() -> object:
        return torch.autograd.grad(F.cross_entropy(module(x[0]), y[0]), params)

    return {"grouped": grouped_step, "sequential": plain_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine())
    print(f"{'model':<18} {'K x batch':>10} {'path':<11} {'paper ms':>9} {'pool first':>10} "
          f"{'x':>5}")
    for case in args.cases:
        name, k, batch = case.split(":")
        paper = MODELS.get(name)(input_shape=SHAPE, n_classes=10)
        fns = {order: steps(module, int(k), int(batch)) for order, module in
               (("paper", paper), ("pool first", build_model(name, SHAPE, 10)))}
        best = {(o, p): float("inf") for o in fns for p in fns[o]}
        for f in (f for by_path in fns.values() for f in by_path.values()):
            f()
        keys = list(best)
        for r in range(args.repeats):
            for o, p in keys if r % 2 == 0 else reversed(keys):
                start = time.perf_counter()
                for _ in range(5):
                    fns[o][p]()
                best[o, p] = min(best[o, p], (time.perf_counter() - start) / 5 * 1e3)
        for path in ("grouped", "sequential"):
            a, b = best["paper", path], best["pool first", path]
            print(f"{name:<18} {k + ' x ' + batch:>10} {path:<11} {a:>9.2f} {b:>10.2f} "
                  f"{a / b:>5.2f}")


if __name__ == "__main__":
    main()

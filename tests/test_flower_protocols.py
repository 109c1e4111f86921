"""Every evaluation protocol under Flower with a silent node: the figures equal what the
simulator's protocol computes on the clients that answered (in one process, a loopback grid)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed: the Flower runtime tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

from flower_cases import CLIENTS, flower_config  # noqa: E402
from flower_grid import LoopbackGrid  # noqa: E402
from test_flower_runtime import executor_for  # noqa: E402

from clusterfed.sim.protocols import PROTOCOLS  # noqa: E402
from clusterfed.sim.simulation import Simulation  # noqa: E402

SILENT = 2

CASES = [
    ("cluster", {"name": "fedavg"}, {}),
    ("cluster", {"name": "fedavg_ft"}, {}),                  # test-time adaptation
    ("local", {"name": "fedavg"}, {"also_cluster": True}),
    ("sampled_local", {"name": "fedavg"}, {}),
    ("min_test_loss", {"name": "ifca", "k": 2, "initialisation": "random"}, {}),
    ("best_of_path", {"name": "cfl", "acceptance": "fixed", "eps1": 0.6, "eps2": 0.1},
     {"validation_fraction": 0.2}),
    ("mixture", {"name": "fedem", "components": 2}, {}),     # mixture weights on the wire
]


class Dropping:
    """The simulator's executor, with one client that never answers."""

    def __init__(self, inner, client: int) -> None:
        self.inner, self.client = inner, client

    def run(self, tasks, round_index, step=0):
        return [r for r in self.inner.run(tasks, round_index, step) if r.client != self.client]

    def test_sizes(self):
        return self.inner.test_sizes()

    def train_sizes(self):
        return self.inner.train_sizes()


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return (np.isnan(a) and np.isnan(b)) or a == pytest.approx(b, rel=1e-5, abs=1e-7)
    return a == b


def test_the_cases_cover_every_protocol():
    assert {p for p, _, _ in CASES} == set(PROTOCOLS)


@pytest.mark.parametrize(("protocol", "algorithm", "options"), CASES,
                         ids=[f"{p}-{a['name']}" for p, a, _ in CASES])
def test_every_protocol_with_a_silent_node_scores_the_clients_that_answered(
        protocol, algorithm, options):
    config = flower_config(algorithm, rounds=2, every=1)
    config["scenario"]["quantity_skew"] = 1.0       # unequal test sizes: weights matter
    config["eval"].update({"protocol": protocol, **options})
    config["run"]["checkpoint_every"] = 0
    grid = LoopbackGrid(range(CLIENTS))
    executor = executor_for(grid, config, reply_timeout=5.0)
    grid.silent.add(grid.node_of(SILENT))
    flower = Simulation(config, federation=executor.federation(), executor=executor)
    flower.run()
    view = flower.algorithm.clusters(flower.state)
    got = flower._evaluate(flower.state, view, 1)

    # The simulator's protocol, in process, on the same state, with the same client silent.
    sim = Simulation(config)
    sim.executor = Dropping(sim.executor, SILENT)
    sim.own_models, sim.previous_models = flower.own_models, flower.previous_models
    sim.round_sampled = flower.round_sampled
    expected = sim._evaluate(flower.state, view, 1)
    assert same(got, expected), (got, expected)

    # By hand: the silent client is not scored, and the means are over the others.
    assert np.isnan(got["per_client_accuracy"][SILENT])
    assert got["unevaluated_clients"] == [SILENT]
    answered = [c for c in range(CLIENTS) if c != SILENT]
    if protocol in ("cluster", "local") and algorithm["name"] == "fedavg":
        full = sim.executor.inner
        own = flower.own_models or {}
        acc = [full.evaluate(own.get(c, view.models[view.assignment[c]]), [c])[0, 1]
               for c in answered]
        assert got["mean_accuracy"] == pytest.approx(np.mean(acc), rel=1e-6)
    if protocol == "sampled_local":
        full = sim.executor.inner
        sampled = [int(c) for c in flower.round_sampled if int(c) != SILENT]
        assert len(sampled) == len(flower.round_sampled) - 1   # the silent one was sampled
        sizes = np.array([len(c.test_y) for c in sim.federation.clients], dtype=float)
        assert len(set(sizes.tolist())) > 1
        acc = np.array([full.evaluate(flower.previous_models.get(
            c, view.models[view.assignment[c]]), [c])[0, 1] for c in sampled])
        assert got["mean_accuracy"] == pytest.approx(
            float(acc @ sizes[sampled] / sizes[sampled].sum()), rel=1e-6)
    for key in ("served_mean_accuracy", "leaf_mean_accuracy", "cluster_mean_accuracy",
                "test_chose_served"):
        if key in got:
            assert np.isfinite(got[key]), key

"""The contract every registered algorithm must pass. A new algorithm joins by registering."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import comparable, tiny_config

from clusterfed import state as st
from clusterfed.algorithms import ALGORITHMS, RoundContext, build_algorithm
from clusterfed.client import ClientTask, TaskKind
from clusterfed.config import merge
from clusterfed.sim.simulation import Simulation, resume_run, run_config

NAMES = ALGORITHMS.names()
CLUSTERING = [n for n in NAMES if getattr(ALGORITHMS.get(n), "toy_mixture_options", None)
              is not None]


class StopAfter:
    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __call__(self, completed: int, record) -> bool:
        if completed == self.rounds:
            raise KeyboardInterrupt  # a crash between rounds
        return False


def assert_state_equal(a, b) -> None:
    """Two states are equal when their serialised forms are byte-identical."""
    assert st.dumps(a) == st.dumps(b)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_state_and_summary(name):
    first = Simulation(tiny_config(name))
    second = Simulation(tiny_config(name))
    s1, s2 = first.run(), second.run()
    assert comparable(s1) == comparable(s2)
    assert_state_equal(first.state, second.state)
    other = Simulation(tiny_config(name, seed=4)).run()
    assert comparable(other) != comparable(s1)


@pytest.mark.parametrize("name", NAMES)
def test_state_survives_serialisation(name):
    sim = Simulation(tiny_config(name, train={"rounds": 2}))
    sim.run()
    restored = st.loads(st.dumps(sim.state))
    assert type(restored) is type(sim.state)
    assert_state_equal(restored, sim.state)
    # The restored state plans the same tasks as the original.
    algo = build_algorithm({"name": name})
    ctx = RoundContext(2, np.arange(sim.federation.num_clients), sim.spec)
    for a, b in zip(algo.plan(sim.state, ctx), algo.plan(restored, ctx), strict=True):
        assert (a.client, a.kind, a.train) == (b.client, b.kind, b.train)
        np.testing.assert_array_equal(a.params, b.params)


@pytest.mark.parametrize("name", NAMES)
def test_interrupted_run_resumes_to_the_same_summary(name, tmp_path):
    cfg = tiny_config(name, run={"checkpoint_every": 2}, eval={"every": 1})
    whole = run_config(cfg, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, tmp_path / "broken", callbacks=[StopAfter(3)])
    # Round 3 finished but the last checkpoint is round 2: round 3 is run again.
    resumed = resume_run(tmp_path / "broken")
    assert comparable(resumed) == comparable(whole)
    lines = (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == cfg["train"]["rounds"]
    assert (tmp_path / "broken" / "metrics.jsonl").read_text() == \
        (tmp_path / "whole" / "metrics.jsonl").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_plans_only_sampled_clients_with_known_task_kinds(name):
    # SOLO trains every client every round by default (not federated work): test its
    # sampled mode here.
    options = {"clients": "sampled"} if name == "local" else {}
    sim = Simulation(merge(tiny_config(name), {"algorithm": {"name": name, **options}}))
    algo, state = sim.algorithm, sim.algorithm.init(sim.setup)
    sampled = np.array([1, 5, 6])
    tasks = algo.plan(state, RoundContext(0, sampled, sim.spec))
    assert tasks and all(isinstance(t, ClientTask) for t in tasks)
    # A signature is a client's one-shot upload on arrival (PACFL, before federation), not
    # sampled work; every other task goes to sampled clients only.
    assert {t.client for t in tasks if t.kind is not TaskKind.SIGNATURE} <= set(sampled.tolist())
    assert all(t.kind in TaskKind for t in tasks)
    view = algo.clusters(state)
    assert view.assignment.shape == (sim.federation.num_clients,)
    assert view.models.shape[1] == sim.model.size


@pytest.mark.parametrize("name", CLUSTERING)
def test_recovers_the_toy_mixture_it_claims(name):
    """Digits with 4 disjoint label swaps over 8 clients (168 images each); claim: ARI >= 0.9."""
    options = dict(ALGORITHMS.get(name).toy_mixture_options)
    cfg = tiny_config(name, scenario={"kind": "label_swap", "clients": 8, "clusters": 4},
                      train={"rounds": options.pop("rounds", 20), "participation": 1.0,
                             "local_epochs": 3, "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                      eval={"every": 5}, run={"checkpoint_every": 0})
    summary = run_config(merge(cfg, {"algorithm": {"name": name, **options}}))
    assert summary["clustering"]["ari"] >= 0.9, summary["clustering"]


def test_fedavg_and_local_make_no_clustering_claim():
    # A method that finds no clusters must not be checked for them (and must not claim to).
    assert "fedavg" not in CLUSTERING and "local" not in CLUSTERING

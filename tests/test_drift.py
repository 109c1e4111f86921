"""scenario.drift: from a round on, some clients hold data of another true cluster, and every
round's clustering is scored against that round's truth."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from helpers import comparable, tiny_config
from test_contract import StopAfter
from test_scenarios import decode_index, index_dataset, label_dataset, original_label, swapped

from clusterfed.algorithms import ClusterView, Setup, Update
from clusterfed.data import build_federation, load_dataset
from clusterfed.data.describe import describe, format_description
from clusterfed.data.export import check_exportable
from clusterfed.data.scenarios import SCENARIOS, Assignment, materialise
from clusterfed.data.scenarios.building import client_data
from clusterfed.data.scenarios.drift import drift_spec, drifted
from clusterfed.errors import ClusterfedError, ConfigError
from clusterfed.flower.node import Population
from clusterfed.sim.simulation import Simulation, resume_run, run_config

SWAP = {"kind": "label_swap", "clients": 8, "clusters": 4}


def test_label_swap_drifted_clients_take_the_new_clusters_label_map() -> None:
    ds = label_dataset()
    fed = build_federation(ds, {**SWAP, "drift": {"round": 3, "clients": [1, 6]}}, seed=2)
    after = fed.drift.after
    pairs = fed.info["pairs"]
    assert fed.true_clusters.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert after.true_clusters.tolist() == [0, 1, 1, 1, 2, 2, 0, 3]   # 'next': 0->1, 3->0
    assert fed.drift.round == 3 and fed.drift.clients == (1, 6)
    assert fed.at_round(2) is fed and fed.at_round(3) is after and fed.at_round(9) is after
    assert fed.info["drift"] == {"round": 3, "clients": [1, 6], "from": [0, 3], "to": [1, 0]}
    for i, new in ((1, 1), (6, 0)):
        for split in ("train", "test"):
            x, y = getattr(after.clients[i], f"{split}_x"), getattr(after.clients[i], f"{split}_y")
            np.testing.assert_array_equal(y, swapped(original_label(x), pairs[new]))
            old = fed.clients[i]
            assert not np.array_equal(getattr(old, f"{split}_y"), y)
    for i in (0, 2, 3, 4, 5, 7):
        assert after.clients[i] is fed.clients[i]


def test_rotation_drifted_client_draws_from_the_new_clusters_copy() -> None:
    ds = index_dataset()
    fed = build_federation(ds, {"kind": "rotation", "clients": 8, "clusters": 4,
                                "replicate": True, "drift": {"round": 2, "clients": [2],
                                                             "to": 3}}, seed=4)
    after = fed.drift.after
    assert after.true_clusters.tolist() == [0, 0, 3, 1, 2, 2, 3, 3]
    x = after.clients[2].train_x
    # 270 degrees now (cluster 3), not 90: turned back it reads as the split's upright marker.
    upright = np.rot90(x, -3, axes=(-2, -1))
    assert (np.rint(upright[:, 0, 1, 0] * 255) == 1).all()
    assert not (np.rint(np.rot90(x, -1, axes=(-2, -1))[:, 0, 1, 0] * 255) == 1).all()
    # Cluster 3's copy shared among its three clients now: a third of the data each.
    assert len(decode_index(upright)) == len(ds.train_y) // 3


def test_label_groups_drifted_client_holds_the_new_groups_labels(digits_data: Any) -> None:
    fed = build_federation(digits_data, {"kind": "label_groups", "clients": 6, "clusters": 3,
                                         "drift": {"round": 5, "clients": 1, "to": [2]}},
                           seed=1)
    (moved,) = fed.drift.clients
    groups = fed.info["group_labels"]
    assert fed.info["drift"]["to"] == [2]
    before, after = fed.clients[moved], fed.drift.after.clients[moved]
    assert set(np.unique(before.train_y)) <= set(groups[fed.true_clusters[moved]])
    assert set(np.unique(after.train_y)) == set(groups[2])
    assert set(np.unique(after.test_y)) <= set(groups[2])


def test_fraction_draws_that_many_clients_by_the_seed(digits_data: Any) -> None:
    spec = {**SWAP, "clients": 20, "drift": {"round": 2, "clients": 0.25}}
    a = build_federation(digits_data, spec, seed=0)
    b = build_federation(digits_data, spec, seed=0)
    assert len(a.drift.clients) == 5 and a.drift.clients == b.drift.clients
    changed = np.flatnonzero(a.true_clusters != a.drift.after.true_clusters)
    assert changed.tolist() == list(a.drift.clients)


@pytest.fixture(scope="module")
def digits_data() -> Any:
    return load_dataset("digits")


@pytest.mark.parametrize(("scenario", "drift", "message"), [
    ({"kind": "iid", "clients": 8}, {"round": 2, "clients": 1}, "at least 2 true clusters"),
    (SWAP, {"round": 1, "clients": 1}, "whole number >= 2"),
    (SWAP, {"round": 2.5, "clients": 1}, "whole number >= 2"),
    (SWAP, {"clients": 1}, "whole number >= 2"),
    (SWAP, {"round": 3}, "clients is required"),
    (SWAP, {"round": 3, "clients": 1.5}, "fraction must be in"),
    (SWAP, {"round": 3, "clients": 9}, "cannot drift 9 of 8"),
    (SWAP, {"round": 3, "clients": [1, 1]}, "distinct client ids"),
    (SWAP, {"round": 3, "clients": [8]}, "distinct client ids"),
    (SWAP, {"round": 3, "clients": [1], "to": 0}, "another cluster"),
    (SWAP, {"round": 3, "clients": [1], "to": 4}, "true clusters 0..3"),
    (SWAP, {"round": 3, "clients": [1], "to": [1, 2]}, "lists 2 clusters for 1"),
    (SWAP, {"round": 3, "clients": [1], "to": "back"}, "'next', a true cluster"),
    (SWAP, {"round": 3, "clients": [0, 1]}, "without clients"),
    (SWAP, {"round": 3, "clients": [1], "when": 3}, "scenario.drift.when"),
    (SWAP, [3, 1], "must be a mapping"),
])
def test_bad_drift_options_say_what_is_wrong(digits_data: Any, scenario: dict, drift: Any,
                                             message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(digits_data, {**scenario, "drift": drift}, seed=0)


@pytest.mark.parametrize(("replan_seed", "message"), [
    (None, "sets its clients' true clusters itself"),   # ignores the moved clients
    (1, "after sharing out the data"),                  # draws other label pairs
])
def test_a_scenario_that_cannot_be_planned_again_is_refused(digits_data: Any,
                                                            replan_seed: int | None,
                                                            message: str) -> None:
    label_swap = SCENARIOS.get("label_swap")
    assign = Assignment(8, 4)
    plan = label_swap(digits_data, assign=assign, rng=np.random.default_rng(0))
    before = materialise(digits_data, plan)
    spec = drift_spec({"round": 2, "clients": [1]}, before.true_clusters,
                      np.random.default_rng(0))

    def replan(moved: Assignment) -> Any:
        if replan_seed is None:
            return plan
        return label_swap(digits_data, assign=moved, rng=np.random.default_rng(replan_seed))

    with pytest.raises(ConfigError, match=message):
        drifted(before, plan, spec, assign, replan, lambda c: client_data(digits_data, c),
                "label_swap")


# ---------------------------------------------------------------- runs


class FixedTruth:
    """Clusters fixed to the initial truth and never trained: its ARI is the truth's drift."""

    def __init__(self, assignment: np.ndarray) -> None:
        self.assignment = assignment

    def init(self, setup: Setup) -> np.ndarray:
        return np.tile(setup.initial_params, (int(self.assignment.max()) + 1, 1))

    def plan(self, state: np.ndarray, ctx: Any) -> list:
        return []

    def update(self, state: np.ndarray, ctx: Any, results: Any) -> Update:
        return Update(state)

    def clusters(self, state: np.ndarray) -> ClusterView:
        return ClusterView(state, self.assignment)


def drift_config(algorithm: str = "fedavg", **sections: Any) -> dict[str, Any]:
    return tiny_config(algorithm, **{"scenario": {**SWAP, "drift": {"round": 4, "clients": [1, 6]}},
                                     "train": {"rounds": 6}, **sections})


def test_every_rounds_ari_is_against_that_rounds_truth(tmp_path) -> None:
    sim = Simulation(drift_config(eval={"every": 3}), tmp_path)
    sim.algorithm = FixedTruth(sim.federation.true_clusters.copy())
    summary = sim.run()
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["ari"] for m in metrics[:3]] == [1.0] * 3
    assert all(m["ari"] < 0.7 and m["nmi"] < 1 for m in metrics[3:])
    assert "mean_accuracy" not in metrics[3] and "mean_accuracy" in metrics[5]
    assert summary["clustering"]["true_assignment"] == [0, 1, 1, 1, 2, 2, 0, 3]
    assert summary["clustering"]["ari"] == metrics[-1]["ari"]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["type"] == "drift"] == [
        {"round": 4, "type": "drift", "clients": [1, 6], "from": [0, 3], "to": [1, 0]}]
    # The executor now holds the drifted clients' new data.
    after = sim.scenario_federation.drift.after
    assert sim.federation is after
    for i in (1, 6):
        np.testing.assert_array_equal(sim.executor.train[i][1].numpy(), after.clients[i].train_y)


def test_records_of_runs_without_drift_are_unchanged(tmp_path) -> None:
    run_config(tiny_config("fedavg", eval={"every": 2}), tmp_path)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "ari" not in metrics[0] and "ari" in metrics[1]


@pytest.mark.parametrize(("checkpoint_every", "stop"), [(3, 4), (5, 6)])
def test_resume_across_the_drift_equals_an_unbroken_run(tmp_path, checkpoint_every: int,
                                                        stop: int) -> None:
    """The last checkpoint before the stop is round 3 (the drift, round 4, runs again) or
    round 5 (after it: the resumed run starts on the new data)."""
    cfg = drift_config("ifca", run={"checkpoint_every": checkpoint_every},
                       eval={"every": 1})
    whole = run_config(cfg, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, tmp_path / "broken", callbacks=[StopAfter(stop)])
    resumed = resume_run(tmp_path / "broken")
    assert comparable(resumed) == comparable(whole)
    for name in ("metrics.jsonl", "events.jsonl"):
        assert (tmp_path / "broken" / name).read_text() == (tmp_path / "whole" / name).read_text()


def test_processes_executor_restarts_on_the_new_data() -> None:
    cfg = drift_config(train={"rounds": 5, "participation": 1.0},
                       run={"checkpoint_every": 0, "threads": 1, "executor": "sequential"})
    sequential = run_config(cfg)
    sim = Simulation(cfg | {"run": {**cfg["run"], "executor": "processes", "workers": 2}})
    summary = sim.run()
    assert comparable(summary) == comparable(sequential)
    assert len(sim.executor.started_pids) == 2   # this executor's own pool, started at round 4


def test_drift_after_the_last_round_is_refused() -> None:
    with pytest.raises(ConfigError, match="never drift"):
        Simulation(drift_config(train={"rounds": 3}))


def test_describe_says_who_drifts_when(digits_data: Any) -> None:
    fed = build_federation(digits_data, {**SWAP, "drift": {"round": 7, "clients": [2]}}, seed=0)
    assert format_description(describe(fed)).splitlines()[-1] == (
        "drift from round 7 (shown: the data before it): clients [2] move from clusters [1] "
        "to [2]")


def test_flower_and_export_refuse_drift(digits_data: Any) -> None:
    with pytest.raises(ConfigError, match="not supported under Flower"):
        Population.build(drift_config())
    fed = build_federation(digits_data, {**SWAP, "drift": {"round": 2, "clients": 1}}, seed=0)
    with pytest.raises(ClusterfedError, match="drifts at round 2"):
        check_exportable(fed, "npz")
    sim = Simulation(tiny_config())
    with pytest.raises(ConfigError, match="with a given executor"):
        Simulation(drift_config(), executor=sim.executor)

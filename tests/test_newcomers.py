"""Newcomers for any algorithm (algorithms/newcomers.py): out until they arrive, then a model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from helpers import comparable, ctx, tiny_config

from clusterfed import state as st
from clusterfed.algorithms import ClusterView, Setup, Update, build_algorithm
from clusterfed.algorithms.newcomers import NOT_JOINED, Newcomers, newcomer_ids
from clusterfed.client import ClientResult, ClientTask, TaskKind
from clusterfed.config import merge, resolve
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import resume_run, run_config
from clusterfed.state import serialisable

D = 3
MODELS = np.array([[0.0] * D, [1.0] * D, [2.0] * D], dtype=np.float32)


@serialisable
@dataclass(frozen=True)
class StubState:
    trained: np.ndarray   # how often each client's result reached update


@dataclass(frozen=True)
class Stub:
    """Serves MODELS[c % models] to client c; every sampled client (`everyone`: every client)
    trains its model."""

    models: int = 3
    everyone: bool = False

    def init(self, setup: Setup) -> StubState:
        return StubState(np.zeros(setup.num_clients, dtype=np.int64))

    def plan(self, state: StubState, c) -> list[ClientTask]:
        who = range(len(state.trained)) if self.everyone else c.sampled
        return [ClientTask(int(i), TaskKind.TRAIN, MODELS[int(i) % self.models], c.train)
                for i in who]

    def update(self, state: StubState, c, results) -> Update:
        trained = state.trained.copy()
        for r in results:
            trained[r.client] += 1
        return Update(StubState(trained))

    def clusters(self, state: StubState) -> ClusterView:
        n = len(state.trained)
        return ClusterView(MODELS[: self.models], np.arange(n) % self.models)


def setup(n: int = 10) -> Setup:
    return Setup(n, np.zeros(D, dtype=np.float32), np.full(n, 20), 0)


def trained(tasks: list[ClientTask]) -> list[ClientResult]:
    return [ClientResult(t.client, TaskKind.TRAIN, 20, np.zeros(D, np.float32), 0.1)
            for t in tasks]


def test_newcomers_sit_out_then_take_the_least_loss_model_and_fine_tune_it():
    algo = Newcomers(Stub(), (8, 9), join_round=2)
    state = algo.init(setup())
    for r in range(2):   # every client sampled: only the old ones train
        tasks = algo.plan(state, ctx(r, np.arange(10)))
        assert sorted(t.client for t in tasks) == list(range(8))
        state = algo.update(state, ctx(r, np.arange(10)), trained(tasks)).state
    assert state.base.trained.tolist() == [2] * 8 + [0, 0]
    assert state.given.tolist() == [NOT_JOINED] * 2
    # Arrival, step 0: each newcomer scores every shared model on its training data.
    tasks = algo.plan(state, ctx(2, np.arange(10)))
    assert [(t.client, t.kind) for t in tasks] == [(8, TaskKind.LOSSES), (9, TaskKind.LOSSES)]
    np.testing.assert_array_equal(tasks[0].params, MODELS)
    losses = [ClientResult(8, TaskKind.LOSSES, 20, losses=np.array([0.7, 0.2, 0.9])),
              ClientResult(9, TaskKind.LOSSES, 20, losses=np.array([0.4, 0.8, 0.3]))]
    upd = algo.update(state, ctx(2, np.arange(10)), losses)
    assert not upd.round_done
    state = upd.state
    assert state.given.tolist() == [1, 2]   # the least loss, not the served 8 % 3, 9 % 3
    view = algo.clusters(state)
    assert view.assignment.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 1, 2]
    # Step 1: each fine-tunes its model; nothing reaches the federation's state.
    tasks = algo.plan(state, ctx(2, np.arange(10), step=1))
    assert [(t.client, t.kind) for t in tasks] == [(8, TaskKind.TRAIN), (9, TaskKind.TRAIN)]
    np.testing.assert_array_equal(tasks[0].params, MODELS[1])
    np.testing.assert_array_equal(tasks[1].params, MODELS[2])
    upd = algo.update(state, ctx(2, np.arange(10), step=1), trained(tasks))
    assert upd.round_done and upd.state.base.trained.tolist() == [2] * 8 + [0, 0]
    # After the arrival the newcomers stay out of the federation.
    assert 8 not in {t.client for t in algo.plan(upd.state, ctx(3, np.arange(10)))}
    # Also from a base that plans for every client, sampled or not (Local's default).
    everyone = Newcomers(Stub(everyone=True), (8, 9), join_round=2)
    planned = everyone.plan(everyone.init(setup()), ctx(0, np.array([1, 8])))
    assert sorted(t.client for t in planned) == list(range(8))


def test_one_model_or_a_model_a_client_is_served_without_a_choice():
    for models, n in ((1, 10), (3, 4)):   # FedAvg's one model; 3 models for 2 old clients
        algo = Newcomers(Stub(models), (n - 2, n - 1), join_round=1)
        state = algo.init(setup(n))
        tasks = algo.plan(state, ctx(1, np.arange(n)))
        assert [t.kind for t in tasks] == [TaskKind.TRAIN] * 2
        np.testing.assert_array_equal(tasks[0].params, MODELS[(n - 2) % models])
    served = Newcomers(Stub(), (8, 9), join_round=1, join="served")
    assert [t.kind for t in served.plan(served.init(setup()), ctx(1, np.arange(10)))] == \
        [TaskKind.TRAIN] * 2
    quiet = Newcomers(Stub(1), (8, 9), join_round=1, finetune=False)
    assert quiet.plan(quiet.init(setup()), ctx(1, np.arange(10))) == []


def test_several_finetune_rounds_each_start_where_the_last_ended():
    # FedAvg-like one model: no loss step; three fine-tuning steps in the arrival round.
    algo = Newcomers(Stub(1), (8, 9), join_round=1, finetune_rounds=3)
    state = algo.init(setup())
    moves = {8: np.full(D, 0.5, np.float32), 9: np.full(D, -1.0, np.float32)}
    expected = {8: MODELS[0].copy(), 9: MODELS[0].copy()}
    for step in range(3):
        tasks = algo.plan(state, ctx(1, np.arange(10), step=step))
        assert [(t.client, t.kind) for t in tasks] == [(8, TaskKind.TRAIN), (9, TaskKind.TRAIN)]
        for task in tasks:   # each starts where the newcomer's last training ended
            np.testing.assert_allclose(task.params, expected[task.client])
            expected[task.client] = expected[task.client] + moves[task.client]
        results = [ClientResult(t.client, TaskKind.TRAIN, 20, moves[t.client], 0.1)
                   for t in tasks]
        upd = algo.update(state, ctx(1, np.arange(10), step=step), results)
        assert upd.round_done == (step == 2)
        assert upd.metrics["newcomers"]["finetune_round"] == step + 1
        state = upd.state
    assert state.tuned is None   # nothing of the fine-tuning stays in the state
    assert state.base.trained.tolist() == [0] * 10
    # The state between steps survives a checkpoint.
    mid = algo.update(algo.init(setup()), ctx(1, np.arange(10)),
                      [ClientResult(8, TaskKind.TRAIN, 20, moves[8], 0.1),
                       ClientResult(9, TaskKind.TRAIN, 20, moves[9], 0.1)]).state
    back = st.loads(st.dumps({"state": mid}))["state"]
    np.testing.assert_allclose(back.tuned, mid.tuned)
    assert back.tuned_rounds == 1


def test_finetune_rounds_run_end_to_end_and_train_the_newcomers_longer(tmp_path):
    once = run_config(toy_with_newcomers("fedavg"), tmp_path / "once")
    thrice = run_config(merge(toy_with_newcomers("fedavg"),
                              {"newcomers": {"finetune_rounds": 3}}), tmp_path / "thrice")
    for c in (10, 11):
        # The same model received, trained three times as long.
        assert once["final"]["cluster_per_client_accuracy"][c] == \
            thrice["final"]["cluster_per_client_accuracy"][c]
    assert once["final"]["per_client_accuracy"][:10] == thrice["final"]["per_client_accuracy"][:10]
    assert once["final"]["per_client_accuracy"][10:] != thrice["final"]["per_client_accuracy"][10:]


def test_bad_newcomers_are_refused_with_the_key_named():
    with pytest.raises(ConfigError, match="newcomers.join_round"):
        resolve({"newcomers": {"clients": [1]}})
    with pytest.raises(ConfigError, match="newcomers.clients"):
        resolve({"newcomers": {"clients": "7", "join_round": 2}})
    with pytest.raises(ConfigError, match="twice"):
        resolve({"newcomers": {"clients": [1, 1], "join_round": 2}})
    bad_join = resolve({"newcomers": {"clients": [1], "join_round": 2, "join": "nearest"}})
    with pytest.raises(ConfigError, match="newcomers.join must"):
        build_algorithm(bad_join["algorithm"], bad_join["newcomers"])
    with pytest.raises(ConfigError, match="does not exist"):
        Newcomers(Stub(), (12,), join_round=1).init(setup())
    with pytest.raises(ConfigError, match="newcomers.finetune_rounds"):
        resolve({"newcomers": {"clients": [1], "join_round": 2, "finetune_rounds": 0}})
    section = {"clients": [6, 7], "join_round": 2, "finetune": True, "join": "least_loss"}
    with pytest.raises(ConfigError, match="finetune_rounds must stay 1"):
        build_algorithm({"name": "pacfl"}, {**section, "finetune_rounds": 2})
    with pytest.raises(ConfigError, match="set twice"):
        build_algorithm({"name": "pacfl", "newcomers": [5], "join_round": 2}, section)


def test_methods_with_their_own_arrival_rule_take_the_section_as_their_options():
    section = {"clients": [6, 7], "join_round": 2, "finetune": False, "join": "least_loss"}
    pacfl = build_algorithm({"name": "pacfl"}, section)
    assert (tuple(pacfl.newcomers), pacfl.join_round, pacfl.finetune_newcomers) == \
        ((6, 7), 2, False)
    assert not isinstance(build_algorithm({"name": "cfl"}, section), Newcomers)
    wrapped = build_algorithm({"name": "per_fedavg"}, section)
    assert isinstance(wrapped, Newcomers)
    assert wrapped.adaptation == wrapped.base.adaptation   # its test-time step stays
    assert not hasattr(build_algorithm({"name": "fedavg"}, section), "adaptation")
    assert newcomer_ids({"newcomers": section}) == [6, 7]
    assert newcomer_ids({"algorithm": {"name": "pacfl", "newcomers": [3]}}) == [3]


def toy_with_newcomers(name: str, clients: int = 12, late: tuple[int, ...] = (10, 11),
                       **options) -> dict:
    """The contract's toy mixture (4 label swaps) over 12 clients, clients 10 and 11 late."""
    cfg = tiny_config(name, scenario={"kind": "label_swap", "clients": clients, "clusters": 4},
                      train={"rounds": 15, "participation": 1.0, "local_epochs": 3,
                             "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                      eval={"every": 5, "protocol": "local", "also_cluster": True},
                      newcomers={"clients": list(late), "join_round": 14},
                      run={"checkpoint_every": 0})
    return merge(cfg, {"algorithm": {"name": name, **options}})


def test_ifca_newcomers_join_their_true_cluster_by_least_loss(tmp_path):
    # 16 clients, 4 a true cluster; one newcomer in the first cluster, one in the last.
    summary = run_config(toy_with_newcomers("ifca", clients=16, late=(3, 14)), tmp_path)
    clustering = summary["clustering"]
    found, true = np.array(clustering["assignment"]), np.array(clustering["true_assignment"])
    assert clustering["ari"] >= 0.9, (found.tolist(), true.tolist())
    for c in (3, 14):   # the model of the old clients of its true cluster
        peers = [p for p in range(16) if true[p] == true[c] and p not in (3, 14)]
        assert set(found[peers]) == {found[c]}, (c, found.tolist(), true.tolist())
    final = summary["final"]
    # Fine-tuned on arrival: the own models differ from the cluster models they received (a
    # no-op fine-tune scores both the same; one client's 14 test images may agree by chance).
    own, served = (tuple(final[key][c] for c in (3, 14))
                   for key in ("per_client_accuracy", "cluster_per_client_accuracy"))
    assert own != served


def test_a_run_cut_off_after_the_arrival_resumes_to_the_same_summary(tmp_path):
    cfg = merge(toy_with_newcomers("ifca", restarts=1, k=4, initialisation="random"),
                {"train": {"rounds": 5}, "newcomers": {"join_round": 2},
                 "run": {"checkpoint_every": 1}})
    whole = run_config(cfg, tmp_path / "whole")

    def stop_after_the_arrival(completed: int, record) -> bool:
        if completed == 4:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, tmp_path / "broken", callbacks=[stop_after_the_arrival])
    state = st.loads((tmp_path / "broken" / "checkpoint.npz").read_bytes())["state"]
    assert (state.given != NOT_JOINED).all()   # the newcomers' models survive the checkpoint
    assert comparable(resume_run(tmp_path / "broken")) == comparable(whole)


def test_compare_shows_the_newcomers_figures_beside_everyone_s(tmp_path):
    from clusterfed.experiments.compare import compare
    from clusterfed.report.tables import format_table, table_rows

    config = merge(toy_with_newcomers("fedavg"), {"train": {"rounds": 3},
                                                   "newcomers": {"join_round": 2}})
    result = compare(config, tmp_path, ["fedavg", "local"])
    rows = table_rows(result)
    assert rows[0][:4] == ["algorithm", "mean acc", "newcomers", "as received"]
    for row, name in zip(rows[1:], ("fedavg", "local"), strict=True):
        news = result["summaries"][name]["final"]["newcomers"]
        assert news["clients"] == [10, 11]
        per_client = result["summaries"][name]["final"]["per_client_accuracy"]
        assert news["mean_accuracy"] == pytest.approx(np.mean(per_client[10:]))
        assert row[2] == f"{news['mean_accuracy']:.4f}"
    assert "newcomers" in format_table(rows)


def test_a_compare_entry_sets_its_own_newcomers_keys():
    from clusterfed.experiments.compare import run_config_of
    config = toy_with_newcomers("fedavg")
    solo = run_config_of(config, {"name": "local", "newcomers": {"finetune_rounds": 5}})
    assert solo["newcomers"]["finetune_rounds"] == 5
    assert solo["newcomers"]["clients"] == [10, 11]   # the rest of the section is the config's
    assert "newcomers" not in solo["algorithm"]
    assert run_config_of(config, {"name": "fedavg"})["newcomers"]["finetune_rounds"] == 1
    # A list stays the algorithm's own option (PACFL's and CFL's late clients).
    pacfl = run_config_of(config, {"name": "pacfl", "newcomers": [10, 11], "join_round": 14})
    assert pacfl["algorithm"]["newcomers"] == [10, 11]

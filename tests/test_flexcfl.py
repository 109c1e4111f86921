"""FlexCFL: the decomposed cosine similarity against an SVD, EDC, the cold start, inter-group
aggregation and the temperature by hand; the group cold start on made-up updates (groups and
one group for iid); a drifted client migrating; one group on an iid federation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import tiny_config
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms import RoundContext, Setup
from clusterfed.algorithms.flexcfl.algorithm import (
    NONE,
    FlexCFL,
    cold_start_groups,
    cosine_dissimilarity,
    decomposed_cosine_similarity,
    edc_matrix,
    group_labels,
    inter_group_params,
    inter_group_updates,
    step_temperature,
)
from clusterfed.algorithms.options import ClusterCount
from clusterfed.client import ClientResult, TaskKind, TrainSpec
from clusterfed.config import merge
from clusterfed.sim.simulation import run_config

SPEC = TrainSpec(lr=0.1, batch_size=10)


def test_dcs_is_the_cosine_with_the_top_singular_directions():
    updates = np.random.default_rng(1).normal(size=(6, 40))
    u, _, _ = np.linalg.svd(updates.T, full_matrices=False)    # d x n: left vectors u_k
    brute = np.array([[row @ u[:, k] / np.linalg.norm(row) for k in range(3)]
                      for row in updates])
    # A singular direction's sign is arbitrary: compare up to one sign per column.
    dcs = decomposed_cosine_similarity(updates, 3)
    signs = np.sign((dcs * brute).sum(axis=0))
    np.testing.assert_allclose(dcs * signs, brute, atol=1e-10)


def test_edc_by_hand():
    dcs = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    # ||(1, 0) - (0, 1)|| / m = sqrt(2) / 2
    np.testing.assert_allclose(edc_matrix(dcs), [[0, np.sqrt(2) / 2, 0],
                                                 [np.sqrt(2) / 2, 0, np.sqrt(2) / 2],
                                                 [0, np.sqrt(2) / 2, 0]])


def test_a_newcomer_joins_the_group_of_the_most_similar_direction():
    directions = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    new = np.array([[2.0, 1.0], [0.0, 0.0], [-1.0, -3.0]])
    d = cosine_dissimilarity(new, directions)
    # (1 - cos) / 2: (2, 1) has cos 2/sqrt5 with e1, 1/sqrt5 with e2, -2/sqrt5 with -e1.
    np.testing.assert_allclose(d[0], [(1 - 2 / np.sqrt(5)) / 2, (1 - 1 / np.sqrt(5)) / 2,
                                      (1 + 2 / np.sqrt(5)) / 2])
    np.testing.assert_allclose(d[1], [0.5, 0.5, 0.5])     # a zero update: no direction
    np.testing.assert_array_equal(cold_start_groups(new, directions), [0, 0, 2])


def test_inter_group_aggregation_by_hand():
    updates = np.array([[3.0, 4.0], [0.0, 2.0]])
    # dw_0 + 0.5 dw_1 / |dw_1| = (3, 4) + 0.5 (0, 1); dw_1 + 0.5 (0.6, 0.8)
    np.testing.assert_allclose(inter_group_updates(updates, 0.5), [[3.0, 4.5], [0.3, 2.4]])
    # The authors' code on models: ((3,4) + (0,2)/2) / (1 + 1/2); ((0,2) + (3,4)/5) / (1 + 1/5)
    np.testing.assert_allclose(inter_group_params(updates, 1.0),
                               [[2.0, 10 / 3], [0.5, 2.8 / 1.2]], rtol=1e-6)


def test_the_step_temperature_by_hand():
    out = step_temperature(np.array([4, 4, 1, 0, 3]), np.array([0.3, 0.1, 0.5, 0.9, 0.1]),
                           np.array([0.2, 0.2, 0.2, 0.2, 0.2]), 4)
    # above the mean: down one; below: up one, at most 4; zero stays zero
    np.testing.assert_array_equal(out, [3, 4, 0, 0, 4])


def blobs(rng: np.random.Generator, sizes, d: int = 60, spread: float = 0.3) -> np.ndarray:
    directions = rng.normal(size=(len(sizes), d))
    return np.vstack([directions[g] + spread * rng.normal(size=(s, d))
                      for g, s in enumerate(sizes)])


def test_group_cold_start_finds_the_directions_or_one_group():
    rng = np.random.default_rng(3)
    truth = np.repeat(np.arange(3), [6, 5, 4])
    updates = blobs(rng, [6, 5, 4])
    assert adjusted_rand_score(truth, group_labels(updates, ClusterCount(), seed=0)) == 1.0
    assert adjusted_rand_score(truth, group_labels(updates, ClusterCount(k=3), seed=0)) == 1.0
    iid = blobs(rng, [15], spread=0.3)     # one direction and noise around it
    assert group_labels(iid, ClusterCount(), seed=0).max() == 0


def train(client: int, update, meta: dict, n: int = 10) -> ClientResult:
    return ClientResult(client, TaskKind.TRAIN, n, update=np.asarray(update, np.float32),
                        loss=0.1, meta=meta)


def grouped_state(algo: FlexCFL, n: int = 5):
    """Groups 0 (clients 0-2) and 1 (clients 3-4), directions e1 and e2, from w_0 = 0."""
    state = algo.init(Setup(n, np.zeros(3, np.float32), np.full(n, 10), 0))
    eye = np.eye(3, dtype=np.float32)[:2]
    return replace(state, models=eye.copy(), directions=eye.copy(),
                   group=np.array([0, 0, 0, 1, 1]), cold=np.zeros(n, bool), grouped=True)


def test_a_drifted_client_migrates_to_the_group_it_now_fits():
    algo = FlexCFL(max_temperature=2, warmup_rounds=0)
    state = grouped_state(algo)
    everyone = np.arange(5)
    # Client 2 drifted: its updates now point along group 1's direction, not group 0's.
    updates = {0: [1, 0.1, 0], 1: [1, -0.1, 0], 2: [0.1, 1, 0], 3: [0, 1, 0.1], 4: [0, 1, -0.1]}
    for rnd in range(2):
        ctx = RoundContext(rnd, everyone, SPEC)
        tasks = algo.plan(state, ctx)
        assert [t.meta.get("phase") for t in tasks] == [None] * 5     # nobody cold: training
        upd = algo.update(state, ctx, [train(t.client, updates[t.client], t.meta)
                                       for t in tasks])
        assert upd.round_done
        state = upd.state
    # Two rounds above its group's mean dissimilarity: temperature 2 -> 0, marked to migrate.
    np.testing.assert_array_equal(state.temperature, [2, 2, 0, 2, 2])
    np.testing.assert_array_equal(state.cold, [False, False, True, False, False])
    assert state.group[2] == 0                                   # served by group 0 until then
    ctx = RoundContext(2, np.array([1, 2, 3]), SPEC)
    tasks = algo.plan(state, ctx)
    assert [(t.client, t.meta["phase"]) for t in tasks] == [(2, "pretrain")]
    np.testing.assert_array_equal(tasks[0].params, state.initial)   # cold start from w_0
    upd = algo.update(state, ctx, [train(2, [0.2, 2.0, 0.0], tasks[0].meta)])
    assert not upd.round_done
    assert upd.state.group[2] == 1 and not upd.state.cold[2] and upd.state.temperature[2] == 2
    assert upd.events[0]["migrated"] == [2]
    step1 = algo.plan(upd.state, RoundContext(2, np.array([1, 2, 3]), SPEC, step=1))
    assert [(t.client, t.meta["group"]) for t in step1] == [(1, 0), (2, 1), (3, 1)]


def test_without_migration_a_drifted_client_stays():
    algo = FlexCFL(max_temperature=1, warmup_rounds=0, migration=False)
    state = grouped_state(algo)
    ctx = RoundContext(0, np.arange(5), SPEC)
    tasks = algo.plan(state, ctx)
    upd = algo.update(state, ctx, [train(t.client, [0, 1, 0] if t.client == 2 else [1, 0, 0],
                                         t.meta) for t in tasks])
    assert not upd.state.cold.any() and upd.state.group[2] == 0


def test_intra_group_fedavg_sets_the_model_and_the_latest_direction():
    algo = FlexCFL(warmup_rounds=0, migration=False)
    state = grouped_state(algo)
    ctx = RoundContext(0, np.array([0, 1, 3]), SPEC)
    tasks = algo.plan(state, ctx)
    upd = algo.update(state, ctx, [train(0, [1, 0, 0], tasks[0].meta, 10),
                                   train(1, [0, 0, 3], tasks[1].meta, 30),
                                   train(3, [0, 2, 0], tasks[2].meta, 10)])
    # Group 0: (1, 0, 0) + (10 (1,0,0) + 30 (0,0,3)) / 40; group 1: (0, 1, 0) + (0, 2, 0).
    np.testing.assert_allclose(upd.state.models, [[1.25, 0, 2.25], [0, 3, 0]])
    np.testing.assert_allclose(upd.state.directions, [[0.25, 0, 2.25], [0, 2, 0]])


def test_options_are_checked():
    with pytest.raises(ValueError, match="direction"):
        FlexCFL(direction="first")
    with pytest.raises(ValueError, match="group_lr"):
        FlexCFL(group_lr=-1.0)
    with pytest.raises(ValueError, match="pretrain_scale"):
        FlexCFL(pretrain_scale=0)


def test_one_group_on_an_iid_federation():
    cfg = tiny_config("flexcfl", scenario={"kind": "iid", "clients": 8},
                      train={"rounds": 3, "participation": 1.0, "local_epochs": 2,
                             "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                      eval={"every": 3}, run={"checkpoint_every": 0})
    summary = run_config(merge(cfg, {"algorithm": {"name": "flexcfl", "warmup_rounds": 2}}))
    assert summary["clustering"]["n_clusters"] == 1


@pytest.mark.parametrize("direction, joined", [("total", 1), ("latest", 0)])
def test_a_newcomer_compares_with_the_groups_path_or_latest_update(direction, joined):
    algo = FlexCFL(warmup_rounds=0, direction=direction)
    state = grouped_state(algo)
    # Paths from w_0 = 0: group 0 (1, 0, 0), group 1 (0, 3, 0); latest updates: group 0
    # (0, 1, 0), group 1 (1, 0, 0). The newcomer's (0.5, 1, 0) is nearest group 1's path
    # (cos 0.89 against 0.45) and group 0's latest update (0.89 against 0.45).
    state = replace(state, models=np.array([[1, 0, 0], [0, 3, 0]], np.float32),
                    directions=np.array([[0, 1, 0], [1, 0, 0]], np.float32),
                    cold=np.array([False, False, True, False, False]))
    ctx = RoundContext(4, np.array([2]), SPEC)
    tasks = algo.plan(state, ctx)
    upd = algo.update(state, ctx, [train(2, [0.5, 1.0, 0.0], tasks[0].meta)])
    assert upd.state.group[2] == joined


def test_the_group_cold_start_makes_groups_from_the_pretrained_updates():
    algo = FlexCFL(warmup_rounds=0)
    n = 12
    state = algo.init(Setup(n, np.ones(60, np.float32), np.full(n, 10), 0))
    ctx = RoundContext(0, np.arange(n), SPEC)
    tasks = algo.plan(state, ctx)
    assert {t.meta["phase"] for t in tasks} == {"pretrain"}
    updates = blobs(np.random.default_rng(5), [4, 4, 4])
    upd = algo.update(state, ctx, [train(c, updates[c], tasks[c].meta) for c in range(n)])
    assert not upd.round_done
    truth = np.repeat(np.arange(3), 4)
    assert adjusted_rand_score(truth, upd.state.group) == 1.0
    for g in range(3):   # each group's model: w_0 plus its members' mean update
        members = upd.state.group == g
        np.testing.assert_allclose(upd.state.models[g], 1 + updates[members].mean(0), rtol=1e-5)
    step1 = algo.plan(upd.state, RoundContext(0, np.arange(n), SPEC, step=1))
    assert [t.meta["group"] for t in step1] == upd.state.group.tolist()


def test_under_sampling_the_group_cold_start_pools_pretraining_over_rounds():
    """4 of 12 clients a round (3 groups of 4): one round's sample holds 1-2 members of a
    group, too few to group it. The cold start pools ceil(12 / 4) = 3 rounds of pre-training
    from w_0 and groups all 12 exactly; nobody is grouped before. Under full participation
    it groups in the first round, as before."""
    n = 12
    updates = blobs(np.random.default_rng(5), [4, 4, 4])
    truth = np.repeat(np.arange(3), 4)
    algo = FlexCFL(warmup_rounds=0)
    state = algo.init(Setup(n, np.ones(60, np.float32), np.full(n, 10), 0))
    for rnd, sampled in enumerate(([0, 1, 4, 8], [2, 5, 9, 10], [3, 6, 7, 11])):
        assert (state.group == NONE).all()
        ctx = RoundContext(rnd, np.array(sampled), SPEC)
        tasks = algo.plan(state, ctx)
        assert {t.meta["phase"] for t in tasks} == {"pretrain"}
        state = algo.update(state, ctx, [train(t.client, updates[t.client], t.meta)
                                         for t in tasks]).state
    assert adjusted_rand_score(truth, state.group) == 1.0
    assert state.pool_clients is None                          # the pool is let go
    one_round = FlexCFL(warmup_rounds=0, pretrain_rounds=1)    # the old rule
    state = one_round.init(Setup(n, np.ones(60, np.float32), np.full(n, 10), 0))
    ctx = RoundContext(0, np.array([0, 1, 4, 8]), SPEC)
    state = one_round.update(state, ctx, [train(t.client, updates[t.client], t.meta)
                                          for t in one_round.plan(state, ctx)]).state
    assert (state.group[[2, 3, 5, 6, 7, 9, 10, 11]] == NONE).all()
    assert adjusted_rand_score(truth[[0, 1, 4, 8]], state.group[[0, 1, 4, 8]]) < 1.0
    with pytest.raises(ValueError, match="pretrain_rounds"):
        FlexCFL(pretrain_rounds=0)

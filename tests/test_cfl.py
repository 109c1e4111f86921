"""CFL (Sattler et al.): the engine, the parameter tree, newcomers, privacy, congruence."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
from helpers import comparable, tiny_config
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms import RoundContext, Setup, build_algorithm
from clusterfed.algorithms.cfl import maths as cfl_math
from clusterfed.algorithms.cfl.algorithm import CFLState, Node
from clusterfed.algorithms.cfl.tree import (
    join_leaf,
    path_models,
    remove_clients,
    route_one_level,
    split_leaf,
)
from clusterfed.client import ClientResult, TaskKind, TrainSpec
from clusterfed.clustering.similarity import gram_matrix
from clusterfed.config import merge
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import Simulation, run_config
from clusterfed.state import dumps, loads

SPEC = TrainSpec(lr=0.1, batch_size=10)


def toy(clients: int = 8, rounds: int = 30, scenario: dict | None = None, **options) -> dict:
    """Digits with 4 disjoint label swaps: the contract suite's toy mixture, 3 local epochs."""
    base = tiny_config("cfl", scenario=scenario or {"kind": "label_swap", "clients": clients,
                                                    "clusters": 4},
                       train={"rounds": rounds, "participation": 1.0, "local_epochs": 3,
                              "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                       eval={"every": 10}, run={"checkpoint_every": 0})
    return merge(base, {"algorithm": {"name": "cfl", "min_child_size": 2, **options}})


def splits(out) -> list[dict]:
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["type"] == "split"]


def hand_state(members: list[int], d: int = 3) -> CFLState:
    n = max(members) + 2
    return CFLState(nodes=(Node(members=np.array(members), parent=-1),), leaves=np.array([0]),
                    models=np.zeros((1, d), np.float32),
                    client_node=np.zeros(n, dtype=np.int64), joined=np.ones(n, dtype=bool),
                    last_split=np.array([-1]))


def result(client: int, update, leaf: int = 0, n: int = 10) -> ClientResult:
    return ClientResult(client, TaskKind.TRAIN, n, update=np.asarray(update, np.float32),
                        loss=1.0, meta={"leaf": leaf})


# The engine on hand-made updates ------------------------------------------------------------

def test_split_of_opposed_groups_by_hand():
    """Two groups with opposite updates: the cluster splits into exactly those groups."""
    algo = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 0.5, "eps2": 1.0})
    state = algo.init(Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0))
    ctx = RoundContext(0, np.arange(4), SPEC)
    ups = [[2, 0.1], [-2, 0.1], [2, -0.1], [-2, -0.1]]   # clients 0, 2 vs 1, 3
    upd = algo.update(state, ctx, [result(c, u) for c, u in enumerate(ups)])
    (event,) = upd.events
    assert event["type"] == "split" and event["parts"] == [[0, 2], [1, 3]]
    # Mean norm 0 < eps1 and max norm ~2 > eps2; alpha_cross_max = cos of (2, .1), (-2, .1).
    assert event["alpha_cross_max"] == pytest.approx((-4 + 0.01) / (4 + 0.01), abs=1e-6)
    new = upd.state
    assert [n.members.tolist() for n in new.nodes[1:]] == [[0, 2], [1, 3]]
    np.testing.assert_array_equal(new.nodes[0].model, [0, 0])  # theta* of the root
    np.testing.assert_allclose(new.models, [[2, 0], [-2, 0]], atol=1e-6)  # own mean updates
    view = algo.clusters(new)
    assert view.assignment.tolist() == [0, 1, 0, 1]
    # Algorithm 3's recursion restarts both children from theta*_parent instead.
    alg3 = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 0.5, "eps2": 1.0,
                            "mode": "alg3"})
    restarted = alg3.update(state, ctx, [result(c, u) for c, u in enumerate(ups)]).state
    np.testing.assert_array_equal(restarted.models, np.zeros((2, 2)))


def four_directions(seed: int = 0, per_group: int = 3) -> list[list[float]]:
    """Updates of 4 groups at the joint stationary point: +-e1, +-e2 plus a little noise."""
    rng = np.random.default_rng(seed)
    axes = np.array([[1, 0, 0, 0], [-1, 0, 0, 0], [0, 1, 0, 0], [0, -1, 0, 0]], float)
    return [(axes[g] + 0.05 * rng.standard_normal(4)).tolist()
            for g in range(4) for _ in range(per_group)]


def test_split_into_groups_finds_every_group_in_the_round_of_the_first_split():
    """Four groups whose updates point along +-e1, +-e2: split_into "groups" tests each side of
    the first bipartition again on its centred similarities and ends with the 4 groups in one
    round; split_into "two" (the paper) stops at one bipartition; one group (noise around
    one direction) never splits."""
    setup = Setup(12, np.zeros(4, np.float32), np.full(12, 10), 0)
    ctx = RoundContext(0, np.arange(12), SPEC)
    options = {"name": "cfl", "rho": None, "similarity_memory": 1, "split_into": "groups"}
    truth = np.repeat(np.arange(4), 3)
    for seed in range(3):
        results = [result(c, u) for c, u in enumerate(four_directions(seed))]
        algo = build_algorithm(options)
        upd = algo.update(algo.init(setup), ctx, results)
        found = algo.clusters(upd.state).assignment
        assert len(upd.state.leaves) == 4
        assert adjusted_rand_score(truth, found) == 1.0
        assert sum(e["type"] == "split" for e in upd.events) == 3
        paper = build_algorithm({**options, "split_into": "two"})
        assert len(paper.update(paper.init(setup), ctx, results).state.leaves) == 2
        rng = np.random.default_rng(seed)
        one = [result(c, [1.0, 0, 0, 0] + 0.3 * rng.standard_normal(4)) for c in range(12)]
        assert len(algo.update(algo.init(setup), ctx, one).state.leaves) == 1
    with pytest.raises(ConfigError, match="split_into"):
        build_algorithm({"name": "cfl", "acceptance": "fixed", "split_into": "groups"})
    assert build_algorithm({"name": "cfl", "acceptance": "fixed"}).split_into == "two"
    assert build_algorithm({"name": "cfl"}).split_into == "groups"   # the default


def test_bipartitions_nest_when_one_side_of_each_is_disjoint():
    members = np.arange(8)
    # Cuts of the groups {0, 1} {2, 3} {4, 5} {6, 7}: off the first group, then the last.
    assert cfl_math.bipartitions_nest(members, [0, 1], [6, 7])
    assert cfl_math.bipartitions_nest(members, [0, 1], [0, 1, 2, 3])
    assert cfl_math.bipartitions_nest(members, [0, 1, 2, 3], [2, 3, 4, 5, 6, 7])
    assert cfl_math.bipartitions_nest(members, [0, 1], [0, 1])
    assert not cfl_math.bipartitions_nest(members, [0, 1, 2, 3], [0, 1, 4, 5])
    assert not cfl_math.bipartitions_nest(members, [0, 2], [0, 1])


def test_centred_similarity_is_the_cosine_of_the_directions_minus_their_mean():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    centred = unit - unit.mean(axis=0)
    want = centred @ centred.T / np.outer(*[np.linalg.norm(centred, axis=1)] * 2)
    np.testing.assert_allclose(cfl_math.centred_similarity(unit @ unit.T), want, atol=1e-12)


def test_no_split_when_criteria_or_gamma_test_fail():
    ups = [[2, 0.1], [-2, 0.1], [2, -0.1], [-2, -0.1]]
    ctx = RoundContext(0, np.arange(4), SPEC)
    setup = Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0)
    # Max norm below eps2 (Eq. 33 fails): no attempt at all.
    algo = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 0.5, "eps2": 5.0})
    assert list(algo.update(algo.init(setup), ctx,
                            [result(c, u) for c, u in enumerate(ups)]).events) == []
    # Nearly parallel updates: alpha_cross_max ~ 0.98, sqrt((1 - a)/2) ~ 0.1 <= gamma_max 0.3.
    near = [[1, 0.0], [1, 0.2], [1, 0.01], [1, 0.21]]
    algo = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 5.0, "eps2": 0.5,
                            "gamma_max": 0.3})
    (event,) = algo.update(algo.init(setup), ctx,
                           [result(c, u) for c, u in enumerate(near)]).events
    assert event["type"] == "split_rejected" and event["reason"] == "gamma_max test failed"
    # split_on "fresh": a member that did not report this round blocks the split (spec A9).
    algo = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 0.5, "eps2": 1.0,
                            "split_on": "fresh"})
    partial = algo.update(algo.init(setup), RoundContext(0, np.arange(3), SPEC),
                          [result(c, u) for c, u in enumerate(ups[:3])])
    assert list(partial.events) == [] and len(partial.state.leaves) == 1


def test_latest_updates_split_a_cluster_no_round_samples_whole():
    """split_on "latest" (A9): half the clients report each round; the second round completes
    every member's latest update, and the split is tested (norms too) on all four."""
    ups = {0: [2, 0.1], 1: [-2, 0.1], 2: [2, -0.1], 3: [-2, -0.1]}   # 0, 2 vs 1, 3
    setup = Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0)

    def two_rounds(samples=([0, 1], [2, 3]), **options):
        algo = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 0.5,
                                "eps2": 1.0, "confirmations": 1, **options})
        state, infos, events = algo.init(setup), [], []
        for rnd, sampled in enumerate(samples):
            upd = algo.update(state, RoundContext(rnd, np.array(sampled), SPEC),
                              [result(c, ups[c]) for c in sampled])
            state, infos, events = upd.state, [*infos, upd.metrics["cfl"]["0"]], [
                *events, *upd.events]
        return state, infos, events

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")               # as other libraries' filters leave it
        state, infos, events = two_rounds(split_on="fresh")   # nobody's round is whole
    assert events == [] and len(state.leaves) == 1
    # said once a run, not each round
    assert ["split_on=latest" in str(w.message) for w in caught] == [True]
    assert state.warned_partial
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # and "latest" has nothing to warn of
        state, infos, (event,) = two_rounds()         # the default
    assert "latest_mean_norm" not in infos[0]         # round 0: clients 2, 3 not heard yet
    assert event["type"] == "split" and event["parts"] == [[0, 2], [1, 3]]
    # Tested on all four: their mean is 0, the largest norm sqrt(4.01); 1 round stale.
    assert infos[1]["latest_mean_norm"] == pytest.approx(0.0, abs=1e-6)
    assert infos[1]["latest_max_norm"] == pytest.approx(np.sqrt(4.01), rel=1e-6)
    assert infos[1]["oldest_update"] == 1
    assert event["mean_norm"] == pytest.approx(0.0, abs=1e-6)
    # Round 0 moved the root by clients 0, 1's mean (0, 0.1); the children add their
    # members' latest updates to it: (2, 0) and (-2, 0).
    np.testing.assert_array_equal(state.nodes[0].model, np.array([0, 0.1], np.float32))
    np.testing.assert_allclose(state.models, [[2, 0.1], [-2, 0.1]], atol=1e-6)
    assert state.latest_updates == {} and state.latest_rounds == {}   # the leaf is gone
    # A lone reporter completing the record splits the cluster the same way.
    (event,) = two_rounds(([0, 1, 2], [3]), split_on="latest")[2]
    assert event["type"] == "split" and event["parts"] == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="split_on='latest'"):
        build_algorithm({"name": "cfl", "split_on": "latest", "similarity_from": "gradients"})


def test_a_split_on_latest_updates_needs_nesting_bipartitions_on_consecutive_tests():
    """Partial rounds test mostly repeated updates, so one accepted test proves little: the
    split waits until nesting bipartitions are accepted on `confirmations` (3) tests in a row.
    Groups that hold split on the third test; reporters that change sides each round (noise
    drawing a crossing bipartition every test) never split, where one test would have split
    them."""
    setup = Setup(6, np.zeros(2, np.float32), np.full(6, 10), 0)
    side = {c: 1.0 if c % 2 == 0 else -1.0 for c in range(6)}   # 0, 2, 4 against 1, 3, 5
    rounds = ([0, 1, 2], [3, 4, 5], [0, 1], [2, 3], [4, 5])

    def run(flips=(), **options):
        algo = build_algorithm({"name": "cfl", "rho": None, "similarity_memory": 1,
                                **options})
        state, split_rounds = algo.init(setup), []
        for rnd, sampled in enumerate(rounds):
            for c in flips[rnd] if rnd < len(flips) else ():
                side[c] = -side[c]
            upd = algo.update(state, RoundContext(rnd, np.array(sampled), SPEC),
                              [result(c, [side[c], 0.01 * c]) for c in sampled])
            state = upd.state
            split_rounds += [rnd for e in upd.events if e["type"] == "split"]
        return state, split_rounds

    state, split_rounds = run()
    assert split_rounds == [3]                   # tests at rounds 1, 2, 3: the third splits
    assert sorted(map(list, (state.nodes[v].members for v in state.leaves))) == [
        [0, 2, 4], [1, 3, 5]]
    assert run(confirmations=1)[1] == [1]        # the first test alone
    # Each round two reporters change sides: every test accepts a different bipartition.
    side.update({c: 1.0 if c % 2 == 0 else -1.0 for c in range(6)})
    flips = ((), (), (0, 1), (2, 3), (4, 5))
    state, split_rounds = run(flips)
    assert split_rounds == [] and len(state.leaves) == 1
    side.update({c: 1.0 if c % 2 == 0 else -1.0 for c in range(6)})
    assert run(flips, confirmations=1)[1] == [1]
    with pytest.raises(ConfigError, match="confirmations"):
        build_algorithm({"name": "cfl", "confirmations": 0})


def test_split_on_defaults_to_latest_and_whole_rounds_keep_no_cache():
    """The default tests latest updates (gradients: this round's); on whole rounds it is
    "fresh" exactly, keeping no cache until a round is partial."""
    assert build_algorithm({"name": "cfl"}).split_on == "latest"
    assert build_algorithm({"name": "cfl", "similarity_from": "gradients"}).split_on == "fresh"
    ups = {0: [2, 0.1], 1: [-2, 0.1], 2: [2, -0.1], 3: [-2, -0.1]}
    setup = Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0)

    def rounds(split_on, samples):
        algo = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 0.5,
                                "eps2": 1.0, "warmup_rounds": 2, "split_on": split_on})
        state, events = algo.init(setup), []
        for rnd, sampled in enumerate(samples):
            upd = algo.update(state, RoundContext(rnd, np.array(sampled), SPEC),
                              [result(c, ups[c]) for c in sampled])
            state, events = upd.state, [*events, *upd.events]
        return state, events

    whole = [[0, 1, 2, 3]] * 3
    (fresh, fresh_events), (latest, latest_events) = (rounds(m, whole)
                                                      for m in ("fresh", "latest"))
    assert [e["parts"] for e in fresh_events] == [e["parts"] for e in latest_events] == [
        [[0, 2], [1, 3]]]
    np.testing.assert_array_equal(fresh.models, latest.models)
    assert rounds("latest", whole[:2])[0].latest_updates == {}   # before the split
    # Whole rounds, then a partial one: the cache starts there, with its reporters only.
    state, events = rounds("latest", [[0, 1, 2, 3], [0, 1]])
    assert events == [] and state.latest_rounds[0].tolist() == [1, 1, -1, -1]


def test_latest_updates_survive_a_checkpoint():
    algo = build_algorithm({"name": "cfl", "split_on": "latest"})
    state = algo.init(Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0))
    state = algo.update(state, RoundContext(0, np.array([1, 3]), SPEC),
                        [result(1, [1, 0]), result(3, [0, 1], n=7)]).state
    back = loads(dumps(state))
    assert {c: u.tolist() for c, u in back.latest_updates[0].items()} == {1: [1, 0], 3: [0, 1]}
    assert back.latest_rounds[0].tolist() == [-1, 0, -1, 0]
    assert back.latest_samples[0].tolist() == [0, 10, 0, 7]
    # A checkpoint from when the rows were one member-order array goes on the same way.
    old = replace(back, latest_updates={0: np.array([[0, 0], [1, 0], [0, 0], [0, 1]],
                                                    np.float32)})
    for start in (back, old):
        upd = algo.update(start, RoundContext(1, np.array([0, 2]), SPEC),
                          [result(0, [2, 0]), result(2, [0, 2])])
        assert upd.metrics["cfl"]["0"]["latest_max_norm"] == pytest.approx(2.0)
        assert upd.metrics["cfl"]["0"]["oldest_update"] == 1


def test_latest_gram_follows_the_cache_round_by_round():
    """split_on "latest" keeps the Gram matrix of the cached updates and recomputes only a
    round's reporters' rows: after every round it equals the whole matrix of the cache, also
    across a whole round (which drops it) and a checkpoint."""
    rng = np.random.default_rng(0)
    m, d = 12, 40
    algo = build_algorithm({"name": "cfl", "split_on": "latest", "warmup_rounds": 10**6})
    state = algo.init(Setup(m, np.zeros(d, np.float32), np.full(m, 10), 0))
    samples = [np.arange(6), np.arange(6, m)] + [rng.choice(m, 5, replace=False)
                                                 for _ in range(6)]
    samples[4] = np.arange(m)                              # a whole round
    seen = 0
    for rnd, sampled in enumerate(samples):
        sampled = np.sort(sampled)
        upd = algo.update(state, RoundContext(rnd, sampled, SPEC),
                          [result(int(c), rng.normal(size=d)) for c in sampled])
        state = loads(dumps(upd.state)) if rnd == 2 else upd.state
        cache = state.latest_updates.get(0, {})
        if 0 in state.latest_grams:
            seen += 1
            whole = gram_matrix(np.stack([cache[c] for c in range(m)]))
            np.testing.assert_allclose(state.latest_grams[0], whole, rtol=1e-10)
        else:
            assert rnd in (0, 4), rnd                     # built once the cache is complete
    assert seen == 6 and len(state.leaves) == 1


def test_second_level_split_maps_positions_to_client_ids():
    """The authors' code stores sub-matrix positions as ids below the root; we must not."""
    state = hand_state([1, 2, 4, 5, 7, 8])
    ups = np.eye(3, dtype=np.float32)[[0, 1, 1, 0, 1, 0]]    # 1, 5, 8 vs 2, 4, 7
    parts = (np.array([0, 3, 5]), np.array([1, 2, 4]))
    new = split_leaf(state, 0, parts, ups, np.ones(6), rnd=4, restart=False)
    assert [n.members.tolist() for n in new.nodes[1:]] == [[1, 5, 8], [2, 4, 7]]
    assert new.client_node[[1, 5, 8]].tolist() == [1, 1, 1]
    assert new.client_node[[2, 4, 7]].tolist() == [2, 2, 2]
    np.testing.assert_array_equal(new.nodes[1].edge_updates, ups[[0, 3, 5]])   # Eq. 47
    assert new.nodes[0].split_round == 4 and new.leaves.tolist() == [1, 2]
    # One level further down: split node 2's members [2, 4, 7] at positions [1] | [0, 2].
    deeper = split_leaf(new, 2, (np.array([1]), np.array([0, 2])), ups[[1, 2, 4]], np.ones(3),
                        rnd=9, restart=False)
    assert [n.members.tolist() for n in deeper.nodes[3:]] == [[4], [2, 7]]
    assert deeper.leaves.tolist() == [1, 3, 4]
    assert len(path_models(deeper, 4)) == 3   # root, node 2, leaf 3


def test_routing_descends_to_the_most_similar_child_and_joins():
    state = hand_state([0, 1, 2, 3])
    ups = np.array([[1, 0, 0], [1, 0.1, 0], [0, 1, 0], [0, 1, 0.1]], np.float32)
    state = split_leaf(state, 0, (np.array([0, 1]), np.array([2, 3])), ups, np.ones(4), 3,
                       restart=False)
    joined = state.joined.copy()
    joined[4] = False
    state = CFLState(**{**state.__dict__, "joined": joined})
    routed, event = route_one_level(state, 4, 0, np.array([0.1, 2.0, 0.0], np.float32))
    assert event["to"] == 2 and event["joined"]
    assert routed.client_node[4] == 2 and routed.joined[4]
    assert 4 in routed.nodes[2].members and 4 in routed.nodes[0].members
    # Ties go to the second child, as Algorithm 4's box says.
    symmetric = split_leaf(hand_state([0, 1, 2, 3]), 0, (np.array([0, 1]), np.array([2, 3])),
                           np.eye(3, dtype=np.float32)[[0, 0, 1, 1]], np.ones(4), 3,
                           restart=False)
    tie, event = route_one_level(symmetric, 4, 0, np.array([1, 1, 0], np.float32))
    assert event["alpha"][0] == pytest.approx(event["alpha"][1])
    assert tie.client_node[4] == 2
    left = remove_clients(routed, [1])
    assert 1 not in left.nodes[1].members and not left.joined[1]
    assert join_leaf(left, 1, 1).joined[1]


@pytest.mark.parametrize("split_on", ["fresh", "latest"])
def test_a_cluster_that_never_splits_is_fedavg_bit_for_bit(split_on):
    # Warm-up beyond the run: the one cluster aggregates as FedAvg does (samples-weighted, A1),
    # with the same sampler, seeds and model, so a run that never splits is FedAvg exactly.
    options = {"name": "cfl", "split_on": split_on, "warmup_rounds": 10**6}
    cfl = Simulation(merge(tiny_config("cfl", scenario={"kind": "label_swap", "clients": 8,
                                                        "clusters": 4, "quantity_skew": 0.8}),
                           {"algorithm": options}))
    fedavg = Simulation(tiny_config("fedavg", scenario={"kind": "label_swap", "clients": 8,
                                                        "clusters": 4, "quantity_skew": 0.8}))
    a, b = cfl.run(), fedavg.run()
    assert a["clustering"]["n_clusters"] == 1
    assert comparable(a)["final"] == comparable(b)["final"]
    np.testing.assert_array_equal(cfl.state.models[0], fedavg.state.model)


def test_bad_options():
    for options, message in [({"eps1": 0.1}, "both eps1 and eps2"),
                             ({"gamma_max": 1.0}, "gamma_max"),
                             ({"bipartition": "ward"}, "bipartition"),
                             ({"mode": "alg4"}, "mode"),
                             ({"min_split_size": 1}, "min_split_size"),
                             ({"patience": 0}, "patience"),
                             ({"gamma_ratio": 0.0}, "gamma_ratio"),
                             ({"acceptance": "loose"}, "acceptance"),
                             ({"similarity_memory": 0}, "similarity_memory")]:
        with pytest.raises(ConfigError, match=message):
            build_algorithm({"name": "cfl", **options})
    algo = build_algorithm({"name": "cfl", "newcomers": [9]})
    with pytest.raises(ValueError, match="client 9 does not exist"):
        algo.init(Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0))


# Whole runs on digits -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cfl-toy")
    return out, run_config(toy(), out)


def test_toy_mixture_recovers_the_true_clusters_and_beats_fedavg(toy_run):
    out, summary = toy_run
    assert summary["clustering"]["ari"] == pytest.approx(1.0)
    assert summary["clustering"]["n_clusters"] == 4
    assert len(splits(out)) == 3                       # k - 1 splits, never merged
    fedavg = run_config(merge(toy(), {"algorithm": {"name": "fedavg"}}))
    assert summary["final"]["mean_accuracy"] >= fedavg["final"]["mean_accuracy"] + 0.10


def test_privacy_on_and_off_give_identical_clusterings_and_accuracy(toy_run, tmp_path):
    out, summary = toy_run
    private = run_config(merge(toy(), {"run": {"privacy": "permutation", "privacy_seed": 7}}),
                         tmp_path)
    assert comparable(private) == comparable(summary)
    plain, hidden = splits(out), splits(tmp_path)
    assert [(e["round"], e["parts"]) for e in hidden] == [(e["round"], e["parts"]) for e in plain]
    assert [e["alpha_cross_max"] for e in hidden] == pytest.approx(
        [e["alpha_cross_max"] for e in plain], abs=1e-9)


def test_newcomers_land_in_their_true_clusters_leaf():
    # 12 clients, 3 per true cluster; one per cluster joins after the tree is built.
    newcomers = [2, 5, 8, 11]
    cfg = toy(clients=12, rounds=32, newcomers=newcomers, join_round=30)
    sim = Simulation(cfg)
    sim.run()
    state, true = sim.state, sim.federation.true_clusters
    assert len(state.leaves) == 4 and state.joined.all()
    for c in newcomers:
        leaf = state.nodes[int(state.client_node[c])]
        mates = [m for m in leaf.members.tolist() if m != c]
        assert mates and all(true[m] == true[c] for m in mates), (c, leaf.members)


def test_congruent_clients_never_split_and_incongruent_ones_keep_large_updates(tmp_path):
    """Fig. 7's contrast with ten clients: an iid federation (congruent by construction) never
    splits at the defaults; two label-swap groups (incongruent) keep a large largest client
    update while the congruent one's falls (Section VI-B), the signal eps2 is read from."""
    congruent = {"kind": "iid", "clients": 10}
    incongruent = {"kind": "label_swap", "clients": 10, "clusters": 2}
    summary = run_config(toy(scenario=congruent, rounds=30), tmp_path / "split")
    assert summary["clustering"]["n_clusters"] == 1 and not splits(tmp_path / "split")
    late_max = {}
    for name, scenario in (("congruent", congruent), ("incongruent", incongruent)):
        out = tmp_path / name
        run_config(toy(scenario=scenario, rounds=30, warmup_rounds=10**6), out)  # no split
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        late_max[name] = np.mean([m["cfl"]["0"]["max_norm"] for m in metrics[20:]])
    assert late_max["incongruent"] > 1.3 * late_max["congruent"], late_max   # 1.03 vs 0.69


def test_half_participation_splits_only_on_latest_updates_and_not_an_iid_federation():
    """Four clients of eight a round: "fresh" never sees a cluster whole and stays one model;
    "latest" recovers the 4 label-swap groups exactly (measured: 96.2 % against 74.1 %) and
    keeps an iid federation whole."""
    def run(scenario=None, **options):
        cfg = merge(toy(scenario=scenario, rounds=50, **options),
                    {"train": {"participation": 0.5}})
        return run_config(cfg)

    fresh, latest = run(split_on="fresh"), run()   # the default: latest
    assert fresh["clustering"]["n_clusters"] == 1
    assert latest["clustering"]["n_clusters"] == 4
    assert latest["clustering"]["ari"] == pytest.approx(1.0)
    assert latest["final"]["mean_accuracy"] >= fresh["final"]["mean_accuracy"] + 0.10
    iid = run({"kind": "iid", "clients": 8})
    assert iid["clustering"]["n_clusters"] == 1


def test_patience_needs_the_criteria_on_consecutive_rounds():
    algo = build_algorithm({"name": "cfl", "acceptance": "fixed", "eps1": 0.5, "eps2": 1.0,
                            "patience": 2})
    state = algo.init(Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0))
    opposed = [[2, 0.1], [-2, 0.1], [2, -0.1], [-2, -0.1]]
    calm = [[0.1, 0], [0.1, 0], [0.1, 0], [0.1, 0]]           # max norm below eps2

    def step(state, ups, rnd):
        return algo.update(state, RoundContext(rnd, np.arange(4), SPEC),
                           [result(c, u) for c, u in enumerate(ups)]).state

    once = step(state, opposed, 0)
    assert len(once.leaves) == 1 and once.streaks == {0: 1}
    interrupted = step(step(once, calm, 1), opposed, 2)
    assert len(interrupted.leaves) == 1 and interrupted.streaks == {0: 1}
    twice = step(once, opposed, 1)
    assert len(twice.leaves) == 2 and twice.streaks == {}


def test_best_of_path_reports_the_best_validating_model_on_each_path():
    from clusterfed.algorithms.cfl.tree import path_models as paths
    cfg = merge(toy(), {"eval": {"protocol": "best_of_path", "validation_fraction": 0.2,
                                 "every": 30}})
    sim = Simulation(cfg)
    summary = sim.run()
    metrics = json.loads(json.dumps(summary))
    assert len(sim.state.leaves) > 1
    for c in range(8):
        path = paths(sim.state, c)
        val = [sim.executor.evaluate(m, [c], split="validation")[0, 1] for m in path]
        best = len(val) - 1 - int(np.argmax(val[::-1]))
        test_acc = sim.executor.evaluate(path[best], [c])[0, 1]
        assert metrics["final"]["per_client_accuracy"][c] == pytest.approx(test_acc, abs=1e-6)


def test_every_round_logs_norms_alpha_gamma_bound_and_the_true_separation_gap(toy_run):
    from clusterfed.algorithms.cfl.maths import separation_gap
    out, summary = toy_run
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    true = np.array(summary["clustering"]["true_assignment"])
    for m in metrics:
        for info in m["cfl"].values():
            assert {"mean_norm", "max_norm", "alpha_cross_max", "gamma_bound"} <= set(info)
            assert info["gamma_bound"] == pytest.approx(
                np.sqrt((1 - info["alpha_cross_max"]) / 2))
        assert set(m["separation_gap"]) == set(m["cfl"])
    # At a split round the logged gap is g(alpha) of the split's own similarity matrix (a
    # side retested within that split, split_into "groups", is tested on centred similarities).
    for e in (e for e in splits(out) if "within_split_of" not in e):
        gap = separation_gap(np.array(e["similarity"]), true[e["members"]])
        assert metrics[e["round"] - 1]["separation_gap"][str(e["node"])] == pytest.approx(
            gap, abs=1e-4)


def test_gradient_mode_runs_the_gradient_tasks_and_logs_their_similarity(tmp_path):
    """With similarity_from=gradients every member also computes a GRADIENT at its cluster's
    model each round, and the logged similarity is theirs (which signal the split follows is
    checked by hand in test_defaults.py)."""
    summary = run_config(toy(similarity_from="gradients", rounds=3), tmp_path)
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert not any(e["type"] == "rejected_result" for e in events)
    assert summary["rounds"] == 3


def test_algorithm_3_mode_builds_the_same_tree_on_the_toy(toy_run, tmp_path):
    out, summary = toy_run
    run_config(toy(mode="alg3"), tmp_path)

    def tree(folder):  # each split as {child, child}; the rounds may differ, the tree not
        return sorted(sorted(e["parts"]) for e in splits(folder))

    assert tree(tmp_path) == tree(out) and len(tree(out)) == 3

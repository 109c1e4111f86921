"""FL+HC: FedAvg rounds, the all-client clustering round, per-cluster FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import tiny_config, weak_groups

from clusterfed.algorithms import RoundContext, Setup, build_algorithm
from clusterfed.algorithms.flhc.algorithm import FLHC, clients_in_cluster, sample_in_cluster
from clusterfed.client.runtime import evaluation_runs
from clusterfed.config import merge
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import Simulation
from clusterfed.tasks import ClientResult, TaskKind, TrainSpec

SPEC = TrainSpec(lr=0.1, batch_size=10)


def fake_results(tasks, updates):
    return [ClientResult(t.client, TaskKind.TRAIN, 10, updates[t.client], 0.0, meta=t.meta)
            for t in tasks]


def clustering_setup(n=9, d=6):
    """Three known groups of update directions over n clients."""
    truth = np.arange(n) % 3
    directions = np.eye(d)[:3] * 2.0
    rng = np.random.default_rng(0)
    updates = (directions[truth] + 0.01 * rng.normal(size=(n, d))).astype(np.float32)
    setup = Setup(n, np.arange(d, dtype=np.float32), np.full(n, 10), seed=5)
    return setup, updates, truth


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="ward linkage needs the l2"):
        build_algorithm({"name": "flhc", "metric": "cosine", "linkage": "ward"})
    for bad in ({"features": "gradients"}, {"rounds_before_clustering": -1},
                {"threshold_mode": "clusters", "threshold": 0.5}, {"participation": 1.5},
                {"cluster_rounding": "ceil"}):
        with pytest.raises(ConfigError):
            build_algorithm({"name": "flhc", **bad})


def test_k_choice_modes_options_are_checked():
    with pytest.raises(ConfigError, match="reads no threshold"):
        build_algorithm({"name": "flhc", "threshold": 0.3})
    with pytest.raises(ConfigError, match="k_choice is read by threshold_mode 'k_choice'"):
        build_algorithm({"name": "flhc", "threshold_mode": "absolute", "threshold": 3.0,
                         "k_choice": {"selector": "eigengap"}})
    # The shared group's flat keys reach FL+HC's group too.
    assert build_algorithm({"name": "flhc", "k_max": 4}).k_choice.k_max == 4


def cluster_once(algo, setup, updates):
    state = algo.init(setup)
    ctx = RoundContext(0, np.arange(setup.num_clients), SPEC)
    return algo.update(state, ctx, fake_results(algo.plan(state, ctx), updates))


def test_the_default_cut_is_the_k_choice_groups_choice():
    """Three tight direction groups, group 2 near group 0: the default (`silhouette_gap_width`)
    and the old silhouette mode take the three; k_choice.k = 2 cuts the tree into two, merging
    the near pair; k_max 2 lets the selector see no more than two."""
    n, d = 12, 6
    truth = np.arange(n) % 3
    directions = np.array([[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0.45, 0, 0, 0, 0]])
    rng = np.random.default_rng(1)
    updates = (directions[truth] + 0.02 * rng.normal(size=(n, d))).astype(np.float32)
    setup = Setup(n, np.zeros(d, dtype=np.float32), np.full(n, 10), seed=5)
    default = cluster_once(FLHC(rounds_before_clustering=0), setup, updates)
    np.testing.assert_array_equal(default.state.assignment, truth)
    assert default.events[0]["threshold_mode"] == "k_choice"
    assert default.events[0]["threshold"] is None
    old = cluster_once(FLHC(rounds_before_clustering=0, threshold_mode="silhouette"), setup,
                       updates)
    np.testing.assert_array_equal(old.state.assignment, truth)
    two = np.where(truth == 2, 0, truth)
    for options in ({"k": 2}, {"k_max": 2}):
        got = cluster_once(FLHC(rounds_before_clustering=0, k_choice=options), setup, updates)
        np.testing.assert_array_equal(got.state.assignment, two)
    # Two noisy groups 0.1 apart: the silhouette rule's floor (0.25) cuts two clusters; at 0
    # it lets a third (silhouette 0.21) through.
    pair = np.arange(n) % 2
    near = np.array([[1, 0, 0, 0, 0, 0], [1, 0.1, 0, 0, 0, 0]])
    rng = np.random.default_rng(1)
    updates = (near[pair] + 0.05 * rng.normal(size=(n, d))).astype(np.float32)
    rule = {"selector": "silhouette"}
    kept = cluster_once(FLHC(rounds_before_clustering=0, k_choice=rule), setup, updates)
    assert kept.state.assignment.max() + 1 == 2
    floor = cluster_once(FLHC(rounds_before_clustering=0,
                              k_choice={**rule, "min_silhouette": 0.0}), setup, updates)
    assert floor.state.assignment.max() + 1 == 3


def test_the_default_finds_groups_the_silhouette_rule_calls_one_and_no_group_in_none():
    """FL+HC's and IFCA's default (options.UPDATES_K_CHOICE: the silhouette rule, else the gap
    statistic) finds the four groups whose silhouettes fall under the silhouette rule's floor
    (which says one), and one cluster where there is none."""
    truth, grouped, alike = weak_groups()
    setup = Setup(len(truth), np.zeros(grouped.shape[1], dtype=np.float32),
                  np.full(len(truth), 10), seed=5)
    default = cluster_once(FLHC(rounds_before_clustering=0), setup, grouped)
    np.testing.assert_array_equal(default.state.assignment, truth)
    rule = cluster_once(FLHC(rounds_before_clustering=0, k_choice={"selector": "silhouette"}),
                        setup, grouped)
    assert rule.state.assignment.max() == 0
    assert cluster_once(FLHC(rounds_before_clustering=0), setup, alike
                        ).state.assignment.max() == 0


def test_clustering_round_tasks_every_client_whatever_the_sample():
    setup, updates, truth = clustering_setup()
    algo = FLHC(rounds_before_clustering=2, metric="l2", linkage="average",
                threshold=3, threshold_mode="clusters")
    state = algo.init(setup)
    before = algo.plan(state, RoundContext(1, np.array([4]), SPEC))
    assert [t.client for t in before] == [4]
    tasks = algo.plan(state, RoundContext(2, np.array([4]), SPEC))
    assert [t.client for t in tasks] == list(range(9))
    assert all(np.array_equal(t.params, setup.initial_params) for t in tasks)
    upd = algo.update(state, RoundContext(2, np.array([4]), SPEC), fake_results(tasks, updates))
    np.testing.assert_array_equal(upd.state.assignment, truth)
    assert not upd.round_done   # the round's FedAvg step follows the clustering
    # Paper (A4 default): every cluster model starts from w_n.
    assert upd.state.models.shape == (3, 6)
    assert all(np.array_equal(m, setup.initial_params) for m in upd.state.models)
    event = upd.events[0]
    assert event["type"] == "hierarchical_clustering" and len(event["tree"]) == 8
    assert event["cluster_sizes"] == [3, 3, 3]


def test_clusters_can_start_from_their_clustering_round_updates():
    setup, updates, truth = clustering_setup()
    algo = FLHC(rounds_before_clustering=0, metric="cosine", linkage="complete",
                threshold=0.5, threshold_mode="silhouette", reuse_clustering_updates=True)
    state = algo.init(setup)
    ctx = RoundContext(0, np.arange(9), SPEC)
    upd = algo.update(state, ctx, fake_results(algo.plan(state, ctx), updates))
    assert upd.round_done
    for c in range(3):
        expected = setup.initial_params + updates[truth == c].astype(np.float64).mean(0)
        np.testing.assert_allclose(upd.state.models[c], expected, rtol=1e-6)


def test_per_cluster_rounds_sample_a_fraction_of_each_cluster_and_average_within_it():
    setup, updates, truth = clustering_setup(n=12)
    algo = FLHC(rounds_before_clustering=0, metric="l2", linkage="ward", threshold=3,
                threshold_mode="clusters")
    state = algo.init(setup)
    ctx = RoundContext(0, np.arange(6), SPEC)   # the run samples C = 6 / 12 = 0.5
    state = algo.update(state, ctx, fake_results(algo.plan(state, ctx), updates)).state
    ctx = RoundContext(3, np.arange(6), SPEC)
    tasks = algo.plan(state, ctx)
    for c in range(3):
        chosen = [t.client for t in tasks if t.meta["cluster"] == c]
        assert len(chosen) == 2 and set(chosen) <= set(np.flatnonzero(truth == c))
        assert all(np.array_equal(t.params, state.models[c]) for t in tasks
                   if t.meta["cluster"] == c)
    assert [t.client for t in algo.plan(state, ctx)] == [t.client for t in tasks]
    new = algo.update(state, ctx, fake_results(tasks, updates)).state
    for c in range(3):
        chosen = [t.client for t in tasks if t.meta["cluster"] == c]
        np.testing.assert_allclose(new.models[c], state.models[c] + updates[chosen].mean(0),
                                   rtol=1e-6)


def test_within_cluster_counts_and_samples():
    assert clients_in_cluster(0.2, 25) == 5
    assert clients_in_cluster(0.2, 4) == 1            # at least one
    assert clients_in_cluster(0.3, 5) == 1            # floor (spec A5)
    assert clients_in_cluster(0.3, 5, "round") == 2
    members = np.array([2, 5, 7, 11, 13])
    a = sample_in_cluster(1, 4, 0, members, 2)
    assert a.tolist() == sample_in_cluster(1, 4, 0, members, 2).tolist()
    assert set(a.tolist()) <= set(members.tolist()) and len(a) == 2
    draws = {tuple(sample_in_cluster(1, r, 0, members, 2)) for r in range(20)}
    assert len(draws) > 3   # rounds draw different clients


def test_the_first_n_rounds_are_fedavg_exactly():
    records = {"fedavg": [], "flhc": []}

    def keep(name):
        return lambda completed, record: records[name].append(record)

    fedavg = Simulation(tiny_config("fedavg", train={"rounds": 3}), callbacks=[keep("fedavg")])
    fedavg_summary = fedavg.run()
    flhc_cfg = merge(tiny_config("flhc", train={"rounds": 3}),
                     {"algorithm": {"name": "flhc", "rounds_before_clustering": 3}})
    flhc = Simulation(flhc_cfg, callbacks=[keep("flhc")])
    flhc_summary = flhc.run()
    np.testing.assert_array_equal(flhc.state.models[0], fedavg.state.model)
    assert flhc_summary["final"] == fedavg_summary["final"]
    assert records["flhc"] == records["fedavg"]
    # A longer run branches after round 3 and keeps the shared rounds.
    longer = Simulation(merge(flhc_cfg, {"train": {"rounds": 4}}), callbacks=[keep("flhc")])
    longer.run()
    assert records["flhc"][3:6] == records["fedavg"]
    assert "flhc_clustering" in records["flhc"][6]


class RecordingExecutor:
    """Wraps the simulator's executor and records which model each client is evaluated with
    (one entry per model sent to a run of EVALUATE tasks)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def run(self, tasks, round_index, step=0):
        for run in evaluation_runs(tasks):
            if tasks[run[0]].kind is TaskKind.EVALUATE:
                self.calls.append((tasks[run[0]].params.copy(), [tasks[i].client for i in run]))
        return self.inner.run(tasks, round_index, step)

    def train_sizes(self):
        return self.inner.train_sizes()

    def test_sizes(self):
        return self.inner.test_sizes()


def test_every_client_is_evaluated_every_round_with_its_assigned_model():
    cfg = merge(tiny_config("flhc", train={"rounds": 4, "participation": 0.5},
                            eval={"every": 1, "target_accuracy": 0.5}),
                {"algorithm": {"name": "flhc", "rounds_before_clustering": 1, "metric": "l2",
                               "linkage": "ward", "threshold": 4, "threshold_mode": "clusters"}})
    probe = Simulation(cfg)
    recorder = RecordingExecutor(probe.executor)
    per_round = []

    def collect(completed, record):
        per_round.append((record, list(recorder.calls)))
        recorder.calls.clear()

    sim = Simulation(cfg, executor=recorder, callbacks=[collect])
    summary = sim.run()
    assert len(per_round) == 4
    for record, calls in per_round:
        evaluated = sorted(c for _, clients in calls for c in clients)
        assert evaluated == list(range(8))
        acc = np.array(record["per_client_accuracy"])
        assert record["clients_at_target"] == pytest.approx(np.mean(acc >= 0.5))
    # After the last round, each client's model is its cluster's.
    view = sim.algorithm.clusters(sim.state)
    assert view.num_clusters == 4 and summary["clustering"]["n_clusters"] == 4
    for params, clients in per_round[-1][1]:
        for c in clients:
            np.testing.assert_array_equal(params, view.models[view.assignment[c]])
    # Before clustering, one model for all; from round 2 on, the clusters' models.
    assert len(per_round[0][1]) == 1 and len(per_round[1][1]) == 4
    assert per_round[1][0]["flhc_clustering"]["clustering_clients"] == 8


def test_a_client_missing_from_the_clustering_round_gets_its_own_cluster():
    setup, updates, truth = clustering_setup()
    algo = FLHC(rounds_before_clustering=0, metric="l1", linkage="single", threshold=3,
                threshold_mode="clusters")
    state = algo.init(setup)
    ctx = RoundContext(0, np.arange(9), SPEC)
    tasks = [t for t in algo.plan(state, ctx) if t.client != 4]
    new = algo.update(state, ctx, fake_results(tasks, updates)).state
    assert new.assignment[4] == 3 and len(new.models) == 4
    np.testing.assert_array_equal(np.delete(new.assignment, 4), np.delete(truth, 4))


def test_a_run_interrupted_after_clustering_resumes_to_the_same_numbers(tmp_path):
    from test_contract import StopAfter

    from clusterfed.sim.simulation import resume_run, run_config

    cfg = merge(tiny_config("flhc", train={"rounds": 4}, run={"checkpoint_every": 2}),
                {"algorithm": {"name": "flhc", "rounds_before_clustering": 1,
                               "threshold_mode": "clusters", "threshold": 3}})
    whole = run_config(cfg, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, tmp_path / "broken", callbacks=[StopAfter(3)])
    resumed = resume_run(tmp_path / "broken")   # from round 2's checkpoint: clustered state
    assert {k: v for k, v in resumed.items() if k != "wall_seconds"} == \
        {k: v for k, v in whole.items() if k != "wall_seconds"}
    assert (tmp_path / "broken" / "metrics.jsonl").read_text() == \
        (tmp_path / "whole" / "metrics.jsonl").read_text()


def test_a_given_partition_continues_exactly_as_the_run_that_found_it():
    """Tables IV/V from one run: a partition found by clustering, given in advance, yields the
    same rounds after the clustering round without training that round."""
    records = {"found": [], "given": []}

    def keep(name):
        return lambda completed, record: records[name].append(record)

    base = merge(tiny_config("flhc", train={"rounds": 5}),
                 {"algorithm": {"name": "flhc", "rounds_before_clustering": 2,
                                "threshold_mode": "clusters", "threshold": 3.0,
                                "record_distances": True}})
    found = Simulation(base, callbacks=[keep("found")])
    found.run()
    labels = found.state.assignment.tolist()
    assert len(set(labels)) == 3
    given_cfg = merge(base, {"algorithm": {"partition": labels, "record_distances": False}})
    given = Simulation(given_cfg, callbacks=[keep("given")])
    given.run()
    np.testing.assert_array_equal(given.state.assignment, found.state.assignment)
    np.testing.assert_array_equal(given.state.models, found.state.models)
    # The clustering round's record differs only in what that round trained: nothing here.
    def same(r):
        drop = ("flhc_clustering", "train_loss") if "flhc_clustering" in r else ()
        return {k: v for k, v in r.items() if k not in drop and not k.endswith("seconds")}

    assert [same(r) for r in records["given"]] == [same(r) for r in records["found"]]
    assert records["given"][2]["flhc_clustering"]["clustering_clients"] == 0


def test_recorded_distances_recut_to_the_runs_own_clusters():
    from clusterfed.clustering import hierarchical as hc

    setup, updates, truth = clustering_setup()
    algo = FLHC(rounds_before_clustering=0, metric="l1", linkage="complete",
                threshold_mode="clusters", threshold=3.0, record_distances=True)
    state = algo.init(setup)
    ctx = RoundContext(0, np.arange(9), SPEC)
    upd = algo.update(state, ctx, fake_results(algo.plan(state, ctx), updates))
    event = upd.events[0]
    assert set(event["distances"]) == {"l1", "l2", "cosine"}
    for metric, condensed in event["distances"].items():
        brute = [np.abs(updates[i] - updates[j]).sum() if metric == "l1" else
                 np.linalg.norm(updates[i] - updates[j]) if metric == "l2" else
                 1 - updates[i] @ updates[j] / np.linalg.norm(updates[i]) /
                 np.linalg.norm(updates[j]) for i in range(9) for j in range(i + 1, 9)]
        np.testing.assert_allclose(condensed, brute, rtol=1e-5, atol=1e-6)
    recut = hc.cluster_condensed(np.array(event["distances"]["l1"]), "complete", 3.0,
                                 "clusters").labels
    assert recut.tolist() == event["labels"]
    np.testing.assert_array_equal(upd.state.assignment, truth)


def test_a_given_partition_must_fit():
    with pytest.raises(ValueError, match="0..k-1"):
        FLHC(partition=(0, 2, 2))
    setup, _, _ = clustering_setup()
    with pytest.raises(ValueError, match="lists 3 clients"):
        FLHC(partition=(0, 1, 1)).init(setup)


def test_pairings_cut_every_pairing_from_one_run_and_train_only_distinct_partitions(tmp_path):
    from clusterfed.experiments import flhc_pairings as fp

    config = merge(tiny_config("flhc", train={"rounds": 3}),
                   {"algorithm": {"name": "flhc", "rounds_before_clustering": 1,
                                  "metric": "l2", "linkage": "ward",
                                  "threshold_mode": "clusters", "threshold": 4.0}})
    result = fp.run_pairings(config, tmp_path, train=True, baseline=True, taus=(2.0, 4.0),
                             mode="clusters")
    rows = result["rows"]
    assert len(rows) == 10 * 2 and len(fp.PAIRINGS) == 10
    # The preset's own pairing at its own cut is the probe run's partition.
    own = next(r for r in rows if (r["metric"], r["linkage"], r["tau"]) == ("l2", "ward", 4.0))
    assert own["labels"] == result["preset_cut"]["labels"]
    trained = sorted(p.name for p in (tmp_path / "partitions").iterdir())
    assert len(trained) == len(result["partitions"]) - 1    # the probe's own is not rerun
    for row in rows:
        assert row["n_clusters"] == len(set(row["labels"])) <= row["tau"]
        assert row["r50"]["mean_accuracy"] is not None
    assert len(fp.best_rows(rows)) == 10
    table = (tmp_path / "table.md").read_text()
    assert "| FedAvg |" in table
    assert "acc r3 |" in table and "r50" not in table   # the run's own last round, named
    # The toy's 4 label-swap groups: every pairing's best cut is scored and, where trained, read.
    assert len(result["best_cuts"]) == 10 and "Any cut of each tree" in table
    assert all(c["r50"]["mean_accuracy"] is not None for c in result["best_cuts"]
               if tuple(c["labels"]) in {tuple(p) for p in result["partitions"]})
    # --finished reads back what has finished and trains nothing: a partition cut off (no
    # summary) loses its figures and stays untrained.
    cut_off = tmp_path / "partitions" / trained[0]
    (cut_off / "summary.json").unlink()
    partial = fp.run_pairings(config, tmp_path, taus=(2.0, 4.0), mode="clusters",
                              finished_only=True)
    assert not (cut_off / "summary.json").exists()
    missing = [r for r in partial["rows"] if "r50" not in r]
    assert missing and len(missing) < len(partial["rows"])
    # Two runs at a time train the same partitions to the same figures.
    both = fp.run_pairings(config, tmp_path / "two", train=True, baseline=True,
                           taus=(2.0, 4.0), mode="clusters", jobs=2)
    assert [r.get("r50") for r in both["rows"]] == [r["r50"] for r in rows]
    assert both["baseline"] == result["baseline"]


def test_pairings_clustering_reads_a_cut_off_probe_and_says_when_there_is_nothing_yet(tmp_path):
    import json

    from clusterfed.experiments import flhc_pairings as fp

    config = merge(tiny_config("flhc", train={"rounds": 3}),
                   {"algorithm": {"name": "flhc", "rounds_before_clustering": 1,
                                  "metric": "l2", "linkage": "ward",
                                  "threshold_mode": "clusters", "threshold": 4.0}})
    with pytest.raises(ConfigError, match="has no run"):
        fp.read_clustering(config, tmp_path, taus=(2.0, 4.0), mode="clusters")
    finished = fp.run_pairings(config, tmp_path, taus=(2.0, 4.0), mode="clusters")
    table = (tmp_path / "table.md").read_text()
    # Cut off after its clustering round: the same cuts, and the finished table untouched.
    probe = tmp_path / "probe"
    (probe / "summary.json").unlink()
    cut_off = fp.read_clustering(config, tmp_path, taus=(2.0, 4.0), mode="clusters")
    def cuts(rows):   # the partitions and their scores (the finished rows add accuracies)
        return [(r["metric"], r["linkage"], r["tau"], r["labels"], r["ari"]) for r in rows]

    assert cuts(cut_off["rows"]) == cuts(finished["rows"])
    assert [c["labels"] for c in cut_off["best_cuts"]] == [
        c["labels"] for c in finished["best_cuts"]]
    assert cut_off["preset_cut"] == finished["preset_cut"]
    assert (tmp_path / "table.md").read_text() == table
    assert cuts(json.loads((tmp_path / "clustering.json").read_text())["rows"]) == cuts(
        finished["rows"])
    assert "Any cut of each tree" in (tmp_path / "clustering.md").read_text()
    # Cut off before it: nothing to read, and said so.
    events = (probe / "events.jsonl").read_text().splitlines()
    (probe / "events.jsonl").write_text("".join(
        line + "\n" for line in events if "hierarchical_clustering" not in line))
    with pytest.raises(ConfigError, match="not reached its clustering round"):
        fp.read_clustering(config, tmp_path, taus=(2.0, 4.0), mode="clusters")


def test_best_cuts_find_the_truth_in_each_tree_and_the_taus_that_cut_there():
    from clusterfed.experiments import flhc_pairings as fp

    # Two groups on a line: average linkage merges at 0.1, 0.2, 0.25, 0.5, then 46.2 / 9 (the
    # mean of the nine cross distances), so 2 clusters for taus from 0.5 / 0.25 = 2 up to
    # (46.2 / 9) / 0.25 (x the median merge height 0.25).
    x = np.array([0.0, 0.1, 0.3, 5.0, 5.2, 5.6])
    condensed = np.abs(x[:, None] - x[None, :])[np.triu_indices(6, 1)]
    distances = {m: condensed for m in ("cosine", "l2", "l1")}
    cuts = fp.best_cuts(distances, np.array([0, 0, 0, 1, 1, 1]))
    assert all(c["ari"] == pytest.approx(1.0) and c["n_clusters"] == 2 for c in cuts)
    average = next(c for c in cuts if (c["metric"], c["linkage"]) == ("l2", "average"))
    np.testing.assert_allclose(average["tau_range"], [2.0, 46.2 / 9 / 0.25])
    # A truth no cut of the tree matches: the best is one cluster (ARI 0), above every merge.
    alternating = fp.best_cuts(distances, np.array([0, 1, 0, 1, 0, 1]))
    assert all(c["n_clusters"] == 1 and c["ari"] == pytest.approx(0.0) for c in alternating)
    assert all(c["tau_range"][1] == np.inf for c in alternating)

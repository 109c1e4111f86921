"""The evaluation protocol 'mixture': each client tested with its mixture of the view's models
(FedEM's and FedRC's prediction), computed by the client, through every executor and the wire."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import executor_pair, tiny_config, uneven_digits
from torch import nn

from clusterfed import config as cfg
from clusterfed.algorithms import ClusterView
from clusterfed.client import ClientTask, TaskKind, run_task
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.work import evaluate_mixture
from clusterfed.errors import ConfigError
from clusterfed.experiments.compare import run_config_of
from clusterfed.flower.wire import check_result, decode_task, encode_task
from clusterfed.models import FlatModel
from clusterfed.sim.grouped import GroupedExecutor
from clusterfed.sim.processes import ProcessExecutor
from clusterfed.sim.protocols import PROTOCOLS, EvalContext, mixture_tasks, run_protocol
from clusterfed.sim.simulation import Simulation
from clusterfed.sim.vectorised import VectorisedExecutor
from clusterfed.tasks import match_results, numbered

# Two linear models on one-hot inputs (no bias): sample i's logits are column i of W.
# A is sure and right on sample 0, mildly wrong on sample 1; B the other way round; both are
# right on sample 2 and both wrong on sample 3. Labels 0, 1, 0, 1.
W_A = np.array([[4.0, 0.5, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
W_B = np.array([[0.0, 0.0, 2.0, 3.0], [0.5, 4.0, 0.0, 0.0]])
X = torch.eye(4)
Y = torch.tensor([0, 1, 0, 1])
WEIGHTS = np.array([0.6, 0.4])


@pytest.fixture
def linear() -> FlatModel:
    return FlatModel(nn.Linear(4, 2, bias=False))


def stacked() -> torch.Tensor:
    return torch.tensor(np.stack([W_A.ravel(), W_B.ravel()]), dtype=torch.float32)


def brute_force(logits: list[np.ndarray], weights: np.ndarray, y: np.ndarray
                ) -> tuple[float, float]:
    """-mean log sum_m w_m softmax_m[y] and the accuracy of argmax sum_m w_m softmax_m."""
    probs = sum(w * np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
                for w, z in zip(weights, logits, strict=True))
    return (float(-np.log(probs[np.arange(len(y)), y]).mean()),
            float((probs.argmax(axis=1) == y).mean()))


def test_the_mixture_is_the_brute_force_and_right_where_each_model_is_wrong(linear):
    loss, acc = evaluate_mixture(linear, stacked(), WEIGHTS, X, Y)
    want_loss, want_acc = brute_force([W_A.T, W_B.T], WEIGHTS, Y.numpy())
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert acc == want_acc == 0.75            # samples 0, 1 and 2
    # Each model alone: right on its own sample and sample 2 only.
    for alone in ([1.0, 0.0], [0.0, 1.0]):
        assert brute_force([W_A.T, W_B.T], np.array(alone), Y.numpy())[1] == 0.5
    # Through the door: an EVALUATE task with the weights answers the mixture's figures.
    task = ClientTask(0, TaskKind.EVALUATE, stacked().numpy(), mixture=WEIGHTS)
    result = run_task(linear, task, (X, Y), (X, Y), torch.Generator())
    np.testing.assert_allclose(result.losses, [want_loss], rtol=1e-6)
    np.testing.assert_allclose(result.accuracies, [0.75])
    assert result.loss == pytest.approx(want_loss, rel=1e-6)


def test_a_zero_weight_leaves_its_model_out(linear):
    three = torch.cat([stacked(), torch.full((1, 8), 50.0)])   # a third, absurd model
    with_zero = evaluate_mixture(linear, three, np.array([0.6, 0.4, 0.0]), X, Y)
    assert with_zero == pytest.approx(evaluate_mixture(linear, stacked(), WEIGHTS, X, Y))


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: ClientTask(0, TaskKind.EVALUATE, p, mixture=np.array([0.5, 0.6])), "sum to 1"),
    (lambda p: ClientTask(0, TaskKind.EVALUATE, p, mixture=np.array([1.0])), "for 2 models"),
    (lambda p: ClientTask(0, TaskKind.EVALUATE, p, mixture=np.array([1.5, -0.5])), ">= 0"),
    (lambda p: ClientTask(0, TaskKind.EVALUATE, p[0], mixture=np.array([1.0])), "stacked"),
    (lambda p: ClientTask(0, TaskKind.LOSSES, p, mixture=WEIGHTS), "EVALUATE"),
])
def test_bad_mixture_weights_are_refused(make, message):
    with pytest.raises(ConfigError, match=message):
        make(stacked().numpy())


# The protocol over an executor ----------------------------------------------------------------

def digits_view(w0: np.ndarray, weights: np.ndarray) -> ClusterView:
    models = np.stack([w0, 0.5 * w0, -w0]).astype(np.float32)
    return ClusterView(models, weights.argmax(axis=1), weights)


def evaluated(protocol: str, view: ClusterView, executor, federation) -> dict:
    ev = EvalContext(view=view, true_clusters=federation.true_clusters,
                     test_sizes=executor.test_sizes())
    counter = iter(range(0, 10**6, 1000))

    def run(tasks):
        tasks = numbered(tasks, next(counter))
        return match_results(tasks, executor.run(tasks, 0))

    return run_protocol(PROTOCOLS[protocol], ev, run)


def test_one_hot_weights_give_the_cluster_protocols_figures():
    federation = uneven_digits()
    seq, _, w0 = executor_pair(federation, VectorisedExecutor)
    served = np.array([0, 2, 1, 0, 2, 1])
    view = digits_view(w0, np.eye(3)[served])
    mixture = evaluated("mixture", view, seq, federation)
    cluster = evaluated("cluster", view, seq, federation)
    assert mixture["per_client_accuracy"] == cluster["per_client_accuracy"]
    assert mixture["mean_accuracy"] == cluster["mean_accuracy"] == \
        mixture["served_mean_accuracy"]
    assert mixture["mean_loss"] == pytest.approx(cluster["mean_loss"], rel=1e-5)
    # Each client was sent its one weighted model only.
    tasks = mixture_tasks(view, "mixture")
    assert [t.params.shape[0] for t in tasks] == [1] * 6


def test_a_soft_mixture_differs_from_the_served_model_and_tasks_share_arrays():
    federation = uneven_digits()
    seq, _, w0 = executor_pair(federation, VectorisedExecutor)
    weights = np.tile([0.5, 0.3, 0.2], (6, 1))
    weights[5] = [0.0, 0.5, 0.5]
    view = digits_view(w0, weights)
    tasks = mixture_tasks(view, "mixture")
    assert all(t.params is view.models for t in tasks[:5])   # every model: no copy
    np.testing.assert_array_equal(tasks[5].params, view.models[1:])
    np.testing.assert_allclose(tasks[5].mixture, [0.5, 0.5])
    record = evaluated("mixture", view, seq, federation)
    assert record["mean_loss"] != pytest.approx(
        evaluated("cluster", view, seq, federation)["mean_loss"], rel=1e-3)


def mixture_door_tasks(w0: np.ndarray) -> list[ClientTask]:
    models = np.stack([w0, 0.5 * w0, -w0]).astype(np.float32)
    weights = [np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.1, 0.8]), np.array([0.25, 0.75])]
    return numbered([ClientTask(c, TaskKind.EVALUATE, models[:len(w)], mixture=w)
                     for c, w in enumerate(weights)], 0)


@pytest.mark.parametrize("executor", [VectorisedExecutor, GroupedExecutor, ProcessExecutor])
def test_every_executor_gives_the_sequential_figures(executor):
    federation = uneven_digits()
    if executor is ProcessExecutor:   # two workers
        seq, _, w0 = executor_pair(federation, VectorisedExecutor)
        with ProcessExecutor(seq.model, federation, seq.seed, workers=2) as other:
            got = other.run(mixture_door_tasks(w0), 0)
    else:
        seq, other, w0 = executor_pair(federation, executor)
        got = other.run(mixture_door_tasks(w0), 0)
    want = seq.run(mixture_door_tasks(w0), 0)
    for a, b in zip(want, got, strict=True):
        assert a.task_id == b.task_id and b.losses.shape == (1,)
        np.testing.assert_allclose(b.losses, a.losses, rtol=1e-6)
        np.testing.assert_array_equal(b.accuracies, a.accuracies)
    # The vectorised path's one-model-at-a-time figures are not the mixture's.
    plain = [replace(t, mixture=None) for t in mixture_door_tasks(w0)]
    assert not np.allclose(seq.run(plain, 0)[0].losses[0], want[0].losses[0])


def test_the_privacy_transform_gives_the_same_mixture():
    federation = uneven_digits()
    seq, _, w0 = executor_pair(federation, VectorisedExecutor)
    transform = ParameterTransform.from_seed("signed_permutation", 4, len(w0))
    private, _, _ = executor_pair(federation, VectorisedExecutor, transform=transform)
    tasks = mixture_door_tasks(w0)
    hidden = [replace(t, params=transform.forward(t.params)) for t in tasks]
    for a, b in zip(seq.run(tasks, 0), private.run(hidden, 0), strict=True):
        np.testing.assert_allclose(b.losses, a.losses, rtol=1e-6)


def test_the_weights_cross_the_flower_wire_and_the_answer_is_shape_checked(linear):
    task = numbered([ClientTask(2, TaskKind.EVALUATE, stacked().numpy(), mixture=WEIGHTS)], 5)[0]
    back, _, _, _ = decode_task(encode_task(task, 0, 0, "{}"))
    np.testing.assert_array_equal(back.mixture, WEIGHTS)
    result = run_task(linear, back, (X, Y), (X, Y), torch.Generator())
    assert check_result(task, result) is None
    per_model = replace(result, losses=np.ones(2), accuracies=np.ones(2))
    assert "expected (1,)" in check_result(task, per_model)


# Configuration and runs -------------------------------------------------------------------------

def synthetic_config(algorithm: dict, **more) -> dict:
    config = tiny_config(
        algorithm["name"],
        data={"dataset": "fedem_synthetic", "clients": 6, "dimension": 10, "n_test": 40},
        scenario={"kind": "writers", "clients": 6, "select": "first"},
        model={"name": "mlp", "hidden": []},
        train={"rounds": 3, "participation": 1.0, "batch_size": 16, "lr": 0.1},
        eval={"protocol": "mixture"}, run={"progress": False, "checkpoint_every": 0,
                                            "threads": 1}, **more)
    config["algorithm"] = dict(algorithm)
    return cfg.resolve(config)


def test_a_method_serving_one_model_is_refused_before_round_one():
    sim = Simulation(synthetic_config({"name": "fedavg"}))
    with pytest.raises(ConfigError, match="eval.protocol=mixture needs a method with mixture "
                                          "weights .*fedavg serves one model per client"):
        sim.run()
    with pytest.raises(ConfigError, match="this algorithm serves one model"):
        mixture_tasks(ClusterView(np.zeros((1, 3), np.float32), np.zeros(2, np.int64)), "m")


def test_a_compare_entry_sets_its_own_eval_keys():
    config = synthetic_config({"name": "fedem", "components": 2})
    served = run_config_of(config, {"name": "fedavg", "eval": {"protocol": "cluster"}})
    assert served["eval"]["protocol"] == "cluster" and served["algorithm"] == {"name": "fedavg"}
    assert served["eval"]["every"] == config["eval"]["every"]   # the others kept
    assert run_config_of(config, {"name": "fedem"})["eval"]["protocol"] == "mixture"
    with pytest.raises(ConfigError, match="unknown eval.protocol"):
        run_config_of(config, {"name": "fedavg", "eval": {"protocol": "nope"}})
    with pytest.raises(ConfigError, match="eval must be a mapping"):
        run_config_of(config, {"name": "fedavg", "eval": "cluster"})


def test_a_compare_entry_sets_its_own_train_keys():
    """PACFL's Table 12 baselines train at their own lr and momentum beside PACFL's."""
    config = synthetic_config({"name": "fedem", "components": 2})
    entry = {"name": "fedavg", "train": {"lr": 0.1, "momentum": 0.9}}
    run = run_config_of(config, entry)
    assert (run["train"]["lr"], run["train"]["momentum"]) == (0.1, 0.9)
    assert run["train"]["rounds"] == config["train"]["rounds"]   # the others kept
    assert run["algorithm"] == {"name": "fedavg"} and entry["train"] == {"lr": 0.1,
                                                                          "momentum": 0.9}
    with pytest.raises(ConfigError, match="unknown config key train.lrr"):
        run_config_of(config, {"name": "fedavg", "train": {"lrr": 0.1}})
    with pytest.raises(ConfigError, match="train must be a mapping"):
        run_config_of(config, {"name": "fedavg", "train": 0.1})


def test_fedem_runs_with_the_mixture_and_scores_each_clients_mixture():
    sim = Simulation(synthetic_config({"name": "fedem", "components": 2}))
    summary = sim.run()
    view = sim.algorithm.clusters(sim.state)
    assert view.weights.shape == (6, 2)
    np.testing.assert_allclose(view.weights.sum(axis=1), 1.0)
    # By hand: each client's models' softmax outputs mixed with its weights, in numpy.
    acc = []
    with torch.no_grad():
        for c, client in enumerate(sim.federation.clients):
            x = torch.from_numpy(client.test_x)
            logits = [sim.model(torch.from_numpy(m), x).double().numpy() for m in view.models]
            acc.append(brute_force(logits, view.weights[c], client.test_y.astype(np.int64))[1])
    np.testing.assert_allclose(summary["final"]["per_client_accuracy"], acc, atol=1e-6)


def test_reproduce_names_a_runs_own_protocol():
    from clusterfed.experiments.reproduce import markdown, summarise

    config = synthetic_config({"name": "fedem", "components": 2})
    run = {"own": 60.0, "cluster": float("nan"), "ari": 0.0, "clusters": 1.0, "seconds": 1.0}
    result = summarise(config, {"fedem": [run], "fedavg": [run]}, [0],
                       {"fedem": "mixture", "fedavg": "cluster"})
    rows = {r["label"]: r for r in result["rows"]}
    assert "eval_protocol" not in rows["fedem"] and rows["fedavg"]["eval_protocol"] == "cluster"
    assert "| fedavg (`cluster`) |" in markdown(result) and "| fedem |" in markdown(result)

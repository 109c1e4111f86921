"""The vectorised executor and batched evaluation against the sequential executor, on CPU."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
from helpers import executor_pair, tiny_config, uneven_digits
from torch import nn

from clusterfed.client.batched import evaluate_clients, evaluate_models
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.work import evaluate
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.choice import executor_kind, resolve_device
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.simulation import Simulation
from clusterfed.sim.vectorised import VectorisedExecutor, batch_plan, module_obstacle, task_obstacle
from clusterfed.tasks import ClientTask, LossSpec, TaskKind, TrainSpec, numbered


@pytest.fixture(scope="module")
def federation():
    return uneven_digits()


def executors(federation, module=None, max_clients=None, transform=None):
    return executor_pair(federation, VectorisedExecutor, module, max_clients, transform)


def untimed(meta):
    return {k: v for k, v in meta.items() if k != "seconds"}


def assert_same(seq_results, vec_results):
    assert len(seq_results) == len(vec_results)
    for a, b in zip(seq_results, vec_results, strict=True):
        assert (a.client, a.kind, a.num_samples, untimed(a.meta), a.task_id) == \
            (b.client, b.kind, b.num_samples, untimed(b.meta), b.task_id)
        for name in ("update", "losses", "accuracies"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                np.testing.assert_allclose(y, x, rtol=1e-4, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(b.loss, a.loss, rtol=1e-5)


@pytest.mark.parametrize("spec", [
    TrainSpec(lr=0.1, batch_size=8, epochs=2),                    # unequal sizes: masked
    TrainSpec(lr=0.05, batch_size=6, epochs=None, steps=7, momentum=0.9, weight_decay=1e-3),
    TrainSpec(lr=0.5, batch_size=50, epochs=1, clip_grad_norm=0.3),   # batch > every client
])
def test_training_equals_sequential(federation, spec, one_thread):
    seq, vec, w0 = executors(federation)
    rng = np.random.default_rng(0)
    # Different starting points per client, as in a clustered round; clients out of order.
    tasks = numbered([ClientTask(c, TaskKind.TRAIN, (w0 + 0.01 * rng.standard_normal(w0.shape)
                                                     ).astype(np.float32), spec, {"leaf": c % 2})
                      for c in (4, 0, 2, 5, 1, 3)], 20)
    sizes = seq.train_sizes()
    assert len(set(sizes.tolist())) > 1   # the masking path is exercised
    assert_same(seq.run(tasks, 3, 1), vec.run(tasks, 3, 1))


@pytest.mark.parametrize("privacy", [None, "signed_permutation"])
def test_many_models_and_mixed_tasks_equal_sequential(federation, privacy):
    size = FlatModel(build_model("digits_cnn", federation.input_shape, 10)).size
    transform = privacy and ParameterTransform.from_seed(privacy, 9, size)
    # Groups split over vmap calls; with CFL's privacy transform, parameters in P-space.
    seq, vec, w0 = executors(federation, max_clients=2, transform=transform)
    if transform:   # the server sends and receives parameters in P-space
        w0 = transform.forward(w0)
    rng = np.random.default_rng(1)
    stacked = (w0 + 0.05 * rng.standard_normal((3, len(w0)))).astype(np.float32)
    spec = TrainSpec(lr=0.1, batch_size=10)
    tasks = numbered([ClientTask(0, TaskKind.LOSSES, stacked),
             ClientTask(1, TaskKind.TRAIN, w0, spec),
             ClientTask(1, TaskKind.EVALUATE, stacked),
             ClientTask(2, TaskKind.GRADIENT, w0),
             ClientTask(3, TaskKind.TRAIN, stacked[0], spec),
             ClientTask(4, TaskKind.EVALUATE, w0),
             ClientTask(5, TaskKind.TRAIN, w0, TrainSpec(lr=0.1, batch_size=4, steps=3,
                                                          epochs=None))], 7)
    assert [r.task_id for r in vec.run(tasks, 0)] == list(range(7, 14))
    assert_same(seq.run(tasks, 0), vec.run(tasks, 0))


@pytest.mark.parametrize("spec", [LossSpec(), LossSpec("train+test"),
                                  LossSpec("train", max_samples=9)])
def test_losses_with_a_loss_spec_are_vectorised_and_equal_sequential(federation, monkeypatch,
                                                                     spec):
    # LCFL's LOSSES tasks always carry a LossSpec; the subsample comes from the task's seed.
    seq, vec, w0 = executors(federation)
    stacked = (w0 + 0.05 * np.random.default_rng(2).standard_normal((3, len(w0)))
               ).astype(np.float32)
    tasks = numbered([ClientTask(c, TaskKind.LOSSES, stacked, loss=spec) for c in (3, 0, 5)], 1)
    expected = seq.run(tasks, 4, 1)
    fallback, sequential = [], SequentialExecutor.run
    monkeypatch.setattr(SequentialExecutor, "run", lambda self, tasks, *a: fallback.extend(
        t.client for t in tasks) or sequential(self, tasks, *a))
    assert_same(expected, vec.run(tasks, 4, 1))
    assert fallback == []


def test_batched_evaluation_equals_client_by_client(federation):
    module = build_model("digits_cnn", federation.input_shape, federation.n_classes)
    model = FlatModel(module)
    w = model.initial_vector()
    data = [(torch.from_numpy(c.test_x), torch.from_numpy(c.test_y)) for c in federation.clients]
    data.insert(2, (data[0][0][:0], data[0][1][:0]))   # a client without test data
    expected = np.array([evaluate(model, w, x, y) for x, y in data])
    for rows in (7, 1000):   # chunks across client boundaries, and everything at once
        np.testing.assert_allclose(evaluate_clients(model, w, data, rows=rows), expected,
                                   rtol=1e-5, atol=1e-7)
    stacked = torch.stack([w, w * 0.5, -w])
    x, y = data[0]
    losses, accs = evaluate_models(model, stacked, x, y, rows=8)
    np.testing.assert_allclose(losses, [evaluate(model, v, x, y)[0] for v in stacked], rtol=1e-5)
    np.testing.assert_allclose(accs, [evaluate(model, v, x, y)[1] for v in stacked])


def test_clients_with_the_same_test_data_are_scored_once(monkeypatch):
    """`test: all` with a label permutation: every client of a cluster holds the same test
    set. Each (model, test set) is scored once; every client still gets its figures."""
    from clusterfed.client import runtime
    from clusterfed.data import build_federation, load_dataset
    fed = build_federation(load_dataset("digits"),
                           {"kind": "label_permutation", "clients": 6, "clusters": 2,
                            "test": "all", "samples_per_client": 40}, seed=0)
    torch.manual_seed(0)
    seq = SequentialExecutor(FlatModel(build_model("digits_cnn", fed.input_shape, 10)), fed, 0)
    w = seq.model.initial_vector().numpy()
    scored: list[int] = []
    real = runtime.evaluate_clients
    monkeypatch.setattr(runtime, "evaluate_clients",
                        lambda model, p, data, **k: scored.append(len(data)) or real(model, p,
                                                                                     data, **k))
    together = seq.evaluate(w, [5, 0, 1, 3, 2, 4])   # clusters 1, 0, 0, 1, 0, 1
    assert scored == [2]                              # one test set a permutation
    alone = np.array([seq.evaluate(w, [c])[0] for c in (5, 0, 1, 3, 2, 4)])
    np.testing.assert_allclose(together, alone, rtol=1e-6)
    assert together[1, 0] != together[0, 0]           # the permutations differ (loss)
    scored.clear()
    distinct = uneven_digits()                        # each client its own test share
    other = SequentialExecutor(FlatModel(build_model("digits_cnn", distinct.input_shape, 10)),
                               distinct, 0)
    other.evaluate(w, [0, 1, 2])
    assert scored == [3]


def test_batch_norm_falls_back_with_a_notice(federation, caplog):
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(),
                           nn.Linear(16, 10))
    assert "batch norm" in module_obstacle(module)
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        seq, vec, w0 = executors(federation, module=module)
    assert "batch norm" in caplog.text and "sequentially" in caplog.text
    tasks = [ClientTask(c, TaskKind.TRAIN, w0, TrainSpec(lr=0.1, batch_size=10))
             for c in range(3)]
    assert_same(seq.run(tasks, 0), vec.run(tasks, 0))


@dataclasses.dataclass(frozen=True)
class ProxSpec(TrainSpec):
    """A train spec with an extra this executor does not know (as FedProx would add)."""

    mu: float = 0.0


def test_tasks_with_unknown_extras_run_sequentially(federation, caplog, monkeypatch):
    seq, vec, w0 = executors(federation)
    calls = []
    monkeypatch.setattr(VectorisedExecutor, "_train_group",
                        lambda self, tasks, *a: calls.append(tasks) or ["vmap"] * len(tasks))
    plain = ClientTask(0, TaskKind.TRAIN, w0, ProxSpec(lr=0.1, batch_size=10))   # mu = default
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        vec.run([ClientTask(1, TaskKind.TRAIN, w0, ProxSpec(lr=0.1, batch_size=10, mu=0.1)),
                 ClientTask(2, TaskKind.TRAIN, w0, TrainSpec(lr=0.1, batch_size=10),
                            meta={"control": np.zeros(3)})], 0)
    assert calls == []
    assert "'mu'" in caplog.text and "'control'" in caplog.text
    assert vec.run([plain], 0) == ["vmap"]   # an extra at its default value is vectorised
    assert len(calls) == 1
    # IFCA's candidate sets (not the client's own model) train like any plain task.
    assert task_obstacle(dataclasses.replace(plain, own_model=False, id=3)) is None


def test_batch_plan_matches_the_sequential_order():
    spec = TrainSpec(lr=0.1, batch_size=4)
    plan = batch_plan(10, spec, 7, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    first, second = torch.randperm(10, generator=gen), torch.randperm(10, generator=gen)
    assert plan.shape == (7, 4)
    np.testing.assert_array_equal(plan[0], first[:4])
    np.testing.assert_array_equal(plan[2, :2], first[8:])
    assert (plan[2, 2:] == -1).all()
    np.testing.assert_array_equal(plan[3], second[:4])


def test_simulation_with_the_vectorised_executor_equals_sequential():
    results = {}
    for kind in ("sequential", "vectorised"):
        cfg = tiny_config("fedavg", train={"rounds": 2}, run={"executor": kind, "device": "cpu",
                                                               "threads": 1})
        sim = Simulation(cfg)
        assert type(sim.executor).__name__.lower().startswith(kind[:6])
        results[kind] = (sim.run(), sim.algorithm.clusters(sim.state).models)
    (a, ma), (b, mb) = results["sequential"], results["vectorised"]
    np.testing.assert_allclose(mb, ma, rtol=1e-4, atol=1e-6)
    assert b["final"]["mean_loss"] == pytest.approx(a["final"]["mean_loss"], rel=1e-4)


def test_executor_choice():
    cpu = torch.device("cpu")
    assert executor_kind("auto", cpu) == "sequential"
    assert executor_kind("auto", torch.device("cuda")) == "vectorised"
    assert executor_kind("vectorised", cpu) == "vectorised"
    assert resolve_device("cpu") == cpu
    with pytest.raises(ConfigError, match="run.executor"):
        Simulation(tiny_config("fedavg", run={"executor": "parallel"}))
    with pytest.raises(ConfigError, match="run.device"):
        resolve_device("no-such-device")


def test_flat_model_call_fills_tied_parameters_and_restores_them():
    shared = nn.Linear(4, 4)
    module = nn.Sequential(shared, nn.ReLU(), shared)   # one weight in two slots
    flat = FlatModel(module)
    assert flat.size == 20
    w = torch.randn(20)
    x = torch.randn(3, 4)
    parts = flat.unflatten(w)
    manual = torch.relu(x @ parts["0.weight"].T + parts["0.bias"]) @ parts["0.weight"].T \
        + parts["0.bias"]
    torch.testing.assert_close(flat(w, x), manual)
    assert module[0].weight is shared.weight and isinstance(module[2].weight, nn.Parameter)
    torch.testing.assert_close(torch.func.vmap(flat, in_dims=(0, None))(torch.stack([w, w]), x)[1],
                               manual)


def test_losses_over_more_than_a_thousand_models_equal_the_sequential_ones(federation):
    # LCFL at M > 1000: models go in chunks (not one image per call), and the shared stack is
    # uploaded once for all clients' tasks.
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    seq, vec, w0 = executors(federation, module=module)
    rng = np.random.default_rng(0)
    stack = (w0 + 0.1 * rng.standard_normal((1200, len(w0)))).astype(np.float32)
    tasks = [ClientTask(c, TaskKind.LOSSES, stack) for c in range(3)]
    expected, got = seq.run(tasks, 0), vec.run(tasks, 0)
    assert vec._stack(stack) is vec._stack(stack)    # one upload while the array is shared
    for e, g in zip(expected, got, strict=True):
        assert g.losses.shape == (1200,)
        np.testing.assert_allclose(g.losses, e.losses, rtol=1e-5)
    model = FlatModel(module)
    x, y = (torch.from_numpy(federation.clients[0].train_x),
            torch.from_numpy(federation.clients[0].train_y))
    losses, accs = evaluate_models(model, torch.from_numpy(stack[:130]), x, y, rows=1000)
    np.testing.assert_allclose(losses, [evaluate(model, torch.from_numpy(v), x, y)[0]
                                        for v in stack[:130]], rtol=1e-5)


def test_many_models_keep_many_samples_per_call(federation):
    # The old chunking gave 1000 // 1200 -> 1 image per call: 1 call per image per chunk.
    model = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    calls = []

    def counted(w, x):
        calls.append(x.shape[0])
        return model(w, x)

    stack = model.initial_vector().expand(1200, -1).contiguous()
    x, y = (torch.from_numpy(federation.clients[0].train_x),
            torch.from_numpy(federation.clients[0].train_y))
    evaluate_models(counted, stack, x, y, rows=1000)
    assert max(calls) >= min(256, len(y)) and len(calls) <= 1200 // 3 + 1

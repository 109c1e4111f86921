"""The grouped executor (clients as one wider model) against the sequential executor, on CPU."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os

import numpy as np
import pytest
import torch
from helpers import EXECUTOR_SEED, executor_pair, tiny_config, uneven_digits
from torch import nn

from clusterfed.client.privacy import ParameterTransform
from clusterfed.models import FlatModel, build_model
from clusterfed.models.grouped import GroupedModel, grouped_obstacle
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.grouped import GroupedExecutor
from clusterfed.sim.simulation import Simulation
from clusterfed.tasks import ClientTask, LocalObjective, LossSpec, TaskKind, TrainSpec


@pytest.fixture(scope="module")
def federation():
    return uneven_digits()


def executors(federation, module=None, max_clients=None, transform=None):
    return executor_pair(federation, GroupedExecutor, module, max_clients, transform)


def assert_same(seq_results, grp_results):
    assert len(seq_results) == len(grp_results)
    for a, b in zip(seq_results, grp_results, strict=True):
        untimed = [{k: v for k, v in r.meta.items() if k != "seconds"} for r in (a, b)]
        assert (a.client, a.kind, a.num_samples, untimed[0]) == \
            (b.client, b.kind, b.num_samples, untimed[1])
        for name in ("update", "losses"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                np.testing.assert_allclose(y, x, rtol=1e-4, atol=2e-6, err_msg=name)
        if a.accuracies is not None:
            np.testing.assert_array_equal(b.accuracies, a.accuracies)
        np.testing.assert_allclose(b.loss, a.loss, rtol=1e-5)


@pytest.mark.parametrize(("name", "shape"), [
    ("cfl_convnet", (1, 28, 28)), ("cnn_femnist_tiny", (1, 28, 28)), ("digits_cnn", (1, 8, 8)),
    ("lenet5", (3, 32, 32)), ("mlp", (1, 28, 28)), ("fedavg_cnn", (1, 28, 28)),
    ("cnn_cifar_small", (3, 32, 32)), ("cnn5_cifar", (3, 32, 32))])
def test_grouped_model_equals_each_copy(name, shape):
    module = build_model(name, shape, 10, normalize={"mean": [0.5] * shape[0],
                                                      "std": [0.25] * shape[0]})
    flat, grouped = FlatModel(module), GroupedModel(module)
    gen = torch.Generator().manual_seed(0)
    w = flat.initial_vector() + 0.01 * torch.randn(3, flat.size, generator=gen)
    x = torch.randn(3, 4, *shape, generator=gen)
    params = grouped.pack(w)
    assert torch.equal(grouped.unpack(params), w)
    each = torch.stack([flat(w[k], x[k]) for k in range(3)])
    torch.testing.assert_close(grouped(params, x), each, rtol=1e-5, atol=1e-5)
    shared = torch.stack([flat(w[k], x[0]) for k in range(3)])
    torch.testing.assert_close(grouped.forward_shared(params, x[0]), shared, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("spec", [
    TrainSpec(lr=0.1, batch_size=8, epochs=2),            # unequal sizes: steps and batches
    TrainSpec(lr=0.05, batch_size=6, epochs=None, steps=7, momentum=0.9, weight_decay=1e-3),
    TrainSpec(lr=0.05, batch_size=5, epochs=1, momentum=0.5, weight_decay=1e-2),
    TrainSpec(lr=0.5, batch_size=50, epochs=1, clip_grad_norm=0.3),   # batch > every client
])
@pytest.mark.parametrize("max_clients", [None, 4])
def test_training_equals_sequential(federation, spec, max_clients, one_thread):
    seq, grp, w0 = executors(federation, max_clients=max_clients)
    rng = np.random.default_rng(0)
    # Different starting points per client, as in a clustered round; clients out of order.
    tasks = [ClientTask(c, TaskKind.TRAIN, (w0 + 0.01 * rng.standard_normal(w0.shape)
                                            ).astype(np.float32), spec, {"leaf": c % 2})
             for c in (4, 0, 2, 5, 1, 3)]
    steps = {spec.num_steps(n) for n in seq.train_sizes().tolist()}
    assert spec.steps or len(steps) > 1   # clients leave the group at different steps
    assert_same(seq.run(tasks, 3, 1), grp.run(tasks, 3, 1))


def test_mlp_and_privacy_and_mixed_tasks_equal_sequential(federation):
    module = build_model("mlp", federation.input_shape, 10, hidden=[32])
    size = FlatModel(module).size
    transform = ParameterTransform.from_seed("signed_permutation", 9, size)
    seq, grp, w0 = executors(federation, module=module, max_clients=2, transform=transform)
    w0 = transform.forward(w0)
    rng = np.random.default_rng(1)
    stacked = (w0 + 0.05 * rng.standard_normal((3, len(w0)))).astype(np.float32)
    spec = TrainSpec(lr=0.1, batch_size=10)
    tasks = [ClientTask(0, TaskKind.LOSSES, stacked),
             ClientTask(1, TaskKind.TRAIN, w0, spec),
             ClientTask(1, TaskKind.EVALUATE, stacked),
             ClientTask(2, TaskKind.GRADIENT, w0),
             ClientTask(3, TaskKind.TRAIN, stacked[0], spec),
             ClientTask(4, TaskKind.EVALUATE, w0),
             ClientTask(5, TaskKind.TRAIN, w0, TrainSpec(lr=0.1, batch_size=4, steps=3,
                                                          epochs=None))]
    assert_same(seq.run(tasks, 0), grp.run(tasks, 0))


@pytest.mark.parametrize("spec", [None, LossSpec("train+test"), LossSpec("train", max_samples=9)])
def test_many_models_are_grouped_and_equal_sequential(federation, monkeypatch, spec):
    seq, grp, w0 = executors(federation)
    stacked = (w0 + 0.05 * np.random.default_rng(2).standard_normal((40, len(w0)))
               ).astype(np.float32)
    tasks = [ClientTask(c, TaskKind.LOSSES, stacked, loss=spec) for c in (3, 0, 5)]
    tasks += [ClientTask(c, TaskKind.EVALUATE, stacked[:5]) for c in (1, 2)]
    expected = seq.run(tasks, 4, 1)
    fallback, sequential = [], SequentialExecutor.run
    monkeypatch.setattr(SequentialExecutor, "run", lambda self, tasks, *a: fallback.extend(
        t.client for t in tasks) or sequential(self, tasks, *a))
    # A small budget: models in several groups, data in several chunks.
    monkeypatch.setattr("clusterfed.sim.grouped.ACTIVATION_FLOATS", 3000)
    grp.widest = 512
    assert_same(expected, grp.run(tasks, 4, 1))
    assert fallback == []


ADAM = {"optimizer": "adam", "lr": 0.01}
OBJECTIVE_SPECS = [
    TrainSpec(lr=0.1, batch_size=8, epochs=2),
    TrainSpec(lr=0.05, batch_size=6, epochs=1, momentum=0.9, weight_decay=1e-3,
              clip_grad_norm=0.5),
]


@pytest.mark.parametrize("spec", OBJECTIVE_SPECS)
@pytest.mark.parametrize("max_clients", [None, 2])
def test_local_objectives_train_grouped_and_equal_sequential(federation, spec, max_clients,
                                                            monkeypatch, one_thread):
    """FedProx (start and named anchor), SCAFFOLD's correction, per-sample weights and
    Per-FedAvg's meta steps train grouped, each client with its own vectors, to the sequential
    path's updates and losses."""
    seq, grp, w0 = executors(federation, max_clients=max_clients)
    fallback, sequential = [], SequentialExecutor.run
    monkeypatch.setattr(SequentialExecutor, "run", lambda self, tasks, *a: (
        fallback.extend(t.client for t in tasks) if self is grp else None) or sequential(
        self, tasks, *a))
    rng = np.random.default_rng(3)
    sizes = seq.train_sizes().tolist()

    def vector(scale: float) -> np.ndarray:
        return (scale * rng.standard_normal(w0.shape)).astype(np.float32)

    def start() -> np.ndarray:
        return (w0 + vector(0.01)).astype(np.float32)

    tasks = []
    for c in (4, 0, 2):   # FedProx, towards the start: a large mu so the pull shows
        tasks.append(ClientTask(c, TaskKind.TRAIN, start(), spec,
                                objective=LocalObjective(prox_mu=1.0)))
    for c in (1, 5):      # FedSoft: towards a centre of its own
        tasks.append(ClientTask(c, TaskKind.TRAIN, start(), spec,
                                objective=LocalObjective(prox_mu=0.5, anchor=w0 + vector(0.1))))
    for c in (3, 0, 1):   # SCAFFOLD
        tasks.append(ClientTask(c, TaskKind.TRAIN, start(), spec,
                                objective=LocalObjective(correction=vector(0.05))))
    for c in (2, 3):      # FedEM's M-step: two components on one client, different weights
        for _ in range(2):
            weights = rng.uniform(0, 2, sizes[c]).astype(np.float32)
            tasks.append(ClientTask(c, TaskKind.TRAIN, start(), spec,
                                    objective=LocalObjective(sample_weights=weights)))
    for variant in ("fo", "hf"):   # Per-FedAvg's meta steps, 2 and 3 batches a step
        for c in (5, 2, 4):
            tasks.append(ClientTask(c, TaskKind.TRAIN, start(), spec,
                                    objective=LocalObjective(maml=variant, maml_alpha=0.03,
                                                             maml_delta=1e-2)))
    for c in (1, 3):   # ... as the PACFL authors step them: one optimiser, epochs of one pass
        pass_spec = dataclasses.replace(spec, batches_per_step=2)
        shared = LocalObjective(maml="fo", maml_alpha=0.03, maml_momentum="shared")
        tasks.append(ClientTask(c, TaskKind.TRAIN, start(), pass_spec, objective=shared))
    tasks.append(ClientTask(5, TaskKind.TRAIN, start(), spec))
    assert_same(seq.run(tasks, 2, 1), grp.run(tasks, 2, 1))
    assert fallback == []


def test_local_objective_vectors_are_in_the_clients_parameter_space(federation):
    """Under a privacy transform the anchor and the correction arrive transformed, as the
    parameters do; the grouped path undoes it as the client runtime does."""
    module = build_model("mlp", federation.input_shape, 10, hidden=[16])
    size = FlatModel(module).size
    transform = ParameterTransform.from_seed("signed_permutation", 4, size)
    seq, grp, w0 = executors(federation, module=module, transform=transform)
    rng = np.random.default_rng(5)
    spec = TrainSpec(lr=0.1, batch_size=10, momentum=0.5)
    tasks = [ClientTask(c, TaskKind.TRAIN, transform.forward(w0),
                        spec, objective=LocalObjective(
                            prox_mu=0.5, anchor=transform.forward(
                                (w0 + 0.1 * rng.standard_normal(size)).astype(np.float32))))
             for c in (0, 1)]
    tasks += [ClientTask(c, TaskKind.TRAIN, transform.forward(w0), spec,
                         objective=LocalObjective(correction=transform.forward(
                             (0.05 * rng.standard_normal(size)).astype(np.float32))))
              for c in (2, 3)]
    assert_same(seq.run(tasks, 0), grp.run(tasks, 0))


def test_adam_and_batch_norm_fall_back_to_sequential(federation, caplog, monkeypatch):
    seq, grp, w0 = executors(federation)
    grouped_calls = []
    original = GroupedExecutor._train_group
    monkeypatch.setattr(GroupedExecutor, "_train_group", lambda self, tasks, *a: (
        grouped_calls.extend(t.client for t in tasks) or original(self, tasks, *a)))
    spec = TrainSpec(lr=0.1, batch_size=10)
    tasks = [ClientTask(0, TaskKind.TRAIN, w0, spec, objective=LocalObjective(prox_mu=0.1)),
             ClientTask(2, TaskKind.TRAIN, w0, spec, objective=LocalObjective(maml="fo")),
             ClientTask(1, TaskKind.TRAIN, w0, TrainSpec(lr=0.01, batch_size=10,
                                                         optimizer="adam")),
             ClientTask(3, TaskKind.TRAIN, w0, spec)]
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        assert_same(seq.run(tasks, 0), grp.run(tasks, 0))
    assert sorted(grouped_calls) == [0, 2, 3]
    assert "'optimizer'" in caplog.text and "sequentially" in caplog.text

    for module in (nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16),
                                 nn.ReLU(), nn.Linear(16, 10)),
                   nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Dropout(0.5),
                                 nn.Linear(16, 10))):
        assert grouped_obstacle(module) is not None
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="clusterfed"):
            seq, grp, w0 = executors(federation, module=module)
        assert "grouped executor" in caplog.text
        grouped_calls.clear()
        tasks = [ClientTask(c, TaskKind.TRAIN, w0, spec) for c in range(3)]
        torch.manual_seed(0)
        expected = seq.run(tasks, 0)
        torch.manual_seed(0)   # dropout draws from the global generator on both paths
        assert_same(expected, grp.run(tasks, 0))
        assert grouped_calls == []


def test_simulation_with_the_grouped_executor_equals_sequential():
    results = {}
    for kind in ("sequential", "grouped"):
        cfg = tiny_config("fedavg", train={"rounds": 2}, run={"executor": kind, "device": "cpu",
                                                               "threads": 1})
        sim = Simulation(cfg)
        assert type(sim.executor).__name__.lower().startswith(kind)
        results[kind] = (sim.run(), sim.algorithm.clusters(sim.state).models)
    (a, ma), (b, mb) = results["sequential"], results["grouped"]
    np.testing.assert_allclose(mb, ma, rtol=1e-4, atol=1e-6)
    assert b["final"]["mean_loss"] == pytest.approx(a["final"]["mean_loss"], rel=1e-4)


@pytest.mark.parametrize("name", ["cfl_convnet", "fedavg_cnn", "lenet5", "mlp",
                                  "cnn_femnist_tiny"])
def test_forward_flops_from_layer_shapes_equal_torchs_flop_counter(name):
    from torch.utils.flop_counter import FlopCounterMode

    from clusterfed.sim.choice import forward_flops
    shape = (1, 28, 28)
    module = build_model(name, shape, 10)
    assert grouped_obstacle(module) is None
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(torch.zeros(1, *shape))
    assert forward_flops(module, shape) == counter.get_total_flops() > 0


def test_auto_groups_small_steps_on_several_cores_and_on_one():
    from clusterfed.sim.choice import Workload, auto_kind, step_flops
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    small = step_flops(FlatModel(build_model("cfl_convnet", (1, 28, 28), 10)), (1, 28, 28), 10)
    large = step_flops(FlatModel(build_model("fedavg_cnn", (1, 28, 28), 10)), (1, 28, 28), 10)
    assert 5e6 < small < 200e6 < large      # cfl_convnet at batch 10 against fedavg_cnn
    # Several cores, small steps: grouped workers (float tolerance).
    several = Workload(20, 8000, 2, None, None, small)
    assert auto_kind(cpu, several)[0] == "grouped"
    assert "float tolerance" in auto_kind(cpu, several)[1]
    # cfl_convnet at batch 128 (164 MFLOP) measured 1.24x plain workers: grouped too.
    mid = step_flops(FlatModel(build_model("cfl_convnet", (1, 28, 28), 10)), (1, 28, 28), 128)
    assert 50e6 < mid < 200e6
    assert auto_kind(cpu, Workload(20, 8000, 2, None, None, mid))[0] == "grouped"
    # Larger steps, a model grouping cannot train, or module state: plain workers / sequential.
    assert auto_kind(cpu, Workload(10, 6000, 2, None, None, large))[0] == "processes"
    assert auto_kind(cpu, Workload(10, 6000, 2, None, "batch norm", small))[0] == "processes"
    assert auto_kind(cpu, Workload(10, 6000, 2, "dropout", None, small))[0] == "sequential"
    # Too few samples a round to start workers: grouped in this process; too large: not.
    tiny = auto_kind(cpu, Workload(10, 200, 2, None, None, small))
    assert tiny[0] == "grouped" and "in this process" in tiny[1]
    assert auto_kind(cpu, Workload(10, 200, 2, None, None, large))[0] == "sequential"
    assert auto_kind(cpu, Workload(10, 200, 2, None, "batch norm", small))[0] == "sequential"
    assert auto_kind(cpu, Workload(1, 200, 2, None, None, small))[0] == "sequential"
    # One core: grouped in this process up to 400 MFLOP a step (fedavg_cnn's 724 lost, 0.6x),
    # for a model it trains and rounds of several clients; else sequential.
    one = auto_kind(cpu, Workload(10, 6000, 1, None, None, small))
    assert one[0] == "grouped" and "one core" in one[1] and "float tolerance" in one[1]
    assert auto_kind(cpu, Workload(10, 200, 1, None, None, mid))[0] == "grouped"
    assert auto_kind(cpu, Workload(10, 6000, 1, None, None, large))[0] == "sequential"
    assert auto_kind(cpu, Workload(10, 6000, 1, None, "batch norm", small))[0] == "sequential"
    assert auto_kind(cpu, Workload(1, 6000, 1, None, None, small))[0] == "sequential"
    assert auto_kind(cuda, several)[0] == "vectorised"


def test_auto_leaves_mlps_to_the_sequential_executor_and_plain_workers():
    # An MLP uses each weight once a sample: grouped it streams every client's weights and
    # measured 0.43x sequential at batch 10 (docs/speed.md, 2026-11-29).
    from clusterfed import config as cfg
    from clusterfed.sim.build import build_federation_for
    from clusterfed.sim.choice import auto_kind, workload
    cpu = torch.device("cpu")
    config = cfg.resolve(tiny_config("fedavg"), ["train.batch_size=10"])
    federation = build_federation_for(config)
    shape = tuple(federation.input_shape)

    def work(name: str, threads: int, **options):
        model = FlatModel(build_model(name, shape, 10, **options))
        run = {**config["run"], "threads": threads}
        return workload(run, config["train"], model, federation)

    mlp, cnn = work("mlp", 1, hidden=200), work("digits_cnn", 1)
    assert mlp.grouped_obstacle is None and mlp.step_flops < cnn.step_flops * 100
    assert mlp.flops_per_parameter == pytest.approx(2.0, rel=0.05)   # one multiply-add a weight
    assert cnn.flops_per_parameter > 10
    one = auto_kind(cpu, mlp)
    assert one[0] == "sequential" and "forward FLOPs a sample per parameter" in one[1]
    assert auto_kind(cpu, cnn)[0] == "grouped"
    busy = dataclasses.replace(mlp, cores=2, samples_per_round=6000)
    assert auto_kind(cpu, busy)[0] == "processes"
    assert auto_kind(cpu, dataclasses.replace(busy, samples_per_round=200))[0] == "sequential"
    assert auto_kind(cpu, dataclasses.replace(cnn, cores=2, samples_per_round=6000))[0] \
        == "grouped"


# Grouped workers (`run.executor=grouped`, `run.workers` 2 or more) ------------------------------


def test_shares_split_the_cost_evenly_one_share_a_worker():
    from clusterfed.sim.processes import shares
    # Longest first to the least loaded: 5 | 4, then 2 -> 4's share, then the ones.
    costs = [5.0, 1.0, 1.0, 4.0, 1.0, 2.0, 1.0, 1.0]
    out = shares(costs, 2)
    assert sorted(i for s in out for i in s) == list(range(8)) and len(out) == 2
    assert all(s == sorted(s) for s in out)
    assert sorted(sum(costs[i] for i in s) for s in out) == [8.0, 8.0]
    assert shares([1.0], 3) == [[0]]   # no empty share


def test_grouped_workers_equal_sequential_on_mixed_tasks(federation, one_thread):
    from clusterfed.sim.processes import ProcessExecutor
    seq, _, w0 = executors(federation)
    module = copy.deepcopy(seq.model.module)
    rng = np.random.default_rng(3)
    stacked = (w0 + 0.05 * rng.standard_normal((3, len(w0)))).astype(np.float32)
    spec = TrainSpec(lr=0.1, batch_size=10, momentum=0.5)
    tasks = [ClientTask(c, TaskKind.TRAIN, (w0 + 0.01 * rng.standard_normal(w0.shape)
                                            ).astype(np.float32), spec) for c in (4, 0, 2, 5, 1, 3)]
    tasks += [ClientTask(0, TaskKind.LOSSES, stacked), ClientTask(2, TaskKind.GRADIENT, w0)]
    with ProcessExecutor(FlatModel(module), federation, EXECUTOR_SEED, workers=2,
                         grouped=True) as proc:
        got = proc.run(tasks, 3, 1)
        assert len(proc.started_pids) == 2
    expected = seq.run(tasks, 3, 1)
    assert_same(expected, got)
    # The workers grouped the training: its sums run in another order, so some update
    # differs in its last bits (plain workers give sequential's bit for bit).
    assert any(not np.array_equal(a.update, b.update)
               for a, b in zip(expected[:6], got[:6], strict=True))


def test_simulation_runs_grouped_in_workers_and_equals_sequential():
    results = {}
    for kind, workers in (("sequential", None), ("grouped", 2)):
        cfg = tiny_config("fedavg", train={"rounds": 2}, run={
            "executor": kind, "device": "cpu", "threads": 1, "workers": workers})
        sim = Simulation(cfg)
        assert type(sim.executor).__name__ == ("ProcessExecutor" if workers
                                               else "SequentialExecutor")
        assert getattr(sim.executor, "grouped", False) == bool(workers)
        results[kind] = (sim.run(), sim.algorithm.clusters(sim.state).models)
    (a, ma), (b, mb) = results["sequential"], results["grouped"]
    np.testing.assert_allclose(mb, ma, rtol=1e-4, atol=1e-6)
    assert b["final"]["mean_loss"] == pytest.approx(a["final"]["mean_loss"], rel=1e-4)


def test_fallbacks_warn_only_where_the_user_named_the_executor(caplog):
    """Adam's steps are handed by the grouped path to the sequential one: a warning under
    `run.executor=grouped`, an info line where `auto` picked grouping."""
    def notices(executor: str) -> list[logging.LogRecord]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="clusterfed"):
            Simulation(tiny_config("fedavg", train={"rounds": 1, **ADAM},
                                   run={"threads": 1, "executor": executor})).run()
        return [r for r in caplog.records if "running those tasks sequentially" in r.message]

    named = notices("grouped")
    assert named and all(r.levelno == logging.WARNING for r in named)
    picked = notices("auto")
    assert picked and all(r.levelno == logging.INFO for r in picked)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_grouped_workers_picked_by_auto_do_not_warn_of_their_fallbacks(capfd):
    """The workers build their own grouped executor: the level travels in their setup (their
    warnings reach stderr through logging's last-resort handler)."""
    busy = {"scenario": {"kind": "label_swap", "clients": 20, "clusters": 4},
            "train": {"participation": 1.0, "local_epochs": 3, "rounds": 1, **ADAM}}
    for executor, level in (("auto", logging.INFO), ("grouped", logging.WARNING)):
        sim = Simulation(tiny_config("fedavg", **busy,
                                     run={"threads": 2, "executor": executor, "workers": 2}))
        assert sim.executor.grouped and sim.executor.notice_level == level
        capfd.readouterr()
        sim.run()
        if level == logging.INFO:
            assert "running those tasks sequentially" not in capfd.readouterr().err

"""The process executor against the sequential one: the same results bit for bit (both single-
threaded), errors raised in the parent, and no worker process left behind."""

from __future__ import annotations

import copy
import gc
import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import comparable, tiny_config
from process_models import FailsInTraining, InterruptsParent, SlowInOneProcess
from torch import nn

from clusterfed.client.privacy import ParameterTransform
from clusterfed.config import merge
from clusterfed.data import build_federation, load_dataset
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.choice import Workload, auto_kind
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.grouped import GroupedExecutor
from clusterfed.sim.processes import ProcessExecutor, WorkerError, chunks, start_obstacle
from clusterfed.sim.shared import Mailbox, flatten, unflatten
from clusterfed.sim.simulation import Simulation, initial_params
from clusterfed.tasks import (
    ClientTask,
    LocalObjective,
    LossSpec,
    SignatureSpec,
    TaskKind,
    TrainSpec,
    numbered,
)

# The sequential reference computes with one thread, as every worker does.
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="checks worker processes through /proc"),
              pytest.mark.usefixtures("one_thread")]
SEED = 5


def gone(pids: list[int]) -> bool:
    """Workers were started, and none of them is alive, a zombie or our child any more."""
    children = {p.pid for p in mp.active_children()}
    return bool(pids) and not any(Path(f"/proc/{p}").exists() or p in children for p in pids)


@pytest.fixture(scope="module")
def federation():
    """Digits, 6 clients of unequal sizes (quantity skew)."""
    return build_federation(load_dataset("digits"),
                            {"kind": "label_swap", "clients": 6, "clusters": 2,
                             "samples_per_client": 40, "test_samples_per_client": 15,
                             "quantity_skew": 0.6}, seed=1)


@pytest.fixture(scope="module")
def module(federation):
    m = build_model("digits_cnn", federation.input_shape, federation.n_classes)
    initial_params(m, 0)
    return m


@pytest.fixture(scope="module")
def pair(federation, module):
    """A sequential and a process executor (2 workers, started once for the module), both with
    a privacy transform and a validation split."""
    transform = ParameterTransform.from_seed("signed_permutation", 7, FlatModel(module).size)
    seq = SequentialExecutor(FlatModel(copy.deepcopy(module)), federation, SEED, transform, 0.25)
    with ProcessExecutor(FlatModel(copy.deepcopy(module)), federation, SEED, transform, 0.25,
                         workers=2) as proc:
        yield seq, proc
    # A test run alone may start no worker (evaluation computes here): none must outlive it.
    assert not proc.started_pids or gone(proc.started_pids)


def mixed_tasks(size: int) -> list[ClientTask]:
    """Every task kind, with the extras a task may carry, in a scrambled client order."""
    rng = np.random.default_rng(0)
    model = lambda: (0.05 * rng.standard_normal(size)).astype(np.float32)  # noqa: E731
    shared = model()                       # one array in several tasks, as FedAvg sends
    stack = np.stack([model() for _ in range(3)])
    spec = TrainSpec(lr=0.1, batch_size=8, momentum=0.5, clip_grad_norm=5.0)
    return numbered([
        ClientTask(4, TaskKind.TRAIN, shared, spec, meta={"cluster": 1}),
        ClientTask(0, TaskKind.TRAIN, shared, spec, meta={"cluster": 0}),
        ClientTask(2, TaskKind.TRAIN, model(),
                   TrainSpec(lr=0.05, batch_size=5, epochs=None, steps=7),
                   objective=LocalObjective(prox_mu=0.1, correction=model())),
        ClientTask(1, TaskKind.TRAIN, model(), TrainSpec(lr=0.05, batch_size=4, epochs=2),
                   objective=LocalObjective(maml="hf")),
        ClientTask(4, TaskKind.TRAIN, model(), spec, meta={"cluster": 2},
                   own_model=False),
        ClientTask(3, TaskKind.GRADIENT, shared),
        ClientTask(5, TaskKind.LOSSES, stack, loss=LossSpec("train+test", max_samples=9)),
        ClientTask(0, TaskKind.LOSSES, stack),
        ClientTask(2, TaskKind.EVALUATE, stack[:2]),
        ClientTask(1, TaskKind.EVALUATE, shared),
        ClientTask(3, TaskKind.SIGNATURE, np.zeros(1, np.float32),
                   signature=SignatureSpec(p=2, center=True)),
    ], 5)


def assert_identical(expected, got) -> None:
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        untimed = lambda meta: {k: v for k, v in meta.items() if k != "seconds"}  # noqa: E731
        assert (a.client, a.kind, a.num_samples, untimed(a.meta), a.task_id) == \
            (b.client, b.kind, b.num_samples, untimed(b.meta), b.task_id)
        assert a.loss == b.loss or (np.isnan(a.loss) and np.isnan(b.loss))
        for name in ("update", "losses", "accuracies", "signature", "signature_labels"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert x.dtype == y.dtype and np.array_equal(x, y), name


def test_every_task_kind_gives_the_sequential_result_bit_for_bit(pair):
    seq, proc = pair
    tasks = mixed_tasks(seq.model.size)
    for round_index, step in [(0, 0), (3, 2)]:
        got = proc.run(tasks, round_index, step)
        assert sorted(r.task_id for r in got) == [t.id for t in tasks]
        assert_identical(seq.run(tasks, round_index, step), got)
    assert len(proc.started_pids) == 2   # one pool for every call


def test_evaluation_and_sizes_equal_the_sequential_ones(pair):
    seq, proc = pair
    params = (0.05 * np.random.default_rng(1).standard_normal(seq.model.size)).astype(np.float32)
    for split in ("test", "validation"):
        assert np.array_equal(seq.evaluate(params, [5, 0, 3], split),
                              proc.evaluate(params, [5, 0, 3], split))
    assert np.array_equal(seq.train_sizes(), proc.train_sizes())
    assert np.array_equal(seq.test_sizes(), proc.test_sizes())


def test_evaluation_computes_with_one_thread_whatever_the_run_uses(pair, monkeypatch,
                                                                  torch_threads):
    seq, proc = pair
    threads, inner = [], proc.local.evaluate
    monkeypatch.setattr(proc.local, "evaluate",
                        lambda *args: threads.append(torch.get_num_threads()) or inner(*args))
    torch_threads(2)
    proc.evaluate(np.zeros(seq.model.size, np.float32), [0, 1])
    assert threads == [1] and torch.get_num_threads() == 2


def test_an_idle_worker_takes_the_next_tasks(federation, tmp_path):
    # One worker sleeps a second a step; the other takes every task after the first two.
    flag = tmp_path / "slow"
    module = SlowInOneProcess(federation.input_shape, federation.n_classes, str(flag), 1.0)
    w = FlatModel(module).initial_vector().numpy()
    tasks = [ClientTask(c, TaskKind.TRAIN, w, TrainSpec(lr=0.1, batch_size=1000))
             for c in range(6)]   # one step each
    with ProcessExecutor(FlatModel(module), federation, SEED, workers=2) as proc:
        proc.run(tasks, 0)
    assert flag.read_text().count("step") == 1    # split evenly, it would have run three


def test_a_failing_task_raises_here_and_the_pool_carries_on(pair):
    seq, proc = pair
    tasks = mixed_tasks(seq.model.size)[:3]
    broken = ClientTask(2, TaskKind.TRAIN, tasks[0].params)     # no TrainSpec
    pids = list(proc.started_pids)
    with pytest.raises(WorkerError, match=r"(?s)client 2's train task.*needs a TrainSpec"):
        proc.run([*tasks, broken], 0)
    assert_identical(seq.run(tasks, 0), proc.run(tasks, 0))
    assert proc.started_pids == pids                            # the same workers


def test_a_dead_worker_raises_and_no_worker_is_left(federation, module):
    proc = ProcessExecutor(FlatModel(copy.deepcopy(module)), federation, SEED, workers=2)
    tasks = mixed_tasks(proc.local.model.size)[:2]
    proc.run(tasks, 0)
    os.kill(proc.started_pids[0], signal.SIGKILL)
    with pytest.raises(WorkerError, match="died"):
        proc.run(tasks, 0)
    assert gone(proc.started_pids)


def test_an_executor_dropped_unclosed_stops_its_workers(federation, module):
    proc = ProcessExecutor(FlatModel(copy.deepcopy(module)), federation, SEED, workers=2)
    proc.run(mixed_tasks(proc.local.model.size)[:2], 0)
    pids = proc.started_pids
    blocks = [box.block.name for box in (proc._pool.tasks, *proc._pool.results)]
    assert all(Path("/dev/shm", name).exists() for name in blocks)
    del proc
    gc.collect()
    assert gone(pids)       # their pipes closed: they left on their own
    assert not any(Path("/dev/shm", name).exists() for name in blocks)   # and were freed


def test_tasks_go_out_longest_first_in_shrinking_chunks():
    costs = [5.0, 1.0, 1.0, 4.0, 1.0, 2.0, 1.0, 1.0]
    out = chunks(costs, 2)
    assert sorted(i for c in out for i in c) == list(range(8))   # each task once
    assert all(c == sorted(c) for c in out)                      # task order within a chunk
    assert out[:2] == [[0], [3]]                 # the longest first, one each to start
    sizes = [sum(costs[i] for i in c) for c in out]
    assert sizes == sorted(sizes, reverse=True)
    assert chunks([1.0], 3) == [[0]]
    assert len(chunks([1.0] * 10_000, 2)) < 60   # a few dozen messages, not one per task


def test_flattened_records_share_arrays_and_come_back_whole():
    tasks = mixed_tasks(10)
    records, arrays = flatten(tasks)
    assert len(arrays) == 8    # `shared` once for its four tasks, `stack` once for its two
    box = Mailbox()
    try:
        layout = box.write(arrays)
        views = box.reserve(0).read(layout)
        back = unflatten(records, views)
        for a, b in zip(tasks, back, strict=True):
            assert np.array_equal(a.params, b.params) and a.train == b.train
            assert (a.objective is None) == (b.objective is None)
            if a.objective is not None and a.objective.correction is not None:
                assert np.array_equal(a.objective.correction, b.objective.correction)
        del views, back
    finally:
        box.unlink()


def record_kinds(executor: ProcessExecutor, seen: set[str]) -> None:
    """Note the kind of every task the executor runs (the evaluation protocol's included)."""
    run = executor.run

    def recording(tasks, *args):
        seen.update(t.kind.value for t in tasks)
        return run(tasks, *args)

    executor.run = recording


@pytest.mark.parametrize("config, kinds", [
    (tiny_config("fedavg", train={"rounds": 2}, run={"privacy": "signed_permutation"}),
     {"train", "evaluate"}),
    (tiny_config("cfl", train={"rounds": 3, "participation": 1.0},
                 eval={"protocol": "best_of_path", "validation_fraction": 0.2}),
     {"train", "evaluate"}),
    (merge(tiny_config("lcfl", train={"rounds": 3, "batch_size": 20}),
           {"algorithm": {"name": "lcfl", "k": 2, "warmup_rounds": 2,
                          "loss_data": "train+test", "loss_samples": 12}}),
     {"train", "losses", "evaluate"}),
    (merge(tiny_config("ifca", train={"rounds": 2}),
           {"algorithm": {"name": "ifca", "k": 2, "initialisation": "random"}}),
     {"train", "losses", "evaluate"}),
], ids=["fedavg", "cfl", "lcfl", "ifca"])
def test_a_run_in_worker_processes_equals_the_sequential_run(config, kinds):
    out, seen = {}, set()
    for kind, threads in (("sequential", 1), ("processes", 2)):
        # Two threads for the run: every worker and the evaluation still compute with one.
        sim = Simulation(merge(config, {"run": {"executor": kind, "workers": 2,
                                                "threads": threads, "checkpoint_every": 0}}))
        if kind == "processes":
            assert isinstance(sim.executor, ProcessExecutor)
            record_kinds(sim.executor, seen)
        out[kind] = (comparable(sim.run()), sim.algorithm.clusters(sim.state).models)
    assert seen == kinds
    assert gone(sim.executor.started_pids)   # closed when the run ended
    (a, ma), (b, mb) = out["sequential"], out["processes"]
    assert a == b
    assert np.array_equal(np.asarray(ma), np.asarray(mb))


def test_no_worker_outlives_a_failed_run(federation):
    sim = Simulation(tiny_config(run={"executor": "processes", "workers": 2}),
                     federation=federation,
                     module=FailsInTraining(federation.input_shape, federation.n_classes))
    with pytest.raises(WorkerError, match="refuses to train"):
        sim.run()
    assert gone(sim.executor.started_pids)


def test_a_grouped_worker_names_its_share_when_it_fails(federation):
    # A grouped worker runs its share as one call through the grouped executor: the error
    # names the share's clients (one client when its share is one task) and carries the
    # worker's traceback through that executor.
    sim = Simulation(tiny_config(run={"executor": "grouped", "workers": 2}),
                     federation=federation,
                     module=FailsInTraining(federation.input_shape, federation.n_classes))
    with pytest.raises(WorkerError, match=r"(the tasks of clients \[|client \d+'s train task)"
                                          r"[^\n]*refuses to train") as raised:
        sim.run()
    assert "vectorised.py" in str(raised.value)   # the grouped executor's run, in the worker
    assert len(sim.executor.started_pids) == 2 and gone(sim.executor.started_pids)


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt even where the test runner was started with SIGINT
    ignored (a shell's background job), which Python then never turns into the exception."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_no_worker_outlives_ctrl_c(federation, tmp_path, sigint_raises):
    module = InterruptsParent(federation.input_shape, federation.n_classes, os.getpid(),
                              str(tmp_path / "interrupted"))
    sim = Simulation(tiny_config(run={"executor": "processes", "workers": 2}),
                     federation=federation, module=module)
    with pytest.raises(KeyboardInterrupt):
        sim.run()
    assert gone(sim.executor.started_pids)


def test_an_interrupted_call_stops_its_workers(federation, tmp_path, sigint_raises):
    module = InterruptsParent(federation.input_shape, federation.n_classes, os.getpid(),
                              str(tmp_path / "interrupted"))
    proc = ProcessExecutor(FlatModel(module), federation, SEED, workers=2)
    w = FlatModel(module).initial_vector().numpy()
    tasks = [ClientTask(c, TaskKind.TRAIN, w, TrainSpec(lr=0.1, batch_size=8)) for c in range(4)]
    with pytest.raises(KeyboardInterrupt):
        proc.run(tasks, 0)
    assert gone(proc.started_pids)    # without a Simulation around it to close it


def test_auto_picks_processes_for_rounds_of_several_clients_on_several_cores():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    busy = Workload(clients_per_round=10, samples_per_round=6000, cores=2, obstacle=None)
    assert auto_kind(cpu, busy)[0] == "processes"
    assert auto_kind(cuda, busy)[0] == "vectorised"
    assert auto_kind(cpu, Workload(2, 2000, 2, None))[0] == "processes"
    for other in (Workload(10, 6000, 1, None), Workload(1, 6000, 2, None),
                  Workload(10, 6000, 2, "batch norm"), Workload(10, 200, 2, None)):
        assert auto_kind(cpu, other)[0] == "sequential"
    with pytest.raises(ConfigError, match="run.workers"):
        Simulation(tiny_config(run={"executor": "processes", "workers": 0}))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_auto_in_a_simulation_weighs_the_config():
    # 20 clients x 3 epochs of about 70 images a round: workers pay, within the run's threads.
    busy = {"scenario": {"kind": "label_swap", "clients": 20, "clusters": 4},
            "train": {"participation": 1.0, "local_epochs": 3}}
    sim = Simulation(tiny_config(**busy, run={"threads": 2}))
    assert isinstance(sim.executor, ProcessExecutor) and sim.executor.workers == 2
    assert sim.executor.grouped     # the tiny model's small steps train grouped
    plain = Simulation(tiny_config(**busy, run={"threads": 2, "executor": "processes"}))
    assert not plain.executor.grouped
    # Held to one thread: the small model grouped in this process, no workers.
    assert type(Simulation(tiny_config(**busy, run={"threads": 1})).executor) is GroupedExecutor
    assert type(Simulation(tiny_config(**busy, run={"threads": 1, "executor": "sequential"})
                           ).executor) is SequentialExecutor
    # Too few samples a round for workers: the small model is grouped in this process.
    assert type(Simulation(tiny_config(run={"threads": 2})).executor) is GroupedExecutor


def test_a_module_with_running_statistics_stays_in_this_process(federation, caplog):
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    proc = ProcessExecutor(FlatModel(module), federation, SEED, workers=2)
    assert "running statistics" in caplog.text
    w = FlatModel(module).initial_vector().numpy()
    proc.run([ClientTask(0, TaskKind.TRAIN, w, TrainSpec(lr=0.1, batch_size=8))], 0)
    assert proc.started_pids == []


def test_workers_never_start_where_they_could_not():
    assert start_obstacle(nn.Linear(2, 2)) is None
    odd = nn.Linear(2, 2)
    odd.hook = lambda x: x                   # pickles by reference: cannot
    assert "does not pickle" in start_obstacle(odd)
    # A script without a main guard: tests/test_choice.py.


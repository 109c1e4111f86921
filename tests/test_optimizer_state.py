"""train.optimizer_state=kept: a client's optimiser (Adam's moments, SGD's momentum) carries over
from one of its tasks to the next, as one torch optimiser kept for the whole run does (FedSoft's
authors' clients); checked against torch, across executors, a resume and the Flower runtime."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import comparable, tiny_config

from clusterfed import config as cfg
from clusterfed.client import ClientTask, TaskKind, TrainSpec
from clusterfed.client.sgd import AdamMoments, state_arrays, state_from_arrays
from clusterfed.data.federation import Federation
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.build import build_federation_for
from clusterfed.sim.choice import workload
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.processes import ProcessExecutor, one_thread
from clusterfed.sim.simulation import Simulation, resume_run, run_config

ADAM = TrainSpec(lr=0.01, batch_size=8, optimizer="adam", optimizer_state="kept")
MOMENTUM = TrainSpec(lr=0.05, batch_size=8, momentum=0.9, optimizer_state="kept")


@pytest.fixture(scope="module")
def digits() -> tuple[FlatModel, Federation]:
    config = cfg.resolve(tiny_config("fedavg"))
    federation = build_federation_for(config)
    torch.manual_seed(0)
    return FlatModel(build_model("digits_cnn", (1, 8, 8), 10)), federation


def torch_one_optimizer(module: torch.nn.Module, starts: list[torch.Tensor],
                        orders: list[list[torch.Tensor]], x: torch.Tensor, y: torch.Tensor,
                        spec: TrainSpec) -> list[torch.Tensor]:
    """One torch optimiser for the whole run: each task loads its start into the parameters
    (the optimiser's state untouched) and steps over its batches; the update of each task."""
    model = copy.deepcopy(module)
    params = list(model.parameters())
    opt = (torch.optim.Adam(params, lr=spec.lr, foreach=False) if spec.optimizer == "adam"
           else torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, foreach=False))
    updates = []
    for start, order in zip(starts, orders, strict=True):
        torch.nn.utils.vector_to_parameters(start.clone(), params)
        for idx in order:
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        updates.append(torch.nn.utils.parameters_to_vector(params).detach() - start)
    return updates


def batch_orders(runtime: SequentialExecutor, client: int, round_index: int, n: int,
                 spec: TrainSpec) -> list[torch.Tensor]:
    gen = runtime.generator(client, round_index, 0)
    order = torch.randperm(n, generator=gen)
    return [order[i:i + spec.batch_size] for i in range(0, n, spec.batch_size)]


@pytest.mark.parametrize("spec", [ADAM, MOMENTUM], ids=["adam", "sgd-momentum"])
def test_kept_state_equals_one_torch_optimiser_for_the_run(digits, spec):
    model, federation = digits
    runtime = SequentialExecutor(model, federation, seed=0)
    x, y = runtime.train[1]
    w0 = model.initial_vector()
    second_start = w0 + 0.01   # the server sends another model in round 2
    got = []
    for r, start in enumerate([w0, second_start]):
        task = ClientTask(1, TaskKind.TRAIN, start.numpy(), spec)
        got.append(torch.as_tensor(runtime.run([task], r)[0].update))
    orders = [batch_orders(runtime, 1, r, len(y), spec) for r in range(2)]
    want = torch_one_optimizer(model.module, [w0, second_start], orders, x, y, spec)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    # A fresh optimiser in round 2 takes other steps: the test sees the state.
    fresh = torch_one_optimizer(model.module, [second_start], orders[1:], x, y, spec)[0]
    assert not torch.allclose(got[1], fresh, atol=1e-6)
    state = runtime.optimizer_states[1]
    assert isinstance(state, AdamMoments if spec.optimizer == "adam" else torch.Tensor)


def test_sgd_momentum_buffer_carries_over_in_a_hand_worked_case():
    # One weight-free model is not at hand: check the step rule's carry-over directly.
    # Two steps of momentum 0.5, lr 1, gradients 1 then 1: fresh each time moves 1 + 1;
    # kept, the second step moves 0.5 * 1 + 1 = 1.5.
    from clusterfed.client.sgd import sgd_step
    spec = TrainSpec(lr=1.0, batch_size=1, momentum=0.5)
    w, v = sgd_step(torch.zeros(1), torch.ones(1), None, spec)
    fresh, _ = sgd_step(w, torch.ones(1), None, spec)
    kept, _ = sgd_step(w, torch.ones(1), v, spec)
    assert float(fresh) == -2.0 and float(kept) == -2.5


def test_fresh_is_the_default_and_keeps_nothing(digits):
    model, federation = digits
    runtime = SequentialExecutor(model, federation, seed=0)
    spec = TrainSpec(lr=0.01, batch_size=8, optimizer="adam")
    params = model.initial_vector().numpy()
    first = runtime.run([ClientTask(1, TaskKind.TRAIN, params, spec)], 0)[0].update
    again = runtime.run([ClientTask(1, TaskKind.TRAIN, params, spec)], 0)[0].update
    np.testing.assert_array_equal(first, again)
    assert runtime.optimizer_states == {}


def test_states_round_trip_through_arrays():
    moments = AdamMoments(3, torch.arange(4.0), torch.ones(4))
    back = state_from_arrays(state_arrays(moments))
    assert back.step == 3 and torch.equal(back.first, moments.first)
    assert torch.equal(state_from_arrays(state_arrays(torch.ones(2))), torch.ones(2))
    assert state_from_arrays(state_arrays(None)) is None
    with pytest.raises(ValueError, match="not an optimiser state"):
        state_from_arrays({"other": np.zeros(1)})


def test_process_executor_keeps_the_state_in_this_process(digits):
    model, federation = digits
    params = model.initial_vector().numpy()
    tasks = [ClientTask(c, TaskKind.TRAIN, params, ADAM) for c in range(4)]
    sequential = SequentialExecutor(model, federation, seed=0)
    with ProcessExecutor(model, federation, seed=0, transform=None, validation_fraction=0.0,
                         workers=2) as processes:
        for r in range(2):
            with one_thread():   # as the parent runs them: bit for bit
                want = sequential.run(tasks, r)
            got = processes.run(tasks, r)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a.update, b.update)
        assert sorted(processes.kept_states()) == [0, 1, 2, 3]


KEPT_ADAM = ["train.optimizer=adam", "train.optimizer_state=kept", "train.lr=0.003",
             "train.momentum=0"]


def test_a_resumed_run_continues_the_kept_states(tmp_path):
    config = cfg.resolve(tiny_config("fedavg", run={"executor": "sequential", "threads": 1}),
                         KEPT_ADAM)
    whole = run_config(config, tmp_path / "whole")
    cut = cfg.resolve(config, ["train.rounds=2"])
    run_config(cut, tmp_path / "cut")
    # The cut folder's config says 2 rounds; resuming with 4 continues it.
    (tmp_path / "cut" / "config.yaml").write_text(
        (tmp_path / "whole" / "config.yaml").read_text())
    resumed = resume_run(tmp_path / "cut")
    assert comparable(resumed) == comparable(whole)
    fresh = run_config(cfg.resolve(config, ["train.optimizer_state=fresh"]), tmp_path / "fresh")
    assert comparable(fresh) != comparable(whole)


def test_an_unknown_optimizer_state_is_refused():
    with pytest.raises(ConfigError, match="train.optimizer_state must be one of fresh, kept"):
        Simulation(cfg.resolve("quickstart", ["train.optimizer_state=persistent"]))


def test_auto_does_not_start_workers_for_kept_states(digits):
    model, federation = digits
    config = cfg.resolve(tiny_config("fedavg"), KEPT_ADAM)
    work = workload(config["run"], config["train"], model, federation)
    assert "optimizer_state=kept" in work.obstacle
    plain = workload(cfg.resolve(tiny_config("fedavg"))["run"],
                     cfg.resolve(tiny_config("fedavg"))["train"], model, federation)
    assert plain.obstacle is None


def test_evaluating_does_not_move_the_kept_states(tmp_path):
    # FedAvg-FT fine-tunes at every evaluation: with its own fresh optimiser, so evaluating
    # every round or only after the last gives the same run.
    config = cfg.resolve(tiny_config("fedavg_ft", run={"executor": "sequential", "threads": 1,
                                                       "checkpoint_every": 0}), KEPT_ADAM)
    every = run_config(cfg.resolve(config, ["eval.every=1"]))
    last = run_config(cfg.resolve(config, ["eval.every=4"]))
    assert every["final"] == last["final"]


def test_two_models_trained_on_one_client_are_refused():
    config = cfg.resolve(tiny_config("fedem"), ["algorithm.components=2", *KEPT_ADAM])
    with pytest.raises(ConfigError, match="fedem trains several models on client"):
        run_config(config)


def test_a_state_of_another_shape_is_refused(digits):
    model, federation = digits
    runtime = SequentialExecutor(model, federation, seed=0)
    runtime.optimizer_states[0] = AdamMoments(1, torch.zeros(3), torch.zeros(3))
    task = ClientTask(0, TaskKind.TRAIN, model.initial_vector().numpy(), ADAM)
    with pytest.raises(ValueError, match=r"kept optimiser state is for \(3,\) parameters"):
        runtime.run([task], 0)


def test_kept_states_outlive_a_drift():
    # scenario.drift swaps the executor for one on the new data; every client's Adam keeps
    # counting its steps across it.
    config = cfg.resolve(tiny_config("fedavg", run={"executor": "sequential", "threads": 1,
                                                    "checkpoint_every": 0}),
                         [*KEPT_ADAM, "train.participation=1.0", "train.rounds=3",
                          "scenario.drift={round: 2, clients: [1]}"])
    sim = Simulation(config)
    sim.run()
    sizes = sim.executor.train_sizes()
    for c, state in sim.executor.optimizer_states.items():
        steps = math.ceil(sizes[c] / config["train"]["batch_size"])
        assert state.step == 3 * steps, c

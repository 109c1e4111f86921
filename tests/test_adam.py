"""`train.optimizer: adam` against torch.optim.Adam on the same batches (brute force)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import digits_client, torch_reference_train

from clusterfed import config as cfg
from clusterfed.client import ClientTask, TaskKind, TrainSpec
from clusterfed.client.sgd import adam_step
from clusterfed.client.work import train
from clusterfed.errors import ConfigError
from clusterfed.sim.build import train_spec
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.grouped import GroupedExecutor
from clusterfed.sim.simulation import Simulation, build_federation_for
from clusterfed.tasks import LocalObjective


@pytest.fixture
def setup():
    return digits_client(23)


def test_one_step_rule_is_torchs_bit_for_bit():
    torch.manual_seed(1)
    spec = TrainSpec(lr=0.01, batch_size=1, optimizer="adam", adam_beta1=0.8,
                     adam_beta2=0.99, adam_eps=1e-6, weight_decay=0.01)
    w0 = torch.randn(50)
    grads = [torch.randn(50) for _ in range(6)]
    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.Adam([p], lr=spec.lr, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01,
                           foreach=False)
    pure, in_place, moments, kept = w0.clone(), w0.clone(), None, None
    for g in grads:
        p.grad = g.clone()
        opt.step()
        pure, moments = adam_step(pure, g.clone(), moments, spec)
        in_place, kept = adam_step(in_place, g.clone(), kept, spec, in_place=True)
        assert torch.equal(pure, p.detach()) and torch.equal(in_place, p.detach())
    assert moments.step == 6
    assert torch.equal(moments.second, opt.state[p]["exp_avg_sq"])


def test_adam_is_not_sgd(setup):
    _, flat, x, y = setup
    w0 = flat.initial_vector()
    adam, _ = train(flat, w0, x, y, TrainSpec(lr=0.01, batch_size=5, optimizer="adam"),
                    torch.Generator().manual_seed(7))
    sgd, _ = train(flat, w0, x, y, TrainSpec(lr=0.01, batch_size=5),
                   torch.Generator().manual_seed(7))
    assert not torch.allclose(sgd, adam, atol=1e-4)


def test_adam_with_a_proximal_term_equals_torch_on_the_penalised_loss(setup):
    module, flat, x, y = setup
    w0 = flat.initial_vector()
    anchor = w0 + 0.05 * torch.randn(len(w0), generator=torch.Generator().manual_seed(3))
    spec = TrainSpec(lr=0.01, batch_size=5, epochs=2, optimizer="adam")
    objective = LocalObjective(prox_mu=0.5, anchor=anchor.numpy())
    update, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(7), objective)
    expected = torch_reference_train(module, x, y, spec, seed=7, prox_mu=0.5, anchor=anchor)
    torch.testing.assert_close(w0 + update, expected, rtol=1e-5, atol=1e-6)


def test_scaffold_corrections_refuse_adam(setup):
    _, flat, x, y = setup
    w0 = flat.initial_vector()
    objective = LocalObjective(correction=np.zeros(len(w0), dtype=np.float32))
    with pytest.raises(ValueError, match="SCAFFOLD"):
        train(flat, w0, x, y, TrainSpec(lr=0.01, batch_size=5, optimizer="adam"),
              torch.Generator().manual_seed(0), objective)


@pytest.mark.parametrize("override, message", [
    ("train.optimizer=rmsprop", "train.optimizer must be one of"),
    ("train.adam_betas=[0.9]", "two numbers"),
    ("train.adam_betas=[0.9,1.0]", r"in \[0, 1\)"),
    ("train.adam_eps=0", "adam_eps must be positive"),
    ("train.momentum=0.5", "momentum is SGD's"),
])
def test_bad_adam_settings_say_which(override, message):
    with pytest.raises(ConfigError, match=message):
        train_spec(cfg.resolve("quickstart", ["train.optimizer=adam", "train.momentum=0",
                                              override])["train"])


def test_grouped_executor_leaves_adam_to_the_sequential_path(caplog):
    config = cfg.resolve("quickstart", ["train.optimizer=adam", "train.momentum=0",
                                        "train.lr=0.003", "run.progress=false"])
    federation = build_federation_for(config)
    model = Simulation(config, federation=federation).model
    spec = train_spec(config["train"])
    params = model.initial_vector().numpy()
    tasks = [ClientTask(c, TaskKind.TRAIN, params, spec) for c in range(4)]
    with caplog.at_level("INFO", logger="clusterfed"):
        got = GroupedExecutor(model, federation, seed=0).run(tasks, 0)
    want = SequentialExecutor(model, federation, seed=0).run(tasks, 0)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.update, b.update)
    assert "optimizer" in caplog.text


def test_a_run_with_adam_learns_digits():
    config = cfg.resolve("quickstart", ["algorithm.name=fedavg", "scenario.kind=iid",
                                        "scenario.clusters=1", "train.optimizer=adam",
                                        "train.momentum=0", "train.lr=0.003",
                                        "train.rounds=3", "run.progress=false",
                                        "run.checkpoint_every=0"])
    summary = Simulation(config).run()
    assert summary["final"]["mean_accuracy"] >= 0.5


def test_the_adam_settings_cross_the_flower_wire():
    pytest.importorskip("flwr", reason="the Flower wire needs the flower extra")
    from clusterfed.flower.wire import decode_task, encode_task

    spec = TrainSpec(lr=1e-4, batch_size=10, optimizer="adam", adam_beta1=0.8, adam_eps=1e-6,
                     optimizer_state="kept")
    task = ClientTask(3, TaskKind.TRAIN, np.zeros(4, dtype=np.float32), spec)
    decoded, _, _, _ = decode_task(encode_task(task, 0, 0, "{}"))
    assert decoded.train == spec


@pytest.mark.parametrize("name, message", [("fednova", "fednova normalises local SGD steps"),
                                           ("scaffold", "scaffold corrects local SGD steps")])
def test_sgd_only_methods_refuse_adam_before_training(name, message):
    config = cfg.resolve("quickstart", [f"algorithm.name={name}", "train.optimizer=adam",
                                        "train.momentum=0", "run.progress=false",
                                        "run.checkpoint_every=0"])
    with pytest.raises(ConfigError, match=message):
        Simulation(config).run()

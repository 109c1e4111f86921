"""Per-sample losses and sample-weighted, anchored local SGD (FedEM, FedRC and FedSoft)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import digits_client, executor_pair, uneven_digits

from clusterfed.client import ClientTask, TaskKind, TrainSpec, run_task
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.work import sample_losses, train
from clusterfed.errors import ConfigError
from clusterfed.flower.wire import check_result, decode_result, encode_result
from clusterfed.sim.grouped import GroupedExecutor
from clusterfed.sim.processes import ProcessExecutor
from clusterfed.sim.vectorised import VectorisedExecutor
from clusterfed.tasks import LocalObjective, LossSpec, numbered

pytestmark = pytest.mark.fast


@pytest.fixture
def setup():
    return digits_client(12)


def per_sample_gradients(module, x, y) -> torch.Tensor:
    """(n, d): each sample's gradient on its own, by autograd one sample at a time."""
    rows = []
    for j in range(len(y)):
        module.zero_grad()
        F.cross_entropy(module(x[j:j + 1]), y[j:j + 1]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in module.parameters()]))
    return torch.stack(rows)


def test_a_weighted_full_batch_step_is_the_weighted_mean_of_sample_gradients(setup):
    module, flat, x, y = setup
    w0 = flat.initial_vector()
    weights = np.array([0, 2, 1, 0.5, 0, 0, 3, 1, 1, 0, 2, 0.25], dtype=np.float32)
    spec = TrainSpec(lr=0.1, batch_size=len(y), epochs=1)
    update, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(0),
                      LocalObjective(sample_weights=weights))
    # (1/n) sum_j w_j grad l_j, each gradient taken alone
    expected = -0.1 * (torch.as_tensor(weights)[:, None] * per_sample_gradients(module, x, y)
                       ).mean(0)
    torch.testing.assert_close(update, expected, rtol=1e-4, atol=1e-7)


def test_unit_weights_change_nothing(setup):
    _, flat, x, y = setup
    w0 = flat.initial_vector()
    spec = TrainSpec(lr=0.1, batch_size=5, epochs=2)
    plain, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(3))
    ones, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(3),
                    LocalObjective(sample_weights=np.ones(len(y), np.float32)))
    torch.testing.assert_close(ones, plain, rtol=1e-5, atol=1e-7)


def test_the_proximal_term_pulls_toward_its_anchor(setup):
    _, flat, x, y = setup
    w0 = flat.initial_vector()
    anchor = (w0 + 1.0).numpy()
    spec = TrainSpec(lr=0.1, batch_size=len(y), epochs=1)
    # No data gradient (all weights 0): one step is -lr mu (w0 - anchor) = +0.1 * 0.5 * 1.
    update, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(0),
                      LocalObjective(prox_mu=0.5, anchor=anchor,
                                     sample_weights=np.zeros(len(y), np.float32)))
    torch.testing.assert_close(update, torch.full_like(w0, 0.05))


def test_per_sample_losses_are_each_samples_loss_under_each_model(setup):
    module, flat, x, y = setup
    w0 = flat.initial_vector()
    stacked = torch.stack([w0, 0.5 * w0])
    got = sample_losses(flat, stacked, x, y)
    with torch.no_grad():
        first = F.cross_entropy(module(x), y, reduction="none").double().numpy()
    assert got.shape == (2, len(y))
    np.testing.assert_allclose(got[0], first, rtol=1e-6)
    task = ClientTask(1, TaskKind.LOSSES, stacked.numpy(), loss=LossSpec(per_sample=True,
                                                                        labels=True))
    result = run_task(flat, task, (x, y), (x[:3], y[:3]), torch.Generator())
    np.testing.assert_allclose(result.losses, got)
    np.testing.assert_array_equal(result.labels, y.numpy())
    mean = run_task(flat, ClientTask(1, TaskKind.LOSSES, stacked.numpy()), (x, y),
                    (x[:3], y[:3]), torch.Generator())
    np.testing.assert_allclose(result.losses.mean(axis=1), mean.losses, rtol=1e-6)
    assert run_task(flat, ClientTask(1, TaskKind.LOSSES, stacked.numpy(),
                                     loss=LossSpec(per_sample=True)), (x, y), (x, y),
                    torch.Generator()).labels is None


@pytest.mark.parametrize(("make", "message"), [
    (lambda: LossSpec(per_sample=True, max_samples=5), "no subsample"),
    (lambda: LossSpec(per_sample=True, data="train+test"), "no test data"),
    (lambda: LossSpec(labels=True), "per-sample losses only"),
    (lambda: LocalObjective(anchor=np.zeros(3)), "mu > 0"),
    (lambda: LocalObjective(sample_weights=np.array([1.0, -1.0])), "finite weight >= 0"),
    (lambda: LocalObjective(maml="fo", sample_weights=np.ones(2)), "MAML"),
])
def test_bad_per_sample_options_are_refused(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_weights_of_the_wrong_length_are_refused(setup):
    _, flat, x, y = setup
    with pytest.raises(ValueError, match="3 sample weights for 12"):
        train(flat, flat.initial_vector(), x, y, TrainSpec(lr=0.1, batch_size=4),
              torch.Generator(), LocalObjective(sample_weights=np.ones(3)))


def test_the_privacy_transform_maps_the_anchor_like_the_parameters():
    t = ParameterTransform.from_seed("signed_permutation", 5, 6)
    anchor = np.arange(6, dtype=np.float32)
    mapped = LocalObjective(prox_mu=1.0, anchor=anchor).map_vectors(t.inverse)
    np.testing.assert_allclose(mapped.anchor, t.inverse(anchor))


def door_tasks(federation, w0: np.ndarray) -> list[ClientTask]:
    stacked = np.stack([w0, 0.9 * w0])
    out = []
    for c in range(3):
        n = int(len(federation.clients[c].train_y))
        weights = np.linspace(0.0, 2.0, n).astype(np.float32)
        out += [ClientTask(c, TaskKind.LOSSES, stacked, loss=LossSpec(per_sample=True,
                                                                     labels=True)),
                ClientTask(c, TaskKind.TRAIN, w0, TrainSpec(lr=0.05, batch_size=8),
                           objective=LocalObjective(prox_mu=0.1, anchor=0.9 * w0,
                                                    sample_weights=weights))]
    return numbered(out, 0)


@pytest.mark.parametrize("executor", [VectorisedExecutor, GroupedExecutor, ProcessExecutor])
def test_every_executor_runs_them_as_the_sequential_one_does(executor, one_thread):
    federation = uneven_digits()
    if executor is ProcessExecutor:   # two workers; tasks answered whole through shared memory
        seq, _, w0 = executor_pair(federation, VectorisedExecutor)
        with ProcessExecutor(seq.model, federation, seq.seed, workers=2) as other:
            got = other.run(door_tasks(federation, w0), 0)
    else:
        seq, other, w0 = executor_pair(federation, executor)
        got = other.run(door_tasks(federation, w0), 0)
    want = seq.run(door_tasks(federation, w0), 0)
    for a, b in zip(want, got, strict=True):
        assert (a.task_id, a.kind) == (b.task_id, b.kind)
        for name in ("update", "losses", "labels"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None)
            if x is None:
                continue
            if executor is GroupedExecutor and name == "update":
                # Trained grouped (one wider model): equal to float tolerance, not bit for bit.
                np.testing.assert_allclose(y, x, rtol=1e-4, atol=2e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(y, x, err_msg=name)


def test_per_sample_results_cross_the_flower_wire_and_are_checked(setup):
    _, flat, x, y = setup
    stacked = torch.stack([flat.initial_vector()] * 3).numpy()
    task = numbered([ClientTask(0, TaskKind.LOSSES, stacked,
                                loss=LossSpec(per_sample=True, labels=True))], 0)[0]
    result = run_task(flat, task, (x, y), (x, y), torch.Generator())
    back = decode_result(encode_result(result))
    np.testing.assert_array_equal(back.losses, result.losses)
    np.testing.assert_array_equal(back.labels, result.labels)
    assert check_result(task, back) is None
    from dataclasses import replace
    short = replace(back, losses=back.losses[:, :-1])
    assert "wrong shape: losses (3, 11), expected (3, 12)" in check_result(task, short)
    assert "labels" in check_result(task, replace(back, labels=None))

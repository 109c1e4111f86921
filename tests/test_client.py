"""Client tasks against plain PyTorch (brute force) on the same batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import digits_client, torch_reference_train

from clusterfed.client import ClientResult, ClientTask, TaskKind, TrainSpec, run_task
from clusterfed.client.work import evaluate, gradient, losses, train
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel
from clusterfed.tasks import match_results, numbered

pytestmark = pytest.mark.fast


@pytest.fixture
def setup():
    return digits_client(23)


@pytest.mark.parametrize("spec", [
    TrainSpec(lr=0.1, batch_size=5, epochs=2),
    TrainSpec(lr=0.05, batch_size=4, epochs=None, steps=9, momentum=0.9, weight_decay=1e-3),
    TrainSpec(lr=0.5, batch_size=6, epochs=2, momentum=0.5, clip_grad_norm=0.25),
    TrainSpec(lr=0.01, batch_size=5, epochs=2, optimizer="adam"),
    TrainSpec(lr=0.003, batch_size=4, epochs=None, steps=9, optimizer="adam",
              weight_decay=1e-3, adam_beta1=0.5),
    TrainSpec(lr=0.01, batch_size=6, epochs=2, optimizer="adam", clip_grad_norm=0.25),
])
def test_train_equals_torch_optimisers(setup, spec):
    module, flat, x, y = setup
    w0 = flat.initial_vector()
    update, loss = train(flat, w0, x, y, spec, torch.Generator().manual_seed(7))
    expected = torch_reference_train(module, x, y, spec, seed=7)
    torch.testing.assert_close(w0 + update, expected, rtol=1e-5, atol=1e-6)
    assert math.isfinite(loss) and loss > 0
    torch.testing.assert_close(flat.initial_vector(), w0)  # the module itself is untouched


def test_epochs_count_partial_batches():
    spec = TrainSpec(lr=0.1, batch_size=10, epochs=3)
    assert spec.num_steps(23) == 9  # ceil(23 / 10) = 3 batches per epoch
    assert spec.num_steps(4) == 3   # batch larger than the data: one batch per epoch
    assert TrainSpec(lr=0.1, batch_size=10, epochs=None, steps=5).num_steps(1000) == 5


def test_lr_decay_per_round():
    spec = TrainSpec(lr=0.1, batch_size=10)
    assert spec.decayed(0.5, 0).lr == pytest.approx(0.1)
    assert spec.decayed(0.5, 3).lr == pytest.approx(0.0125)


@pytest.mark.parametrize("kwargs", [dict(epochs=None, steps=None), dict(epochs=1, steps=2),
                                    dict(epochs=0), dict(batch_size=0), dict(lr=0.0),
                                    dict(lr=float("nan")), dict(momentum=1.0),
                                    dict(clip_grad_norm=0.0)])
def test_bad_train_spec(kwargs):
    with pytest.raises(ConfigError):
        TrainSpec(**{"lr": 0.1, "batch_size": 10, **kwargs})


def test_gradient_is_full_batch_mean_gradient(setup):
    module, flat, x, y = setup
    w0 = flat.initial_vector()
    grad, loss = gradient(flat, w0, x, y)
    module.zero_grad()
    full = F.cross_entropy(module(x), y)
    full.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)
    assert loss == pytest.approx(float(full.detach()), rel=1e-5)


def test_evaluate_and_losses(setup):
    module, flat, x, y = setup
    w0 = flat.initial_vector()
    with torch.no_grad():
        logits = module(x)
    loss, acc = evaluate(flat, w0, x, y)
    assert loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    other = w0 * 0.5
    stacked = torch.stack([w0, other])
    got = losses(flat, stacked, x, y)
    assert got[0] == pytest.approx(loss, rel=1e-6)
    assert got[1] == pytest.approx(evaluate(flat, other, x, y)[0], rel=1e-6)


def test_run_task_dispatch(setup):
    _, flat, x, y = setup
    w0 = flat.initial_vector().numpy()
    gen = torch.Generator().manual_seed(0)
    tx, ty = x[:5], y[:5]
    spec = TrainSpec(lr=0.1, batch_size=8)
    r = run_task(flat, ClientTask(3, TaskKind.TRAIN, w0, spec, {"cluster": 2}), (x, y), (tx, ty),
                 gen)
    assert (r.client, r.num_samples, r.meta["cluster"]) == (3, 23, 2)
    assert r.update.shape == w0.shape and np.abs(r.update).sum() > 0
    ev = run_task(flat, ClientTask(3, TaskKind.EVALUATE, np.stack([w0, w0])), (x, y), (tx, ty),
                  gen)
    assert ev.num_samples == 5 and ev.accuracies.shape == (2,)
    ls = run_task(flat, ClientTask(3, TaskKind.LOSSES, w0), (x, y), (tx, ty), gen)
    assert ls.losses.shape == (1,)
    with pytest.raises(ValueError):
        run_task(flat, ClientTask(3, TaskKind.TRAIN, w0), (x, y), (tx, ty), gen)


def test_non_finite_results_are_detected():
    ok = ClientResult(0, TaskKind.TRAIN, 5, update=np.ones(3, np.float32), loss=0.3)
    assert ok.is_finite()
    assert not ClientResult(0, TaskKind.TRAIN, 5, update=np.array([1, np.nan], np.float32),
                            loss=0.3).is_finite()
    assert not ClientResult(0, TaskKind.TRAIN, 5, update=np.ones(2, np.float32),
                            loss=float("inf")).is_finite()
    assert not ClientResult(0, TaskKind.LOSSES, 5, losses=np.array([np.inf])).is_finite()


def test_clipping_is_active_in_the_clipped_case(setup):
    # Guards the clipped reference case above: at norm 0.25 the gradients really are clipped.
    module, flat, x, y = setup
    grad, _ = gradient(flat, flat.initial_vector(), x, y)
    assert float(grad.norm()) > 0.25


def test_evaluation_chunks_hold_about_a_thousand_targets():
    from clusterfed.client.work import chunk_rows
    assert chunk_rows(torch.zeros(5000, dtype=torch.long)) == 1000
    assert chunk_rows(torch.zeros(5000, 35, dtype=torch.long)) == 28
    assert chunk_rows(torch.zeros(0, dtype=torch.long)) == 1000


def test_padded_targets_are_not_scored():
    # Sequence targets padded with -100 (cross_entropy's ignore_index) count neither way.
    module = torch.nn.Sequential(torch.nn.Embedding(6, 6))

    class PerToken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x):
            return self.inner(x).permute(0, 2, 1)   # (N, vocab, T)

    flat = FlatModel(PerToken())
    x = torch.tensor([[1, 2, 3], [4, 5, 0]])
    y = torch.tensor([[2, 3, 4], [5, -100, -100]])
    loss, acc = evaluate(flat, flat.initial_vector(), x, y)
    logits = PerToken()(x)
    expected = F.cross_entropy(logits, y, reduction="sum") / 4
    assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
    correct = int((logits.argmax(1) == y).sum())
    assert acc == pytest.approx(correct / 4)


def test_results_find_their_tasks_by_id_alone():
    w = np.zeros(3, np.float32)
    spec = TrainSpec(lr=0.1, batch_size=4)
    # Two tasks alike in client, kind and meta (nothing but the id tells them apart).
    tasks = numbered([ClientTask(0, TaskKind.TRAIN, w, spec, {"set": 0}),
                      ClientTask(0, TaskKind.TRAIN, w, spec, {"set": 0}),
                      ClientTask(1, TaskKind.TRAIN, w, spec),
                      ClientTask(2, TaskKind.LOSSES, w)], 10)
    assert [t.id for t in tasks] == [10, 11, 12, 13]
    # Task 10 never answered; results come in any order and carry other meta.
    results = [ClientResult(2, TaskKind.LOSSES, 5, meta={"seconds": 0.1}, task_id=13),
               ClientResult(0, TaskKind.TRAIN, 5, meta={}, task_id=11),
               ClientResult(1, TaskKind.TRAIN, 5, task_id=12)]
    pairs = match_results(tasks, results)
    assert [(t.id, r.task_id) for t, r in pairs] == [(11, 11), (12, 12), (13, 13)]
    assert pairs[0][0] is tasks[1] and pairs[0][1] is results[1]
    with pytest.raises(ValueError, match="answers task 9, which was not sent"):
        match_results(tasks, [ClientResult(0, TaskKind.TRAIN, 5, task_id=9)])
    with pytest.raises(ValueError, match="answered twice"):
        match_results(tasks, [results[1], results[1]])
    with pytest.raises(ValueError, match="its result is client 1"):
        match_results(tasks, [ClientResult(1, TaskKind.TRAIN, 5, task_id=11)])
    with pytest.raises(ValueError, match="has no id"):
        match_results([ClientTask(0, TaskKind.TRAIN, w, spec)], [])
    with pytest.raises(ValueError, match="share the id"):
        match_results([tasks[0], tasks[0]], [])


def test_run_task_answers_with_the_task_id():
    flat = FlatModel(torch.nn.Linear(3, 2))
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 0, 1])
    params = flat.initial_vector().numpy()
    for kind in (TaskKind.TRAIN, TaskKind.GRADIENT, TaskKind.LOSSES, TaskKind.EVALUATE):
        task = ClientTask(3, kind, params, TrainSpec(lr=0.1, batch_size=2), id=42)
        result = run_task(flat, task, (x, y), (x, y), torch.Generator().manual_seed(0))
        assert result.task_id == 42, kind

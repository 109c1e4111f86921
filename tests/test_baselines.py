"""The non-clustered baselines: each one's defining update against a hand-worked small case.

FedProx, SCAFFOLD and Per-FedAvg's client steps are checked on softmax regression, whose
gradient and Hessian-vector product are written out below in numpy; FedNova, SCAFFOLD and
LG-FedAvg's server updates on hand-made results.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import comparable, tiny_config

from clusterfed import state as st
from clusterfed.algorithms import ALGORITHMS, RoundContext, Setup, build_algorithm
from clusterfed.algorithms.fednova.algorithm import local_step_norms
from clusterfed.algorithms.lg_fedavg.algorithm import layer_index, shared_mask
from clusterfed.client import ClientResult, ClientTask, TaskKind, TrainSpec, run_task
from clusterfed.client.work import evaluate, meta_train, train
from clusterfed.config import merge
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.sampling import task_seed
from clusterfed.sim.protocols import ADAPTATION_STEP
from clusterfed.sim.simulation import Simulation
from clusterfed.tasks import LocalObjective

BASELINES = ["fedprox", "fednova", "scaffold", "lg_fedavg", "per_fedavg", "fedavg_ft"]


# Softmax regression, logits = X W^T + b, by hand ------------------------------------------------

def unpack(w: np.ndarray, k: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    return w[:k * d].reshape(k, d), w[k * d:]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def cross_entropy(w: np.ndarray, x: np.ndarray, y: np.ndarray, k: int) -> float:
    W, b = unpack(w, k, x.shape[1])
    return float(-np.log(softmax(x @ W.T + b)[np.arange(len(y)), y]).mean())


def grad(w: np.ndarray, x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """Gradient of the mean cross-entropy: (p - onehot)^T [x, 1] / n."""
    W, b = unpack(w, k, x.shape[1])
    r = softmax(x @ W.T + b)
    r[np.arange(len(y)), y] -= 1
    r /= len(y)
    return np.concatenate([(r.T @ x).ravel(), r.sum(0)])


def hvp(w: np.ndarray, v: np.ndarray, x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """Hessian of the mean cross-entropy times v: (diag(p) - p p^T) dz per sample."""
    W, b = unpack(w, k, x.shape[1])
    VW, vb = unpack(v, k, x.shape[1])
    p = softmax(x @ W.T + b)
    dz = x @ VW.T + vb
    dp = (p * dz - p * (p * dz).sum(1, keepdims=True)) / len(y)
    return np.concatenate([(dp.T @ x).ravel(), dp.sum(0)])


@pytest.fixture
def linear():
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 4)
    x = torch.randn(6, 3)
    y = torch.tensor([0, 1, 2, 3, 1, 2])
    return FlatModel(module), x, y


def numpy_of(*tensors):
    return [t.detach().numpy().astype(np.float64) for t in tensors]


# Client side -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mu,correct,momentum", [(0.5, False, 0.0), (0.5, False, 0.5),
                                                 (0.0, True, 0.0), (0.0, True, 0.5)])
def test_proximal_term_and_correction_by_hand(linear, mu, correct, momentum):
    """FedProx: g + mu (w - w0) through momentum; SCAFFOLD: + (c - c_i) after it, per step."""
    flat, x, y = linear
    w0 = flat.initial_vector()
    corr = np.linspace(-0.3, 0.4, flat.size).astype(np.float32) if correct else None
    spec = TrainSpec(lr=0.2, batch_size=6, epochs=3, momentum=momentum)  # full batch: 3 steps
    update, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(1),
                      LocalObjective(prox_mu=mu, correction=corr))
    wn, xn, yn = *numpy_of(w0, x), y.numpy()
    w, v = wn.copy(), None
    for _ in range(3):
        g = grad(w, xn, yn, 4) + mu * (w - wn)
        v = g if v is None else momentum * v + g
        w = w - 0.2 * (v + (corr if correct else 0.0))
    np.testing.assert_allclose(wn + update.numpy(), w, rtol=1e-5, atol=1e-6)


def test_plain_objective_equals_plain_sgd(linear):
    flat, x, y = linear
    w0 = flat.initial_vector()
    spec = TrainSpec(lr=0.1, batch_size=4, epochs=2, momentum=0.9)
    plain, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(3))
    zero, _ = train(flat, w0, x, y, spec, torch.Generator().manual_seed(3), LocalObjective())
    torch.testing.assert_close(plain, zero, rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_per_fedavg_meta_steps_by_hand(linear, variant):
    """Two meta steps, every batch the full data (batch_size >= n)."""
    flat, x, y = linear
    w0 = flat.initial_vector()
    alpha, beta = 0.3, 0.5
    objective = LocalObjective(maml=variant, maml_alpha=alpha, maml_delta=1e-3)
    spec = TrainSpec(lr=beta, batch_size=10, epochs=None, steps=2)
    update, loss = meta_train(flat, w0, x, y, spec, torch.Generator().manual_seed(0), objective)
    wn, xn, yn = *numpy_of(w0, x), y.numpy()
    w, losses = wn.copy(), []
    for _ in range(2):
        inner = w - alpha * grad(w, xn, yn, 4)                # w~ = w - alpha grad f(w)
        losses.append(cross_entropy(inner, xn, yn, 4))
        g = grad(inner, xn, yn, 4)
        if variant == "hf":
            g = g - alpha * hvp(w, g, xn, yn, 4)              # (I - alpha H) grad f(w~)
        w = w - beta * g
    np.testing.assert_allclose(wn + update.numpy(), w, rtol=1e-4, atol=2e-5)
    # The loss reported is the meta-objective's: the mean of f(w~) over meta steps.
    assert loss == pytest.approx(np.mean(losses), rel=1e-5)
    # FO and HF differ by the Hessian term: not the same update.
    other = LocalObjective(maml="hf" if variant == "fo" else "fo", maml_alpha=alpha)
    other_update, _ = meta_train(flat, w0, x, y, spec, torch.Generator().manual_seed(0), other)
    assert not torch.allclose(update, other_update, atol=1e-5)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_per_fedavg_shared_momentum_is_the_pacfl_authors_loop(linear, momentum):
    """`maml_momentum: shared` against the PACFL authors' Client_Per_FedAvg.train written out
    with torch.optim.SGD: an inner step of alpha, the gradient at w~, the weights put back,
    an outer step of beta, one optimiser (and momentum buffer) for both; full batches."""
    flat, x, y = linear
    w0 = flat.initial_vector()
    alpha, beta, steps = 0.3, 0.5, 3
    spec = TrainSpec(lr=beta, batch_size=10, epochs=None, steps=steps, momentum=momentum)
    shared = LocalObjective(maml="fo", maml_alpha=alpha, maml_momentum="shared")
    update, _ = meta_train(flat, w0, x, y, spec, torch.Generator().manual_seed(0), shared)
    net = torch.nn.Linear(3, 4)
    torch.nn.utils.vector_to_parameters(w0.clone(), net.parameters())
    sgd = torch.optim.SGD(net.parameters(), lr=alpha, momentum=momentum)
    for _ in range(steps):
        saved = {k: v.clone() for k, v in net.state_dict().items()}
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        for group in sgd.param_groups:
            group["lr"] = alpha
        sgd.step()
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        net.load_state_dict(saved)
        for group in sgd.param_groups:
            group["lr"] = beta
        sgd.step()
    expected = torch.nn.utils.parameters_to_vector(net.parameters()).detach()
    torch.testing.assert_close(w0 + update, expected, rtol=1e-5, atol=1e-6)
    # Momentum on the meta-gradient alone is another loop, unless there is no momentum.
    meta, _ = meta_train(flat, w0, x, y, spec, torch.Generator().manual_seed(0),
                         replace(shared, maml_momentum="meta"))
    assert torch.allclose(meta, update, atol=1e-6) == (momentum == 0.0)


def test_per_fedavg_epoch_of_one_pass_takes_a_meta_step_a_pair_of_batches():
    """The PACFL authors' `len(ldr_train) // 2` meta steps an epoch (`epoch: pass`)."""
    def spec(**options) -> TrainSpec:
        algo = build_algorithm({"name": "per_fedavg", **options})
        state = algo.init(Setup(2, np.zeros(3, np.float32), np.array([20, 20]), 0))
        ctx = RoundContext(0, np.array([0]), TrainSpec(lr=0.01, batch_size=10, epochs=3))
        return algo.plan(state, ctx)[0].train

    assert spec(epoch="batches").num_steps(55) == 3 * 6     # a step a batch: two passes
    assert spec(epoch="pass").num_steps(55) == 3 * 3        # 6 batches, 3 pairs: one pass
    assert spec(epoch="pass").num_steps(5) == 3             # one batch: still a step
    assert spec(epoch="pass", variant="hf").num_steps(60) == 3 * 2   # three batches a step
    with pytest.raises(ValueError, match="first-order"):
        build_algorithm({"name": "per_fedavg", "momentum": "shared", "variant": "hf"})
    with pytest.raises(ValueError, match="epoch"):
        build_algorithm({"name": "per_fedavg", "epoch": "twice"})
    with pytest.raises(ConfigError, match="first order"):
        LocalObjective(maml="hf", maml_momentum="shared")


def test_train_results_report_their_local_steps(linear):
    flat, x, y = linear
    spec = TrainSpec(lr=0.1, batch_size=4, epochs=3)   # ceil(6 / 4) = 2 batches an epoch
    r = run_task(flat, ClientTask(0, TaskKind.TRAIN, flat.initial_vector().numpy(), spec,
                                  {"cluster": 1}), (x, y), (x, y), torch.Generator())
    assert r.meta == {"cluster": 1, "local_steps": 6}


def test_bad_objectives():
    with pytest.raises(ConfigError):
        LocalObjective(prox_mu=-1.0)
    with pytest.raises(ConfigError):
        LocalObjective(maml="so")
    with pytest.raises(ConfigError):
        LocalObjective(maml="fo", prox_mu=0.1)


# Server side -------------------------------------------------------------------------------------

def result(client: int, update, samples: int, steps: int | None = None) -> ClientResult:
    meta = {} if steps is None else {"local_steps": steps}
    return ClientResult(client, TaskKind.TRAIN, samples, update=np.array(update, np.float32),
                        loss=1.0, meta=meta)


def context(sampled, lr=0.1, momentum=0.0) -> RoundContext:
    return RoundContext(0, np.array(sampled), TrainSpec(lr=lr, batch_size=10, momentum=momentum))


def test_fednova_normalises_unequal_local_steps():
    algo = build_algorithm({"name": "fednova"})
    state = algo.init(Setup(3, np.zeros(2, np.float32), np.array([2, 6, 5]), 0))
    # tau = 2 and 6, p = 1/4 and 3/4: d = (1, 0) and (0, 1), tau_eff = 2/4 + 18/4 = 5.
    upd = algo.update(state, context([0, 1]), [result(0, [2.0, 0.0], 2, steps=2),
                                               result(1, [0.0, 6.0], 6, steps=6)])
    np.testing.assert_allclose(upd.state.model, [1.25, 3.75])
    assert upd.metrics["tau_eff"] == pytest.approx(5.0)
    # FedAvg's average would be (0.5, 4.5): the longer-trained client would dominate.
    fedavg = build_algorithm({"name": "fedavg"})
    equal = [result(0, [2.0, 0.0], 2, steps=4), result(1, [0.0, 6.0], 6, steps=4)]
    np.testing.assert_allclose(algo.update(state, context([0, 1]), equal).state.model,
                               fedavg.update(state, context([0, 1]), equal).state.model,
                               rtol=1e-6)


def test_fednova_momentum_norm_is_the_summed_heavy_ball_coefficients():
    """||a||_1: how far tau momentum steps of a constant unit gradient move, in units of lr."""
    for rho in (0.0, 0.5, 0.9):
        for tau in (1, 3, 10):
            v, moved = 0.0, 0.0
            for _ in range(tau):
                v = rho * v + 1.0
                moved += v
            assert local_step_norms(np.array([tau]), rho)[0] == pytest.approx(moved)
    assert local_step_norms(np.array([3]), 0.5)[0] == pytest.approx(1 + 1.5 + 1.75)


def test_scaffold_control_variates_option_two():
    algo = build_algorithm({"name": "scaffold"})
    state = algo.init(Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0))
    state = type(state)(state.model, np.array([1.0, 0.0], np.float32),
                        {1: np.array([0.5, 0.0], np.float32)}, 4)
    tasks = algo.plan(state, context([1, 2], lr=0.1))
    np.testing.assert_allclose(tasks[0].objective.correction, [0.5, 0.0])  # c - c_1
    np.testing.assert_allclose(tasks[1].objective.correction, [1.0, 0.0])  # c - 0
    upd = algo.update(state, context([1, 2], lr=0.1),
                      [result(1, [-0.3, 0.1], 10, steps=3), result(2, [0.6, 0.0], 10, steps=2)])
    s = upd.state
    # c_i+ = c_i - c + (x - y_i) / (K lr)
    np.testing.assert_allclose(s.client_controls[1], [0.5 - 1 + 0.3 / 0.3, -0.1 / 0.3], rtol=1e-6)
    np.testing.assert_allclose(s.client_controls[2], [-1 - 0.6 / 0.2, 0.0], rtol=1e-6)
    # c <- c + (1/N) sum (c_i+ - c_i) with N = 4; x <- x + mean(y_i - x)
    np.testing.assert_allclose(s.control, [1 + (0 - 4) / 4, (-1 / 3) / 4], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(s.model, [0.15, 0.05], rtol=1e-6)
    assert sorted(s.client_controls) == [1, 2]
    restored = st.loads(st.dumps(s))
    np.testing.assert_array_equal(restored.client_controls[2], s.client_controls[2])


def test_scaffold_option_one_uses_the_gradient_at_the_server_model():
    algo = build_algorithm({"name": "scaffold", "option": "I"})
    state = algo.init(Setup(2, np.zeros(2, np.float32), np.full(2, 10), 0))
    tasks = algo.plan(state, context([0, 1]))
    assert [(t.client, t.kind) for t in tasks] == [(0, TaskKind.TRAIN), (0, TaskKind.GRADIENT),
                                                   (1, TaskKind.TRAIN), (1, TaskKind.GRADIENT)]
    g = ClientResult(0, TaskKind.GRADIENT, 10, update=np.array([2.0, -2.0], np.float32))
    upd = algo.update(state, context([0, 1]), [result(0, [1.0, 1.0], 10, steps=5), g,
                                               result(1, [3.0, 3.0], 10, steps=5)])
    # Client 1's gradient was rejected: it keeps out of the round; client 0 sets c_0 = g.
    np.testing.assert_allclose(upd.state.client_controls[0], [2.0, -2.0])
    np.testing.assert_allclose(upd.state.control, [1.0, -1.0])
    np.testing.assert_allclose(upd.state.model, [1.0, 1.0])
    assert 1 not in upd.state.client_controls


LAYOUT = (("0.weight", (2, 2)), ("0.bias", (2,)), ("1.weight", (1, 2)), ("1.bias", (1,)))


def test_lg_keeps_local_layers_and_averages_the_head():
    algo = build_algorithm({"name": "lg_fedavg", "global_layers": 1})
    w0 = np.arange(9, dtype=np.float32)
    state = algo.init(Setup(3, w0, np.array([1, 1, 3]), 0, LAYOUT))
    np.testing.assert_array_equal(state.shared, [False] * 6 + [True] * 3)
    u0 = np.arange(9, dtype=np.float32) / 10
    u2 = -np.ones(9, dtype=np.float32)
    s = algo.update(state, context([0, 2]), [result(0, u0, 1), result(2, u2, 3)]).state
    np.testing.assert_allclose(s.local[0], w0[:6] + u0[:6])   # client 0's own, not averaged
    np.testing.assert_allclose(s.local[1], w0[:6])            # not sampled: untouched
    np.testing.assert_allclose(s.local[2], w0[:6] - 1)
    np.testing.assert_allclose(s.head, w0[6:] + (u0[6:] + 3 * u2[6:]) / 4, rtol=1e-6)
    view = algo.clusters(s)
    np.testing.assert_array_equal(view.assignment, [0, 1, 2])
    np.testing.assert_allclose(view.models[:, 6:], np.tile(s.head, (3, 1)))
    np.testing.assert_allclose(view.models[:, :6], s.local)
    # The next round starts each client from its own local layers and the averaged head.
    task = algo.plan(s, context([2]))[0]
    np.testing.assert_allclose(task.params, view.models[2])


def test_lg_layers_are_weight_layers_with_their_norms():
    def layout(name, shape, k):
        return tuple((n, tuple(p.shape)) for n, p in build_model(name, shape, k).named_parameters())

    assert max(layer_index(layout("lenet5", (1, 28, 28), 10))) + 1 == 5
    assert max(layer_index(layout("resnet9_gn", (3, 32, 32), 100))) + 1 == 9
    lenet = layout("lenet5", (1, 28, 28), 10)
    mask = shared_mask(lenet, 2)   # PACFL: fc2 + fc3 global
    assert mask.sum() == 120 * 84 + 84 + 84 * 10 + 10 and mask[-1] and not mask[0]
    with pytest.raises(ConfigError):
        shared_mask(lenet, 6)


def test_lg_runs_and_needs_the_layout():
    sim = Simulation(tiny_config("lg_fedavg", train={"rounds": 2, "participation": 1.0}))
    sim.run()
    view = sim.algorithm.clusters(sim.state)
    shared = sim.state.shared
    assert np.all(view.models[:, shared] == view.models[0, shared])
    assert not np.allclose(view.models[0, ~shared], view.models[1, ~shared])
    with pytest.raises(ConfigError, match="privacy"):
        Simulation(tiny_config("lg_fedavg", run={"privacy": "permutation"})).run()


def test_fedprox_without_mu_is_fedavg():
    a = Simulation(tiny_config("fedavg"))
    b = Simulation(merge(tiny_config("fedprox"), {"algorithm": {"name": "fedprox", "mu": 0.0}}))
    assert a.run()["final"] == b.run()["final"]
    tasks = b.algorithm.plan(b.state, context([0]))
    assert tasks[0].objective is None


# Test-time adaptation ---------------------------------------------------------------------------

def test_fedavg_ft_fine_tunes_at_evaluation_and_leaves_the_state_alone():
    plain = Simulation(tiny_config("fedavg", eval={"every": 2}))
    tuned = Simulation(merge(tiny_config("fedavg_ft", eval={"every": 2}),
                             {"algorithm": {"name": "fedavg_ft", "finetune_epochs": 2}}))
    s_plain, s_tuned = plain.run(), tuned.run()
    assert st.dumps(plain.state) == st.dumps(tuned.state)   # same training, same state
    # Each client's figure is its served model after 2 epochs of its own SGD, seeded per client;
    # FedAvg's is the served model itself.
    model, spec = tuned.state.model, tuned.spec
    finetune = TrainSpec(lr=spec.lr, batch_size=spec.batch_size, epochs=2, momentum=spec.momentum)
    for c in (0, 5):
        x, y = tuned.executor.train[c]
        gen = torch.Generator().manual_seed(task_seed(3, 3, ADAPTATION_STEP, c))
        update, _ = train(tuned.model, torch.as_tensor(model), x, y, finetune, gen)
        acc = evaluate(tuned.model, torch.as_tensor(model) + update, *tuned.executor.test[c])[1]
        served = evaluate(tuned.model, torch.as_tensor(model), *tuned.executor.test[c])[1]
        assert s_tuned["final"]["per_client_accuracy"][c] == pytest.approx(acc, abs=1e-6)
        assert s_plain["final"]["per_client_accuracy"][c] == pytest.approx(served, abs=1e-6)


def test_per_fedavg_personalises_with_one_step_of_alpha():
    algo = build_algorithm({"name": "per_fedavg", "alpha": 0.02, "beta": 0.001})
    spec = TrainSpec(lr=0.05, batch_size=10, epochs=3, momentum=0.5)
    adapt = algo.adaptation(None, spec)
    assert (adapt.lr, adapt.steps, adapt.epochs, adapt.momentum) == (0.02, 1, None, 0.0)
    state = algo.init(Setup(2, np.zeros(3, np.float32), np.full(2, 10), 0))
    task = algo.plan(state, RoundContext(0, np.array([1]), spec))[0]
    assert task.train.lr == 0.001 and task.objective.maml == "fo"
    assert task.objective.maml_alpha == 0.02
    records = []
    sim = Simulation(tiny_config("per_fedavg", train={"rounds": 2}),
                     callbacks=[lambda r, record: records.append(record)])
    summary = sim.run()
    # Tested after one personalisation step; the served (global) model's figure is kept too.
    assert records[-1]["mean_accuracy"] == summary["final"]["mean_accuracy"]
    w = torch.as_tensor(sim.state.model)
    step = sim.algorithm.adaptation(sim.state, sim.spec)
    served, personal = [], []
    for c in range(sim.federation.num_clients):
        x, y = sim.executor.train[c]
        gen = torch.Generator().manual_seed(task_seed(3, 1, ADAPTATION_STEP, c))
        update, _ = train(sim.model, w, x, y, step, gen)
        served.append(evaluate(sim.model, w, *sim.executor.test[c])[1])
        personal.append(evaluate(sim.model, w + update, *sim.executor.test[c])[1])
    assert records[-1]["served_mean_accuracy"] == pytest.approx(np.mean(served), abs=1e-6)
    assert records[-1]["mean_accuracy"] == pytest.approx(np.mean(personal), abs=1e-6)
    assert build_algorithm({"name": "per_fedavg", "personal_steps": 0}).adaptation(
        None, spec) is None
    # Under protocol 'local' the client is tested the same way: personalised from the global.
    local = Simulation(tiny_config("per_fedavg", train={"rounds": 2}, eval={"protocol": "local"}))
    assert local.run()["final"] == summary["final"]


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_are_registered_and_make_no_clustering_claim(name):
    assert getattr(ALGORITHMS.get(name), "toy_mixture_options", None) is None


@pytest.mark.parametrize("options", [{"name": "fedprox", "mu": -1}, {"name": "scaffold",
                                     "option": "III"}, {"name": "per_fedavg", "variant": "so"},
                                     {"name": "lg_fedavg", "global_layers": 0},
                                     {"name": "fedavg_ft", "finetune_epochs": 0}])
def test_bad_options_raise(options):
    with pytest.raises(ConfigError):
        build_algorithm(options)


@pytest.mark.parametrize("name", ["fedprox", "scaffold", "fedavg_ft"])
def test_privacy_transform_is_invisible(name):
    """SCAFFOLD's correction and test-time fine-tuning cross the privacy transform correctly."""
    plain = Simulation(tiny_config(name, train={"rounds": 2}))
    private = Simulation(tiny_config(name, train={"rounds": 2},
                                     run={"privacy": "signed_permutation", "privacy_seed": 5}))
    assert comparable(plain.run()) == comparable(private.run())

"""The model zoo: the specs' parameter counts, shapes, and fitness for flat-vector training."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from clusterfed.client import TrainSpec
from clusterfed.client.work import evaluate, train
from clusterfed.errors import ConfigError
from clusterfed.models import MODELS, FlatModel, build_model


@dataclass(frozen=True)
class Case:
    """A model on its natural input, shrunk through its options where that keeps tests quick."""

    input_shape: tuple[int, ...]
    n_classes: int
    options: dict[str, Any] = field(default_factory=dict)
    batch: int = 4
    lr: float = 0.05

    @property
    def tokens(self) -> bool:
        return len(self.input_shape) == 1


CASES = {
    "fedavg_cnn": Case((1, 28, 28), 10),
    "digits_cnn": Case((1, 8, 8), 10),
    "lenet5": Case((3, 32, 32), 10),
    "cfl_convnet": Case((1, 28, 28), 62),
    "cnn_femnist_tiny": Case((1, 28, 28), 10),
    "cnn_cifar_small": Case((3, 32, 32), 10),
    "cnn5_cifar": Case((3, 32, 32), 10),
    "resnet9_gn": Case((3, 32, 32), 100, batch=2, lr=0.001),
    "mlp": Case((1, 28, 28), 10),
    "lstm_lm": Case((12,), 50, {"embed_dim": 16, "hidden": 32}, lr=0.5),
    "char_lstm": Case((20,), 80, {"hidden": 32}, lr=0.5),
}


def make(name: str) -> nn.Module:
    case = CASES[name]
    torch.manual_seed(0)
    return build_model(name, case.input_shape, case.n_classes, **case.options)


def batch(name: str, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    case = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    if not case.tokens:
        x = torch.randn(case.batch, *case.input_shape, generator=gen)
        return x, torch.randint(0, case.n_classes, (case.batch,), generator=gen)
    tokens = torch.randint(0, case.n_classes, (case.batch, case.input_shape[0] + 1),
                           generator=gen)
    if name == "lstm_lm":  # a target per position: the sequence shifted by one
        return tokens[:, :-1], tokens[:, 1:]
    return tokens[:, :-1], tokens[:, -1]


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_every_case_is_registered():
    assert set(CASES) <= set(MODELS.names())


@pytest.mark.parametrize(("name", "input_shape", "n_classes", "options", "expected"), [
    ("fedavg_cnn", (1, 28, 28), 10, {}, 1_663_370),        # flhc.md
    ("lenet5", (3, 32, 32), 10, {}, 62_006),               # pacfl.md §4.4, pinned
    ("lenet5", (1, 28, 28), 10, {}, 44_426),               # pacfl.md §4.4, FMNIST
    ("lenet5", (3, 32, 32), 40, {}, 64_556),               # pacfl.md §4.4, MIX-4
    ("cnn_femnist_tiny", (1, 28, 28), 10, {}, 417_482),    # lcfl.md §4.3
    ("cnn_cifar_small", (3, 32, 32), 10, {}, 610_142),     # lcfl.md §4.3
    ("resnet9_gn", (3, 32, 32), 100, {}, 6_621_540),       # pacfl.md §4.4
    ("cfl_convnet", (1, 28, 28), 62, {}, 6 * 26 + 16 * 151 + 62 * 257),
    ("cnn5_cifar", (3, 32, 32), 10, {}, 122_570),
    ("mlp", (1, 28, 28), 10, {}, 199_210),                 # McMahan et al.'s 2NN
    ("mlp", (1, 28, 28), 10, {"hidden": []}, 7_850),       # logistic regression
    # LEAF's TensorFlow stacked LSTM: one bias per gate, 4h(in + h + 1) per layer.
    ("char_lstm", (80,), 80, {}, 80 * 8 + 1024 * (8 + 257) + 1024 * (256 + 257) + 257 * 80),
    ("lstm_lm", (35,), 10_000, {}, 4_769_552),
])
def test_parameter_counts(name, input_shape, n_classes, options, expected):
    assert num_params(build_model(name, input_shape, n_classes, **options)) == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_shape(name):
    case = CASES[name]
    x, y = batch(name)
    with torch.no_grad():
        out = make(name)(x)
    if name == "lstm_lm":
        assert out.shape == (case.batch, case.n_classes, case.input_shape[0])
    else:
        assert out.shape == (case.batch, case.n_classes)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_running_statistics(name):
    module = make(name)
    assert not any(isinstance(m, nn.modules.batchnorm._NormBase) for m in module.modules())
    assert list(module.buffers()) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_flat_training_reduces_loss(name):
    case = CASES[name]
    module = make(name)
    flat = FlatModel(module)
    x, y = batch(name)
    w0 = flat.initial_vector()
    torch.testing.assert_close(flat(w0, x), module(x))
    before, _ = evaluate(flat, w0, x, y)
    spec = TrainSpec(lr=case.lr, batch_size=case.batch, epochs=None, steps=3)
    update, train_loss = train(flat, w0, x, y, spec, torch.Generator().manual_seed(0))
    after, _ = evaluate(flat, w0 + update, x, y)
    assert math.isfinite(train_loss) and math.isfinite(after)
    assert update.abs().sum() > 0
    assert after < before


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_over_stacked_parameters(name):
    flat = FlatModel(make(name))
    x, _ = batch(name)
    x2, _ = batch(name, seed=5)
    w0 = flat.initial_vector()
    noise = torch.randn(flat.size, generator=torch.Generator().manual_seed(2))
    stacked = torch.stack([w0, w0 + 0.01 * noise])
    with torch.no_grad():
        shared = vmap(flat, in_dims=(0, None))(stacked, x)  # several models, one batch
        torch.testing.assert_close(shared, torch.stack([flat(w, x) for w in stacked]),
                                   rtol=1e-4, atol=1e-5)
        own = vmap(flat)(stacked, torch.stack([x, x2]))     # each model its own batch
        torch.testing.assert_close(own, torch.stack([flat(stacked[0], x), flat(stacked[1], x2)]),
                                   rtol=1e-4, atol=1e-5)


def test_lstm_lm_accuracy_is_per_token():
    flat = FlatModel(make("lstm_lm"))
    x, y = batch("lstm_lm")
    w0 = flat.initial_vector()
    loss, accuracy = evaluate(flat, w0, x, y)
    logits = flat(w0, x)
    assert loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert accuracy == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert accuracy * y.numel() == pytest.approx(round(accuracy * y.numel()))


def test_options_reach_the_model():
    lm = build_model("lstm_lm", (10,), 30, embed_dim=4, hidden=6, layers=3)
    assert lm.embedding.embedding_dim == 4 and len(lm.lstm) == 3
    net = build_model("mlp", (3, 4, 5), 7, hidden=[9])
    assert [m.out_features for m in net if isinstance(m, nn.Linear)] == [9, 7]


@pytest.mark.parametrize("name", sorted(CASES))
def test_unknown_option_is_named(name):
    case = CASES[name]
    with pytest.raises(ConfigError, match="bogus_width"):
        build_model(name, case.input_shape, case.n_classes, bogus_width=3)


@pytest.mark.parametrize(("name", "input_shape", "options"), [
    ("lenet5", (20,), {}),
    ("lenet5", (1, 8, 8), {}),           # too small for two 5x5 convs and pools
    ("resnet9_gn", (3, 4, 4), {}),
    ("lstm_lm", (3, 32, 32), {}),
    ("char_lstm", (80,), {"hidden": 0}),
    ("mlp", (1, 28, 28), {"hidden": [0]}),
])
def test_bad_shapes_and_sizes_are_config_errors(name, input_shape, options):
    with pytest.raises(ConfigError, match=name if not options else next(iter(options))):
        build_model(name, input_shape, 10, **options)


def test_normalize_puts_the_papers_input_normalisation_in_front_of_any_model():
    # The PACFL code's Fashion-MNIST transform, (x - 0.1307) / 0.3081, on inputs in [0, 1].
    plain = build_model("lenet5", (1, 28, 28), 10)
    normed = build_model("lenet5", (1, 28, 28), 10,
                         normalize={"mean": [0.1307], "std": [0.3081]})
    normed[1].load_state_dict(plain.state_dict())
    x = torch.rand(4, 1, 28, 28)
    torch.testing.assert_close(normed(x), plain((x - 0.1307) / 0.3081))
    # Same parameters, no buffers: flat vectors and vmap work as without it.
    assert FlatModel(normed).size == FlatModel(plain).size and not list(normed.buffers())
    flat = FlatModel(normed)
    w = flat.initial_vector()
    with torch.no_grad():
        torch.testing.assert_close(vmap(flat, in_dims=(0, None))(torch.stack([w, w]), x)[1],
                                   flat(w, x))
    three = build_model("mlp", (3, 2, 2), 4, normalize={"mean": [0.5, 0.4, 0.3],
                                                        "std": [0.2, 0.1, 0.4]})
    y = torch.rand(2, 3, 2, 2)
    expected = (y - torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1)) / torch.tensor(
        [0.2, 0.1, 0.4]).view(1, 3, 1, 1)
    torch.testing.assert_close(three(y), three[1](expected))
    for bad in ({"mean": [0.1]}, {"mean": [0.1], "std": [0.0]}, [0.1, 0.3]):
        with pytest.raises(ConfigError, match="normalize"):
            build_model("mlp", (1, 2, 2), 4, normalize=bad)


@pytest.mark.parametrize("name", sorted(CASES))
def test_pool_before_relu_keeps_every_output_and_gradient_bit_for_bit(name):
    import copy

    from clusterfed.models.zoo import MODELS as FACTORIES
    case = CASES[name]
    torch.manual_seed(0)
    paper = FACTORIES.get(name)(input_shape=case.input_shape, n_classes=case.n_classes,
                                **case.options)
    built = make(name)
    # The same parameters (same init seed), so any difference is the layer order's.
    assert all(torch.equal(a, b) for a, b in zip(paper.parameters(), built.parameters(),
                                                  strict=True))
    x, _ = batch(name)
    if not case.tokens:     # zeros and ties: windows with no positive value, equal maxima
        x = x.clamp(min=0) * (x.abs() > 0.5)
    outputs = []
    for model in (paper, copy.deepcopy(built)):
        out = model(x)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        outputs.append((out, torch.autograd.grad((out * weights).sum(),
                                                 list(model.parameters()))))
    (a, ga), (b, gb) = outputs
    assert torch.equal(a, b)
    assert all(torch.equal(p, q) for p, q in zip(ga, gb, strict=True))


def test_pool_before_relu_moves_each_relu_a_max_pool_follows():
    from clusterfed.models.rewrite import pool_before_relu
    model = pool_before_relu(nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Sequential(nn.Conv2d(2, 2, 3), nn.ReLU(), nn.AvgPool2d(2)),   # avg: not exact
        nn.Tanh(), nn.MaxPool2d(2), nn.ReLU(), nn.MaxPool2d(1, return_indices=True)))
    kinds = [type(m).__name__ for m in model.modules()
             if not isinstance(m, nn.Sequential)]
    assert kinds == ["Conv2d", "MaxPool2d", "ReLU", "Conv2d", "ReLU", "AvgPool2d", "Tanh",
                     "MaxPool2d", "ReLU", "MaxPool2d"]
    assert [type(m).__name__ for m in build_model("cfl_convnet", (1, 28, 28), 10)[0]] == [
        "Conv2d", "MaxPool2d", "ReLU", "Conv2d", "MaxPool2d", "ReLU", "Flatten"]

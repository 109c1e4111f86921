"""Image classifiers of the papers: (N, C, H, W) floats in, (N, n_classes) logits out.

None uses batch norm: with no running statistics a model is a pure function of its parameters,
which FlatModel and vmap over stacked parameter vectors rely on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from clusterfed.errors import ConfigError
from clusterfed.models.zoo import MODELS, image_shape


def _flat_features(name: str, features: nn.Module, shape: tuple[int, int, int]) -> int:
    """Width of `features`' flattened output, found by running one blank image through it."""
    try:
        with torch.no_grad():
            return features(torch.zeros(1, *shape)).numel()
    except RuntimeError as exc:
        raise ConfigError(f"model {name} cannot take inputs shaped {shape}: {exc}") from exc


def _two_conv_pool(name: str, input_shape: tuple[int, ...], channels: tuple[int, int],
                   padding: int = 0) -> tuple[nn.Sequential, int]:
    """Two 5x5 conv-ReLU-maxpool blocks and a flatten, and the width of what they put out.

    The feature stack of LeNet-5, CFL's ConvNet and LCFL's two small CNNs.
    """
    shape = image_shape(name, input_shape)
    features = nn.Sequential(
        nn.Conv2d(shape[0], channels[0], 5, padding=padding), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels[0], channels[1], 5, padding=padding), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    return features, _flat_features(name, features, shape)


@MODELS.register("lenet5")
def lenet5(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """PACFL's LeNet-5 (pacfl.md §4.4, Table 10; code `SimpleCNN` / `SimpleCNNMNIST`).

    5x5 conv 6, pool, 5x5 conv 16, pool (no padding), fc 120, fc 84, fc n_classes. The fc1 input
    is 400 on 3x32x32 and 256 on 1x28x28. Parameters: 62,006 on 3x32x32 with 10 classes (the
    count the spec pins); 44,426 on 1x28x28 (FMNIST); 64,556 with MIX-4's 40 outputs.
    """
    features, width = _two_conv_pool("lenet5", input_shape, (6, 16))
    return nn.Sequential(
        features,
        nn.Linear(width, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, n_classes),
    )


@MODELS.register("cfl_convnet")
def cfl_convnet(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """CFL's reference-code ConvNet for EMNIST (cfl.md §4.7; also A13's MNIST CNN).

    5x5 conv 6, pool, 5x5 conv 16, pool (no padding), then one linear layer from 16*4*4 = 256
    straight to the classes: no hidden fc layer. Parameters: 18,506 on 1x28x28 with EMNIST
    byclass's 62 classes; 5,142 with 10 classes.
    """
    features, width = _two_conv_pool("cfl_convnet", input_shape, (6, 16))
    return nn.Sequential(features, nn.Linear(width, n_classes))


@MODELS.register("cnn_femnist_tiny")
def cnn_femnist_tiny(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """LCFL's `CNNFEMnist_Tiny` (lcfl.md §4.3) for FEMNIST and Rotated MNIST.

    5x5 conv 16 ('same'), pool, 5x5 conv 32 ('same'), pool, fc 256, fc n_classes.
    Parameters: 417,482 on 1x28x28 with 10 classes (the spec's count; LCFL's FEMNIST subset
    uses letters a-j, so 10 classes there too).
    """
    features, width = _two_conv_pool("cnn_femnist_tiny", input_shape, (16, 32), padding=2)
    return nn.Sequential(features, nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, n_classes))


@MODELS.register("cnn_cifar_small")
def cnn_cifar_small(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """LCFL's `CNNCifar_Small` (lcfl.md §4.3) for Rotated CIFAR-10.

    5x5 conv 32, pool, 5x5 conv 84, pool (no padding; 84*5*5 = 2100), fc 256, fc n_classes.
    Parameters: 610,142 on 3x32x32 with 10 classes.
    """
    features, width = _two_conv_pool("cnn_cifar_small", input_shape, (32, 84))
    return nn.Sequential(features, nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, n_classes))


@MODELS.register("cnn5_cifar")
def cnn5_cifar(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """CFL's "5-layer CNN" for CIFAR-10, as cfl.md's ambiguity A13 recommends (a guess).

    3x3 conv 32, pool, 3x3 conv 64, pool, 3x3 conv 64, fc 64, fc n_classes: five weight layers.
    A13 leaves the padding open; 'valid' convolutions (32-30-15-13-6-4, 64*4*4 = 1024 features)
    give the common Keras CIFAR-10 tutorial network. Parameters: 122,570 on 3x32x32, 10 classes.
    """
    shape = image_shape("cnn5_cifar", input_shape)
    features = nn.Sequential(
        nn.Conv2d(shape[0], 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3), nn.ReLU(),
        nn.Flatten(),
    )
    width = _flat_features("cnn5_cifar", features, shape)
    return nn.Sequential(features, nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, n_classes))


def _conv_gn(c_in: int, c_out: int, pool: bool = False) -> nn.Sequential:
    # GroupNorm(32) instead of batch norm, as in PACFL's code: no running statistics.
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(32, c_out),
                               nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class ResNet9GN(nn.Module):
    """ResNet-9 with GroupNorm; see `resnet9_gn`."""

    def __init__(self, in_channels: int, n_classes: int) -> None:
        super().__init__()
        self.prep = _conv_gn(in_channels, 64)
        self.layer1_head = _conv_gn(64, 128, pool=True)
        self.layer1_res = nn.Sequential(_conv_gn(128, 128), _conv_gn(128, 128))
        self.layer2 = _conv_gn(128, 256, pool=True)
        self.layer3_head = _conv_gn(256, 512, pool=True)
        self.layer3_res = nn.Sequential(_conv_gn(512, 512), _conv_gn(512, 512))
        # Global max pool: MaxPool2d(4) of the code on 32x32 inputs, and any size besides.
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.linear = nn.Linear(512, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1_head(self.prep(x))
        x = x + self.layer1_res(x)
        x = self.layer3_head(self.layer2(x))
        x = x + self.layer3_res(x)
        return self.linear(self.pool(x).flatten(1))


@MODELS.register("resnet9_gn")
def resnet9_gn(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """PACFL's ResNet-9 with GroupNorm for CIFAR-100 (pacfl.md §4.4, Table 11; code `ResNet9`).

    Every conv is 3x3, padding 1, with bias, followed by GroupNorm(32) and ReLU; pools after
    layer1_head, layer2 and layer3_head; two residual blocks; global max pool; one linear head.
    Parameters: 6,621,540 on 3x32x32 with 100 classes (211.89 Mbit at fp32).
    """
    c, h, w = image_shape("resnet9_gn", input_shape)
    if h < 8 or w < 8:
        raise ConfigError(f"model resnet9_gn needs images of at least 8x8, got {input_shape}")
    return ResNet9GN(c, n_classes)


@MODELS.register("mlp")
def mlp(input_shape: tuple[int, ...], n_classes: int,
        hidden: Sequence[int] | int = (200, 200)) -> nn.Module:
    """A fully connected ReLU network on the flattened input; any input shape.

    The default (200, 200) is McMahan et al.'s MNIST "2NN": 199,210 parameters on 1x28x28 with
    10 classes. `hidden=[]` gives multinomial logistic regression.
    """
    sizes = [hidden] if isinstance(hidden, int) else list(hidden)
    if any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ConfigError(f"model.hidden must be positive layer widths, got {hidden!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for size in sizes:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)

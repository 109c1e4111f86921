"""Model factories by name. Each takes the input shape (C, H, W) and the number of classes."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from clusterfed.errors import ConfigError
from clusterfed.models.rewrite import pool_before_relu
from clusterfed.registry import Registry, accepted_keys, check_keys

ModelFactory = Callable[..., nn.Module]
MODELS: Registry[ModelFactory] = Registry("model")


def build_model(name: str, input_shape: tuple[int, ...], n_classes: int, **options: Any
                ) -> nn.Module:
    """A registered model by name, or a user's factory given as 'package.module:function'.

    `normalize: {mean: [...], std: [...]}` (any model) puts a per-channel (x - mean) / std in
    front of it: the papers' code normalises its training tensors while the data here stay
    in [0, 1] (PACFL's signatures are taken from the raw pixels, as its code does).

    Every model comes with each ReLU that a max pooling follows moved after the pooling
    (`rewrite.pool_before_relu`): the same function and gradients, bit for bit, for less work.
    """
    normalize = options.pop("normalize", None)
    factory = import_factory(name) if ":" in name else MODELS.get(name)
    allowed = accepted_keys(factory)
    check_keys("model", options, None if allowed is None else allowed - {"input_shape",
                                                                          "n_classes"})
    module = pool_before_relu(factory(input_shape=input_shape, n_classes=n_classes, **options))
    if normalize is None:
        return module
    if not isinstance(normalize, dict) or set(normalize) != {"mean", "std"}:
        raise ConfigError(f"model.normalize must be {{mean: [...], std: [...]}}, got "
                          f"{normalize!r}")
    return nn.Sequential(InputNormalize(normalize["mean"], normalize["std"]), module)


class InputNormalize(nn.Module):
    """(x - mean) / std per channel of (N, C, ...) inputs. Constants, not buffers: the model
    stays a pure function of its parameters (FlatModel, vmap)."""

    def __init__(self, mean: Any, std: Any) -> None:
        super().__init__()
        self.mean = [float(v) for v in (mean if isinstance(mean, list | tuple) else [mean])]
        self.std = [float(v) for v in (std if isinstance(std, list | tuple) else [std])]
        if len(self.mean) != len(self.std) or not all(v > 0 for v in self.std):
            raise ConfigError(f"model.normalize: one positive std per mean, got mean "
                              f"{self.mean} and std {self.std}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, len(self.mean)) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).reshape(shape)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).reshape(shape)
        return (x - mean) / std


def import_factory(path: str) -> ModelFactory:
    """'package.module:function' -> the function, which takes (input_shape, n_classes, ...)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"model.name {path!r}: cannot import {module_name} ({err})") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"model.name {path!r}: {module_name} has no callable {attr!r}")
    return factory


def image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError(f"model {name} takes images shaped (C, H, W), got {input_shape}")
    return input_shape  # type: ignore[return-value]


@MODELS.register("fedavg_cnn")
def fedavg_cnn(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """McMahan et al.'s CNN: 5x5 conv 32, pool, 5x5 conv 64, pool, fc 512 ('same' padding).

    1,663,370 parameters on 28x28x1 inputs with 10 classes.
    """
    c, h, w = image_shape("fedavg_cnn", input_shape)
    return nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), 512), nn.ReLU(),
        nn.Linear(512, n_classes),
    )


@MODELS.register("digits_cnn")
def digits_cnn(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """A small CNN for 8x8 digits: 3x3 conv 16, pool, 3x3 conv 32, pool, fc 64."""
    c, h, w = image_shape("digits_cnn", input_shape)
    return nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), 64), nn.ReLU(),
        nn.Linear(64, n_classes),
    )

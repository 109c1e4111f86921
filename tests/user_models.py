"""A user's own model factory, imported by tests as 'user_models:tiny_mlp'."""

from torch import nn


def tiny_mlp(input_shape: tuple[int, ...], n_classes: int, hidden: int = 16) -> nn.Module:
    size = 1
    for s in input_shape:
        size *= s
    return nn.Sequential(nn.Flatten(), nn.Linear(size, hidden), nn.ReLU(),
                         nn.Linear(hidden, n_classes))

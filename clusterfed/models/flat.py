"""A module seen as a function of one flat float32 parameter vector."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call


class FlatModel:
    """Runs a module with parameters taken from a flat vector, without copying them in.

    The vector is split into views shaped like the module's parameters, so gradients land in
    one flat tensor and every update is a vector operation.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.sizes = [p.numel() for _, p in module.named_parameters()]
        self.size = sum(self.sizes)

    def initial_vector(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).float()

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(flat, self.sizes)
        return {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}

    def __call__(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, self.unflatten(flat), (x,))

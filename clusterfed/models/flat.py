"""A module seen as a function of one flat float32 parameter vector."""

from __future__ import annotations

import torch
from torch import nn


class FlatModel:
    """Runs a module with parameters taken from a flat vector, without copying them in.

    The vector is split into views shaped like the module's parameters, so gradients land in
    one flat tensor and every update is a vector operation.

    The views are put in the module's parameter slots for the duration of one call and the
    original parameters put back after it: what `torch.func.functional_call` does, without
    its per-call bookkeeping, which cost small CNNs about a tenth of their training speed
    (benchmarks/overhead.py). Tied parameters (one tensor in several slots) get the same view
    in every slot. It works under `torch.func.vmap` and `grad` as functional_call does.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.sizes = [p.numel() for _, p in module.named_parameters()]
        self.size = sum(self.sizes)
        # Every parameter slot (owner module, attribute) and which unique parameter fills it.
        position = {id(p): i for i, (_, p) in enumerate(module.named_parameters())}
        self._slots: list[tuple[nn.Module, str, int]] = []
        for name, p in module.named_parameters(remove_duplicate=False):
            owner, _, attr = name.rpartition(".")
            self._slots.append((module.get_submodule(owner), attr, position[id(p)]))

    def initial_vector(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).float()

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(flat, self.sizes)
        return {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}

    def __call__(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        views = [p.view(s) for p, s in zip(torch.split(flat, self.sizes), self.shapes,
                                           strict=True)]
        saved = [owner._parameters[attr] for owner, attr, _ in self._slots]
        try:
            for owner, attr, i in self._slots:
                owner._parameters[attr] = views[i]  # type: ignore[assignment]
            return self.module(x)
        finally:
            for (owner, attr, _), original in zip(self._slots, saved, strict=True):
                owner._parameters[attr] = original

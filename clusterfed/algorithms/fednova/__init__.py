"""FedNova (Wang et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.fednova.algorithm import FedNova

__all__ = ["FedNova"]

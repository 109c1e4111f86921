"""FedProx (Li et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.fedprox.algorithm import FedProx

__all__ = ["FedProx"]

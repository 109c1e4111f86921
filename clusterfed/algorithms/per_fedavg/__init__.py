"""Per-FedAvg (Fallah et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.per_fedavg.algorithm import PerFedAvg

__all__ = ["PerFedAvg"]

"""LG-FedAvg (Liang et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.lg_fedavg.algorithm import LGFedAvg, LGState

__all__ = ["LGFedAvg", "LGState"]

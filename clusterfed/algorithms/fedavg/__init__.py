"""FedAvg (McMahan et al., 2017) (its folder: docs/design.md)."""

from clusterfed.algorithms.fedavg.algorithm import FedAvg, FedAvgState

__all__ = ["FedAvg", "FedAvgState"]

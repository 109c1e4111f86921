"""FedAvg with local fine-tuning at evaluation (its folder: docs/design.md)."""

from clusterfed.algorithms.fedavg_ft.algorithm import FedAvgFT

__all__ = ["FedAvgFT"]

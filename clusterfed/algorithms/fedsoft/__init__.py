"""FedSoft (Ruan and Joe-Wong, 2022) (its folder: docs/design.md)."""

from clusterfed.algorithms.fedsoft.algorithm import FedSoft, FedSoftState

__all__ = ["FedSoft", "FedSoftState"]

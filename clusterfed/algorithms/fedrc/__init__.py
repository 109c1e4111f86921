"""FedRC (Guo, Tang, Lin, 2024) (its folder: docs/design.md)."""

from clusterfed.algorithms.fedrc.algorithm import FedRC

__all__ = ["FedRC"]

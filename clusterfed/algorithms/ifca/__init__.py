"""IFCA (Ghosh et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.ifca.algorithm import IFCA, IFCAState

__all__ = ["IFCA", "IFCAState"]

"""FeSEM (Long, Xie et al., 2020/2023) (its folder: docs/design.md)."""

from clusterfed.algorithms.fesem.algorithm import FeSEM, FeSEMState

__all__ = ["FeSEM", "FeSEMState"]

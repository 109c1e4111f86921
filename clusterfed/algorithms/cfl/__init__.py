"""CFL (Sattler et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.cfl.algorithm import CFL, CFLState, Node

__all__ = ["CFL", "CFLState", "Node"]

"""SCAFFOLD (Karimireddy et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.scaffold.algorithm import Scaffold, ScaffoldState

__all__ = ["Scaffold", "ScaffoldState"]

"""LCFL (Gu et al., 2024) (its folder: docs/design.md)."""

from clusterfed.algorithms.lcfl.algorithm import LCFL, LCFLState

__all__ = ["LCFL", "LCFLState"]

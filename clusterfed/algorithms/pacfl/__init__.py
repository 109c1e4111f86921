"""PACFL (Vahidian et al., 2023) (its folder: docs/design.md)."""

from clusterfed.algorithms.pacfl.algorithm import PACFL, PACFLState

__all__ = ["PACFL", "PACFLState"]

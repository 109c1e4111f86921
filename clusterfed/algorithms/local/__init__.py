"""Local (SOLO): every client trains alone (its folder: docs/design.md)."""

from clusterfed.algorithms.local.algorithm import Local, LocalState

__all__ = ["Local", "LocalState"]

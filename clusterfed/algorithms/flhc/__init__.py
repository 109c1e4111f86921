"""FL+HC (Briggs et al., 2020) (its folder: docs/design.md)."""

from clusterfed.algorithms.flhc.algorithm import FLHC, FLHCState

__all__ = ["FLHC", "FLHCState"]

"""FedEM (Marfoq et al., 2021) (its folder: docs/design.md)."""

from clusterfed.algorithms.fedem.algorithm import FedEM, MixtureState

__all__ = ["FedEM", "MixtureState"]

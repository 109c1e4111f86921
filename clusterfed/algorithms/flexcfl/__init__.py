"""FlexCFL / FedGroup (Duan et al., 2021/2022) (its folder: docs/design.md)."""

from clusterfed.algorithms.flexcfl.algorithm import FlexCFL, FlexCFLState

__all__ = ["FlexCFL", "FlexCFLState"]

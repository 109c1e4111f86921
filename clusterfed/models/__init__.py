"""The papers' architectures as nn.Module factories, and the flat-vector view of any module."""

from clusterfed.models.flat import FlatModel
from clusterfed.models.zoo import MODELS, build_model

__all__ = ["MODELS", "FlatModel", "build_model"]

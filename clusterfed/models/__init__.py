"""The papers' architectures as nn.Module factories, and the flat-vector view of any module."""

# Importing the modules registers their architectures.
from clusterfed.models import text as _text  # noqa: E402,F401,I001
from clusterfed.models import vision as _vision  # noqa: E402,F401
from clusterfed.models.flat import FlatModel
from clusterfed.models.zoo import MODELS, build_model

__all__ = ["MODELS", "FlatModel", "build_model"]

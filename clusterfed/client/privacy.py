"""CFL's privacy transform (Sattler et al., Section V-B): an orthonormal map P of parameter space.

Clients share a secret the server never sees and derive the same P from it: a secret file
(`client/secret.py`; `run.privacy_secret_file` in-process, each node's `privacy-secret-file`
under Flower), or in the simulator a seed. They upload P(update)
and undo P on what they download, so the server clusters and averages in P-space. Cosines and
norms are invariant under P (Eq. 45) and averaging commutes with it (Eq. 46), so clustering and
accuracy are the same as without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clusterfed.client.secret import transform_entropy
from clusterfed.errors import ConfigError

KINDS = ("none", "permutation", "signed_permutation")


@dataclass(frozen=True)
class ParameterTransform:
    """x -> signs * x[perm] along the last axis, and its inverse."""

    perm: np.ndarray
    signs: np.ndarray | None = None

    @classmethod
    def from_seed(cls, kind: str, seed: int, size: int) -> ParameterTransform:
        return cls._draw(kind, seed, size)

    @classmethod
    def from_secret(cls, kind: str, secret: bytes, size: int) -> ParameterTransform:
        """The transform of a secret file's bytes (256 bits of hash seed the generator)."""
        return cls._draw(kind, transform_entropy(secret), size)

    @classmethod
    def _draw(cls, kind: str, entropy: int, size: int) -> ParameterTransform:
        if kind not in KINDS[1:]:
            raise ConfigError(f"unknown run.privacy {kind!r}; valid: {', '.join(KINDS)}")
        rng = np.random.default_rng([entropy, 0x9A1F])
        perm = rng.permutation(size)
        signs = rng.choice(np.array([-1.0, 1.0], np.float32), size) if kind.startswith(
            "signed") else None
        return cls(perm, signs)

    def forward(self, x: np.ndarray) -> np.ndarray:
        out = x[..., self.perm]
        return out * self.signs if self.signs is not None else out

    def inverse(self, y: np.ndarray) -> np.ndarray:
        # Sign flips are their own inverse; they are undone before the permutation.
        y = y * self.signs if self.signs is not None else y
        out = np.empty_like(y)
        out[..., self.perm] = y
        return out

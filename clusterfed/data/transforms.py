"""Per-client transforms, applied once when a federation is built."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Identity:
    def apply_x(self, x: np.ndarray) -> np.ndarray:
        return x

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        return y


@dataclass(frozen=True)
class LabelSwap:
    """Swap two labels in both directions (CFL's and FL+HC's concept shift)."""

    a: int
    b: int

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        return x

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        out = y.copy()
        out[y == self.a] = self.b
        out[y == self.b] = self.a
        return out


@dataclass(frozen=True)
class Rotate:
    """Rotate images counter-clockwise by `degrees` (IFCA's and LCFL's covariate shift)."""

    degrees: float

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        quarter_turns, rest = divmod(float(self.degrees), 90.0)
        if rest == 0.0:
            # Exact for multiples of 90 degrees: no interpolation blur.
            return np.ascontiguousarray(np.rot90(x, k=int(quarter_turns) % 4, axes=(-2, -1)))
        from scipy.ndimage import rotate

        turned = rotate(x.astype(np.float32), self.degrees, axes=(-1, -2), reshape=False, order=1)
        return np.clip(np.rint(turned), 0, 255).astype(x.dtype)

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        return y

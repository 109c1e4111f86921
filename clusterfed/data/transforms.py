"""Per-client transforms, applied once when a federation is built.

Image transforms act on (N, C, H, W) arrays (uint8, or floats in [0, 1]) and leave anything
else, such as int64 token ids (N, T), unchanged: the scenarios refuse to pair them with text.
Label transforms map every entry of y, so they also work on (N, T) sequence targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from clusterfed.data.corruptions import corrupt


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
        if not is_image(x):
            return x
        quarter_turns, rest = divmod(float(self.degrees), 90.0)
        if rest == 0.0:
            # Exact for multiples of 90 degrees: no interpolation blur.
            return np.ascontiguousarray(np.rot90(x, k=int(quarter_turns) % 4, axes=(-2, -1)))
        from scipy.ndimage import rotate

        turned = rotate(x.astype(np.float32), self.degrees, axes=(-1, -2), reshape=False, order=1)
        return np.clip(np.rint(turned), 0, 255).astype(x.dtype)

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        return y


@dataclass(frozen=True)
class LabelMap:
    """Relabel through a lookup table: label l becomes table[l] (a permutation or a subset map)."""

    table: tuple[int, ...]

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        return x

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        # Negative entries (a text loader's ignore index) are not labels: keep them.
        out = np.array(y, dtype=np.int64, copy=True)
        valid = out >= 0
        out[valid] = np.asarray(self.table, dtype=np.int64)[out[valid]]
        return out


@dataclass(frozen=True)
class Invert:
    """Pixel inversion, x -> max - x (255 for uint8, 1 for floats): a covariate shift."""

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        if not is_image(x):
            return x
        if x.dtype == np.uint8:
            return np.subtract(np.uint8(255), x)
        return (1.0 - x).astype(x.dtype)

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        return y


@dataclass(frozen=True)
class Corrupt:
    """A CIFAR-10-C / MNIST-C corruption at a severity (`corruptions.py`), its random draws
    from `seed`: the same images get the same corruption on every build."""

    name: str
    severity: int
    seed: tuple[int, ...]
    table: str = "cifar10_c"

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        if not is_image(x):
            return x
        rng = np.random.default_rng(list(self.seed))
        if x.dtype == np.uint8:
            out = corrupt(x.astype(np.float64) / 255.0, self.name, self.severity, rng, self.table)
            # Truncated to whole grey levels, as CIFAR-10-C's images were saved (np.uint8).
            return (out * 255.0).astype(np.uint8)
        return corrupt(x, self.name, self.severity, rng, self.table).astype(x.dtype)

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        return y


def flip_labels(y: np.ndarray, rate: float, flip: str, n_classes: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Label noise: round(rate n) of the n labels, chosen uniformly, are flipped.

    `symmetric`: to a uniformly random other label (l + U{1..K-1} mod K); `pair`: to the next
    label, l + 1 mod K (Han et al. 2018, co-teaching). Returns the labels and the flipped
    positions.
    """
    out = np.array(y, dtype=np.int64, copy=True)
    chosen = np.sort(rng.choice(len(out), int(round(rate * len(out))), replace=False))
    step = (rng.integers(1, n_classes, len(chosen)) if flip == "symmetric"
            else np.ones(len(chosen), dtype=np.int64))
    out[chosen] = (out[chosen] + step) % n_classes
    return out, chosen


@dataclass(frozen=True)
class NoisyLabels:
    """`flip_labels` with its draws from `seed`; a scenario gives it to training data only."""

    rate: float
    flip: str
    n_classes: int
    seed: tuple[int, ...]

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        return x

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(list(self.seed))
        return flip_labels(y, self.rate, self.flip, self.n_classes, rng)[0]


@dataclass(frozen=True)
class Chain:
    """Transforms applied in order (a scenario's own, then a corruption or label noise)."""

    steps: tuple[Any, ...]   # each with apply_x and apply_y (scenarios' `Transform`)

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        for step in self.steps:
            x = step.apply_x(x)
        return x

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        for step in self.steps:
            y = step.apply_y(y)
        return y


@dataclass(frozen=True)
class Mixed:
    """A client whose samples come from several sources (FedSoft's mixtures): the first
    floor(shares[0] n) of any n samples take parts[0], the next floor(shares[1] n) parts[1],
    ..., the last part the rest (the authors' rounding). The split is by position, so x and y
    (and train and test) stay aligned; a scenario shuffles the samples before."""

    shares: tuple[float, ...]
    parts: tuple[Any, ...]   # one Transform a source

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        return self._apply(x, "apply_x")

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        return self._apply(y, "apply_y")

    def _apply(self, a: np.ndarray, method: str) -> np.ndarray:
        ends = np.cumsum(mixture_counts(self.shares, len(a)))
        pieces = [getattr(part, method)(a[end - n:end])
                  for part, end, n in zip(self.parts, ends, np.diff(ends, prepend=0), strict=True)]
        return np.concatenate(pieces) if pieces else a


def mixture_counts(shares: tuple[float, ...] | np.ndarray, n: int) -> np.ndarray:
    """Samples per source of n: floor(share n) for every source but the last, which takes the
    rest (ycruan/FedSoft clients_preparation.py: int(frac * num_samples), the last the rest)."""
    counts = np.floor(np.asarray(shares, dtype=np.float64)[:-1] * n).astype(np.int64)
    return np.append(counts, n - counts.sum())


def is_image(x: np.ndarray) -> bool:
    """Images are (N, [C,] H, W) of uint8 or floats; integer token ids are not."""
    return x.ndim >= 3 and (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.floating))


# Per-channel (mean, std) of each source in the PACFL authors' code (spec pacfl.md 4.1).
AUTHORS_NORMALISATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ((0.507, 0.487, 0.441), (0.267, 0.256, 0.276)),
    "svhn": ((0.4376821, 0.4437697, 0.47280442), (0.19803012, 0.20101562, 0.19703614)),
    "fashion_mnist": ((0.1307,), (0.3081,)),
    "usps": ((0.1307,), (0.3081,)),
}


@dataclass(frozen=True)
class Normalize:
    """Images -> float32 (x / 255 for uint8) - mean, / std per channel; a one-value mean or
    std covers every channel (a grayscale source repeated to 3 channels, as in MIX-4)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def apply_x(self, x: np.ndarray) -> np.ndarray:
        if not is_image(x):
            return x
        scaled = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean = np.asarray(self.mean, dtype=np.float32).reshape(shape)
        std = np.asarray(self.std, dtype=np.float32).reshape(shape)
        return (scaled - mean) / std

    def apply_y(self, y: np.ndarray) -> np.ndarray:
        return y

"""Common image corruptions (CIFAR-10-C, MNIST-C), generated here from clean images.

Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
Perturbations" (ICLR 2019) define each corruption as a function of the image and one
parameter per severity 1..5; their CIFAR-10-C parameters (`make_cifar_c.py`, for 32x32
images) are the table `cifar10_c`. Mu & Gilmer, "MNIST-C" (2019), use the same functions with
parameters for 28x28 grey digits (`corruptions.py`, the severities of their full list): the
table `mnist_c`. With x in [0, 1] and p the parameter of the severity:

| corruption     | definition                                                            |
|----------------|-----------------------------------------------------------------------|
| gaussian_noise | clip(x + N(0, p^2)), per pixel and channel                            |
| shot_noise     | clip(Poisson(p x) / p): photon noise, p photons at full intensity     |
| impulse_noise  | salt and pepper: a share p of the values set to 0 or 1, half each     |
| speckle_noise  | clip(x + x N(0, p^2))                                                 |
| gaussian_blur  | Gaussian filter of standard deviation p per channel (edges: nearest)  |
| defocus_blur   | convolution with a disk of radius r, anti-aliased by a 3-tap Gaussian |
|                | of deviation a, p = (r, a) (edges: mirrored)                          |
| contrast       | clip((x - m) p + m), m each image's mean per channel                  |
| brightness     | HSV value V + p (clipped), hue and saturation kept                    |
| pixelate       | box-filter resize to floor(p H) x floor(p W) pixels and back          |

Written here from those definitions with numpy and scipy.ndimage: torchvision has no CPU build
in this environment, and the authors' scikit-image, OpenCV and ImageMagick are no dependency.
Where their libraries fix a detail, it is reproduced: scikit-image's `gaussian` (truncated at 4
deviations, nearest edges) and `random_noise(mode="s&p")` (per value, salt vs pepper 0.5);
OpenCV's `GaussianBlur` kernel and `filter2D` edges (reflect-101) for the disk; PIL's BOX
resampling (each output pixel the plain mean of the input pixels whose centres fall in its
footprint: nearest neighbour when enlarging) for pixelate. Brightness is the HSV edit done in
closed form: with hue and saturation fixed every channel scales with V, so the image becomes
x V'/V (grey V' where V = 0). Deviations: PIL rounds pixelate's small image to whole grey
levels, here it stays exact (at most one grey level apart); the random draws are numpy's
Generator's, not the global state the authors' scripts use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import ndimage

Corruption = Callable[[np.ndarray, Any, np.random.Generator], np.ndarray]


def gaussian_noise(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(x + rng.normal(scale=sigma, size=x.shape), 0.0, 1.0)


def shot_noise(x: np.ndarray, photons: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.poisson(x * photons) / photons, 0.0, 1.0)


def impulse_noise(x: np.ndarray, amount: float, rng: np.random.Generator) -> np.ndarray:
    hit = rng.random(x.shape) < amount
    salt = rng.random(x.shape) < 0.5
    out = x.copy()
    out[hit & salt] = 1.0
    out[hit & ~salt] = 0.0
    return out


def speckle_noise(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(x + x * rng.normal(scale=sigma, size=x.shape), 0.0, 1.0)


def gaussian_blur(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    # Only the two image axes: images and channels are not mixed.
    sigmas = (0.0,) * (x.ndim - 2) + (sigma, sigma)
    return np.clip(ndimage.gaussian_filter(x, sigmas, mode="nearest", truncate=4.0), 0.0, 1.0)


def gaussian_taps(size: int, sigma: float) -> np.ndarray:
    """OpenCV's Gaussian kernel of `size` taps: exp(-t^2 / (2 sigma^2)), t centred, sum 1."""
    t = np.arange(size) - (size - 1) / 2.0
    taps = np.exp(-t ** 2 / (2.0 * sigma ** 2))
    return taps / taps.sum()


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """The defocus disk: the pixels within `radius` of the centre (a 17x17 grid up to radius
    8), normalised, then smoothed by a Gaussian of 3 taps (5 for larger disks)."""
    half, taps = (8, 3) if radius <= 8 else (int(radius), 5)
    grid = np.arange(-half, half + 1)
    disk = (grid[:, None] ** 2 + grid[None, :] ** 2 <= radius ** 2).astype(np.float64)
    disk /= disk.sum()
    g = gaussian_taps(taps, alias_blur)
    disk = ndimage.correlate1d(disk, g, axis=0, mode="mirror")
    return ndimage.correlate1d(disk, g, axis=1, mode="mirror")


def defocus_blur(x: np.ndarray, param: tuple[float, float], rng: np.random.Generator
                 ) -> np.ndarray:
    kernel = disk_kernel(*param)
    kernel = kernel.reshape((1,) * (x.ndim - 2) + kernel.shape)
    return np.clip(ndimage.correlate(x, kernel, mode="mirror"), 0.0, 1.0)


def contrast(x: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    means = x.mean(axis=(-2, -1), keepdims=True)
    return np.clip((x - means) * factor + means, 0.0, 1.0)


def brightness(x: np.ndarray, shift: float, rng: np.random.Generator) -> np.ndarray:
    # V is the largest channel; (N, H, W) images have one channel.
    value = x.max(axis=1, keepdims=True) if x.ndim >= 4 else x
    brighter = np.clip(value + shift, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(value > 0, x * (brighter / value), brighter)
    return np.clip(scaled, 0.0, 1.0)


def box_resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of PIL's BOX resampling along one axis.

    Output pixel i is centred at (i + 0.5) s, s = n_in / n_out, and averages the input pixels
    j whose centre j + 0.5 lies in (centre - w/2, centre + w/2], w = max(s, 1).
    """
    scale = n_in / n_out
    width = max(scale, 1.0)
    centres = (np.arange(n_out) + 0.5) * scale
    offsets = (np.arange(n_in)[None, :] + 0.5 - centres[:, None]) / width
    weights = ((offsets > -0.5) & (offsets <= 0.5)).astype(np.float64)
    return weights / weights.sum(axis=1, keepdims=True)


def pixelate(x: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    h, w = x.shape[-2:]
    small_h, small_w = max(int(h * factor), 1), max(int(w * factor), 1)
    down_h, down_w = box_resize_matrix(h, small_h), box_resize_matrix(w, small_w)
    up_h, up_w = box_resize_matrix(small_h, h), box_resize_matrix(small_w, w)
    small = down_h @ x @ down_w.T
    return np.clip(up_h @ small @ up_w.T, 0.0, 1.0)


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "speckle_noise": speckle_noise,
    "gaussian_blur": gaussian_blur,
    "defocus_blur": defocus_blur,
    "contrast": contrast,
    "brightness": brightness,
    "pixelate": pixelate,
}

# The parameter of severities 1..5 in each published table.
TABLES: dict[str, dict[str, tuple[Any, ...]]] = {
    # Hendrycks & Dietterich's make_cifar_c.py.
    "cifar10_c": {
        "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
        "shot_noise": (500, 250, 100, 75, 50),
        "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
        "speckle_noise": (0.06, 0.10, 0.12, 0.16, 0.20),
        "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
        "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
        "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
        "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
        "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
    },
    # Mu & Gilmer's MNIST-C corruptions.py.
    "mnist_c": {
        "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
        "shot_noise": (60, 25, 12, 5, 3),
        "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
        "speckle_noise": (0.15, 0.2, 0.35, 0.45, 0.6),
        "gaussian_blur": (1, 2, 3, 4, 6),
        "defocus_blur": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
        "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
        "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
        "pixelate": (0.6, 0.5, 0.4, 0.3, 0.25),
    },
}
SEVERITIES = (1, 2, 3, 4, 5)


def corrupt(x: np.ndarray, name: str, severity: int, rng: np.random.Generator,
            table: str = "cifar10_c") -> np.ndarray:
    """Images (N, [C,] H, W) of floats in [0, 1] with corruption `name` at `severity`."""
    param = TABLES[table][name][severity - 1]
    return CORRUPTIONS[name](np.asarray(x, dtype=np.float64), param, rng)

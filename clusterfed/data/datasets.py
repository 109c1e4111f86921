"""Datasets as in-memory arrays, and the data root they are read from."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.errors import ConfigError
from clusterfed.registry import Registry, accepted_keys, check_keys


@dataclass(frozen=True)
class Dataset:
    """A labelled dataset split into train and test.

    Images are uint8 arrays shaped (N, C, H, W) (float32 in [0, 1] once in a federation);
    text is int64 token ids shaped (N, T), with labels (N,) for next-token classification or
    (N, T) for sequence language modelling. Labels are int64; `n_classes` is the vocabulary
    size for text. `train_groups` / `test_groups` give each sample's natural owner (a FEMNIST
    writer, a Shakespeare role, a MIX-4 source dataset) where the data have one.
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    n_classes: int
    train_groups: np.ndarray | None = None
    test_groups: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


DatasetLoader = Callable[..., Dataset]
DATASETS: Registry[DatasetLoader] = Registry("dataset")


def data_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The data root: an explicit setting, else $CLUSTERFED_DATA, else the user cache folder."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("CLUSTERFED_DATA"):
        return Path(os.environ["CLUSTERFED_DATA"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "clusterfed" / "data"


def load_dataset(name: str, root: str | os.PathLike[str] | None = None,
                 **options: object) -> Dataset:
    """Load a registered dataset by name; `options` are the loader's own keywords."""
    loader = DATASETS.get(name)
    allowed = accepted_keys(loader)
    if allowed is not None:
        allowed -= {"root"}
    check_keys("data", options, allowed)
    return loader(root=data_root(root), **options)


def positive_option(key: str, value: object) -> int:
    """A loader's `data.KEY` as a whole number >= 1, or one clear ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"data.{key} must be a positive integer, got {value!r}")
    return value


def fraction_option(key: str, value: object) -> float:
    """A loader's `data.KEY` as a number in (0, 1), or one clear ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"data.{key} must be a number in (0, 1), got {value!r}")
    return float(value)


@DATASETS.register("digits")
def load_digits(root: Path | None = None, test_fraction: float = 0.25) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 images), split once with a fixed seed."""
    from sklearn.datasets import load_digits as sk_digits

    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"data.test_fraction must be in (0, 1), got {test_fraction}")
    bunch = sk_digits()
    # Pixel values are 0..16; scale them to the 0..255 of every other image dataset.
    images = np.clip(bunch.images * 16.0, 0, 255).astype(np.uint8)[:, None, :, :]
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    n_test = int(round(len(labels) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset("digits", images[train], labels[train], images[test], labels[test], 10)


# Importing the readers registers them.
from clusterfed.data import idx as _idx  # noqa: E402,F401
from clusterfed.data import images as _images  # noqa: E402,F401
from clusterfed.data import leaf as _leaf  # noqa: E402,F401
from clusterfed.data import synthetic as _synthetic  # noqa: E402,F401
from clusterfed.data import text as _text  # noqa: E402,F401

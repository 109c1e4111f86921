"""A client's own data, read from a folder it holds: no scenario, no partition, no truth.

A real federation's node serves the files it is given (`data-path` in a Flower node config); the
in-process simulator reads a folder of such folders (`data.dataset=folders data.root=DIR`, one
`DIR/client-K/` per client) so a federation's files can be tried before deploying them. Every
client's data becomes a `ClientData` exactly as a scenario's would: float32 inputs, int64 labels.

Formats (`fmt`, or detected from the folder's contents):
- `npz`: one `.npz` with `x` and `y` (or `x_train`/`y_train`), optionally `x_test`/`y_test`.
  uint8 inputs are scaled to [0, 1]; float inputs are taken as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.clustering.metrics import NO_TRUTH
from clusterfed.data.scenarios import ClientData, Federation
from clusterfed.errors import ConfigError, DataError
from clusterfed.registry import check_keys

FORMATS = ("npz",)
# `data.dataset` of a federation read from client folders (or, on a Flower node, its own folder).
FOLDERS = "folders"
# The `data` keys of FOLDERS besides `dataset` and `root`: the federation's agreement.
FOLDERS_KEYS = {"format", "label_column", "classes", "test_fraction", "n_classes", "input_shape",
                "download"}
CLIENT_FOLDER = re.compile(r"client-(\d+)$")


@dataclass(frozen=True)
class OwnDataOptions:
    """What the federation agrees on about every client's files (the run config's `data`)."""

    fmt: str = "auto"
    label_column: str = "label"             # csv
    classes: tuple[str, ...] | None = None  # image folders whose class folders are not 0..K-1
    test_fraction: float = 0.0              # split a test set off when the files hold none
    seed: int = 0


def detect_format(path: Path) -> str:
    """The format of a client's folder (or file), from what it holds."""
    if path.is_file():
        if path.suffix == ".npz":
            return "npz"
        raise DataError(f"{path}: cannot tell the data format of this file; "
                        f"supported: {', '.join(FORMATS)}")
    if not path.is_dir():
        raise DataError(f"client data {path} does not exist")
    if list(path.glob("*.npz")):
        return "npz"
    raise DataError(f"{path}: no client data found (looked for {', '.join(FORMATS)}); "
                    f"see docs/flower.md for the layouts")


def _as_inputs(x: np.ndarray, where: Path) -> np.ndarray:
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{where}: inputs must be numeric, got {x.dtype}")
    return x.astype(np.float32, copy=False)


def _as_labels(y: np.ndarray, where: Path) -> np.ndarray:
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: labels must be integers, got {y.dtype}")
    if len(y) and y.min() < 0:
        raise DataError(f"{where}: labels must be >= 0, found {int(y.min())}")
    return y.astype(np.int64, copy=False)


def load_npz(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(train x, train y, test x, test y) of a client's .npz (test None when it has none)."""
    files = [path] if path.is_file() else sorted(path.glob("*.npz"))
    if len(files) != 1:
        raise DataError(f"{path}: expected one .npz file, found {len(files)}")
    with np.load(files[0], allow_pickle=False) as arrays:
        keys = set(arrays.files)
        xk, yk = ("x", "y") if {"x", "y"} <= keys else ("x_train", "y_train")
        if not {xk, yk} <= keys:
            raise DataError(f"{files[0]}: needs arrays x and y (or x_train and y_train); "
                            f"has {', '.join(sorted(keys))}")
        test = ({"x_test", "y_test"} <= keys)
        return (arrays[xk], arrays[yk], arrays["x_test"] if test else None,
                arrays["y_test"] if test else None)


LOADERS = {"npz": load_npz}


def load_client_data(path: str | Path, options: OwnDataOptions = OwnDataOptions()
                     ) -> ClientData:
    """One client's data from its folder (or file) in the agreed format."""
    path = Path(path).expanduser()
    fmt = detect_format(path) if options.fmt == "auto" else options.fmt
    if fmt not in LOADERS:
        raise DataError(f"unknown data format {fmt!r}; supported: {', '.join(LOADERS)}")
    x, y, tx, ty = LOADERS[fmt](path)
    if len(x) != len(y):
        raise DataError(f"{path}: {len(x)} inputs but {len(y)} labels")
    x, y = _as_inputs(np.asarray(x), path), _as_labels(np.asarray(y), path)
    if tx is None:
        x, y, tx, ty = _split_test(x, y, options.test_fraction, options.seed)
    else:
        tx, ty = _as_inputs(np.asarray(tx), path), _as_labels(np.asarray(ty), path)
    return ClientData(x, y, tx, ty)


def _split_test(x: np.ndarray, y: np.ndarray, fraction: float, seed: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n_test = int(round(fraction * len(y)))
    order = np.random.default_rng([seed, 0x0D47]).permutation(len(y))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def client_folders(root: str | Path) -> list[Path]:
    """`root/client-0, client-1, ...` in client order; the numbers must be 0..n-1."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data.root {root} is not a folder of client folders")
    found = {int(m.group(1)): p for p in root.iterdir()
             if p.is_dir() and (m := CLIENT_FOLDER.match(p.name))}
    if not found:
        raise DataError(f"{root} holds no client-K folders (client-0, client-1, ...)")
    if sorted(found) != list(range(len(found))):
        raise DataError(f"{root}: client folders must be numbered 0..{len(found) - 1} without "
                        f"gaps; found {sorted(found)}")
    return [found[k] for k in range(len(found))]


def federation_from_folders(root: str | Path, options: OwnDataOptions = OwnDataOptions(),
                            *, n_classes: int | None = None,
                            input_shape: Sequence[int] | None = None) -> Federation:
    """The federation of `root/client-K/` folders; its true clusters are unknown (NO_TRUTH).

    `n_classes` and `input_shape`, when given, are the federation's agreement and every client is
    checked against them; otherwise they are read from the data.
    """
    clients = [load_client_data(p, options) for p in client_folders(root)]
    shapes = {tuple(c.train_x.shape[1:]) for c in clients}
    if input_shape is None and len(shapes) > 1:
        raise DataError(f"{root}: clients' inputs have different shapes {sorted(shapes)}")
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else shapes.pop()
    top = max(int(max(c.train_y.max(initial=0), c.test_y.max(initial=0))) for c in clients) + 1
    classes = int(n_classes) if n_classes is not None else top
    for k, c in enumerate(clients):
        problem = check_client(c, shape, classes)
        if problem:
            raise DataError(f"{root}/client-{k}: {problem}")
    info: dict[str, Any] = {"dataset": "folders", "root": str(root), "truth": "unknown"}
    return Federation(clients, np.full(len(clients), NO_TRUTH, dtype=np.int64), classes, shape,
                      info)


def check_client(data: ClientData, input_shape: Sequence[int], n_classes: int) -> str | None:
    """Why a client's data does not fit the federation's agreement, or None when it does."""
    shape = tuple(data.train_x.shape[1:])
    if shape != tuple(input_shape):
        return f"inputs shaped {list(shape)}, the federation's are {list(input_shape)}"
    top = int(max(data.train_y.max(initial=0), data.test_y.max(initial=0)))
    if top >= n_classes:
        return f"label {top} outside the federation's {n_classes} classes"
    if data.num_train == 0:
        return "no training samples"
    return None


@dataclass(frozen=True)
class Agreement:
    """What a federation of own data agrees on: how to read files, and the model's shape."""

    options: OwnDataOptions
    n_classes: int | None = None
    input_shape: tuple[int, ...] | None = None


def agreement_from_config(data: Mapping[str, Any], seed: int = 0) -> Agreement:
    """The `data` section of a FOLDERS config as an Agreement (unknown keys refused)."""
    given = {k: v for k, v in data.items() if k not in ("dataset", "root")}
    check_keys("data", given, FOLDERS_KEYS)
    classes = given.get("classes")
    fraction = float(given.get("test_fraction", 0.0))
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"data.test_fraction must be in [0, 1), got {fraction}")
    options = OwnDataOptions(fmt=str(given.get("format", "auto")),
                             label_column=str(given.get("label_column", "label")),
                             classes=None if classes is None else tuple(map(str, classes)),
                             test_fraction=fraction, seed=int(seed))
    shape = given.get("input_shape")
    n = given.get("n_classes")
    return Agreement(options, None if n is None else int(n),
                     None if shape is None else tuple(int(s) for s in shape))


def federation_from_config(data: Mapping[str, Any], seed: int = 0) -> Federation:
    """`data.dataset=folders data.root=DIR`: the federation of DIR's client folders."""
    if not data.get("root"):
        raise ConfigError(f"data.dataset={FOLDERS} needs data.root=DIR, a folder of client-K "
                          f"folders (clusterfed scenario export writes one)")
    agreement = agreement_from_config(data, seed)
    return federation_from_folders(data["root"], agreement.options,
                                   n_classes=agreement.n_classes,
                                   input_shape=agreement.input_shape)

"""A client's own data, read from a folder it holds: no scenario, no partition, no truth.

A real federation's node serves the files it is given (`data-path` in a Flower node config); the
in-process simulator reads a folder of such folders (`data.dataset=folders data.root=DIR`, one
`DIR/client-K/` per client) so a federation's files can be tried before deploying them. Every
client's data becomes a `ClientData` exactly as a scenario's would: float32 inputs, int64 labels.

Formats (`fmt`, or detected from the folder's contents; the readers are `own_readers.py`):
- `npz`: one `.npz` with `x` and `y` (or `x_train`/`y_train`), optionally `x_test`/`y_test`.
- `images`: `<client>/<class>/*.png|jpg|...`, or `<client>/train/<class>/...` and
  `<client>/test/<class>/...`; class folders are whole numbers, or names listed in
  `data.classes`. Images become (C, H, W) with the agreed channels and size.
- `csv`: `train.csv` (and `test.csv`) or one `.csv`: a header, numeric feature columns and the
  label column (`data.label_column`); rows take the agreed `input_shape` when it has as many
  values as there are features.
- `hf`: a Hugging Face `datasets` folder (`save_to_disk`; splits `train`, `test`), inputs from
  `data.feature_column` (default `image` or `x`); needs `pip install 'clusterfed[hf]'`.

uint8 inputs (pixels) are scaled to [0, 1]; other numbers are taken as they are. Then the
federation's `data.normalize` ([mean per channel], [std per channel]) applies, to every format.
The test set is the files' own, else a seeded `data.test_fraction` of the training data.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.clustering.metrics import NO_TRUTH
from clusterfed.data import own_readers as readers
from clusterfed.data.federation import ClientData, Federation
from clusterfed.errors import ConfigError, DataError
from clusterfed.registry import check_keys

FORMATS = ("npz", "images", "csv", "hf")
# `data.dataset` of a federation read from client folders (or, on a Flower node, its own folder).
FOLDERS = "folders"
# The `data` keys of FOLDERS besides `dataset` and `root`: the federation's agreement.
FOLDERS_KEYS = {"format", "label_column", "feature_column", "classes", "test_fraction",
                "n_classes", "input_shape", "normalize", "resize", "download"}
CLIENT_FOLDER = re.compile(r"client-(\d+)$")


@dataclass(frozen=True)
class OwnDataOptions:
    """What the federation agrees on about every client's files (the run config's `data`)."""

    fmt: str = "auto"
    label_column: str = "label"             # csv, hf
    classes: tuple[str, ...] | None = None  # class names (folders, text labels) in label order
    test_fraction: float = 0.0              # split a test set off when the files hold none
    seed: int = 0
    feature_column: str | None = None       # hf (default: `image`, else `x`)
    # The agreed input shape: images take its channels and must have its size; CSV rows take it.
    input_shape: tuple[int, ...] | None = None
    # ([mean per channel], [std per channel]) applied after scaling, or None.
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    resize: bool = False                    # images of another size are resized, not refused


def detect_format(path: Path) -> str:
    """The format of a client's folder (or file), from what it holds."""
    if path.is_file():
        if path.suffix in (".npz", ".csv"):
            return path.suffix[1:]
        raise DataError(f"{path}: cannot tell the data format of this file; "
                        f"supported: {', '.join(FORMATS)}")
    if not path.is_dir():
        raise DataError(f"client data {path} does not exist")
    if list(path.glob("*.npz")):
        return "npz"
    if readers.is_hf_folder(path):
        return "hf"
    if list(path.glob("*.csv")):
        return "csv"
    if readers.image_roots(path) is not None:
        return "images"
    held = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    if not held:
        raise DataError(f"{path} is empty: no client data")
    raise DataError(f"{path}: no client data in a known format ({', '.join(FORMATS)}); it holds "
                    f"{', '.join(held[:5])}{' ...' if len(held) > 5 else ''}; see docs/data.md "
                    f"for the layouts")


def _as_inputs(x: np.ndarray, where: Path) -> np.ndarray:
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{where}: inputs must be numeric, got {x.dtype}")
    return x.astype(np.float32, copy=False)


def _as_labels(y: np.ndarray, where: Path) -> np.ndarray:
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: labels must be integers, got {y.dtype} (class names need "
                        f"data.classes)")
    if y.ndim != 1:
        raise DataError(f"{where}: labels must be one integer per sample, got shape "
                        f"{list(y.shape)}")
    if len(y) and y.min() < 0:
        raise DataError(f"{where}: labels must be >= 0, found {int(y.min())}")
    return y.astype(np.int64, copy=False)


def normalise(x: np.ndarray, normalize: tuple[tuple[float, ...], tuple[float, ...]] | None,
              where: Path) -> np.ndarray:
    """(x - mean) / std per channel (axis 1), as the scenarios' Normalize does it."""
    if normalize is None:
        return x
    mean, std = (np.asarray(v, dtype=np.float32) for v in normalize)
    if x.ndim < 2 or len(mean) not in (1, x.shape[1]):
        raise DataError(f"{where}: data.normalize has {len(mean)} values per channel, the "
                        f"inputs shaped {list(x.shape[1:])} have {x.shape[1] if x.ndim > 1 else 0}"
                        f" channels")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / std.reshape(shape)


Reader = Callable[[Path, OwnDataOptions], readers.Split]
LOADERS: dict[str, Reader] = {"npz": readers.read_npz, "images": readers.read_image_folders,
                              "csv": readers.read_csv, "hf": readers.read_hf}


def load_client_data(path: str | Path, options: OwnDataOptions = OwnDataOptions()
                     ) -> ClientData:
    """One client's data from its folder (or file) in the agreed format."""
    path = Path(path).expanduser()
    fmt = detect_format(path) if options.fmt == "auto" else options.fmt
    if fmt not in LOADERS:
        raise DataError(f"unknown data format {fmt!r}; supported: {', '.join(LOADERS)}")
    x, y, tx, ty = LOADERS[fmt](path, options)
    if len(x) != len(y):
        raise DataError(f"{path}: {len(x)} inputs but {len(y)} labels")
    x, y = _as_inputs(np.asarray(x), path), _as_labels(np.asarray(y), path)
    x = normalise(x, options.normalize, path)
    if tx is None:
        x, y, tx, ty = _split_test(x, y, options.test_fraction, options.seed)
    else:
        if len(tx) != len(ty):
            raise DataError(f"{path}: {len(tx)} test inputs but {len(ty)} test labels")
        tx, ty = _as_inputs(np.asarray(tx), path), _as_labels(np.asarray(ty), path)
        tx = normalise(tx, options.normalize, path)
    return ClientData(x, y, tx, ty)


def _split_test(x: np.ndarray, y: np.ndarray, fraction: float, seed: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A seeded random `fraction` of the samples as the test set; both keep the files' order."""
    n_test = int(round(fraction * len(y)))
    order = np.random.default_rng([seed, 0x0D47]).permutation(len(y))
    # Sorted: the samples stay in the files' order (no test set leaves them as they are).
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
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
    if input_shape is not None and options.input_shape is None:
        # Images are read at the agreed channels and size.
        options = replace(options, input_shape=tuple(int(s) for s in input_shape))
    folders = client_folders(root)
    clients = [load_client_data(p, options) for p in folders]
    shapes = [tuple(c.train_x.shape[1:]) for c in clients]
    if input_shape is None and len(set(shapes)) > 1:
        raise DataError(odd_shape_message(folders, shapes))
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else shapes[0]
    top = max(int(max(c.train_y.max(initial=0), c.test_y.max(initial=0))) for c in clients) + 1
    classes = int(n_classes) if n_classes is not None else top
    for k, c in enumerate(clients):
        problem = check_client(c, shape, classes)
        if problem:
            raise DataError(f"{root}/client-{k}: {problem}")
    info: dict[str, Any] = {"dataset": "folders", "root": str(root), "truth": "unknown"}
    return Federation(clients, np.full(len(clients), NO_TRUTH, dtype=np.int64), classes, shape,
                      info)


def odd_shape_message(folders: Sequence[Path], shapes: Sequence[tuple[int, ...]]) -> str:
    """The first client whose inputs are shaped unlike most clients', naming the file where
    it can (an image folder's odd image)."""
    common = Counter(shapes).most_common(1)[0][0]
    k = next(i for i, s in enumerate(shapes) if s != common)
    image = readers.image_unlike(folders[k], common)
    what = image or f"{folders[k]}: inputs shaped {list(shapes[k])}"
    return (f"{what}; the other clients' inputs are {list(common)}: make them agree, or set "
            f"data.input_shape (images are converted to its channels)")


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

    @property
    def normalize(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        return self.options.normalize


def agreement_from_config(data: Mapping[str, Any], seed: int = 0) -> Agreement:
    """The `data` section of a FOLDERS config as an Agreement (unknown keys refused)."""
    given = {k: v for k, v in data.items() if k not in ("dataset", "root")}
    check_keys("data", given, FOLDERS_KEYS)
    classes = given.get("classes")
    if classes is not None and (isinstance(classes, str | bytes) or not classes
                                or len(set(map(str, classes))) != len(classes)):
        raise ConfigError(f"data.classes must be a list of distinct class names, got {classes!r}")
    fraction = float(given.get("test_fraction", 0.0))
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"data.test_fraction must be in [0, 1), got {fraction}")
    fmt = str(given.get("format", "auto"))
    if fmt != "auto" and fmt not in FORMATS:
        raise ConfigError(f"unknown data.format {fmt!r}; valid: auto, {', '.join(FORMATS)}")
    raw_shape = given.get("input_shape")
    shape = None if raw_shape is None else tuple(int(s) for s in raw_shape)
    n = given.get("n_classes")
    n_classes = None if n is None else int(n)
    if classes is not None:
        if n_classes is not None and n_classes != len(classes):
            raise ConfigError(f"data.n_classes={n_classes} but data.classes lists "
                              f"{len(classes)} classes")
        n_classes = len(classes)
    feature = given.get("feature_column")
    options = OwnDataOptions(fmt=fmt, label_column=str(given.get("label_column", "label")),
                             classes=None if classes is None else tuple(map(str, classes)),
                             test_fraction=fraction, seed=int(seed),
                             feature_column=None if feature is None else str(feature),
                             input_shape=shape,
                             normalize=parse_normalize(given.get("normalize"), shape),
                             resize=bool(given.get("resize", False)))
    if options.resize and shape is None:
        raise ConfigError("data.resize=true needs data.input_shape, the size to resize to")
    return Agreement(options, n_classes, shape)


def parse_normalize(raw: Any, input_shape: Sequence[int] | None = None
                    ) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """`[[mean per channel], [std per channel]]` (or `{mean: [...], std: [...]}`), checked."""
    if raw is None:
        return None
    if isinstance(raw, Mapping) and set(raw) == {"mean", "std"}:
        raw = [raw["mean"], raw["std"]]
    try:
        mean, std = ([float(v) for v in part] for part in raw)
    except (TypeError, ValueError):
        raise ConfigError(f"data.normalize must be [[mean per channel], [std per channel]], "
                          f"got {raw!r}") from None
    if not mean or len(mean) != len(std):
        raise ConfigError(f"data.normalize needs as many means as stds (at least one), got "
                          f"{len(mean)} and {len(std)}")
    if min(std) <= 0:
        raise ConfigError(f"data.normalize: every std must be positive, got {std}")
    if input_shape is not None and len(mean) not in (1, int(input_shape[0])):
        raise ConfigError(f"data.normalize has {len(mean)} values per channel, the input_shape "
                          f"{list(input_shape)} has {input_shape[0]} channels")
    return tuple(mean), tuple(std)


def federation_from_config(data: Mapping[str, Any], seed: int = 0) -> Federation:
    """`data.dataset=folders data.root=DIR`: the federation of DIR's client folders."""
    if not data.get("root"):
        raise ConfigError(f"data.dataset={FOLDERS} needs data.root=DIR, a folder of client-K "
                          f"folders (clusterfed scenario export writes one)")
    agreement = agreement_from_config(data, seed)
    return federation_from_folders(data["root"], agreement.options,
                                   n_classes=agreement.n_classes,
                                   input_shape=agreement.input_shape)

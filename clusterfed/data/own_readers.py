"""Readers of a client's own files: npz, image folders, CSV, Hugging Face `datasets` folders.

Every reader takes a client's folder (or file) and the federation's agreement and returns a
`Split` as stored: inputs keep their dtype (8-bit pixels stay uint8, so `own.load_client_data`
scales every format by one rule), labels are integers, names already looked up in
`data.classes`. The test arrays are None where the files hold no test set.

Labels written as text (class folder names, CSV label cells, string or named `ClassLabel`
columns) are class names: with `data.classes` each must be in that list and becomes its
position; without it each must be a whole number. A node sees only its own classes, so the
federation lists them: sorted names alone would give different numbers on different nodes.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from clusterfed.errors import DataError

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from clusterfed.data.own import OwnDataOptions

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
# The Pillow mode each agreed channel count converts to.
CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
GREY_MODES = {"1", "L", "LA"}
HF_MARKERS = ("dataset_dict.json", "state.json")
HF_FEATURES = ("image", "x")
HF_INSTALL = "pip install 'clusterfed[hf]'"


class Split(NamedTuple):
    """A client's arrays as its files hold them; test ones None when the files have none."""

    x: np.ndarray
    y: np.ndarray
    test_x: np.ndarray | None
    test_y: np.ndarray | None


# ---------------------------------------------------------------- labels


def labels_from_names(names: Sequence[str], classes: Sequence[str] | None, where: str
                      ) -> np.ndarray:
    """Class names -> int64 labels: positions in `classes`, else the names as whole numbers."""
    if classes is not None:
        index = {name: i for i, name in enumerate(classes)}
        unknown = sorted({n for n in names if n not in index})
        if unknown:
            raise DataError(f"{where}: class {unknown[0]!r} is not in data.classes "
                            f"{list(classes)}" + (f" ({len(unknown)} such)"
                                                  if len(unknown) > 1 else ""))
        return np.array([index[n] for n in names], dtype=np.int64)
    labels = np.empty(len(names), dtype=np.int64)
    for i, name in enumerate(names):
        try:
            labels[i] = int(name)
        except ValueError:
            raise DataError(
                f"{where}: label {name!r} is not an integer; list the federation's class names "
                f"in data.classes (every node the same list, which fixes their numbers)"
            ) from None
    return labels


# ---------------------------------------------------------------- npz


def read_npz(path: Path, options: OwnDataOptions) -> Split:
    """One `.npz` with `x` and `y` (or `x_train`/`y_train`), optionally `x_test`/`y_test`."""
    files = [path] if path.is_file() else sorted(path.glob("*.npz"))
    if len(files) != 1:
        raise DataError(f"{path}: expected one .npz file, found {len(files)}")
    with np.load(files[0], allow_pickle=False) as arrays:
        keys = set(arrays.files)
        xk, yk = ("x", "y") if {"x", "y"} <= keys else ("x_train", "y_train")
        if not {xk, yk} <= keys:
            raise DataError(f"{files[0]}: needs arrays x and y (or x_train and y_train); "
                            f"has {', '.join(sorted(keys))}")
        test = {"x_test", "y_test"} <= keys
        return Split(arrays[xk], arrays[yk], arrays["x_test"] if test else None,
                     arrays["y_test"] if test else None)


# ---------------------------------------------------------------- images


def _is_image(path: Path) -> bool:
    return (path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")
            and path.is_file())


def _subfolders(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def image_roots(path: Path) -> dict[str, Path] | None:
    """{'train': ..., 'test': ...} class-folder roots of an image-folder client, or None.

    `<client>/train/<class>/*` (and `<client>/test/<class>/*`) when `train/` holds folders,
    else `<client>/<class>/*`.
    """
    if not path.is_dir():
        return None
    train = path / "train"
    if train.is_dir() and _subfolders(train):
        test = path / "test"
        return {"train": train, **({"test": test} if test.is_dir() else {})}
    if any(_is_image(f) for d in _subfolders(path) for f in d.iterdir()):
        return {"train": path}
    return None


def class_files(folder: Path) -> list[Path]:
    """The images of one class folder. Anything else there (hidden files aside) is refused,
    not skipped: a stray file or an empty folder is more likely a mistake than a choice."""
    held = [f for f in folder.iterdir() if not f.name.startswith(".")]
    if not held:
        raise DataError(f"{folder}: empty class folder; put its images in, or remove it")
    for f in held:
        if not _is_image(f):
            raise DataError(f"{f}: not an image ({', '.join(IMAGE_SUFFIXES)}) but in a class "
                            f"folder, where every file is a sample; move it out")
    return held


def image_files(root: Path, classes: Sequence[str] | None) -> tuple[list[Path], np.ndarray]:
    """The image files under `root/<class>/` and their labels.

    Ordered by file name, then class: an exported federation (files named by sample index)
    reads back in its original order, which the run's seeded batch orders depend on.
    """
    found = [(f.name, d.name, f) for d in _subfolders(root) for f in class_files(d)]
    found.sort(key=lambda item: (item[0], item[1]))
    names = [cls for _, cls, _ in found]
    labels = labels_from_names(names, classes, f"{root}") if found else np.zeros(0, np.int64)
    return [f for _, _, f in found], labels


def image_array(image: PILImage.Image, where: str, channels: int | None,
                size: tuple[int, int] | None, resize: bool) -> np.ndarray:
    """A Pillow image -> uint8 (C, H, W) with `channels` channels and `size` (height, width).

    A size that differs is refused unless `resize`; grey and colour images are converted to
    the agreed channel count (colour to grey by Pillow's ITU-R 601-2 luma).
    """
    if image.mode.startswith(("I", "F")):
        raise DataError(f"{where}: {image.mode} images (16-bit or float) are not supported; "
                        f"save 8-bit grey or colour images")
    if channels is None:
        channels = 1 if image.mode in GREY_MODES else 3
    if channels not in CHANNEL_MODES:
        raise DataError(f"images have 1, 3 or 4 channels; the federation's input_shape has "
                        f"{channels}")
    if size is not None and (image.height, image.width) != size:
        if not resize:
            raise DataError(f"{where}: image is {image.height}x{image.width} pixels (height x "
                            f"width), the federation's are {size[0]}x{size[1]}; resize the "
                            f"files, or set data.resize=true")
        image = image.resize((size[1], size[0]), resample=_bilinear())
    pixels = np.asarray(image.convert(CHANNEL_MODES[channels]), dtype=np.uint8)
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def _bilinear() -> Any:
    from PIL import Image

    return Image.Resampling.BILINEAR


def _image_geometry(options: OwnDataOptions, where: Path
                    ) -> tuple[int | None, tuple[int, int] | None]:
    shape = options.input_shape
    if shape is None:
        if options.resize:
            raise DataError(f"{where}: data.resize needs data.input_shape, the size to resize to")
        return None, None
    if len(shape) != 3:
        raise DataError(f"{where}: images need a (channels, height, width) input_shape; the "
                        f"federation's is {list(shape)}")
    return int(shape[0]), (int(shape[1]), int(shape[2]))


def read_images(files: Sequence[Path], options: OwnDataOptions, where: Path,
                channels: int | None = None) -> np.ndarray:
    """The images in `files` as one uint8 (N, C, H, W) array, checked against the agreement.

    Without an agreed shape, the channels are `channels` and the size is the first image's.
    """
    from PIL import Image

    agreed_channels, size = _image_geometry(options, where)
    channels = agreed_channels or channels
    out = []
    for file in files:
        try:
            with Image.open(file) as image:
                pixels = image_array(image, str(file), channels, size, options.resize)
        except (OSError, SyntaxError) as err:  # Pillow's errors for unreadable files
            raise DataError(f"{file}: not a readable image ({err})") from None
        if size is None:
            size = (pixels.shape[1], pixels.shape[2])
        out.append(pixels)
    if not out:
        return np.zeros((0, *(options.input_shape or (channels or 1, 0, 0))), dtype=np.uint8)
    return np.stack(out)


def _natural_channels(files: Iterable[Path]) -> int:
    """1 when every image is grey, else 3 (colour; alpha dropped): the channels to agree on."""
    from PIL import Image

    for file in files:
        try:
            with Image.open(file) as image:
                if image.mode not in GREY_MODES:
                    return 3
        except (OSError, SyntaxError) as err:
            raise DataError(f"{file}: not a readable image ({err})") from None
    return 1


def image_unlike(path: Path, shape: Sequence[int]) -> str | None:
    """Which image of an image-folder client makes its inputs differ from `shape` (the other
    clients'), and how, or None: a colour image among grey ones, an image of another size."""
    roots = image_roots(path)
    if roots is None or len(shape) != 3:
        return None
    from PIL import Image

    for root in roots.values():
        for file in sorted(f for d in _subfolders(root) for f in class_files(d)):
            with Image.open(file) as image:
                channels = 1 if image.mode in GREY_MODES else 3
                if channels != shape[0]:
                    return (f"{file} is a {'grey' if channels == 1 else 'colour'} image "
                            f"({image.mode})")
                if (image.height, image.width) != tuple(shape[1:]):
                    return f"{file} is {image.height}x{image.width} pixels"
    return None


def read_image_folders(path: Path, options: OwnDataOptions) -> Split:
    """`<client>/<class>/*.png|jpg|...`, or `<client>/train/<class>/...` and `test/<class>/...`."""
    roots = image_roots(path)
    if roots is None:
        raise DataError(f"{path}: no class folders of images (<client>/<class>/*.png, or "
                        f"<client>/train/<class>/...)")
    train_files, y = image_files(roots["train"], options.classes)
    if not train_files:
        raise DataError(f"{roots['train']}: no images in its class folders")
    test_files, ty = image_files(roots["test"], options.classes) if "test" in roots else ([], None)
    # One channel count for the client's train and test images, when none is agreed.
    channels = (None if options.input_shape is not None
                else _natural_channels([*train_files, *test_files]))
    x = read_images(train_files, options, path, channels)
    if ty is None:
        return Split(x, y, None, None)
    tx = (read_images(test_files, options, path, channels) if test_files
          else np.zeros((0, *x.shape[1:]), dtype=np.uint8))
    if tx.shape[1:] != x.shape[1:]:
        raise DataError(f"{roots['test']}: test images are {list(tx.shape[1:])}, the training "
                        f"images {list(x.shape[1:])}")
    return Split(x, y, tx, ty)


# ---------------------------------------------------------------- csv


def csv_files(path: Path) -> tuple[Path, Path | None]:
    """(train file, test file or None): `train.csv` and `test.csv`, or the client's one .csv."""
    if path.is_file():
        return path, None
    files = sorted(path.glob("*.csv"))
    names = {f.name: f for f in files}
    if "train.csv" in names:
        return names["train.csv"], names.get("test.csv")
    if len(files) == 1 and files[0].name != "test.csv":
        return files[0], None
    raise DataError(f"{path}: expected train.csv (and optionally test.csv) or one .csv file; "
                    f"found {', '.join(names) or 'none'}")


def read_table(file: Path, label_column: str, classes: Sequence[str] | None
               ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(feature column names, float64 features (N, F), int64 labels) of one CSV with a header."""
    with file.open(newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    if not rows:
        raise DataError(f"{file}: empty; a CSV needs a header row naming its columns")
    header = [name.strip() for name in rows[0]]
    if label_column not in header:
        raise DataError(f"{file}: no column {label_column!r} in its header {header[:8]}"
                        f"{' ...' if len(header) > 8 else ''}; the first row must name the "
                        f"columns, and data.label_column the label's")
    at = header.index(label_column)
    features = [name for i, name in enumerate(header) if i != at]
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DataError(f"{file}, line {line}: {len(row)} cells, the header has "
                            f"{len(header)}")
    body = rows[1:]
    labels = labels_from_names([row[at].strip() for row in body], classes, str(file))
    cells = [row[:at] + row[at + 1:] for row in body]
    try:
        x = np.array(cells, dtype=np.float64).reshape(len(body), len(features))
    except ValueError:
        raise DataError(_bad_cell(file, cells, features)) from None
    return features, x, labels


def _bad_cell(file: Path, cells: Sequence[Sequence[str]], features: Sequence[str]) -> str:
    for line, row in enumerate(cells, start=2):
        for name, cell in zip(features, row, strict=True):
            try:
                float(cell)
            except ValueError:
                return (f"{file}, line {line}, column {name!r}: {cell!r} is not a number "
                        f"(feature columns must be numeric)")
    return f"{file}: feature columns must be numeric"


def read_csv(path: Path, options: OwnDataOptions) -> Split:
    """Numeric feature columns and a label column, with a header; train.csv/test.csv or one."""
    train, test = csv_files(path)
    features, x, y = read_table(train, options.label_column, options.classes)
    tx = ty = None
    if test is not None:
        test_features, tx, ty = read_table(test, options.label_column, options.classes)
        if sorted(test_features) != sorted(features):
            raise DataError(f"{test}: its feature columns differ from {train.name}'s")
        tx = tx[:, [test_features.index(name) for name in features]]
    shape = options.input_shape
    if shape is not None and tuple(shape) != (len(features),):
        # Flat rows of e.g. images take the agreed shape when the sizes agree.
        if math.prod(shape) != len(features):
            raise DataError(f"{train}: {len(features)} feature columns, but the federation's "
                            f"input_shape {list(shape)} has {math.prod(shape)} values")
        x = x.reshape(len(x), *shape)
        tx = None if tx is None else tx.reshape(len(tx), *shape)
    return Split(x, y, tx, ty)


# ---------------------------------------------------------------- Hugging Face datasets


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in HF_MARKERS)


def _datasets_package(path: Path) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path} is a Hugging Face datasets folder; reading it needs the "
                        f"datasets package: {HF_INSTALL}") from None
    return datasets


def read_hf(path: Path, options: OwnDataOptions) -> Split:
    """A folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk` (train, test)."""
    datasets = _datasets_package(path)
    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable datasets folder ({err})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DataError(f"{path}: a DatasetDict needs a 'train' split; it has "
                            f"{', '.join(loaded)}")
        train, test = loaded["train"], loaded.get("test")
    else:
        train, test = loaded, None
    x, y = _hf_arrays(datasets, train, options, f"{path} (train)")
    if test is None:
        return Split(x, y, None, None)
    tx, ty = _hf_arrays(datasets, test, options, f"{path} (test)")
    return Split(x, y, tx, ty)


def _hf_arrays(datasets: Any, ds: Any, options: OwnDataOptions, where: str
               ) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of one split; `datasets` is the package."""
    columns = list(ds.column_names)
    feature = options.feature_column or next((c for c in HF_FEATURES if c in columns), None)
    if feature is None or feature not in columns:
        raise DataError(f"{where}: no input column {feature or ' or '.join(HF_FEATURES)!r}; "
                        f"columns: {', '.join(columns)} (set data.feature_column)")
    if options.label_column not in columns:
        raise DataError(f"{where}: no label column {options.label_column!r}; columns: "
                        f"{', '.join(columns)} (set data.label_column)")
    kind = ds.features[feature]
    if isinstance(kind, datasets.Image):
        images = ds[:][feature]
        channels = (None if options.input_shape is not None
                    else 1 if all(im.mode in GREY_MODES for im in images) else 3)
        agreed, size = _image_geometry(options, Path(where))
        channels = agreed or channels
        out = []
        for i, image in enumerate(images):
            pixels = image_array(image, f"{where}, row {i}", channels, size, options.resize)
            size = size or (pixels.shape[1], pixels.shape[2])
            out.append(pixels)
        x = np.stack(out) if out else np.zeros((0, *(options.input_shape or (1, 0, 0))),
                                                np.uint8)
    else:
        x = np.asarray(ds.with_format("numpy")[:][feature])
        if x.dtype == object:
            raise DataError(f"{where}: column {feature!r} holds inputs of different shapes")
    return x, _hf_labels(datasets, ds, options, where)


def _hf_labels(datasets: Any, ds: Any, options: OwnDataOptions, where: str) -> np.ndarray:
    column = options.label_column
    kind = ds.features[column]
    values = ds[:][column]
    if isinstance(kind, datasets.ClassLabel):
        if options.classes is None:
            return np.asarray(values, dtype=np.int64)
        # The dataset's own names, renumbered by the federation's list.
        return labels_from_names([kind.names[v] for v in values], options.classes, where)
    if isinstance(kind, datasets.Value) and kind.dtype == "string":
        return labels_from_names([str(v) for v in values], options.classes, where)
    return np.asarray(values)

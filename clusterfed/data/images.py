"""Readers of CIFAR-10/100 (python batches), SVHN (.mat), USPS (LIBSVM bz2 or hdf5) and MIX-4."""

from __future__ import annotations

import bz2
import io
import pickle
import tarfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset
from clusterfed.data.files import RemoteFile, check_md5, fetch, missing_file, read_checked
from clusterfed.errors import ConfigError, DataError
from clusterfed.registry import accepted_keys

# ---------------------------------------------------------------- CIFAR

# md5 of each extracted batch file, as torchvision's CIFAR10 / CIFAR100 classes carry them
# (torchvision/datasets/cifar.py). These are the files inside the official tar.gz.
CIFAR_FILES: dict[str, dict[str, str]] = {
    "cifar10": {
        "data_batch_1": "c99cafc152244af753f735de768cd75f",
        "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
        "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
        "test_batch": "40351d587109b95175f43aff81a1287e",
    },
    "cifar100": {
        "train": "16019d7e3df5f24257cddd939b257f8d",
        "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    },
}
# (folder inside the archive, archive name) under <root>/<name>/.
CIFAR_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", "cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python", "cifar-100-python.tar.gz"),
}
CIFAR_URLS = {
    "cifar10": ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
    "cifar100": ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
}
_CIFAR_HOME = "https://www.cs.toronto.edu/~kriz/cifar.html"


@DATASETS.register("cifar10")
def load_cifar10(root: Path, download: bool = False) -> Dataset:
    """CIFAR-10 from `<root>/cifar10/cifar-10-batches-py/` or the official tar.gz beside it."""
    files = _cifar_files(root, "cifar10", download)
    train = [_cifar_batch(files[f"data_batch_{i}"], f"data_batch_{i}", b"labels", 10)
             for i in range(1, 6)]
    test_x, test_y = _cifar_batch(files["test_batch"], "test_batch", b"labels", 10)
    return Dataset("cifar10", np.concatenate([x for x, _ in train]),
                   np.concatenate([y for _, y in train]), test_x, test_y, 10)


@DATASETS.register("cifar100")
def load_cifar100(root: Path, download: bool = False, labels: str = "fine") -> Dataset:
    """CIFAR-100 from `<root>/cifar100/cifar-100-python/` or the official tar.gz beside it.

    `labels` is "fine" (100 classes) or "coarse" (the 20 superclasses).
    """
    if labels not in ("fine", "coarse"):
        raise ConfigError(f"data.labels must be 'fine' or 'coarse', got {labels!r}")
    key, n_classes = (b"fine_labels", 100) if labels == "fine" else (b"coarse_labels", 20)
    files = _cifar_files(root, "cifar100", download)
    train_x, train_y = _cifar_batch(files["train"], "train", key, n_classes)
    test_x, test_y = _cifar_batch(files["test"], "test", key, n_classes)
    return Dataset("cifar100", train_x, train_y, test_x, test_y, n_classes,
                   meta={"labels": labels})


def _cifar_files(root: Path, name: str, download: bool) -> dict[str, bytes]:
    """The verified bytes of every batch: extracted files first, the rest from the archive."""
    folder, archive_name = CIFAR_LAYOUT[name]
    base = root / name
    out = {}
    from_archive = {}
    for member, md5 in CIFAR_FILES[name].items():
        if (base / folder / member).exists():
            spec = RemoteFile(f"{name}/{folder}/{member}", md5)
            out[member] = read_checked(root, spec, download=False, home=_CIFAR_HOME)
        else:
            from_archive[f"{folder}/{member}"] = member
    if not from_archive:
        return out
    archive = base / archive_name
    if not archive.exists() and download:
        fetch(archive, CIFAR_URLS[name])
    if not archive.exists():
        first = next(iter(from_archive.values()))
        raise missing_file(base / folder / first, CIFAR_FILES[name][first], _CIFAR_HOME,
                           alternative=f"the official {archive_name} at {archive}")
    try:
        # One sequential pass: a backward seek in a tar.gz decompresses it again.
        with tarfile.open(archive, "r|gz") as tar:
            for info in tar:
                member = from_archive.get(info.name)
                extracted = tar.extractfile(info) if member is not None else None
                if extracted is None:
                    continue
                data = extracted.read()
                check_md5(data, f"{archive} (member {info.name})", CIFAR_FILES[name][member],
                          _CIFAR_HOME)
                out[member] = data
    except DataError:
        raise
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise DataError(f"corrupt data file {archive} ({err}); replace it with the official "
                        f"{archive_name} from {_CIFAR_HOME}") from err
    absent = [m for m in from_archive if from_archive[m] not in out]
    if absent:
        raise DataError(f"{archive} holds no {absent[0]}; replace it with the official "
                        f"{archive_name} from {_CIFAR_HOME}")
    return out


def _cifar_batch(data: bytes, name: str, label_key: bytes,
                 n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    # Unpickling is safe here: the bytes have already matched the official md5.
    try:
        batch = pickle.loads(data, encoding="bytes")
        x = np.asarray(batch[b"data"])
        y = np.asarray(batch[label_key], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError,
            AttributeError, IndexError) as err:
        raise DataError(f"{name} is not a CIFAR python batch ({err!r})") from err
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or y.shape != (len(x),):
        raise DataError(f"{name}: expected uint8 data (N, 3072) and N labels, got data "
                        f"{x.dtype} {x.shape} and {y.shape} labels")
    _check_labels(y, n_classes, name)
    # Rows are the 1024 red, then green, then blue values of a 32x32 image, row-major.
    return x.reshape(-1, 3, 32, 32), y


def _check_labels(y: np.ndarray, n_classes: int, name: str) -> None:
    if len(y) and (y.min() < 0 or y.max() >= n_classes):
        raise DataError(f"{name}: labels outside 0..{n_classes - 1}")


# ---------------------------------------------------------------- SVHN

# md5 of each .mat file, as torchvision's SVHN class carries them (torchvision/datasets/svhn.py).
SVHN_FILES = {
    "train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
    "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
    "extra_32x32.mat": "a93ce644f1a588dc4d68dda5feec44a7",
}
SVHN_MIRRORS = ("http://ufldl.stanford.edu/housenumbers/",)
_SVHN_HOME = "http://ufldl.stanford.edu/housenumbers/"


@DATASETS.register("svhn")
def load_svhn(root: Path, download: bool = False, extra: bool = False) -> Dataset:
    """SVHN cropped digits from `<root>/svhn/{train,test}_32x32.mat`.

    `extra=True` appends the 531,131 images of extra_32x32.mat to the training set.
    """
    parts = ["train_32x32.mat", "extra_32x32.mat"] if extra else ["train_32x32.mat"]
    train = [_svhn_part(root, name, download) for name in parts]
    test_x, test_y = _svhn_part(root, "test_32x32.mat", download)
    return Dataset("svhn", np.concatenate([x for x, _ in train]),
                   np.concatenate([y for _, y in train]), test_x, test_y, 10)


def _svhn_part(root: Path, filename: str, download: bool) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    spec = RemoteFile(f"svhn/{filename}", SVHN_FILES[filename],
                      tuple(m + filename for m in SVHN_MIRRORS))
    data = read_checked(root, spec, download=download, home=_SVHN_HOME)
    try:
        mat = loadmat(io.BytesIO(data))
        x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).ravel()
    except (MatReadError, ValueError, KeyError, TypeError, OSError) as err:
        raise DataError(f"{filename} is not an SVHN .mat file ({err!r})") from err
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3) or len(y) != x.shape[3]:
        raise DataError(f"{filename}: expected uint8 X (32, 32, 3, N) and N labels, got X "
                        f"{x.dtype} {x.shape} and {len(y)} labels")
    y = y.astype(np.int64)
    if len(y) and (y.min() < 1 or y.max() > 10):
        raise DataError(f"{filename}: labels outside 1..10")
    # X is (H, W, C, N); the digit 0 has label 10.
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y % 10


# ---------------------------------------------------------------- USPS

# md5 of the bz2 files themselves, as torchvision's USPS class carries them
# (torchvision/datasets/usps.py). No md5 of the decompressed text is published, so the
# compressed file is what is verified. The hdf5 variant has no published checksum at all.
USPS_FILES = {
    "usps.bz2": "ec16c51db3855ca6c91edd34d0e9b197",
    "usps.t.bz2": "8ea070ee2aca1ac39742fdd1ef5ed118",
}
USPS_MIRRORS = ("https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass/",)
_USPS_HOME = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html#usps"


@DATASETS.register("usps")
def load_usps(root: Path, download: bool = False) -> Dataset:
    """USPS from the LIBSVM files `<root>/usps/usps.bz2` and `usps.t.bz2` (or `usps.h5`).

    Pixels in [-1, 1] become uint8 as torchvision's USPS makes them, (v + 1) / 2 * 255
    truncated, so the arrays equal torchvision's; LIBSVM labels 1..10 are the digits 0..9.
    Without the bz2 files, `usps.h5` (groups train/test with data in [0, 1] and target 0..9)
    is read when h5py is installed; it is not verified, as no checksum of it is published.
    """
    folder = root / "usps"
    have_bz2 = all((folder / name).exists() for name in USPS_FILES)
    if not have_bz2 and not download and (folder / "usps.h5").exists():
        return _usps_h5(folder / "usps.h5")
    parts = []
    for name, md5 in USPS_FILES.items():
        spec = RemoteFile(f"usps/{name}", md5, tuple(m + name for m in USPS_MIRRORS))
        raw = read_checked(root, spec, download=download, home=_USPS_HOME)
        try:
            text = bz2.decompress(raw).decode("ascii")
        except (OSError, EOFError, ValueError) as err:
            raise DataError(f"{folder / name} is not a valid bz2 text file ({err})") from err
        parts.append(_parse_libsvm(text, name))
    (train_x, train_y), (test_x, test_y) = parts
    return Dataset("usps", train_x, train_y, test_x, test_y, 10)


def _parse_libsvm(text: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Lines of `label index:value ...` (1-based indices, absent features 0) -> images, labels."""
    lines = [line for line in text.splitlines() if line.strip()]
    features = np.zeros((len(lines), 256), dtype=np.float32)
    labels = np.empty(len(lines), dtype=np.int64)
    for row, line in enumerate(lines):
        label, *tokens = line.replace(":", " ").split()
        try:
            labels[row] = int(float(label))
            pairs = np.array(tokens, dtype=np.float64).reshape(-1, 2)
        except ValueError as err:
            raise DataError(f"{name} line {row + 1} is not LIBSVM text ({err})") from err
        index = pairs[:, 0].astype(np.int64)
        if len(index) and (index.min() < 1 or index.max() > 256):
            raise DataError(f"{name} line {row + 1}: feature index outside 1..256")
        features[row, index - 1] = pairs[:, 1]
    if len(labels) and (labels.min() < 1 or labels.max() > 10):
        raise DataError(f"{name}: labels outside 1..10")
    # float32 arithmetic and truncation, exactly as torchvision's USPS.
    pixels = ((np.clip(features, -1, 1) + 1) / 2 * 255).astype(np.uint8)
    return pixels.reshape(-1, 1, 16, 16), labels - 1


def _usps_h5(path: Path) -> Dataset:
    try:
        import h5py
    except ImportError as err:
        raise DataError(f"{path} is hdf5, which needs h5py: pip install h5py, or put the LIBSVM "
                        f"files usps.bz2 and usps.t.bz2 in {path.parent} "
                        f"(from {_USPS_HOME})") from err
    arrays = []
    try:
        with h5py.File(path, "r") as hf:
            for part in ("train", "test"):
                x = np.asarray(hf[part]["data"][:], dtype=np.float32)
                y = np.asarray(hf[part]["target"][:]).astype(np.int64).ravel()
                arrays.append((x, y, part))
    except (OSError, KeyError, ValueError, TypeError) as err:
        raise DataError(f"{path} is not a USPS hdf5 file with train/test groups of data "
                        f"and target ({err})") from err
    out = []
    for x, y, part in arrays:
        if x.size != len(y) * 256:
            raise DataError(f"{path}: {part}/data does not hold {len(y)} images of 16x16")
        _check_labels(y, 10, f"{path} {part}/target")
        out.append(((np.clip(x, 0, 1) * 255).astype(np.uint8).reshape(-1, 1, 16, 16), y))
    (train_x, train_y), (test_x, test_y) = out
    return Dataset("usps", train_x, train_y, test_x, test_y, 10, meta={"source": "hdf5"})


# ---------------------------------------------------------------- MIX-4

MIX4 = ("cifar10", "svhn", "fashion_mnist", "usps")


@DATASETS.register("mix")
def load_mix(root: Path, download: bool = False, datasets: Sequence[str] = MIX4,
             shape: Sequence[int] = (3, 32, 32), fit: str = "pad") -> Dataset:
    """PACFL's MIX-4: several image datasets side by side, one group per source.

    Each source is read by its own reader from the same root and brought to `shape` by
    `fit_images`; source k's label l becomes offset_k + l with offsets the running sum of the
    sources' class counts (10k + l for four 10-class sources: 40 classes, the 40 outputs of
    PACFL's MIX-4 LeNet). `train_groups` / `test_groups` hold the source index and
    meta["groups"] the source names. PACFL's code orders the sources usps, cifar10, svhn,
    fashion_mnist; the order only permutes the label blocks.
    """
    if isinstance(datasets, str) or not datasets:
        raise ConfigError(f"data.datasets must be a non-empty list of dataset names, "
                          f"got {datasets!r}")
    names = [str(name) for name in datasets]
    if len(set(names)) != len(names) or "mix" in names:
        raise ConfigError(f"data.datasets must name distinct datasets other than mix: {names}")
    target = _check_shape(shape)
    if fit not in ("pad", "resize"):
        raise ConfigError(f"data.fit must be 'pad' or 'resize', got {fit!r}")
    # Per split: lists of images, labels and group ids, one entry per source.
    parts: dict[str, tuple[list[np.ndarray], ...]] = {"train": ([], [], []),
                                                      "test": ([], [], [])}
    offsets = []
    offset = 0
    for k, name in enumerate(names):
        loader = DATASETS.get(name)
        keys = accepted_keys(loader)
        options = {"download": download} if keys is None or "download" in keys else {}
        source = loader(root=root, **options)
        if source.train_x.dtype != np.uint8 or source.train_x.ndim != 4:
            raise ConfigError(f"data.datasets: {name} is not an image dataset")
        offsets.append(offset)
        for part, x, y in (("train", source.train_x, source.train_y),
                           ("test", source.test_x, source.test_y)):
            images, labels, groups = parts[part]
            images.append(fit_images(x, target, fit))
            labels.append(y.astype(np.int64) + offset)
            groups.append(np.full(len(y), k, dtype=np.int64))
        offset += source.n_classes
    train_x, train_y, train_g = (np.concatenate(a) for a in parts["train"])
    test_x, test_y, test_g = (np.concatenate(a) for a in parts["test"])
    return Dataset("mix", train_x, train_y, test_x, test_y, offset, train_groups=train_g,
                   test_groups=test_g, meta={"groups": names, "label_offsets": offsets})


def _check_shape(shape: Sequence[int]) -> tuple[int, int, int]:
    try:
        c, h, w = (int(v) for v in shape)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"data.shape must be [channels, height, width], got {shape!r}") from err
    if c not in (1, 3) or h < 1 or w < 1:
        raise ConfigError(f"data.shape needs 1 or 3 channels and a positive size, got {shape!r}")
    return c, h, w


def fit_images(x: np.ndarray, shape: Sequence[int], fit: str = "pad") -> np.ndarray:
    """Bring uint8 images (N, C, H, W) to `shape` (C', H', W').

    Size: with fit="pad", images no larger than the target are zero-padded around the centre,
    as PACFL pads FMNIST (2 pixels a side) and USPS (8 a side) to 32x32; larger ones, and every
    image with fit="resize", are resized by bilinear interpolation with antialiasing
    (torch.nn.functional.interpolate, align_corners=False), rounded back to uint8.
    Channels: one channel is repeated to three, as PACFL does; three become one by the
    ITU-R 601-2 luma weights that PIL's convert("L") uses.
    """
    c, h, w = (int(v) for v in shape)
    if x.shape[1] == 3 and c == 1:
        luma = np.tensordot(x.astype(np.float32), np.array([0.299, 0.587, 0.114], np.float32),
                            axes=([1], [0]))
        x = np.clip(np.rint(luma), 0, 255).astype(np.uint8)[:, None]
    elif x.shape[1] not in (1, c):
        raise ConfigError(f"cannot turn {x.shape[1]}-channel images into {c} channels")
    height, width = x.shape[2:]
    if fit == "pad" and height <= h and width <= w:
        if (height, width) != (h, w):
            top, left = (h - height) // 2, (w - width) // 2
            padded = np.zeros((len(x), x.shape[1], h, w), dtype=np.uint8)
            padded[:, :, top:top + height, left:left + width] = x
            x = padded
    elif (height, width) != (h, w):
        x = _resize(x, (h, w))
    if x.shape[1] != c:
        x = np.repeat(x, c, axis=1)
    return np.ascontiguousarray(x)


def _resize(x: np.ndarray, size: tuple[int, int], chunk: int = 4096) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    out = np.empty((len(x), x.shape[1], *size), dtype=np.uint8)
    for start in range(0, len(x), chunk):  # chunks bound the float32 copy's memory
        batch = torch.tensor(x[start:start + chunk], dtype=torch.float32)
        resized = F.interpolate(batch, size=size, mode="bilinear", align_corners=False,
                                antialias=True)
        out[start:start + chunk] = resized.round().clamp(0, 255).to(torch.uint8).numpy()
    return out

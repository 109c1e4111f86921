"""MNIST-family readers of the idx file format."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset
from clusterfed.data.files import RemoteFile, read_checked
from clusterfed.errors import DataError

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data: bytes, name: str = "idx file") -> np.ndarray:
    """Parse the bytes of an idx file (magic 0x0000TTDD, then D big-endian sizes, then data)."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DataError(f"{name} is not an idx file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{name}: truncated idx header ({len(data)} bytes, needs {header})")
    shape = tuple(int(s) for s in np.frombuffer(data[4:header], dtype=">u4"))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(
            f"{name}: idx header says {expected} bytes of data, found {len(data) - header}")
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
_FASHION_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)

IDX_FILES: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte.gz": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte.gz": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte.gz": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte.gz": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}
_HOMES = {"mnist": (_MNIST_MIRRORS, "http://yann.lecun.com/exdb/mnist/"),
          "fashion_mnist": (_FASHION_MIRRORS, "https://github.com/zalandoresearch/fashion-mnist")}


def load_idx_dataset(name: str, root: Path, *, download: bool = False,
                     md5s: dict[str, str] | None = None, mirrors: tuple[str, ...] | None = None
                     ) -> Dataset:
    """Read `<root>/<name>/raw/*-idx?-ubyte.gz`, verifying each file's content md5."""
    default_mirrors, home = _HOMES[name]
    files = md5s or IDX_FILES[name]
    arrays = {}
    for filename, md5 in files.items():
        spec = RemoteFile(f"{name}/raw/{filename}", md5,
                          tuple(m + filename for m in (mirrors or default_mirrors)))
        content = read_checked(root, spec, download=download, home=home)
        arrays[filename] = parse_idx(content, filename)
    train_x = arrays["train-images-idx3-ubyte.gz"][:, None]
    test_x = arrays["t10k-images-idx3-ubyte.gz"][:, None]
    train_y = arrays["train-labels-idx1-ubyte.gz"].astype(np.int64)
    test_y = arrays["t10k-labels-idx1-ubyte.gz"].astype(np.int64)
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise DataError(f"{name}: image and label files disagree on the number of samples")
    return Dataset(name, train_x, train_y, test_x, test_y, 10)


@DATASETS.register("mnist")
def load_mnist(root: Path, download: bool = False) -> Dataset:
    """MNIST from its four idx files under `<root>/mnist/raw/`."""
    return load_idx_dataset("mnist", root, download=download)


@DATASETS.register("fashion_mnist")
def load_fashion_mnist(root: Path, download: bool = False) -> Dataset:
    """Fashion-MNIST from its four idx files under `<root>/fashion_mnist/raw/`."""
    return load_idx_dataset("fashion_mnist", root, download=download)

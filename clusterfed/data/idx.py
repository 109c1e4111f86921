"""MNIST-family readers of the idx file format."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset
from clusterfed.data.files import RemoteFile, check_md5, fetch, gunzip, missing_file, read_checked
from clusterfed.errors import ConfigError, DataError

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
    return _image_dataset(name, arrays["train-images-idx3-ubyte.gz"],
                          arrays["train-labels-idx1-ubyte.gz"],
                          arrays["t10k-images-idx3-ubyte.gz"],
                          arrays["t10k-labels-idx1-ubyte.gz"], 10)


def _image_dataset(name: str, train_images: np.ndarray, train_labels: np.ndarray,
                   test_images: np.ndarray, test_labels: np.ndarray, n_classes: int,
                   meta: dict[str, object] | None = None) -> Dataset:
    """A Dataset from (N, H, W) idx images and (N,) idx labels."""
    train_x, test_x = train_images[:, None], test_images[:, None]
    train_y, test_y = train_labels.astype(np.int64), test_labels.astype(np.int64)
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise DataError(f"{name}: image and label files disagree on the number of samples")
    return Dataset(name, train_x, train_y, test_x, test_y, n_classes, meta=dict(meta or {}))


@DATASETS.register("mnist")
def load_mnist(root: Path, download: bool = False) -> Dataset:
    """MNIST from its four idx files under `<root>/mnist/raw/`."""
    return load_idx_dataset("mnist", root, download=download)


@DATASETS.register("fashion_mnist")
def load_fashion_mnist(root: Path, download: bool = False) -> Dataset:
    """Fashion-MNIST from its four idx files under `<root>/fashion_mnist/raw/`."""
    return load_idx_dataset("fashion_mnist", root, download=download)


# ---------------------------------------------------------------- checks shared by the readers
# Some known checksums cover a compressed file or an archive member, not the decompressed
# content that read_checked hashes; these give the same messages for bytes read any other way.


# ---------------------------------------------------------------- EMNIST

# md5 of each .gz file as it sits in NIST's gzip.zip, from the `mnists` package
# (github.com/pczarnik/mnists, mnists/_emnist.py). No md5 of the decompressed idx content is
# published, so these hash the compressed file: a re-gzipped copy does not match. The `mnist`
# split is left out because no checksum of its files was found.
EMNIST_FILES: dict[str, dict[str, str]] = {
    "balanced": {
        "emnist-balanced-train-images-idx3-ubyte.gz": "4041b0d6f15785d3fa35263901b5496b",
        "emnist-balanced-train-labels-idx1-ubyte.gz": "7a35cc7b2b7ee7671eddf028570fbd20",
        "emnist-balanced-test-images-idx3-ubyte.gz": "6818d20fe2ce1880476f747bbc80b22b",
        "emnist-balanced-test-labels-idx1-ubyte.gz": "acd3694070dcbf620e36670519d4b32f",
    },
    "byclass": {
        "emnist-byclass-train-images-idx3-ubyte.gz": "712dda0bd6f00690f32236ae4325c377",
        "emnist-byclass-train-labels-idx1-ubyte.gz": "ee299a3ee5faf5c31e9406763eae7e43",
        "emnist-byclass-test-images-idx3-ubyte.gz": "1435209e34070a9002867a9ab50160d7",
        "emnist-byclass-test-labels-idx1-ubyte.gz": "7a0f934bd176c798ecba96b36fda6657",
    },
    "bymerge": {
        "emnist-bymerge-train-images-idx3-ubyte.gz": "4a792d4df261d7e1ba27979573bf53f3",
        "emnist-bymerge-train-labels-idx1-ubyte.gz": "491be69ef99e1ab1f5b7f9ccc908bb26",
        "emnist-bymerge-test-images-idx3-ubyte.gz": "8eb5d34c91f1759a55831c37ec2a283f",
        "emnist-bymerge-test-labels-idx1-ubyte.gz": "c13f4cd5211cdba1b8fa992dae2be992",
    },
    "digits": {
        "emnist-digits-train-images-idx3-ubyte.gz": "d2662ecdc47895a6bbfce25de9e9a677",
        "emnist-digits-train-labels-idx1-ubyte.gz": "2223fcfee618ac9c89ef20b6e48bcf9e",
        "emnist-digits-test-images-idx3-ubyte.gz": "a159b8b3bd6ab4ed4793c1cb71a2f5cc",
        "emnist-digits-test-labels-idx1-ubyte.gz": "8afde66ea51d865689083ba6bb779fac",
    },
    "letters": {
        "emnist-letters-train-images-idx3-ubyte.gz": "8795078f199c478165fe18db82625747",
        "emnist-letters-train-labels-idx1-ubyte.gz": "c16de4f1848ddcdddd39ab65d2a7be52",
        "emnist-letters-test-images-idx3-ubyte.gz": "382093a19703f68edac6d01b8dfdfcad",
        "emnist-letters-test-labels-idx1-ubyte.gz": "d4108920cd86601ec7689a97f2de7f59",
    },
}
EMNIST_CLASSES = {"balanced": 47, "byclass": 62, "bymerge": 47, "digits": 10, "letters": 26}
EMNIST_ZIP = "emnist/raw/gzip.zip"
EMNIST_URLS = ("https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip",
               "https://www.itl.nist.gov/iaui/vip/cs_links/EMNIST/gzip.zip")
_EMNIST_HOME = "https://www.nist.gov/itl/products-and-services/emnist-dataset"


@DATASETS.register("emnist")
def load_emnist(root: Path, download: bool = False, split: str = "balanced") -> Dataset:
    """EMNIST `split` from NIST's idx files under `<root>/emnist/raw/`, loose or in gzip.zip.

    A loose file is used where present, else the member of `<root>/emnist/raw/gzip.zip`
    (downloaded when asked). EMNIST stores every image transposed relative to MNIST; it is
    transposed back. `letters` labels 1..26 become 0..25.
    """
    if split not in EMNIST_FILES:
        raise ConfigError(f"data.split must be one of {', '.join(sorted(EMNIST_FILES))}, "
                          f"got {split!r}")
    raw = root / "emnist" / "raw"
    archive_path = root / EMNIST_ZIP
    archive: zipfile.ZipFile | None = None
    arrays = {}
    try:
        for filename, md5 in EMNIST_FILES[split].items():
            path = raw / filename
            if path.exists():
                data, where = path.read_bytes(), str(path)
            else:
                if archive is None:
                    archive = _open_emnist_zip(archive_path, path, md5, download)
                data, where = _zip_member(archive, archive_path, filename)
            check_md5(data, where, md5, _EMNIST_HOME, of="the .gz file")
            key = filename.removeprefix(f"emnist-{split}-")
            arrays[key] = parse_idx(gunzip(data, where), filename)
    finally:
        if archive is not None:
            archive.close()
    n_classes = EMNIST_CLASSES[split]
    shift = 1 if split == "letters" else 0
    labels = {}
    for part in ("train", "test"):
        y = arrays[f"{part}-labels-idx1-ubyte.gz"].astype(np.int64) - shift
        if len(y) and (y.min() < 0 or y.max() >= n_classes):
            raise DataError(f"emnist-{split}-{part}-labels: labels outside "
                            f"{shift}..{n_classes - 1 + shift}")
        labels[part] = y
    # (N, H, W) -> (N, W, H): the stored images are transposed relative to MNIST.
    images = {part: np.ascontiguousarray(arrays[f"{part}-images-idx3-ubyte.gz"].transpose(0, 2, 1))
              for part in ("train", "test")}
    return _image_dataset("emnist", images["train"], labels["train"], images["test"],
                          labels["test"], n_classes, meta={"split": split})


def _open_emnist_zip(archive_path: Path, wanted: Path, md5: str,
                     download: bool) -> zipfile.ZipFile:
    if not archive_path.exists() and download:
        fetch(archive_path, EMNIST_URLS)
    if not archive_path.exists():
        raise missing_file(wanted, md5, _EMNIST_HOME, of="the .gz file",
                           alternative=f"NIST's gzip.zip at {archive_path}")
    try:
        return zipfile.ZipFile(archive_path)
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"{archive_path} is not a valid zip file ({err}); replace it with "
                        f"gzip.zip from {_EMNIST_HOME}") from err


def _zip_member(archive: zipfile.ZipFile, archive_path: Path, filename: str) -> tuple[bytes, str]:
    # NIST's zip keeps the files under gzip/; match on the base name to accept any folder.
    names = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == filename]
    if not names:
        raise DataError(f"{archive_path} holds no {filename}; replace it with gzip.zip from "
                        f"{_EMNIST_HOME}")
    try:
        return archive.read(names[0]), f"{archive_path} (member {names[0]})"
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
        raise DataError(f"corrupt data file {archive_path}: cannot read {names[0]} ({err}); "
                        f"replace it with gzip.zip from {_EMNIST_HOME}") from err

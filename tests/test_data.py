"""Datasets: the idx reader, checked file access, download, the data root and the loaders."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from clusterfed.data import DATASETS, Dataset, data_root, load_dataset
from clusterfed.data import files as files_module
from clusterfed.data import idx as idx_module
from clusterfed.data.idx import load_idx_dataset, parse_idx
from clusterfed.errors import ConfigError, DataError

pytestmark = pytest.mark.fast

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def idx_bytes(array: np.ndarray, type_code: int = 0x08, dtype: str = "u1") -> bytes:
    """The bytes of an idx file holding `array`: magic 0x0000TTDD, big-endian sizes, data."""
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.asarray(array).astype(dtype).tobytes()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def fake_mnist_arrays(n_train: int = 12, n_test: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, n_test, dtype=np.uint8),
    }


def write_gz_files(folder: Path, arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """Write each array as a gzipped idx file; return the md5s of their decompressed content."""
    folder.mkdir(parents=True, exist_ok=True)
    md5s = {}
    for filename, array in arrays.items():
        content = idx_bytes(array)
        (folder / filename).write_bytes(gzip.compress(content))
        md5s[filename] = md5(content)
    return md5s


@pytest.fixture
def fake_mnist(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    """A tiny MNIST in the official layout: <root>/mnist/raw/<4 gz files>."""
    arrays = fake_mnist_arrays()
    md5s = write_gz_files(tmp_path / "root" / "mnist" / "raw", arrays)
    return tmp_path / "root", arrays, md5s


# ---------------------------------------------------------------- parse_idx


def test_parse_idx_images_and_labels() -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4) * 7
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    data = idx_bytes(images)
    assert data[:4] == b"\x00\x00\x08\x03"
    assert data[4:16] == b"\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04"
    out = parse_idx(data)
    assert out.dtype == np.uint8 and out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, images)
    label_data = idx_bytes(labels)
    assert label_data[:4] == b"\x00\x00\x08\x01"
    np.testing.assert_array_equal(parse_idx(label_data), labels)


def test_parse_idx_big_endian_int32_becomes_native() -> None:
    values = np.array([[1, -2], [70000, -(2**31)]], dtype=np.int32)
    out = parse_idx(idx_bytes(values, type_code=0x0C, dtype=">i4"))
    assert out.dtype.isnative and out.dtype.kind == "i" and out.dtype.itemsize == 4
    np.testing.assert_array_equal(out, values)


@pytest.mark.parametrize("cut", [1, 100])
def test_parse_idx_truncated_data(cut: int) -> None:
    data = idx_bytes(np.zeros((3, 28, 28), dtype=np.uint8))
    with pytest.raises(DataError, match=r"my-file.*header says 2352 bytes.*found"):
        parse_idx(data[:-cut], "my-file")


@pytest.mark.parametrize("length", [6, 8, 12])
def test_parse_idx_truncated_header(length: int) -> None:
    # magic says three sizes (12 bytes) follow; the file stops inside them.
    data = idx_bytes(np.zeros((3, 28, 28), dtype=np.uint8))[:length]
    with pytest.raises(DataError, match="my-file"):
        parse_idx(data, "my-file")


@pytest.mark.parametrize("magic", [
    b"\x00\x00\x07\x03",  # unknown type code
    b"\x01\x00\x08\x03",  # first byte not zero
    b"\x00\x01\x08\x01",  # second byte not zero
    b"PK\x03\x04",        # some other file format
])
def test_parse_idx_bad_magic(magic: bytes) -> None:
    data = idx_bytes(np.zeros((2, 2, 2), dtype=np.uint8))
    with pytest.raises(DataError, match=r"labels\.idx is not an idx file \(bad magic number\)"):
        parse_idx(magic + data[4:], "labels.idx")


def test_parse_idx_too_short_for_magic() -> None:
    with pytest.raises(DataError, match="bad magic number"):
        parse_idx(b"\x00\x00", "tiny")


# ---------------------------------------------------------------- fake MNIST on disk


def test_load_idx_dataset_fake_mnist(fake_mnist) -> None:
    root, arrays, md5s = fake_mnist
    ds = load_idx_dataset("mnist", root, md5s=md5s)
    assert isinstance(ds, Dataset) and ds.name == "mnist" and ds.n_classes == 10
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (5, 1, 28, 28) and ds.test_x.dtype == np.uint8
    assert ds.train_y.dtype == np.int64 and ds.test_y.dtype == np.int64
    assert ds.input_shape == (1, 28, 28)
    np.testing.assert_array_equal(ds.train_x[:, 0], arrays["train-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(ds.test_x[:, 0], arrays["t10k-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(ds.train_y, arrays["train-labels-idx1-ubyte.gz"])
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte.gz"])


def test_load_dataset_mnist_by_name(fake_mnist, monkeypatch: pytest.MonkeyPatch) -> None:
    root, arrays, md5s = fake_mnist
    # Against the official checksums the fake files are corrupt ...
    with pytest.raises(DataError, match="corrupt data file"):
        load_dataset("mnist", root)
    # ... and with their own checksums registered they load through the registry.
    monkeypatch.setitem(idx_module.IDX_FILES, "mnist", md5s)
    ds = load_dataset("mnist", root)
    assert ds.train_x.shape == (12, 1, 28, 28)
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte.gz"])
    # The root may also come from $CLUSTERFED_DATA.
    monkeypatch.setenv("CLUSTERFED_DATA", str(root))
    assert load_dataset("mnist").train_y.tolist() == ds.train_y.tolist()


def test_missing_file_message(fake_mnist) -> None:
    root, _, md5s = fake_mnist
    missing = root / "mnist" / "raw" / "t10k-labels-idx1-ubyte.gz"
    missing.unlink()
    with pytest.raises(DataError) as info:
        load_idx_dataset("mnist", root, md5s=md5s)
    message = str(info.value)
    assert "missing data file" in message
    assert str(missing) in message
    assert md5s["t10k-labels-idx1-ubyte.gz"] in message
    assert "--data-dir" in message and "CLUSTERFED_DATA" in message


def test_corrupt_file_message(fake_mnist) -> None:
    root, arrays, md5s = fake_mnist
    path = root / "mnist" / "raw" / "train-labels-idx1-ubyte.gz"
    changed = arrays["train-labels-idx1-ubyte.gz"].copy()
    changed[0] = (changed[0] + 1) % 10
    content = idx_bytes(changed)
    path.write_bytes(gzip.compress(content))
    with pytest.raises(DataError) as info:
        load_idx_dataset("mnist", root, md5s=md5s)
    message = str(info.value)
    assert "corrupt data file" in message and str(path) in message
    assert md5(content) in message
    assert md5s["train-labels-idx1-ubyte.gz"] in message
    assert md5(content) != md5s["train-labels-idx1-ubyte.gz"]


def test_not_gzip_file(fake_mnist) -> None:
    root, arrays, md5s = fake_mnist
    path = root / "mnist" / "raw" / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(idx_bytes(arrays["t10k-images-idx3-ubyte.gz"]))  # plain, not gzipped
    with pytest.raises(DataError, match="not a valid gzip file") as info:
        load_idx_dataset("mnist", root, md5s=md5s)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("damage", ["truncate", "deflate", "crc"])
def test_damaged_gzip_file(fake_mnist, damage: str) -> None:
    root, _, md5s = fake_mnist
    path = root / "mnist" / "raw" / "train-images-idx3-ubyte.gz"
    raw = bytearray(path.read_bytes())
    if damage == "truncate":  # gzip raises EOFError
        raw = raw[: len(raw) // 2]
    elif damage == "deflate":  # first byte after the 10-byte gzip header: zlib.error
        raw[10] ^= 0xFF
    else:  # inside the (stored, random) data: the CRC check fails
        raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz"):
        load_idx_dataset("mnist", root, md5s=md5s)


def test_image_and_label_counts_disagree(tmp_path: Path) -> None:
    arrays = fake_mnist_arrays()
    arrays["t10k-labels-idx1-ubyte.gz"] = arrays["t10k-labels-idx1-ubyte.gz"][:-1]
    md5s = write_gz_files(tmp_path / "mnist" / "raw", arrays)
    with pytest.raises(DataError, match="disagree on the number of samples"):
        load_idx_dataset("mnist", tmp_path, md5s=md5s)


# ---------------------------------------------------------------- download


def test_download_from_file_mirror(tmp_path: Path) -> None:
    arrays = fake_mnist_arrays(seed=1)
    mirror = tmp_path / "mirror"
    md5s = write_gz_files(mirror, arrays)
    root = tmp_path / "root"
    raw = root / "mnist" / "raw"
    assert not raw.exists()
    # Without download=True nothing is fetched.
    with pytest.raises(DataError, match="missing data file"):
        load_idx_dataset("mnist", root, md5s=md5s, mirrors=(mirror.as_uri() + "/",))
    ds = load_idx_dataset("mnist", root, download=True, md5s=md5s,
                          mirrors=(mirror.as_uri() + "/",))
    assert sorted(p.name for p in raw.iterdir()) == sorted(MNIST_FILES)
    for name in MNIST_FILES:
        assert (raw / name).read_bytes() == (mirror / name).read_bytes()
    np.testing.assert_array_equal(ds.train_x[:, 0], arrays["train-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte.gz"])


def test_download_tries_next_mirror(tmp_path: Path) -> None:
    arrays = fake_mnist_arrays(seed=2)
    mirror = tmp_path / "mirror"
    md5s = write_gz_files(mirror, arrays)
    empty = tmp_path / "empty"
    empty.mkdir()
    ds = load_idx_dataset("mnist", tmp_path / "root", download=True, md5s=md5s,
                          mirrors=(empty.as_uri() + "/", mirror.as_uri() + "/"))
    assert len(ds.train_y) == 12


def test_download_then_verified(tmp_path: Path) -> None:
    arrays = fake_mnist_arrays(seed=3)
    mirror = tmp_path / "mirror"
    md5s = write_gz_files(mirror, arrays)
    wrong = dict(md5s, **{"t10k-images-idx3-ubyte.gz": "0" * 32})
    with pytest.raises(DataError, match="corrupt data file.*t10k-images-idx3-ubyte.gz"):
        load_idx_dataset("mnist", tmp_path / "root", download=True, md5s=wrong,
                         mirrors=(mirror.as_uri() + "/",))


def test_download_missing_on_mirror(tmp_path: Path) -> None:
    arrays = fake_mnist_arrays(seed=4)
    mirror = tmp_path / "mirror"
    md5s = write_gz_files(mirror, arrays)
    (mirror / "t10k-images-idx3-ubyte.gz").unlink()
    root = tmp_path / "root"
    with pytest.raises(DataError, match="could not download t10k-images-idx3-ubyte.gz"):
        load_idx_dataset("mnist", root, download=True, md5s=md5s,
                         mirrors=(mirror.as_uri() + "/",))
    raw = root / "mnist" / "raw"
    assert not list(root.rglob("*.part"))
    assert not (raw / "t10k-images-idx3-ubyte.gz").exists()


def test_interrupted_download_leaves_no_part_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = fake_mnist_arrays(seed=5)
    mirror = tmp_path / "mirror"
    md5s = write_gz_files(mirror, arrays)
    calls = []

    def broken_copy(src, dst, *args, **kwargs) -> None:
        calls.append(dst.name)
        dst.write(src.read(10))
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(files_module.shutil, "copyfileobj", broken_copy)
    root = tmp_path / "root"
    with pytest.raises(DataError, match="could not download.*connection reset") as info:
        load_idx_dataset("mnist", root, download=True, md5s=md5s,
                         mirrors=(mirror.as_uri() + "/", mirror.as_uri() + "/"))
    assert calls and all(name.endswith(".part") for name in calls)
    assert len(calls) == 2  # both mirrors tried for the first file
    assert str(info.value).count(mirror.as_uri()) == 2
    assert not list(root.rglob("*.part"))
    assert not list(root.rglob("*.gz"))


def test_existing_files_are_not_downloaded_again(fake_mnist, tmp_path: Path) -> None:
    root, _, md5s = fake_mnist
    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    ds = load_idx_dataset("mnist", root, download=True, md5s=md5s,
                          mirrors=(empty.as_uri() + "/",))
    assert len(ds.test_y) == 5


# ---------------------------------------------------------------- data root


def test_data_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERFED_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root(tmp_path / "explicit") == tmp_path / "explicit"
    assert data_root(str(tmp_path / "explicit")) == tmp_path / "explicit"
    assert data_root() == tmp_path / "env"
    assert data_root(None) == tmp_path / "env"
    monkeypatch.delenv("CLUSTERFED_DATA")
    assert data_root() == tmp_path / "xdg" / "clusterfed" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == tmp_path / "home" / ".cache" / "clusterfed" / "data"
    assert data_root("~/mine") == tmp_path / "home" / "mine"


def test_data_root_empty_env_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERFED_DATA", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "clusterfed" / "data"


# ---------------------------------------------------------------- digits and the registry


def test_digits() -> None:
    from sklearn.datasets import load_digits as sk_digits

    ds = load_dataset("digits")
    assert ds.name == "digits" and ds.n_classes == 10
    assert len(ds.train_y) + len(ds.test_y) == 1797
    assert len(ds.test_y) == 449 and len(ds.train_y) == 1348
    for x, y in ((ds.train_x, ds.train_y), (ds.test_x, ds.test_y)):
        assert x.shape == (len(y), 1, 8, 8) and x.dtype == np.uint8
        assert y.dtype == np.int64
    assert ds.train_x.max() > 200 and ds.test_x.max() > 200
    assert set(np.unique(ds.train_y)) == set(range(10))
    # Train and test together are exactly sklearn's samples (a partition), scaled by 16.
    bunch = sk_digits()
    expected = np.clip(bunch.images * 16, 0, 255).astype(np.uint8).reshape(1797, 64)
    got_x = np.concatenate([ds.train_x, ds.test_x]).reshape(1797, 64)
    got_y = np.concatenate([ds.train_y, ds.test_y])

    def rows(x: np.ndarray, y: np.ndarray) -> list[bytes]:
        return sorted(r.tobytes() + bytes([int(t)]) for r, t in zip(x, y, strict=True))

    assert rows(got_x, got_y) == rows(expected, bunch.target)


def test_digits_deterministic_and_test_fraction() -> None:
    a, b = load_dataset("digits"), load_dataset("digits")
    np.testing.assert_array_equal(a.train_x, b.train_x)
    np.testing.assert_array_equal(a.train_y, b.train_y)
    np.testing.assert_array_equal(a.test_x, b.test_x)
    half = load_dataset("digits", test_fraction=0.5)
    assert len(half.train_y) + len(half.test_y) == 1797
    assert abs(len(half.test_y) - 898.5) <= 0.5
    with pytest.raises(ConfigError, match="test_fraction"):
        load_dataset("digits", test_fraction=1.5)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("cifar-1000")
    message = str(info.value)
    assert "cifar-1000" in message
    for name in ("digits", "mnist", "fashion_mnist"):
        assert name in DATASETS and name in message


def test_unknown_option_names_key() -> None:
    with pytest.raises(ConfigError, match=r"data\.shuffle_seed"):
        load_dataset("digits", shuffle_seed=3)
    with pytest.raises(ConfigError, match=r"data\.md5s"):
        load_dataset("mnist", md5s={})


# ---------------------------------------------------------------- real MNIST


@pytest.mark.shared_data
def test_real_mnist(shared_data: Path) -> None:
    ds = load_dataset("mnist", shared_data)  # verifies the official content checksums
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (10000, 1, 28, 28) and ds.test_x.dtype == np.uint8
    assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
    assert ds.train_y.dtype == np.int64
    assert ds.train_x.max() == 255 and ds.train_x.min() == 0
    counts = np.bincount(ds.train_y, minlength=10)
    assert len(counts) == 10 and counts.sum() == 60000
    assert ((counts >= 5000) & (counts <= 7000)).all(), counts
    test_counts = np.bincount(ds.test_y, minlength=10)
    assert len(test_counts) == 10 and ((test_counts >= 800) & (test_counts <= 1200)).all()

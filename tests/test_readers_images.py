"""Image readers: CIFAR, SVHN, USPS, EMNIST, FEMNIST and the MIX-4 mixture, on tiny files."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import pickle
import struct
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
from scipy.io import savemat

from clusterfed.data import idx as idx_module
from clusterfed.data import images as images_module
from clusterfed.data import load_dataset
from clusterfed.data.images import fit_images
from clusterfed.errors import ConfigError, DataError

pytestmark = pytest.mark.fast


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assert_one_error(call, *parts: str, match: str | None = None) -> str:
    """`call()` raises one DataError whose message holds every one of `parts`."""
    with pytest.raises(DataError, match=match) as info:
        call()
    message = str(info.value)
    for part in parts:
        assert part in message, (part, message)
    return message


def tar_gz(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------- CIFAR


def cifar_pickle(data: np.ndarray, labels: list[int], label_key: bytes = b"labels",
                 **extra: object) -> bytes:
    """A batch as the official files hold it: a dict with bytes keys, numpy data, list labels."""
    batch = {b"batch_label": b"testing batch", label_key: labels, b"data": data,
             b"filenames": [b"x.png"] * len(labels)}
    batch.update({k.encode(): v for k, v in extra.items()})
    raw = pickle.dumps(batch, protocol=2)
    # The official Python 2 pickles name numpy.core, as numpy < 2 wrote it.
    return raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")


def fake_cifar10(n: int = 3, seed: int = 0) -> tuple[dict[str, bytes], np.ndarray, np.ndarray]:
    """Six tiny batches; returns their bytes and the rows and labels in loading order."""
    gen = rng(seed)
    files, rows, labels = {}, [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = gen.integers(0, 256, (n, 3072), dtype=np.uint8)
        y = gen.integers(0, 10, n).tolist()
        files[name] = cifar_pickle(data, y)
        rows.append(data)
        labels.append(y)
    return files, np.stack(rows), np.array(labels)


@pytest.fixture
def cifar10_files(monkeypatch: pytest.MonkeyPatch):
    files, rows, labels = fake_cifar10()
    monkeypatch.setitem(images_module.CIFAR_FILES, "cifar10",
                        {name: md5(data) for name, data in files.items()})
    return files, rows, labels


def write_folder(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def check_cifar10(ds, rows: np.ndarray, labels: np.ndarray) -> None:
    n = rows.shape[1]
    assert ds.name == "cifar10" and ds.n_classes == 10
    assert ds.train_x.shape == (5 * n, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (n, 3, 32, 32) and ds.test_x.dtype == np.uint8
    assert ds.train_y.dtype == np.int64 and ds.test_y.dtype == np.int64
    np.testing.assert_array_equal(ds.train_y, labels[:5].ravel())
    np.testing.assert_array_equal(ds.test_y, labels[5])
    # A row is the red plane, then green, then blue, each 32x32 row-major.
    first = rows[0, 0]
    assert ds.train_x[0, 1, 2, 3] == first[1024 + 2 * 32 + 3]
    assert ds.train_x[0, 2, 31, 0] == first[2048 + 31 * 32]
    np.testing.assert_array_equal(ds.train_x.reshape(5 * n, -1), rows[:5].reshape(5 * n, -1))
    np.testing.assert_array_equal(ds.test_x.reshape(n, -1), rows[5])


def test_cifar10_from_folder(tmp_path: Path, cifar10_files) -> None:
    files, rows, labels = cifar10_files
    write_folder(tmp_path / "cifar10" / "cifar-10-batches-py", files)
    check_cifar10(load_dataset("cifar10", tmp_path), rows, labels)


def test_cifar10_from_archive_and_folder(tmp_path: Path, cifar10_files) -> None:
    files, rows, labels = cifar10_files
    tar_gz(tmp_path / "cifar10" / "cifar-10-python.tar.gz",
           {"cifar-10-batches-py/readme.html": b"<html/>"}
           | {f"cifar-10-batches-py/{k}": v for k, v in files.items() if k != "test_batch"})
    # Extracted files are used first; the archive supplies the rest.
    write_folder(tmp_path / "cifar10" / "cifar-10-batches-py",
                 {"test_batch": files["test_batch"]})
    check_cifar10(load_dataset("cifar10", tmp_path), rows, labels)


def test_cifar10_missing(tmp_path: Path, cifar10_files) -> None:
    expected = images_module.CIFAR_FILES["cifar10"]["data_batch_1"]
    path = tmp_path / "cifar10" / "cifar-10-batches-py" / "data_batch_1"
    assert_one_error(lambda: load_dataset("cifar10", tmp_path), "missing data file", str(path),
                     expected, "cifar-10-python.tar.gz", "--data-dir", "CLUSTERFED_DATA")


def test_cifar10_corrupt_file(tmp_path: Path, cifar10_files) -> None:
    files, _, _ = cifar10_files
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    write_folder(folder, files)
    data = bytearray(files["data_batch_3"])
    data[-40] ^= 1
    (folder / "data_batch_3").write_bytes(bytes(data))
    assert_one_error(lambda: load_dataset("cifar10", tmp_path), "corrupt data file",
                     str(folder / "data_batch_3"), md5(bytes(data)),
                     md5(files["data_batch_3"]))


def test_cifar10_corrupt_archive_member(tmp_path: Path, cifar10_files) -> None:
    files, _, _ = cifar10_files
    changed = dict(files, data_batch_2=files["data_batch_2"][:-1] + b"!")
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    tar_gz(archive, {f"cifar-10-batches-py/{k}": v for k, v in changed.items()})
    assert_one_error(lambda: load_dataset("cifar10", tmp_path), "corrupt data file",
                     str(archive), "cifar-10-batches-py/data_batch_2",
                     md5(files["data_batch_2"]))


def test_cifar10_damaged_or_incomplete_archive(tmp_path: Path, cifar10_files) -> None:
    files, _, _ = cifar10_files
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    tar_gz(archive, {f"cifar-10-batches-py/{k}": v for k, v in files.items()})
    archive.write_bytes(archive.read_bytes()[:200])
    assert_one_error(lambda: load_dataset("cifar10", tmp_path), str(archive),
                     match="corrupt data file")
    tar_gz(archive, {f"cifar-10-batches-py/{k}": v for k, v in files.items()
                     if k != "data_batch_5"})
    assert_one_error(lambda: load_dataset("cifar10", tmp_path), str(archive),
                     "cifar-10-batches-py/data_batch_5", match="holds no")


def test_cifar10_download(tmp_path: Path, cifar10_files,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    files, rows, labels = cifar10_files
    mirror = tmp_path / "mirror" / "cifar-10-python.tar.gz"
    tar_gz(mirror, {f"cifar-10-batches-py/{k}": v for k, v in files.items()})
    monkeypatch.setitem(images_module.CIFAR_URLS, "cifar10", (mirror.as_uri(),))
    root = tmp_path / "root"
    with pytest.raises(DataError, match="missing data file"):
        load_dataset("cifar10", root)
    check_cifar10(load_dataset("cifar10", root, download=True), rows, labels)
    assert (root / "cifar10" / "cifar-10-python.tar.gz").read_bytes() == mirror.read_bytes()


def test_cifar100_fine_and_coarse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = rng(1)
    files, arrays = {}, {}
    for name, n in (("train", 4), ("test", 2)):
        data = gen.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine, coarse = gen.integers(0, 100, n).tolist(), gen.integers(0, 20, n).tolist()
        files[name] = cifar_pickle(data, fine, b"fine_labels", coarse_labels=coarse)
        arrays[name] = (data, fine, coarse)
    monkeypatch.setitem(images_module.CIFAR_FILES, "cifar100",
                        {k: md5(v) for k, v in files.items()})
    tar_gz(tmp_path / "cifar100" / "cifar-100-python.tar.gz",
           {f"cifar-100-python/{k}": v for k, v in files.items()})
    fine = load_dataset("cifar100", tmp_path)
    assert fine.n_classes == 100 and fine.train_x.shape == (4, 3, 32, 32)
    np.testing.assert_array_equal(fine.train_y, arrays["train"][1])
    np.testing.assert_array_equal(fine.test_y, arrays["test"][1])
    np.testing.assert_array_equal(fine.test_x.reshape(2, -1), arrays["test"][0])
    coarse = load_dataset("cifar100", tmp_path, labels="coarse")
    assert coarse.n_classes == 20 and coarse.meta["labels"] == "coarse"
    np.testing.assert_array_equal(coarse.train_y, arrays["train"][2])
    with pytest.raises(ConfigError, match="data.labels"):
        load_dataset("cifar100", tmp_path, labels="medium")


def test_cifar_batch_with_bad_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, _, _ = fake_cifar10()
    files["test_batch"] = cifar_pickle(np.zeros((2, 3072), np.uint8), [3, 10])
    monkeypatch.setitem(images_module.CIFAR_FILES, "cifar10",
                        {k: md5(v) for k, v in files.items()})
    write_folder(tmp_path / "cifar10" / "cifar-10-batches-py", files)
    assert_one_error(lambda: load_dataset("cifar10", tmp_path), "test_batch", "0..9")


# ---------------------------------------------------------------- SVHN


def svhn_mat(n: int, seed: int, labels: list[int] | None = None) -> tuple[bytes, np.ndarray]:
    """A .mat file as the official one: X (32, 32, 3, N) uint8, y (N, 1) with 10 for digit 0."""
    x = rng(seed).integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = np.array(labels if labels is not None else rng(seed).integers(1, 11, n), np.uint8)
    buffer = io.BytesIO()
    savemat(buffer, {"X": x, "y": y.reshape(-1, 1)})
    return buffer.getvalue(), x


@pytest.fixture
def svhn_files(monkeypatch: pytest.MonkeyPatch):
    files = {"train_32x32.mat": svhn_mat(4, 0, [10, 1, 5, 10]),
             "test_32x32.mat": svhn_mat(3, 1, [2, 10, 9]),
             "extra_32x32.mat": svhn_mat(2, 2, [7, 10])}
    monkeypatch.setattr(images_module, "SVHN_FILES",
                        {k: md5(data) for k, (data, _) in files.items()})
    return files


def test_svhn(tmp_path: Path, svhn_files) -> None:
    write_folder(tmp_path / "svhn", {k: v[0] for k, v in svhn_files.items()})
    ds = load_dataset("svhn", tmp_path)
    assert ds.name == "svhn" and ds.n_classes == 10
    assert ds.train_x.shape == (4, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(ds.train_y, [0, 1, 5, 0])  # 10 is the digit 0
    np.testing.assert_array_equal(ds.test_y, [2, 0, 9])
    assert ds.train_y.dtype == np.int64
    x = svhn_files["train_32x32.mat"][1]  # (H, W, C, N)
    assert ds.train_x[2, 1, 5, 7] == x[5, 7, 1, 2]
    np.testing.assert_array_equal(ds.test_x, svhn_files["test_32x32.mat"][1].transpose(3, 2, 0, 1))
    extra = load_dataset("svhn", tmp_path, extra=True)
    assert extra.train_x.shape == (6, 3, 32, 32)
    np.testing.assert_array_equal(extra.train_y, [0, 1, 5, 0, 7, 0])
    np.testing.assert_array_equal(extra.train_x[:4], ds.train_x)


def test_svhn_missing_and_corrupt(tmp_path: Path, svhn_files) -> None:
    folder = tmp_path / "svhn"
    write_folder(folder, {"train_32x32.mat": svhn_files["train_32x32.mat"][0]})
    expected = images_module.SVHN_FILES["test_32x32.mat"]
    assert_one_error(lambda: load_dataset("svhn", tmp_path), "missing data file",
                     str(folder / "test_32x32.mat"), expected, "ufldl.stanford.edu")
    wrong = svhn_mat(3, 5)[0]
    (folder / "test_32x32.mat").write_bytes(wrong)
    assert_one_error(lambda: load_dataset("svhn", tmp_path), "corrupt data file",
                     str(folder / "test_32x32.mat"), expected, md5(wrong))


def test_svhn_bad_labels(tmp_path: Path, svhn_files, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {k: v[0] for k, v in svhn_files.items()}
    files["test_32x32.mat"] = svhn_mat(2, 4, [0, 3])[0]
    monkeypatch.setattr(images_module, "SVHN_FILES", {k: md5(v) for k, v in files.items()})
    write_folder(tmp_path / "svhn", files)
    assert_one_error(lambda: load_dataset("svhn", tmp_path), "test_32x32.mat", "1..10")


def test_svhn_download(tmp_path: Path, svhn_files, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "mirror"
    write_folder(mirror, {k: v[0] for k, v in svhn_files.items()})
    monkeypatch.setattr(images_module, "SVHN_MIRRORS", (mirror.as_uri() + "/",))
    ds = load_dataset("svhn", tmp_path / "root", download=True)
    assert len(ds.train_y) == 4
    assert sorted(p.name for p in (tmp_path / "root" / "svhn").iterdir()) == [
        "test_32x32.mat", "train_32x32.mat"]


# ---------------------------------------------------------------- USPS


def libsvm_text(values: np.ndarray, labels: list[int], sparse_rows: tuple[int, ...] = ()) -> str:
    lines = []
    for row, (v, label) in enumerate(zip(values, labels, strict=True)):
        pairs = [f"{i + 1}:{x:.6f}" for i, x in enumerate(v) if row not in sparse_rows or x != 0]
        lines.append(" ".join([str(label), *pairs]) + " ")
    return "\n".join(lines) + "\n"


@pytest.fixture
def usps_files(monkeypatch: pytest.MonkeyPatch):
    gen = rng(3)
    train = np.round(gen.uniform(-1, 1, (5, 256)), 6)
    train[0, :4] = [-1, 1, 0, 0.5]
    train[1, 10:20] = 0  # row 1 is written sparse: zeros left out, as LIBSVM allows
    test = np.round(gen.uniform(-1, 1, (2, 256)), 6)
    files = {"usps.bz2": bz2.compress(libsvm_text(train, [1, 10, 3, 4, 5], (1,)).encode()),
             "usps.t.bz2": bz2.compress(libsvm_text(test, [7, 2]).encode())}
    monkeypatch.setattr(images_module, "USPS_FILES", {k: md5(v) for k, v in files.items()})
    return files, train, test


def test_usps(tmp_path: Path, usps_files) -> None:
    files, train, test = usps_files
    write_folder(tmp_path / "usps", files)
    ds = load_dataset("usps", tmp_path)
    assert ds.name == "usps" and ds.n_classes == 10
    assert ds.train_x.shape == (5, 1, 16, 16) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (2, 1, 16, 16)
    np.testing.assert_array_equal(ds.train_y, [0, 9, 2, 3, 4])
    np.testing.assert_array_equal(ds.test_y, [6, 1])
    assert ds.train_x[0, 0, 0, :4].tolist() == [0, 255, 127, 191]  # -1, 1, 0, 0.5
    expected = ((train.astype(np.float32) + 1) / 2 * 255).astype(np.uint8).reshape(5, 1, 16, 16)
    np.testing.assert_array_equal(ds.train_x, expected)
    assert (ds.train_x[1, 0, 0, 10:16] == 127).all()  # absent features are 0
    expected_test = ((test.astype(np.float32) + 1) / 2 * 255).astype(np.uint8)
    np.testing.assert_array_equal(ds.test_x.reshape(2, 256), expected_test)


def test_usps_missing_corrupt_download(tmp_path: Path, usps_files,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    files, _, _ = usps_files
    folder = tmp_path / "usps"
    assert_one_error(lambda: load_dataset("usps", tmp_path), "missing data file",
                     str(folder / "usps.bz2"), md5(files["usps.bz2"]), "libsvmtools")
    broken = bz2.compress(b"1 1:0.5\n")
    write_folder(folder, {"usps.bz2": broken, "usps.t.bz2": files["usps.t.bz2"]})
    assert_one_error(lambda: load_dataset("usps", tmp_path), "corrupt data file",
                     str(folder / "usps.bz2"), md5(files["usps.bz2"]), md5(broken))
    mirror = tmp_path / "mirror"
    write_folder(mirror, files)
    monkeypatch.setattr(images_module, "USPS_MIRRORS", (mirror.as_uri() + "/",))
    root = tmp_path / "root"
    assert len(load_dataset("usps", root, download=True).train_y) == 5
    assert (root / "usps" / "usps.t.bz2").read_bytes() == files["usps.t.bz2"]


@pytest.mark.parametrize("text,problem", [("3 1:0.5 2\n", "not LIBSVM text"),
                                          ("3 257:0.5\n", "index outside 1..256"),
                                          ("11 1:0.5\n", "labels outside 1..10")])
def test_usps_malformed_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usps_files,
                             text: str, problem: str) -> None:
    files = dict(usps_files[0], **{"usps.t.bz2": bz2.compress(text.encode())})
    monkeypatch.setattr(images_module, "USPS_FILES", {k: md5(v) for k, v in files.items()})
    write_folder(tmp_path / "usps", files)
    assert_one_error(lambda: load_dataset("usps", tmp_path), "usps.t.bz2", problem)


def test_usps_h5_without_h5py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py now raises ImportError
    (tmp_path / "usps").mkdir()
    (tmp_path / "usps" / "usps.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    assert_one_error(lambda: load_dataset("usps", tmp_path), "h5py", "pip install h5py",
                     "usps.bz2", str(tmp_path / "usps" / "usps.h5"))


def test_usps_h5_with_h5py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = rng(4)
    groups = {"train": {"data": gen.uniform(0, 1, (3, 256)), "target": np.array([0, 9, 4])},
              "test": {"data": gen.uniform(0, 1, (2, 256)), "target": np.array([5, 1])}}

    class File:  # the part of h5py.File the reader uses
        def __init__(self, path: Path, mode: str) -> None:
            assert Path(path).name == "usps.h5" and mode == "r"

        def __enter__(self) -> dict:
            return groups

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setitem(sys.modules, "h5py", types.SimpleNamespace(File=File))
    (tmp_path / "usps").mkdir()
    (tmp_path / "usps" / "usps.h5").write_bytes(b"")
    ds = load_dataset("usps", tmp_path)
    assert ds.train_x.shape == (3, 1, 16, 16) and ds.train_x.dtype == np.uint8
    np.testing.assert_array_equal(ds.train_y, [0, 9, 4])
    expected = (groups["test"]["data"].astype(np.float32) * 255).astype(np.uint8)
    np.testing.assert_array_equal(ds.test_x.reshape(2, 256), expected)


# ---------------------------------------------------------------- EMNIST


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.asarray(array, dtype=np.uint8).tobytes()


def fake_emnist(split: str, n_classes: int, seed: int = 0):
    """The four gz files of a split, with images stored transposed as EMNIST stores them."""
    gen = rng(seed)
    shift = 1 if split == "letters" else 0
    upright, labels, files = {}, {}, {}
    for part, n in (("train", 6), ("test", 3)):
        images = gen.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = gen.integers(0, n_classes, n) + shift
        y[0] = shift + n_classes - 1
        upright[part], labels[part] = images, y - shift
        prefix = f"emnist-{split}-{part}"
        files[f"{prefix}-images-idx3-ubyte.gz"] = gzip.compress(
            idx_bytes(images.transpose(0, 2, 1)))
        files[f"{prefix}-labels-idx1-ubyte.gz"] = gzip.compress(idx_bytes(y))
    return files, upright, labels


def patch_emnist(monkeypatch: pytest.MonkeyPatch, split: str, files: dict[str, bytes]) -> None:
    # The known EMNIST checksums are of the .gz files themselves.
    monkeypatch.setitem(idx_module.EMNIST_FILES, split, {k: md5(v) for k, v in files.items()})


@pytest.mark.parametrize("split,n_classes", [("digits", 10), ("letters", 26), ("balanced", 47),
                                             ("byclass", 62), ("bymerge", 47)])
def test_emnist_loose_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str,
                            n_classes: int) -> None:
    files, upright, labels = fake_emnist(split, n_classes)
    patch_emnist(monkeypatch, split, files)
    write_folder(tmp_path / "emnist" / "raw", files)
    ds = load_dataset("emnist", tmp_path, split=split)
    assert ds.name == "emnist" and ds.n_classes == n_classes and ds.meta["split"] == split
    assert ds.train_x.shape == (6, 1, 28, 28) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (3, 1, 28, 28) and ds.train_y.dtype == np.int64
    np.testing.assert_array_equal(ds.train_x[:, 0], upright["train"])  # transpose undone
    np.testing.assert_array_equal(ds.test_x[:, 0], upright["test"])
    np.testing.assert_array_equal(ds.train_y, labels["train"])
    np.testing.assert_array_equal(ds.test_y, labels["test"])
    assert ds.train_y.max() == n_classes - 1 and ds.train_y.min() >= 0


def test_emnist_letters_shift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, _, _ = fake_emnist("letters", 26)
    stored = idx_bytes(np.array([1, 26, 13], dtype=np.uint8))
    files["emnist-letters-test-labels-idx1-ubyte.gz"] = gzip.compress(stored)
    files["emnist-letters-test-images-idx3-ubyte.gz"] = gzip.compress(
        idx_bytes(np.zeros((3, 28, 28), np.uint8)))
    patch_emnist(monkeypatch, "letters", files)
    write_folder(tmp_path / "emnist" / "raw", files)
    assert load_dataset("emnist", tmp_path, split="letters").test_y.tolist() == [0, 25, 12]


def test_emnist_labels_out_of_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, _, _ = fake_emnist("letters", 26)
    files["emnist-letters-test-labels-idx1-ubyte.gz"] = gzip.compress(
        idx_bytes(np.array([0, 3, 4], np.uint8)))  # letters start at 1
    patch_emnist(monkeypatch, "letters", files)
    write_folder(tmp_path / "emnist" / "raw", files)
    assert_one_error(lambda: load_dataset("emnist", tmp_path, split="letters"),
                     "emnist-letters-test-labels", "1..26")


def test_emnist_from_zip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, upright, labels = fake_emnist("letters", 26, seed=2)
    other, _, _ = fake_emnist("digits", 10, seed=3)
    patch_emnist(monkeypatch, "letters", files)
    raw = tmp_path / "emnist" / "raw"
    raw.mkdir(parents=True)
    with zipfile.ZipFile(raw / "gzip.zip", "w") as archive:  # NIST's layout: gzip/<file>
        for name, data in (files | other).items():
            archive.writestr(f"gzip/{name}", data)
    ds = load_dataset("emnist", tmp_path, split="letters")
    np.testing.assert_array_equal(ds.train_x[:, 0], upright["train"])
    np.testing.assert_array_equal(ds.test_y, labels["test"])


def test_emnist_missing_and_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, _, _ = fake_emnist("digits", 10)
    patch_emnist(monkeypatch, "digits", files)
    raw = tmp_path / "emnist" / "raw"
    name = "emnist-digits-train-images-idx3-ubyte.gz"
    assert_one_error(lambda: load_dataset("emnist", tmp_path, split="digits"),
                     "missing data file", str(raw / name), md5(files[name]), "gzip.zip",
                     "--data-dir")
    write_folder(raw, files)
    changed = gzip.compress(idx_bytes(np.zeros((6, 28, 28), np.uint8)))
    (raw / name).write_bytes(changed)
    assert_one_error(lambda: load_dataset("emnist", tmp_path, split="digits"),
                     "corrupt data file", str(raw / name), md5(files[name]), md5(changed))
    (raw / name).unlink()
    with zipfile.ZipFile(raw / "gzip.zip", "w") as archive:
        archive.writestr(f"gzip/{name}", changed)
    assert_one_error(lambda: load_dataset("emnist", tmp_path, split="digits"),
                     "corrupt data file", str(raw / "gzip.zip"), f"gzip/{name}", md5(files[name]))
    (raw / "gzip.zip").write_bytes(b"not a zip")
    assert_one_error(lambda: load_dataset("emnist", tmp_path, split="digits"),
                     str(raw / "gzip.zip"), match="not a valid zip file")


def test_emnist_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, upright, _ = fake_emnist("balanced", 47, seed=5)
    patch_emnist(monkeypatch, "balanced", files)
    mirror = tmp_path / "mirror" / "gzip.zip"
    mirror.parent.mkdir()
    with zipfile.ZipFile(mirror, "w") as archive:
        for name, data in files.items():
            archive.writestr(f"gzip/{name}", data)
    monkeypatch.setattr(idx_module, "EMNIST_URLS", (mirror.as_uri(),))
    ds = load_dataset("emnist", tmp_path / "root", download=True)  # balanced by default
    assert ds.n_classes == 47
    np.testing.assert_array_equal(ds.test_x[:, 0], upright["test"])
    assert (tmp_path / "root" / "emnist" / "raw" / "gzip.zip").exists()


def test_emnist_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.split.*letters"):
        load_dataset("emnist", tmp_path, split="mnist-ish")


# ---------------------------------------------------------------- FEMNIST


def leaf_json(writers: dict[str, tuple[np.ndarray, list[int]]]) -> str:
    """A LEAF json file: pixels as floats in [0, 1], one list of 784 per image."""
    return json.dumps({
        "users": list(writers),
        "num_samples": [len(y) for _, y in writers.values()],
        "user_data": {w: {"x": (x.reshape(len(y), 784) / 255).tolist(), "y": y}
                      for w, (x, y) in writers.items()},
    })


@pytest.fixture
def femnist_root(tmp_path: Path):
    gen = rng(6)

    def images(n: int) -> np.ndarray:
        return gen.integers(0, 256, (n, 28, 28)).astype(np.float64)

    data = {
        "train": [{"f0300": (images(2), [0, 61]), "f0100": (images(3), [10, 36, 5])},
                  {"f0200": (images(1), [7])}],
        "test": [{"f0100": (images(1), [1]), "f0300": (images(2), [2, 3]),
                  "f0200": (images(1), [4])}],
    }
    for part, contents in data.items():
        folder = tmp_path / "femnist" / part
        folder.mkdir(parents=True)
        for i, writers in enumerate(contents):
            (folder / f"all_data_{i}_niid_05_keep_0_{part}_9.json").write_text(leaf_json(writers))
    return tmp_path, data


def test_femnist(femnist_root) -> None:
    root, data = femnist_root
    ds = load_dataset("femnist", root)
    assert ds.name == "femnist" and ds.n_classes == 62
    assert ds.meta["groups"] == ["f0100", "f0200", "f0300"]
    assert ds.train_x.shape == (6, 1, 28, 28) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (4, 1, 28, 28)
    assert ds.train_groups.dtype == np.int64 and ds.train_y.dtype == np.int64
    # Samples come in writer order; a writer has the same id in train and test.
    np.testing.assert_array_equal(ds.train_groups, [0, 0, 0, 1, 2, 2])
    np.testing.assert_array_equal(ds.test_groups, [0, 1, 2, 2])
    np.testing.assert_array_equal(ds.train_y, [10, 36, 5, 7, 0, 61])
    np.testing.assert_array_equal(ds.test_y, [1, 4, 2, 3])
    # LEAF's x * 255, rounded, polarity kept (1.0 is NIST's white background).
    np.testing.assert_array_equal(ds.train_x[:3, 0], data["train"][0]["f0100"][0])
    np.testing.assert_array_equal(ds.test_x[2:, 0], data["test"][0]["f0300"][0])
    inverted = load_dataset("femnist", root, invert=True)
    np.testing.assert_array_equal(inverted.train_x, 255 - ds.train_x)


def test_femnist_max_writers(femnist_root) -> None:
    root, data = femnist_root
    ds = load_dataset("femnist", root, max_writers=2)
    assert ds.meta["groups"] == ["f0100", "f0200"]
    np.testing.assert_array_equal(ds.train_groups, [0, 0, 0, 1])
    np.testing.assert_array_equal(ds.test_y, [1, 4])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_writers"):
            load_dataset("femnist", root, max_writers=bad)


def test_femnist_missing(tmp_path: Path) -> None:
    message = assert_one_error(lambda: load_dataset("femnist", tmp_path, download=True),
                               str(tmp_path / "femnist" / "train"), "preprocess.sh",
                               "not md5-verified")
    assert "cannot be downloaded" in message


def test_femnist_bad_files(femnist_root) -> None:
    root, _ = femnist_root
    path = root / "femnist" / "test" / "all_data_0_niid_05_keep_0_test_9.json"
    path.write_text('{"users": ["a"]')
    assert_one_error(lambda: load_dataset("femnist", root), str(path), match="not a LEAF json")
    path.write_text(json.dumps({"users": ["a"], "num_samples": [1],
                                "user_data": {"a": {"x": [[0.5] * 783], "y": [3]}}}))
    assert_one_error(lambda: load_dataset("femnist", root), str(path), "784")
    path.write_text(json.dumps({"users": ["a"], "num_samples": [1],
                                "user_data": {"a": {"x": [[1.5] * 784], "y": [3]}}}))
    assert_one_error(lambda: load_dataset("femnist", root), str(path), "[0, 1]")
    # A writer in two files of one folder means outputs of different LEAF runs were mixed.
    second = root / "femnist" / "test" / "all_data_1_niid_05_keep_0_test_9.json"
    path.write_text(leaf_json({"f0100": (np.zeros((1, 28, 28)), [1])}))
    second.write_text(leaf_json({"f0100": (np.zeros((1, 28, 28)), [2])}))
    assert_one_error(lambda: load_dataset("femnist", root), "f0100", str(second),
                     match="appears in two files")


# ---------------------------------------------------------------- MIX-4


@pytest.fixture
def mix_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cifar10_files, svhn_files,
             usps_files):
    """Tiny cifar10, svhn, fashion_mnist and usps in one data root."""
    write_folder(tmp_path / "cifar10" / "cifar-10-batches-py", cifar10_files[0])
    write_folder(tmp_path / "svhn", {k: v[0] for k, v in svhn_files.items()})
    write_folder(tmp_path / "usps", usps_files[0])
    gen = rng(7)
    fmnist = {"train-images-idx3-ubyte.gz": gen.integers(0, 256, (4, 28, 28)),
              "train-labels-idx1-ubyte.gz": np.array([0, 9, 3, 3]),
              "t10k-images-idx3-ubyte.gz": gen.integers(0, 256, (2, 28, 28)),
              "t10k-labels-idx1-ubyte.gz": np.array([8, 1])}
    contents = {k: idx_bytes(v) for k, v in fmnist.items()}
    write_folder(tmp_path / "fashion_mnist" / "raw",
                 {k: gzip.compress(v) for k, v in contents.items()})
    monkeypatch.setitem(idx_module.IDX_FILES, "fashion_mnist",
                        {k: md5(v) for k, v in contents.items()})
    return tmp_path


def test_mix4(mix_root: Path) -> None:
    ds = load_dataset("mix", mix_root)
    parts = {name: load_dataset(name, mix_root)
             for name in ("cifar10", "svhn", "fashion_mnist", "usps")}
    assert ds.name == "mix" and ds.n_classes == 40
    assert ds.meta["groups"] == ["cifar10", "svhn", "fashion_mnist", "usps"]
    assert ds.meta["label_offsets"] == [0, 10, 20, 30]
    assert ds.train_x.shape == (15 + 4 + 4 + 5, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (3 + 3 + 2 + 2, 3, 32, 32)
    for x, y, g, split in ((ds.train_x, ds.train_y, ds.train_groups, "train"),
                           (ds.test_x, ds.test_y, ds.test_groups, "test")):
        assert y.dtype == np.int64 and g.dtype == np.int64
        for k, (name, part) in enumerate(parts.items()):
            source_x = getattr(part, f"{split}_x")
            mine = g == k
            np.testing.assert_array_equal(y[mine], getattr(part, f"{split}_y") + 10 * k)
            sub = x[mine]
            if name in ("cifar10", "svhn"):
                np.testing.assert_array_equal(sub, source_x)
                continue
            pad = (32 - source_x.shape[-1]) // 2  # 2 for FMNIST, 8 for USPS
            inner = sub[:, :, pad:32 - pad, pad:32 - pad]
            np.testing.assert_array_equal(inner, np.repeat(source_x, 3, axis=1))
            border = sub.copy()
            border[:, :, pad:32 - pad, pad:32 - pad] = 0
            assert not border.any()
    assert sorted(set(ds.train_y.tolist())) == sorted(
        {int(v) + 10 * k for k, p in enumerate(parts.values()) for v in p.train_y})


def test_mix_other_order_and_shape(mix_root: Path) -> None:
    ds = load_dataset("mix", mix_root, datasets=["usps", "cifar10"], shape=[1, 28, 28])
    cifar = load_dataset("cifar10", mix_root)
    usps = load_dataset("usps", mix_root)
    assert ds.meta["groups"] == ["usps", "cifar10"] and ds.n_classes == 20
    assert ds.train_x.shape == (5 + 15, 1, 28, 28)
    np.testing.assert_array_equal(ds.train_y[ds.train_groups == 0], usps.train_y)
    np.testing.assert_array_equal(ds.train_y[ds.train_groups == 1], cifar.train_y + 10)
    np.testing.assert_array_equal(ds.train_x[:5, :, 6:22, 6:22], usps.train_x)
    np.testing.assert_array_equal(ds.train_x[5:], fit_images(cifar.train_x, (1, 28, 28)))


def test_mix_source_without_download_option(mix_root: Path) -> None:
    # scikit-learn's digits (8x8, no download keyword) pad to 16x16 beside USPS.
    ds = load_dataset("mix", mix_root, download=True, datasets=["digits", "usps"],
                      shape=[1, 16, 16])
    digits = load_dataset("digits")
    assert ds.n_classes == 20 and ds.meta["label_offsets"] == [0, 10]
    np.testing.assert_array_equal(ds.test_x[ds.test_groups == 0][:, :, 4:12, 4:12],
                                  digits.test_x)
    np.testing.assert_array_equal(ds.test_y[ds.test_groups == 1], [16, 11])


def test_mix_bad_options(mix_root: Path) -> None:
    for options, key in (({"datasets": "cifar10"}, "datasets"),
                         ({"datasets": []}, "datasets"),
                         ({"datasets": ["usps", "usps"]}, "datasets"),
                         ({"datasets": ["mix"]}, "datasets"),
                         ({"shape": [2, 32, 32]}, "shape"),
                         ({"shape": [3, 32]}, "shape"),
                         ({"fit": "crop"}, "fit")):
        with pytest.raises(ConfigError, match=f"data.{key}"):
            load_dataset("mix", mix_root, **options)
    with pytest.raises(ConfigError, match="unknown dataset"):
        load_dataset("mix", mix_root, datasets=["usps", "imagenet"])


def test_fit_images() -> None:
    x = rng(8).integers(0, 256, (2, 1, 16, 16), dtype=np.uint8)
    padded = fit_images(x, (3, 32, 32))
    assert padded.shape == (2, 3, 32, 32) and padded.dtype == np.uint8
    np.testing.assert_array_equal(padded[:, 1, 8:24, 8:24], x[:, 0])
    assert padded.sum() == 3 * x.astype(np.int64).sum()
    same = rng(9).integers(0, 256, (2, 3, 8, 8), dtype=np.uint8)
    np.testing.assert_array_equal(fit_images(same, (3, 8, 8)), same)
    np.testing.assert_array_equal(fit_images(same, (3, 8, 8), fit="resize"), same)
    # A flat image stays flat through resizing; an odd pad puts the extra row below.
    flat = np.full((1, 1, 10, 10), 77, np.uint8)
    assert (fit_images(flat, (1, 4, 6)) == 77).all()
    assert (fit_images(flat, (1, 13, 13), fit="resize") == 77).all()
    odd = fit_images(flat, (1, 13, 13))
    assert odd[0, 0, 1:11, 1:11].min() == 77 and odd.sum() == 77 * 100
    # Three channels become one by luma weights.
    rgb = np.zeros((1, 3, 2, 2), np.uint8)
    rgb[0, 0], rgb[0, 1], rgb[0, 2] = 255, 100, 10
    grey = fit_images(rgb, (1, 2, 2))
    assert grey.shape == (1, 1, 2, 2) and (grey == round(0.299 * 255 + 58.7 + 1.14)).all()
    # Halving is antialiased bilinear (PIL's triangle filter, 2 input pixels each side): an
    # output pixel takes 6/7 of its own 2x2 block and 1/7 of the next, along each axis.
    b = np.array([[0, 200], [100, 50]], np.uint8)
    half = fit_images(np.kron(b, np.ones((2, 2), np.uint8))[None, None], (1, 2, 2))
    w = np.array([[6, 1], [1, 6]]) / 7
    np.testing.assert_array_equal(half[0, 0], np.rint(w @ b @ w.T))

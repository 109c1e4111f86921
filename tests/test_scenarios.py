"""Scenarios: how a dataset becomes a federation with known true clusters."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest

from clusterfed.data import SCENARIOS, Dataset, Federation, build_federation, load_dataset
from clusterfed.data.transforms import Rotate
from clusterfed.errors import ConfigError

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


def index_dataset(n_train: int = 400, n_test: int = 120) -> Dataset:
    """Images (N, 1, 2, 2) whose pixels encode the sample's index (and the split it is in)."""
    def images(n: int, split: int) -> np.ndarray:
        i = np.arange(n)
        x = np.zeros((n, 1, 2, 2), dtype=np.uint8)
        x[:, 0, 0, 0] = i // 256
        x[:, 0, 0, 1] = i % 256
        x[:, 0, 1, 0] = split
        return x

    return Dataset("index", images(n_train, 1), np.arange(n_train) % 10,
                   images(n_test, 2), np.arange(n_test) % 10, 10)


def decode_index(x: np.ndarray) -> np.ndarray:
    """The indices `index_dataset` encoded, from float images in [0, 1]."""
    pix = np.rint(x * 255).astype(np.int64)
    return pix[:, 0, 0, 0] * 256 + pix[:, 0, 0, 1]


def label_dataset(n_train: int = 400, n_test: int = 100) -> Dataset:
    """Images whose every pixel is label * 20, so the original label is readable from x."""
    rng = np.random.default_rng(11)
    train_y = rng.integers(0, 10, n_train).astype(np.int64)
    test_y = rng.integers(0, 10, n_test).astype(np.int64)

    def images(y: np.ndarray) -> np.ndarray:
        return np.broadcast_to((y * 20).astype(np.uint8)[:, None, None, None],
                               (len(y), 1, 3, 3)).copy()

    return Dataset("labels", images(train_y), train_y, images(test_y), test_y, 10)


def original_label(x: np.ndarray) -> np.ndarray:
    return np.rint(x[:, 0, 0, 0] * 255 / 20).astype(np.int64)


def swapped(y: np.ndarray, pair: list[int]) -> np.ndarray:
    a, b = pair
    return np.where(y == a, b, np.where(y == b, a, y))


def corner_dataset(n_train: int = 40, n_test: int = 16, size: int = 6) -> Dataset:
    """Asymmetric images: one bright pixel in the top-left corner, nothing else."""
    def images(n: int) -> np.ndarray:
        x = np.zeros((n, 1, size, size), dtype=np.uint8)
        x[:, 0, 0, 0] = 255
        return x

    return Dataset("corner", images(n_train), np.zeros(n_train, np.int64),
                   images(n_test), np.zeros(n_test, np.int64), 10)


def row_keys(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    return [img.tobytes() + int(label).to_bytes(2, "big") for img, label in zip(x, y, strict=True)]


def assert_same_federation(a: Federation, b: Federation) -> None:
    assert a.num_clients == b.num_clients
    np.testing.assert_array_equal(a.true_clusters, b.true_clusters)
    for ca, cb in zip(a.clients, b.clients, strict=True):
        for field in ("train_x", "train_y", "test_x", "test_y"):
            np.testing.assert_array_equal(getattr(ca, field), getattr(cb, field))
    assert a.info == b.info


# ---------------------------------------------------------------- iid


def test_iid_digits_sizes_and_types(digits: Dataset) -> None:
    fed = build_federation(digits, {"kind": "iid", "clients": 10}, seed=0)
    assert fed.num_clients == 10 and fed.n_classes == 10 and fed.input_shape == (1, 8, 8)
    np.testing.assert_array_equal(fed.true_clusters, np.zeros(10))
    assert fed.true_clusters.dtype == np.int64
    np.testing.assert_array_equal(fed.train_sizes(), np.full(10, len(digits.train_y) // 10))
    for c in fed.clients:
        assert len(c.test_y) == len(digits.test_y) // 10
        assert c.train_x.dtype == np.float32 and c.train_x.shape[1:] == (1, 8, 8)
        assert c.train_y.dtype == np.int64
        assert 0.0 <= c.train_x.min() and c.train_x.max() <= 1.0
        assert c.train_x.max() > 200 / 255
    # Between them, the clients hold no sample twice: as a multiset of (image, label) rows,
    # the clients' data never holds a row more often than the source does.
    for split in ("train", "test"):
        source = Counter(row_keys(getattr(digits, f"{split}_x").astype(np.float32) / 255.0,
                                  getattr(digits, f"{split}_y")))
        held = Counter(k for c in fed.clients
                       for k in row_keys(getattr(c, f"{split}_x"), getattr(c, f"{split}_y")))
        assert sum(held.values()) == 10 * (len(getattr(digits, f"{split}_y")) // 10)
        assert all(n <= source[k] for k, n in held.items())


def test_iid_disjoint_indices_and_labels_kept() -> None:
    ds = index_dataset()
    fed = build_federation(ds, {"kind": "iid", "clients": 7}, seed=5)
    for split in ("train", "test"):
        seen: set[int] = set()
        n = len(getattr(ds, f"{split}_y"))
        for c in fed.clients:
            x, y = getattr(c, f"{split}_x"), getattr(c, f"{split}_y")
            assert len(y) == n // 7
            marker = np.rint(x[:, 0, 1, 0] * 255)
            assert (marker == (1 if split == "train" else 2)).all()
            idx = decode_index(x)
            assert idx.min() >= 0 and idx.max() < n
            np.testing.assert_array_equal(y, idx % 10)  # labels travel with their images
            assert len(set(idx.tolist())) == len(idx)
            assert seen.isdisjoint(idx.tolist())
            seen.update(idx.tolist())
        assert len(seen) == 7 * (n // 7)
    # The split is random, not the first block of indices.
    assert sorted(decode_index(fed.clients[0].train_x)) != list(range(400 // 7))


def test_iid_samples_per_client(digits: Dataset) -> None:
    fed = build_federation(digits, {"kind": "iid", "clients": 6, "samples_per_client": 25,
                                    "test_samples_per_client": 4}, seed=1)
    np.testing.assert_array_equal(fed.train_sizes(), np.full(6, 25))
    assert [len(c.test_y) for c in fed.clients] == [4] * 6


def test_iid_too_many_samples(digits: Dataset) -> None:
    n = len(digits.train_y)
    with pytest.raises(ConfigError, match=rf"cannot give 10 clients 200 train.*{n}"):
        build_federation(digits, {"kind": "iid", "clients": 10, "samples_per_client": 200}, 0)
    with pytest.raises(ConfigError, match="test"):
        build_federation(digits, {"kind": "iid", "clients": 10,
                                  "test_samples_per_client": 100}, 0)
    with pytest.raises(ConfigError):
        build_federation(digits, {"kind": "iid", "clients": 3, "samples_per_client": 0}, 0)
    with pytest.raises(ConfigError):  # more clients than test samples
        build_federation(digits, {"kind": "iid", "clients": 500}, 0)


def test_iid_ignores_clusters_with_warning(digits: Dataset,
                                           caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        fed = build_federation(digits, {"kind": "iid", "clients": 6, "clusters": 3}, 0)
    np.testing.assert_array_equal(fed.true_clusters, np.zeros(6))
    assert "single true cluster" in caplog.text


# ---------------------------------------------------------------- label_swap


def test_label_swap_four_clusters() -> None:
    ds = label_dataset()
    fed = build_federation(ds, {"kind": "label_swap", "clients": 20, "clusters": 4}, seed=3)
    np.testing.assert_array_equal(fed.true_clusters, np.repeat(np.arange(4), 5))
    pairs = fed.info["pairs"]
    assert len(pairs) == 4 and all(len(p) == 2 for p in pairs)
    flat = [v for p in pairs for v in p]
    assert len(set(flat)) == 8 and all(0 <= v < 10 for v in flat)
    changed_per_cluster = np.zeros(4, dtype=int)
    for i, c in enumerate(fed.clients):
        pair = pairs[fed.true_clusters[i]]
        for x, y in ((c.train_x, c.train_y), (c.test_x, c.test_y)):
            orig = original_label(x)
            np.testing.assert_array_equal(y, swapped(orig, pair))
            changed_per_cluster[fed.true_clusters[i]] += int((y != orig).sum())
            # Labels outside the own pair are never changed.
            outside = ~np.isin(orig, pair)
            np.testing.assert_array_equal(y[outside], orig[outside])
    assert (changed_per_cluster > 0).all()


def test_label_swap_explicit_pairs() -> None:
    ds = label_dataset()
    fed = build_federation(ds, {"kind": "label_swap", "clients": 6, "clusters": 2,
                                "pairs": [[1, 7], [3, 5]]}, seed=0)
    assert fed.info["pairs"] == [[1, 7], [3, 5]]
    np.testing.assert_array_equal(fed.true_clusters, [0, 0, 0, 1, 1, 1])
    for i, c in enumerate(fed.clients):
        pair = [1, 7] if i < 3 else [3, 5]
        for x, y in ((c.train_x, c.train_y), (c.test_x, c.test_y)):
            np.testing.assert_array_equal(y, swapped(original_label(x), pair))
    all_train = np.concatenate([c.train_y for c in fed.clients[:3]])
    all_orig = np.concatenate([original_label(c.train_x) for c in fed.clients[:3]])
    assert ((all_orig == 1) & (all_train == 7)).any() and ((all_orig == 7) & (all_train == 1)).any()


def test_label_swap_too_many_clusters(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match=r"12 distinct labels.*10"):
        build_federation(digits, {"kind": "label_swap", "clients": 10, "clusters": 6}, 0)


@pytest.mark.parametrize("pairs", [
    [[1, 2], [2, 3]],   # overlapping
    [[4, 4], [1, 2]],   # a label paired with itself
    [[1, 10], [2, 3]],  # out of range
    [[-1, 2], [5, 3]],  # negative
])
def test_label_swap_bad_pairs(digits: Dataset, pairs: list[list[int]]) -> None:
    with pytest.raises(ConfigError, match="disjoint labels in 0..9"):
        build_federation(digits, {"kind": "label_swap", "clients": 4, "clusters": 2,
                                  "pairs": pairs}, 0)


def test_label_swap_wrong_number_of_pairs(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match="1 pairs for 2 clusters"):
        build_federation(digits, {"kind": "label_swap", "clients": 4, "clusters": 2,
                                  "pairs": [[1, 2]]}, 0)


# ---------------------------------------------------------------- rotation


def test_rotation_default_angles_exact() -> None:
    ds = corner_dataset()
    fed = build_federation(ds, {"kind": "rotation", "clients": 8, "clusters": 4}, seed=2)
    assert fed.info["angles"] == [0.0, 90.0, 180.0, 270.0]
    np.testing.assert_array_equal(fed.true_clusters, np.repeat(np.arange(4), 2))
    base = ds.train_x[0, 0]
    # Counter-clockwise: the top-left corner goes to the bottom-left after 90 degrees.
    corners = {0: (0, 0), 1: (5, 0), 2: (5, 5), 3: (0, 5)}
    for i, c in enumerate(fed.clients):
        k = int(fed.true_clusters[i])
        expected = np.rot90(base, k).astype(np.float32) / 255.0
        for x in (c.train_x, c.test_x):
            assert len(x) > 0
            for img in x:
                np.testing.assert_array_equal(img[0], expected)
                assert img[0][corners[k]] == 1.0 and img[0].sum() == 1.0


def test_rotate_transform_directions() -> None:
    img = np.zeros((2, 1, 9, 9), dtype=np.uint8)
    img[:, 0, 1, 6:8] = 200
    img[:, 0, 1:4, 7] = 200
    for k in range(-3, 5):
        np.testing.assert_array_equal(Rotate(90.0 * k).apply_x(img),
                                      np.rot90(img, k % 4, axes=(-2, -1)))
    np.testing.assert_array_equal(Rotate(0).apply_x(img), img)
    labels = np.arange(5)
    np.testing.assert_array_equal(Rotate(33).apply_y(labels), labels)


def smooth_blob(size: int = 21) -> np.ndarray:
    """An off-centre Gaussian blob, (1, 1, size, size) uint8."""
    r, c = np.mgrid[0:size, 0:size]
    blob = 250 * np.exp(-((r - 6.0) ** 2 + (c - 13.0) ** 2) / (2 * 2.0 ** 2))
    return np.rint(blob).astype(np.uint8)[None, None]


def centre_of_mass(img: np.ndarray) -> np.ndarray:
    img = img.astype(np.float64)
    r, c = np.mgrid[0:img.shape[0], 0:img.shape[1]]
    return np.array([(r * img).sum(), (c * img).sum()]) / img.sum()


def test_rotate_generic_path_agrees_with_rot90() -> None:
    blob = smooth_blob()
    exact = Rotate(90.0).apply_x(blob)
    np.testing.assert_array_equal(exact, np.rot90(blob, 1, axes=(-2, -1)))
    # Just off 90 degrees forces scipy's interpolating path; it must turn the same way.
    generic = Rotate(90.0 + 1e-6).apply_x(blob)
    assert generic.dtype == np.uint8 and generic.shape == blob.shape
    assert np.abs(generic.astype(int) - exact.astype(int)).max() <= 1
    # Two 45-degree turns approximate one 90-degree turn.
    twice = Rotate(45).apply_x(Rotate(45).apply_x(blob))
    assert np.abs(twice.astype(int) - exact.astype(int)).max() < 40
    np.testing.assert_allclose(centre_of_mass(twice[0, 0]), centre_of_mass(exact[0, 0]),
                               atol=0.5)
    # 45 degrees counter-clockwise moves the blob at (6, 13) towards the top-left quarter.
    half = centre_of_mass(Rotate(45).apply_x(blob)[0, 0])
    centre = 10.0
    angle = np.degrees(np.arctan2(-(half[0] - centre), half[1] - centre))
    start = np.degrees(np.arctan2(-(6.0 - centre), 13.0 - centre))
    assert abs(angle - (start + 45)) < 3


def test_rotation_generic_angle_in_federation(digits: Dataset) -> None:
    fed = build_federation(digits, {"kind": "rotation", "clients": 4, "clusters": 2,
                                    "angles": [0, 45], "samples_per_client": 20,
                                    "test_samples_per_client": 5}, seed=0)
    assert fed.info["angles"] == [0.0, 45.0]
    unrotated = {c.train_x[j].tobytes() for c in fed.clients[:2] for j in range(20)}
    for c in fed.clients:
        assert c.train_x.dtype == np.float32 and c.train_x.shape == (20, 1, 8, 8)
        assert 0.0 <= c.train_x.min() and c.train_x.max() <= 1.0
    # Cluster 0 holds original digits images; cluster 1's are turned versions.
    pixels = {img.tobytes() for img in digits.train_x.astype(np.float32) / 255.0}
    assert unrotated <= pixels
    rotated = [img.tobytes() for c in fed.clients[2:] for img in c.train_x]
    assert sum(r in pixels for r in rotated) < len(rotated) // 2


def test_rotation_angles_count_mismatch(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match="3 angles for 2 clusters"):
        build_federation(digits, {"kind": "rotation", "clients": 4, "clusters": 2,
                                  "angles": [0, 90, 180]}, 0)


def test_rotation_shared_split_is_disjoint() -> None:
    ds = index_dataset()
    fed = build_federation(ds, {"kind": "rotation", "clients": 8, "clusters": 4,
                                "angles": [0, 0, 0, 0]}, seed=4)
    idx = np.concatenate([decode_index(c.train_x) for c in fed.clients])
    assert len(idx) == len(set(idx.tolist())) == 8 * (400 // 8)


@pytest.mark.parametrize("split", ["train", "test"])
def test_rotation_replicate(split: str) -> None:
    ds = index_dataset()
    fed = build_federation(ds, {"kind": "rotation", "clients": 8, "clusters": 4,
                                "replicate": True}, seed=4)
    n = len(getattr(ds, f"{split}_y"))
    by_cluster: dict[int, list[set[int]]] = {}
    for i, c in enumerate(fed.clients):
        k = int(fed.true_clusters[i])
        x = getattr(c, f"{split}_x")
        # Undo the cluster's rotation before reading the encoded index.
        upright = np.rot90(x, -k, axes=(-2, -1))
        marker = np.rint(upright[:, 0, 1, 0] * 255)
        assert (marker == (1 if split == "train" else 2)).all()
        by_cluster.setdefault(k, []).append(set(decode_index(upright).tolist()))
    assert sorted(by_cluster) == [0, 1, 2, 3]
    for members in by_cluster.values():
        assert len(members) == 2
        # Same cluster: never a shared source sample; the two halves cover the data.
        assert members[0].isdisjoint(members[1])
        assert len(members[0]) == len(members[1]) == n // 2
        assert len(members[0] | members[1]) == 2 * (n // 2)
    # Different clusters: each has its own copy of the data, so they share source samples.
    assert by_cluster[0][0] & (by_cluster[1][0] | by_cluster[1][1])
    # Without replicate, the same clients would all be disjoint (checked elsewhere);
    # with it, the eight clients hold four times half the data each.
    total = sum(len(s) for m in by_cluster.values() for s in m)
    assert total == 4 * 2 * (n // 2)


# ---------------------------------------------------------------- config errors


def test_more_clusters_than_clients(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match=r"clusters=5.*clients=4"):
        build_federation(digits, {"kind": "rotation", "clients": 4, "clusters": 5}, 0)


@pytest.mark.parametrize("clients", [0, -3])
def test_no_clients(digits: Dataset, clients: int) -> None:
    with pytest.raises(ConfigError, match="scenario.clients must be at least 1"):
        build_federation(digits, {"kind": "iid", "clients": clients}, 0)


def test_clients_required(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match="scenario.clients"):
        build_federation(digits, {"kind": "iid"}, 0)


def test_zero_clusters(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match="scenario.clusters must be at least 1"):
        build_federation(digits, {"kind": "label_swap", "clients": 4, "clusters": 0}, 0)


def test_unknown_kind_lists_valid_kinds(digits: Dataset) -> None:
    with pytest.raises(ConfigError) as info:
        build_federation(digits, {"kind": "gaussian_blobs", "clients": 4}, 0)
    message = str(info.value)
    assert "gaussian_blobs" in message
    for kind in ("iid", "label_swap", "rotation"):
        assert kind in SCENARIOS and kind in message


@pytest.mark.parametrize("kind,key", [
    ("iid", "pairs"), ("rotation", "pairs"), ("label_swap", "angles"), ("iid", "assign"),
    ("iid", "rng"), ("rotation", "dataset"), ("label_swap", "alpha"),
])
def test_unknown_scenario_key(digits: Dataset, kind: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"scenario\.{key}\b"):
        build_federation(digits, {"kind": kind, "clients": 4, key: 1}, 0)


def test_scenario_dict_not_mutated(digits: Dataset) -> None:
    scenario = {"kind": "rotation", "clients": 4, "clusters": 2, "angles": [0, 180]}
    build_federation(digits, scenario, 0)
    assert scenario == {"kind": "rotation", "clients": 4, "clusters": 2, "angles": [0, 180]}


# ---------------------------------------------------------------- seeds


@pytest.mark.parametrize("scenario", [
    {"kind": "iid", "clients": 5},
    {"kind": "label_swap", "clients": 8, "clusters": 4},
    {"kind": "rotation", "clients": 6, "clusters": 3, "replicate": True},
])
def test_same_seed_same_federation(digits: Dataset, scenario: dict) -> None:
    assert_same_federation(build_federation(digits, scenario, 42),
                           build_federation(digits, scenario, 42))


def test_different_seed_different_split() -> None:
    ds = index_dataset()
    scenario = {"kind": "iid", "clients": 4}
    a = build_federation(ds, scenario, 1)
    b = build_federation(ds, scenario, 2)
    assert set(decode_index(a.clients[0].train_x)) != set(decode_index(b.clients[0].train_x))
    digits = label_dataset()
    swaps = {tuple(map(tuple, build_federation(
        digits, {"kind": "label_swap", "clients": 4, "clusters": 2}, s).info["pairs"]))
        for s in range(6)}
    assert len(swaps) > 1

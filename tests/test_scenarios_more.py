"""Every scenario: true clusters, label sets, transforms, test rules, seeds and bad options."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import numpy as np
import pytest

from clusterfed.data import SCENARIOS, Dataset, Federation, build_federation, load_dataset
from clusterfed.data import partition as part
from clusterfed.data.transforms import Invert, LabelMap, Rotate
from clusterfed.errors import ConfigError

pytestmark = pytest.mark.fast

# ---------------------------------------------------------------- synthetic data


def tagged(n_train: int = 1200, n_test: int = 400, n_classes: int = 10, n_groups: int = 0,
           seed: int = 0, balanced: bool = False, meta: dict | None = None) -> Dataset:
    """4x4 images that carry their own index, split (1 train, 2 test) and original label."""
    rng = np.random.default_rng(seed)

    def make(n: int, split: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        y = (np.arange(n) % n_classes if balanced else rng.integers(0, n_classes, n)).astype(
            np.int64)
        i = np.arange(n)
        x = np.zeros((n, 1, 4, 4), dtype=np.uint8)
        x[:, 0, 0, 0] = i // 256
        x[:, 0, 0, 1] = i % 256
        x[:, 0, 1, 0] = split
        x[:, 0, 1, 1] = y * 20
        g = rng.integers(0, n_groups, n).astype(np.int64) if n_groups else None
        return x, y, g

    tx, ty, tg = make(n_train, 1)
    vx, vy, vg = make(n_test, 2)
    return Dataset("tagged", tx, ty, vx, vy, n_classes, tg, vg, dict(meta or {}))


def decode(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(index, split marker, original label) from float images `tagged` made."""
    pix = np.rint(x * 255).astype(np.int64)
    return pix[:, 0, 0, 0] * 256 + pix[:, 0, 0, 1], pix[:, 0, 1, 0], pix[:, 0, 1, 1] // 20


def identity_x(_: int, x: np.ndarray) -> np.ndarray:
    return x


def same_labels(_: int, y: np.ndarray) -> np.ndarray:
    return y


def indices(fed: Federation, split: str, undo: Callable = identity_x) -> list[np.ndarray]:
    out = []
    for i, c in enumerate(fed.clients):
        out.append(decode(undo(int(fed.true_clusters[i]), getattr(c, f"{split}_x")))[0])
    return out


def check_rules(fed: Federation, ds: Dataset, undo: Callable = identity_x,
                relabel: Callable = same_labels) -> None:
    """Train and test come from their own split, hold the images they claim, and both get
    the client's cluster transform (`undo` inverts the image one, `relabel` is the label one)."""
    for i, c in enumerate(fed.clients):
        k = int(fed.true_clusters[i])
        for split, marker in (("train", 1), ("test", 2)):
            x, y = getattr(c, f"{split}_x"), getattr(c, f"{split}_y")
            idx, mark, orig = decode(undo(k, x))
            assert (mark == marker).all(), (i, split)
            np.testing.assert_array_equal(orig, getattr(ds, f"{split}_y")[idx])
            np.testing.assert_array_equal(y, relabel(k, orig))


def assert_disjoint(parts: list[np.ndarray]) -> np.ndarray:
    allidx = np.concatenate(parts)
    assert len(allidx) == len(set(allidx.tolist()))
    return allidx


def label_sets(fed: Federation, split: str = "train") -> list[set[int]]:
    return [set(getattr(c, f"{split}_y").tolist()) for c in fed.clients]


def assert_same_federation(a: Federation, b: Federation) -> None:
    np.testing.assert_array_equal(a.true_clusters, b.true_clusters)
    for ca, cb in zip(a.clients, b.clients, strict=True):
        for name in ("train_x", "train_y", "test_x", "test_y"):
            np.testing.assert_array_equal(getattr(ca, name), getattr(cb, name))
    assert a.info == b.info


@pytest.fixture(scope="module")
def ds() -> Dataset:
    return tagged()


# ---------------------------------------------------------------- partition maths


def test_split_sizes_by_hand() -> None:
    np.testing.assert_array_equal(part.split_sizes(10, [1, 1, 1]), [4, 3, 3])
    np.testing.assert_array_equal(part.split_sizes(10, [0, 1, 1]), [0, 5, 5])
    np.testing.assert_array_equal(part.split_sizes(7, [1, 2, 4]), [1, 2, 4])
    np.testing.assert_array_equal(part.split_sizes(10, [1, 0, 0], minimum=2), [6, 2, 2])
    assert part.split_sizes(0, []).tolist() == []
    with pytest.raises(ConfigError, match="at least 3"):
        part.split_sizes(5, [1, 1], minimum=3)


def test_take_by_counts_disjoint_and_exact() -> None:
    labels = np.array([0, 1, 0, 1, 2, 2, 0])
    counts = np.array([[2, 0, 1], [1, 2, 0]])
    got = part.take_by_counts(labels, counts, np.array([0, 1, 2]), np.random.default_rng(0))
    assert [np.bincount(labels[g], minlength=3).tolist() for g in got] == [[2, 0, 1], [1, 2, 0]]
    assert_disjoint(got)
    with pytest.raises(ConfigError, match=r"label 2: the clients need 3, the data have 2"):
        part.take_by_counts(labels, np.array([[0, 0, 3]]), np.array([0, 1, 2]),
                            np.random.default_rng(0))


def test_random_label_sets_niid_bench_rule() -> None:
    classes = np.arange(5) * 2  # labels need not be 0..K-1
    sets = part.random_label_sets(12, classes, 3, np.random.default_rng(1))
    for i, s in enumerate(sets):
        assert len(set(s.tolist())) == 3 and set(s.tolist()) <= set(classes.tolist())
        assert classes[i % 5] in s


def test_window_and_cyclic_label_sets() -> None:
    order = np.array([5, 2, 9, 0, 1, 7, 3, 4, 6, 8])
    assert [s.tolist() for s in part.window_label_sets(order, 3, 3, 0)] == [
        [2, 5, 9], [0, 1, 7], [3, 4, 6]]
    assert [s.tolist() for s in part.window_label_sets(order, 3, 4, 1)] == [
        [0, 2, 5, 9], [0, 1, 3, 7], [3, 4, 6, 8]]
    with pytest.raises(ConfigError, match="need 13 labels"):
        part.window_label_sets(order, 3, 5, 1)
    assert [s.tolist() for s in part.cyclic_label_sets([0, 8, 9], np.arange(10), 3)] == [
        [0, 1, 2], [8, 9, 0], [9, 0, 1]]


def test_matched_test_counts_by_hand() -> None:
    train = np.array([[30, 10, 0], [10, 0, 0]])
    np.testing.assert_array_equal(part.matched_test_counts(train, np.array([8, 5, 9])),
                                  [[6, 5, 0], [2, 0, 0]])
    np.testing.assert_array_equal(part.matched_test_counts(train, np.array([8, 5, 9]), 4),
                                  [[3, 1, 0], [4, 0, 0]])


def test_dirichlet_counts_cover_every_sample() -> None:
    sizes = np.array([50, 70, 40])
    counts, draws = part.dirichlet_counts(sizes, 6, 0.5, np.random.default_rng(2), min_size=5)
    np.testing.assert_array_equal(counts.sum(axis=0), sizes)
    assert counts.sum(axis=1).min() >= 5 and draws >= 1
    with pytest.raises(ConfigError, match="needs 200 samples; the data have 160"):
        part.dirichlet_counts(sizes, 20, 0.5, np.random.default_rng(2), min_size=10)


def test_a_draw_no_rejection_satisfies_is_topped_up() -> None:
    """A client whose quantity-skew share is 2 samples of 400 rarely reaches 10 by the draw
    (the realistic tier's MNIST seed 5): after max_tries the last draw is topped up."""
    sizes = np.array([100, 100, 100, 100])
    weights = np.array([1.0, 40.0, 40.0, 40.0, 40.0, 40.0, 40.0, 40.0, 40.0, 40.0]) / 361
    counts, draws = part.dirichlet_counts(sizes, 10, 0.1, np.random.default_rng(0), min_size=10,
                                          weights=weights, max_tries=3)
    assert draws == 4
    np.testing.assert_array_equal(counts.sum(axis=0), sizes)
    assert counts.sum(axis=1).min() == 10
    # By hand: the poorest takes one of the richest client's most plentiful class.
    np.testing.assert_array_equal(part.top_up(np.array([[0, 1], [5, 2]]), 2),
                                  [[1, 1], [4, 2]])


def test_a_draw_rejection_satisfies_is_the_rejections() -> None:
    """Topping up never touches a draw NIID-Bench's rule accepts: the same counts as the
    rejection alone (max_tries large), whatever max_tries."""
    sizes = np.array([50, 70, 40])
    first, draws = part.dirichlet_counts(sizes, 6, 0.5, np.random.default_rng(7), min_size=5)
    again, _ = part.dirichlet_counts(sizes, 6, 0.5, np.random.default_rng(7), min_size=5,
                                     max_tries=draws)
    np.testing.assert_array_equal(first, again)


# ---------------------------------------------------------------- label_skew


def test_label_skew_niid_bench(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_skew", "clients": 20, "labels_per_client": 2}, 0)
    np.testing.assert_array_equal(fed.true_clusters, np.zeros(20))
    sets = fed.info["label_sets"]
    assert fed.info["labels_per_client"] == 2
    for i, (s, held) in enumerate(zip(sets, label_sets(fed), strict=True)):
        assert len(s) == 2 and i % 10 in s and held <= set(s)
    train = assert_disjoint(indices(fed, "train"))
    # Every label is owned, so every sample is handed out; owners get equal splits.
    assert len(train) == len(ds.train_y)
    for c in range(10):
        shares = [int((cl.train_y == c).sum()) for cl, s in zip(fed.clients, sets, strict=True)
                  if c in s]
        assert max(shares) - min(shares) <= 1
    check_rules(fed, ds)


def test_label_skew_test_split_follows_training_labels(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_skew", "clients": 10, "labels_per_client": 3}, 4)
    assert_disjoint(indices(fed, "test"))
    train_hist = np.stack([np.bincount(c.train_y, minlength=10) for c in fed.clients])
    test_hist = np.stack([np.bincount(c.test_y, minlength=10) for c in fed.clients])
    for c in range(10):
        if train_hist[:, c].sum():
            expected = (ds.test_y == c).sum() * train_hist[:, c] / train_hist[:, c].sum()
            assert np.abs(test_hist[:, c] - expected).max() < 1
    assert all(t <= s for t, s in zip(label_sets(fed, "test"), label_sets(fed), strict=True))


def test_label_skew_fraction_and_pacfl_test_by_labels(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_skew", "clients": 10, "label_fraction": 0.3,
                                "test": "by_labels"}, 1)
    assert fed.info["labels_per_client"] == 3 and fed.info["test"] == "by_labels"
    for held, idx in zip(label_sets(fed), indices(fed, "test"), strict=True):
        assert len(held) == 3
        expected = np.flatnonzero(np.isin(ds.test_y, sorted(held)))
        np.testing.assert_array_equal(np.sort(idx), expected)
    check_rules(fed, ds)


def test_label_skew_samples_per_client_even_over_labels(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_skew", "clients": 8, "labels_per_client": 2,
                                "samples_per_client": 10, "test_samples_per_client": 4}, 2)
    for c in fed.clients:
        assert sorted(np.bincount(c.train_y).tolist()).count(5) == 2 and len(c.train_y) == 10
        assert len(c.test_y) == 4 and set(c.test_y.tolist()) <= set(c.train_y.tolist())
    assert_disjoint(indices(fed, "train"))
    assert_disjoint(indices(fed, "test"))


@pytest.mark.parametrize("options,message", [
    ({"labels_per_client": 11}, "labels_per_client=11 is more than the 10 labels"),
    ({"labels_per_client": 0}, "labels_per_client must be a whole number >= 1"),
    ({"label_fraction": 20}, r"fraction in \(0, 1\] \(0.2 for PACFL's 20 %\)"),
    ({"label_fraction": 0.0}, "fraction in"),
    ({}, "exactly one of labels_per_client"),
    ({"labels_per_client": 2, "label_fraction": 0.2}, "exactly one of labels_per_client"),
])
def test_label_skew_bad_options(ds: Dataset, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(ds, {"kind": "label_skew", "clients": 4, **options}, 0)


def test_label_skew_more_samples_than_a_label_has(ds: Dataset) -> None:
    with pytest.raises(ConfigError, match="not enough train samples of label"):
        build_federation(ds, {"kind": "label_skew", "clients": 20, "labels_per_client": 1,
                              "samples_per_client": 60}, 0)


# ---------------------------------------------------------------- label_groups


def test_label_groups_disjoint(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_groups", "clients": 12, "clusters": 4}, 3)
    np.testing.assert_array_equal(fed.true_clusters, np.repeat(np.arange(4), 3))
    groups = [set(g) for g in fed.info["group_labels"]]
    assert all(len(g) == 2 for g in groups)
    assert len(set().union(*groups)) == 8  # disjoint
    for i, held in enumerate(label_sets(fed)):
        assert held == groups[fed.true_clusters[i]]
        assert set(fed.clients[i].test_y.tolist()) <= held
    assert_disjoint(indices(fed, "train"))
    assert_disjoint(indices(fed, "test"))
    check_rules(fed, ds)


def test_label_groups_overlap_and_explicit(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_groups", "clients": 6, "clusters": 3,
                                "labels_per_group": 4, "overlap": 2}, 0)
    g = [set(v) for v in fed.info["group_labels"]]
    assert len(g[0] & g[1]) == 2 and len(g[1] & g[2]) == 2 and all(len(v) == 4 for v in g)
    assert_disjoint(indices(fed, "train"))
    fed = build_federation(ds, {"kind": "label_groups", "clients": 4, "clusters": 2,
                                "group_labels": [[1, 2, 3], [3, 4]]}, 0)
    assert [set(v) for v in label_sets(fed)] == [{1, 2, 3}] * 2 + [{3, 4}] * 2


@pytest.mark.parametrize("options,message", [
    ({"labels_per_group": 4}, "3 groups of 4 labels overlapping by 0 need 12 labels"),
    ({"overlap": 3, "labels_per_group": 3}, "overlap in 0..2"),
    ({"group_labels": [[1], [2]]}, "2 groups for 3 clusters"),
    ({"group_labels": [[1], [2], [2, 2]]}, "distinct labels"),
    ({"group_labels": [[1], [2], [3]], "overlap": 1}, "leave out labels_per_group and overlap"),
])
def test_label_groups_bad_options(ds: Dataset, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(ds, {"kind": "label_groups", "clients": 6, "clusters": 3, **options}, 0)


# ---------------------------------------------------------------- dirichlet


def max_share(fed: Federation) -> float:
    return float(np.mean([np.bincount(c.train_y, minlength=10).max() / len(c.train_y)
                          for c in fed.clients]))


def test_dirichlet_alpha_controls_concentration() -> None:
    big = tagged(n_train=6000, n_test=600)
    small = build_federation(big, {"kind": "dirichlet", "clients": 20, "alpha": 0.05}, 0)
    large = build_federation(big, {"kind": "dirichlet", "clients": 20, "alpha": 100.0}, 0)
    # Small alpha: most of a client's data is one label. Large alpha: close to 1/10 each.
    assert max_share(small) > 0.6
    assert max_share(large) < 0.2
    held = [np.mean([(np.bincount(c.train_y, minlength=10) >= 0.05 * len(c.train_y)).sum()
                     for c in f.clients]) for f in (small, large)]
    assert held[0] < 4 and held[1] == 10


def test_dirichlet_partition_rules(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "dirichlet", "clients": 10, "alpha": 0.3,
                                "min_size": 30}, 5)
    assert fed.info["alpha"] == 0.3 and fed.info["min_size"] == 30
    assert fed.info["dirichlet_draws"][0] >= 1
    assert fed.train_sizes().min() >= 30
    train = assert_disjoint(indices(fed, "train"))
    assert len(train) == len(ds.train_y)  # NIID-Bench hands out every sample
    assert_disjoint(indices(fed, "test"))
    assert all(t <= s for t, s in zip(label_sets(fed, "test"), label_sets(fed), strict=True))
    check_rules(fed, ds)


def test_dirichlet_retries_until_min_size() -> None:
    data = tagged(n_train=600, n_test=100)
    draws = [build_federation(data, {"kind": "dirichlet", "clients": 10, "alpha": 0.1,
                                     "min_size": 40}, s).info["dirichlet_draws"][0]
             for s in range(6)]
    assert max(draws) > 1  # the rule was exercised, not just satisfied by luck


def test_dirichlet_samples_per_client_is_the_pool(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "dirichlet", "clients": 5, "alpha": 1.0,
                                "samples_per_client": 40, "min_size": 5}, 0)
    assert fed.train_sizes().sum() == 200 and fed.train_sizes().min() >= 5


@pytest.mark.parametrize("options,message", [
    ({}, "needs alpha > 0"),
    ({"alpha": 0}, "alpha must be a number > 0, got 0"),
    ({"alpha": -0.5}, "alpha must be a number > 0"),
    ({"alpha": 0.5, "min_size": 200}, "min_size=200 for 10 clients needs 2000 samples"),
])
def test_dirichlet_bad_options(ds: Dataset, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(ds, {"kind": "dirichlet", "clients": 10, **options}, 0)


# ---------------------------------------------------------------- shards


def test_shards_mcmahan() -> None:
    data = tagged(n_train=400, n_test=200, balanced=True)
    fed = build_federation(data, {"kind": "shards", "clients": 10}, 1)
    np.testing.assert_array_equal(fed.true_clusters, np.zeros(10))
    assert fed.info["shards_per_client"] == 2 and fed.info["shard_size"] == 20
    np.testing.assert_array_equal(fed.train_sizes(), np.full(10, 40))
    assert len(assert_disjoint(indices(fed, "train"))) == 400
    # 40 samples per label = exactly 2 shards: a client holds 1 or 2 labels, 20 or 40 of each.
    for c in fed.clients:
        counts = np.bincount(c.train_y)
        assert set(counts[counts > 0].tolist()) <= {20, 40}
    assert fed.info["label_sets"] == [sorted(s) for s in label_sets(fed)]
    assert all(t <= s for t, s in zip(label_sets(fed, "test"), label_sets(fed), strict=True))
    assert_disjoint(indices(fed, "test"))
    check_rules(fed, data)


def test_shards_uneven_and_options(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "shards", "clients": 7, "shards_per_client": 3}, 0)
    size = 1200 // 21
    assert fed.info["shard_size"] == size
    np.testing.assert_array_equal(fed.train_sizes(), np.full(7, 3 * size))
    assert max(len(s) for s in label_sets(fed)) <= 6
    with pytest.raises(ConfigError, match="shards_per_client must be a whole number >= 1"):
        build_federation(ds, {"kind": "shards", "clients": 4, "shards_per_client": 0}, 0)
    with pytest.raises(ConfigError, match="cannot cut 1200 samples into 700 clients x 2"):
        build_federation(ds, {"kind": "shards", "clients": 700}, 0)


# ---------------------------------------------------------------- label_swap and label_permutation


def test_label_swap_with_dirichlet_inside(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_swap", "clients": 8, "clusters": 2,
                                "labels": {"kind": "dirichlet", "alpha": 0.2}}, 0)
    pairs = fed.info["pairs"]
    assert fed.info["labels"] == {"kind": "dirichlet", "alpha": 0.2}

    def swap(k: int, y: np.ndarray) -> np.ndarray:
        a, b = pairs[k]
        return np.where(y == a, b, np.where(y == b, a, y))

    check_rules(fed, ds, relabel=swap)
    assert max_share(fed) > 0.4  # the Dirichlet skew is there


def test_label_permutation_per_cluster(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "label_permutation", "clients": 12, "clusters": 4}, 7)
    perms = fed.info["permutations"]
    assert len(perms) == 4 and all(sorted(p) == list(range(10)) for p in perms)
    assert len({tuple(p) for p in perms}) == 4
    np.testing.assert_array_equal(fed.true_clusters, np.repeat(np.arange(4), 3))
    check_rules(fed, ds, relabel=lambda k, y: np.asarray(perms[k])[y])
    assert_disjoint(indices(fed, "train"))


def test_label_permutation_cfl_whole_test_set(ds: Dataset) -> None:
    perms = [[1, 0, 2, 3, 4, 5, 6, 7, 8, 9], list(range(9, -1, -1))]
    fed = build_federation(ds, {"kind": "label_permutation", "clients": 4, "clusters": 2,
                                "permutations": perms, "test": "all"}, 0)
    assert fed.info["permutations"] == perms
    for idx in indices(fed, "test"):
        np.testing.assert_array_equal(idx, np.arange(len(ds.test_y)))
    check_rules(fed, ds, relabel=lambda k, y: np.asarray(perms[k])[y])


@pytest.mark.parametrize("perms,message", [
    ([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]], "1 permutations for 2 clusters"),
    ([list(range(10)), [0] * 10], "permutation of 0..9"),
])
def test_label_permutation_bad(ds: Dataset, perms: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(ds, {"kind": "label_permutation", "clients": 4, "clusters": 2,
                              "permutations": perms}, 0)


def test_label_map_transform() -> None:
    y = np.array([[0, 2], [1, 1]])
    np.testing.assert_array_equal(LabelMap((2, 0, 1)).apply_y(y), [[2, 1], [0, 0]])
    # A text loader's ignore index (negative) is not a label and stays as it is.
    np.testing.assert_array_equal(LabelMap((2, 0, 1)).apply_y(np.array([1, -100])), [0, -100])
    x = np.arange(4)
    assert LabelMap((2, 0, 1)).apply_x(x) is x


# ---------------------------------------------------------------- rotation and invert


def unrotate(angles: list[float]) -> Callable:
    return lambda k, x: np.rot90(x, -int(angles[k] // 90), axes=(-2, -1))


def test_rotation_with_label_skew_inside(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "rotation", "clients": 8, "clusters": 4,
                                "labels": {"kind": "label_skew", "labels_per_client": 2}}, 0)
    assert fed.info["labels"] == {"kind": "label_skew", "labels_per_client": 2}
    assert all(len(s) <= 2 for s in label_sets(fed))
    check_rules(fed, ds, undo=unrotate(fed.info["angles"]))
    assert_disjoint(indices(fed, "train", unrotate(fed.info["angles"])))


def test_rotation_replicate_with_dirichlet_and_test_all(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "rotation", "clients": 6, "clusters": 2,
                                "replicate": True, "test": "all",
                                "labels": {"kind": "dirichlet", "alpha": 0.5, "min_size": 5}}, 0)
    undo = unrotate(fed.info["angles"])
    check_rules(fed, ds, undo=undo)
    train = indices(fed, "train", undo)
    for j in range(2):
        # Each rotation's copy of the data is split among its own clients, all of it.
        members = [train[i] for i in range(6) if fed.true_clusters[i] == j]
        assert len(assert_disjoint(members)) == len(ds.train_y)
    assert len(fed.info["dirichlet_draws"]) == 2
    for idx in indices(fed, "test", undo):
        assert len(idx) == len(ds.test_y)


def test_invert_two_clusters(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "invert", "clients": 6, "clusters": 2}, 0)
    assert fed.info["inverted"] == [False, True]
    check_rules(fed, ds, undo=lambda k, x: 1.0 - x if k == 1 else x)
    # Inverted images are really different: the background is white.
    assert fed.clients[0].train_x[:, 0, 3, 3].max() == 0.0
    assert fed.clients[5].train_x[:, 0, 3, 3].min() == 1.0
    assert_disjoint(indices(fed, "train", lambda k, x: 1.0 - x if k == 1 else x))


def test_invert_alternating_and_explicit(ds: Dataset, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        fed = build_federation(ds, {"kind": "invert", "clients": 6, "clusters": 3}, 0)
    assert fed.info["inverted"] == [False, True, False] and "alternates" in caplog.text
    fed = build_federation(ds, {"kind": "invert", "clients": 4, "clusters": 2,
                                "inverted": [True, False]}, 0)
    check_rules(fed, ds, undo=lambda k, x: 1.0 - x if k == 0 else x)
    with pytest.raises(ConfigError, match="1 entries for 2 clusters"):
        build_federation(ds, {"kind": "invert", "clients": 4, "clusters": 2,
                              "inverted": [True]}, 0)


def test_invert_transform_values() -> None:
    x = np.array([[[[0, 255], [10, 200]]]], dtype=np.uint8)
    np.testing.assert_array_equal(Invert().apply_x(x), 255 - x)
    assert Invert().apply_x(x).dtype == np.uint8
    f = np.array([[[[0.0, 0.25]]]], dtype=np.float32)
    np.testing.assert_allclose(Invert().apply_x(f), [[[[1.0, 0.75]]]])
    tokens = np.arange(12).reshape(3, 4)
    assert Invert().apply_x(tokens) is tokens and Rotate(90).apply_x(tokens) is tokens


# ---------------------------------------------------------------- mix and topics


NAMES = ["usps", "cifar10", "svhn", "fmnist"]


@pytest.fixture(scope="module")
def sources() -> Dataset:
    return tagged(n_groups=4, meta={"groups": NAMES})


def test_mix_one_source_per_cluster(sources: Dataset) -> None:
    fed = build_federation(sources, {"kind": "mix", "clients": 8, "clusters": 4,
                                     "clients_per_cluster": [1, 3, 2, 2]}, 0)
    np.testing.assert_array_equal(fed.true_clusters, [0, 1, 1, 1, 2, 2, 3, 3])
    assert fed.info["groups"] == [0, 1, 2, 3] and fed.info["group_names"] == NAMES
    assert fed.info["clients_per_cluster"] == [1, 3, 2, 2]
    for split in ("train", "test"):
        groups = getattr(sources, f"{split}_groups")
        for i, idx in enumerate(indices(fed, split)):
            assert (groups[idx] == fed.true_clusters[i]).all()
        assert_disjoint(indices(fed, split))
    # A lone client takes its whole source.
    assert len(fed.clients[0].train_y) == (sources.train_groups == 0).sum()
    check_rules(fed, sources)


def test_mix_pacfl_balanced_classes_and_whole_source_test(sources: Dataset) -> None:
    fed = build_federation(sources, {"kind": "mix", "clients": 4, "clusters": 4,
                                     "samples_per_client": 20, "test": "all",
                                     "labels": {"kind": "label_skew", "label_fraction": 1.0}},
                           0)
    for i, c in enumerate(fed.clients):
        assert np.bincount(c.train_y, minlength=10).tolist() == [2] * 10
        np.testing.assert_array_equal(np.sort(indices(fed, "test")[i]),
                                      np.flatnonzero(sources.test_groups == i))


def test_mix_groups_subset(sources: Dataset) -> None:
    fed = build_federation(sources, {"kind": "mix", "clients": 4, "clusters": 2,
                                     "groups": [3, 1]}, 0)
    assert fed.info["group_names"] == ["fmnist", "cifar10"]
    for i, idx in enumerate(indices(fed, "train")):
        assert (sources.train_groups[idx] == [3, 1][fed.true_clusters[i]]).all()


@pytest.mark.parametrize("options,message", [
    ({"clusters": 2}, r"has 4 groups but scenario.clusters=2; set scenario.clusters=4"),
    ({"clusters": 2, "groups": [0, 7]}, "distinct groups of the data"),
    ({"clusters": 2, "groups": [0]}, "1 entries for 2 clusters"),
])
def test_mix_bad_options(sources: Dataset, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(sources, {"kind": "mix", "clients": 4, **options}, 0)


def test_mix_needs_groups(ds: Dataset) -> None:
    with pytest.raises(ConfigError, match="'mix' needs a dataset with per-sample groups"):
        build_federation(ds, {"kind": "mix", "clients": 4, "clusters": 2}, 0)


def token_dataset(n_train: int = 200, n_test: int = 80, topics: int = 4) -> Dataset:
    """Text: int64 token rows whose first two tokens are the index and the split."""
    rng = np.random.default_rng(5)

    def make(n: int, split: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = rng.integers(2, 50, (n, 6)).astype(np.int64)
        x[:, 0], x[:, 1] = np.arange(n), split
        return x, np.roll(x, -1, axis=1), rng.integers(0, topics, n).astype(np.int64)

    tx, ty, tg = make(n_train, 0)
    vx, vy, vg = make(n_test, 1)
    return Dataset("tokens", tx, ty, vx, vy, 300, tg, vg, {"groups": ["w", "s", "b", "t"]})


def test_topics_on_text_leaves_tokens_alone() -> None:
    data = token_dataset()
    fed = build_federation(data, {"kind": "topics", "clients": 8, "clusters": 4}, 0)
    assert fed.info["group_source"] == "groups" and fed.info["group_names"] == ["w", "s", "b", "t"]
    seen = []
    for i, c in enumerate(fed.clients):
        for split, x, y in (("train", c.train_x, c.train_y), ("test", c.test_x, c.test_y)):
            assert x.dtype == np.int64 and y.shape == x.shape
            idx = x[:, 0]
            np.testing.assert_array_equal(x, getattr(data, f"{split}_x")[idx])
            np.testing.assert_array_equal(y, getattr(data, f"{split}_y")[idx])
            assert (getattr(data, f"{split}_groups")[idx] == fed.true_clusters[i]).all()
        seen.append(c.train_x[:, 0])
    # Two clients per topic, equal shares (an odd sample out stays unused).
    per_topic = np.bincount(data.train_groups)
    assert len(assert_disjoint(seen)) == (per_topic // 2 * 2).sum()


def test_topics_falls_back_to_labels(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "topics", "clients": 6, "clusters": 3,
                                "groups": [4, 0, 7]}, 0)
    assert fed.info["group_source"] == "labels"
    for i, (train, test) in enumerate(zip(label_sets(fed), label_sets(fed, "test"),
                                          strict=True)):
        assert train == test == {[4, 0, 7][fed.true_clusters[i]]}
    check_rules(fed, ds)


def test_text_guards() -> None:
    data = token_dataset()
    with pytest.raises(ConfigError, match="'rotation' transforms images; dataset tokens"):
        build_federation(data, {"kind": "rotation", "clients": 4, "clusters": 2}, 0)
    with pytest.raises(ConfigError, match="'invert' transforms images"):
        build_federation(data, {"kind": "invert", "clients": 4, "clusters": 2}, 0)
    with pytest.raises(ConfigError, match="needs one class label per sample"):
        build_federation(data, {"kind": "label_skew", "clients": 4, "labels_per_client": 2}, 0)
    with pytest.raises(ConfigError, match="by_labels needs one class label per sample"):
        build_federation(data, {"kind": "iid", "clients": 4, "test": "by_labels"}, 0)


# ---------------------------------------------------------------- writers


def writer_dataset(meta: dict | None = None) -> Dataset:
    """30 writers: writer g has g + 1 train samples; writer 0 has no test sample."""
    base = tagged(n_train=465, n_test=58)
    train_g = np.repeat(np.arange(30), np.arange(1, 31))
    test_g = np.repeat(np.arange(1, 30), 2)
    return Dataset("writers", base.train_x, base.train_y, base.test_x, base.test_y, 10,
                   train_g, test_g, dict(meta or {}))


def test_writers_natural_clients() -> None:
    data = writer_dataset({"groups": [f"f{g:04d}" for g in range(30)]})
    fed = build_federation(data, {"kind": "writers", "clients": 10, "min_samples": 5}, 3)
    chosen = fed.info["writers"]
    assert len(set(chosen)) == 10 and chosen == sorted(chosen) and min(chosen) >= 4
    assert fed.info["writer_names"] == [f"f{g:04d}" for g in chosen]
    np.testing.assert_array_equal(fed.true_clusters, np.zeros(10))
    for g, tr, te in zip(chosen, indices(fed, "train"), indices(fed, "test"), strict=True):
        np.testing.assert_array_equal(np.sort(tr), np.flatnonzero(data.train_groups == g))
        np.testing.assert_array_equal(np.sort(te), np.flatnonzero(data.test_groups == g))
    check_rules(fed, data)
    other = build_federation(data, {"kind": "writers", "clients": 10, "min_samples": 5}, 4)
    assert other.info["writers"] != chosen


def test_writers_first_caps_and_clusters(caplog: pytest.LogCaptureFixture) -> None:
    data = writer_dataset()
    fed = build_federation(data, {"kind": "writers", "clients": 5, "select": "first",
                                  "samples_per_client": 3}, 0)
    assert fed.info["writers"] == [1, 2, 3, 4, 5]  # writer 0 has no test sample
    assert fed.train_sizes().tolist() == [2, 3, 3, 3, 3]
    data = writer_dataset({"group_clusters": [g % 3 for g in range(30)]})
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        fed = build_federation(data, {"kind": "writers", "clients": 9, "select": "first"}, 0)
    assert caplog.text == ""
    assert fed.info["writers"] == [3, 6, 9, 1, 4, 7, 2, 5, 8]
    np.testing.assert_array_equal(fed.true_clusters, np.repeat(np.arange(3), 3))


@pytest.mark.parametrize("options,message", [
    ({"clients": 27, "min_samples": 5}, "asks for 27 clients, but dataset writers has 26 groups"),
    ({"test": "by_labels"}, "scenario.test must be 'split'"),
    ({"quantity_skew": 1.0}, "quantity_skew and clients_per_cluster do not apply"),
    ({"select": "best"}, "'random' or 'first'"),
    ({"min_samples": 0}, "min_samples must be a whole number >= 1"),
])
def test_writers_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(writer_dataset(), {"kind": "writers", "clients": 4, **options}, 0)


def test_writers_need_groups(ds: Dataset) -> None:
    with pytest.raises(ConfigError, match="'writers' needs a dataset with per-sample groups"):
        build_federation(ds, {"kind": "writers", "clients": 4}, 0)


# ---------------------------------------------------------------- cyclic_classes


def test_cyclic_classes_fedprox_rule(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "cyclic_classes", "clients": 20, "clusters": 10}, 0)
    np.testing.assert_array_equal(fed.true_clusters, np.repeat(np.arange(10), 2))
    for i, (train, test) in enumerate(zip(label_sets(fed), label_sets(fed, "test"),
                                          strict=True)):
        j = int(fed.true_clusters[i])
        assert train == {j, (j + 1) % 10, (j + 2) % 10} and test <= train
    assert_disjoint(indices(fed, "train"))
    assert_disjoint(indices(fed, "test"))
    check_rules(fed, ds)


def test_cyclic_classes_subset_is_relabelled() -> None:
    data = tagged(n_classes=12)
    cycle = [2, 4, 6, 8, 10]
    fed = build_federation(data, {"kind": "cyclic_classes", "clients": 10, "clusters": 5,
                                  "classes": cycle, "classes_per_client": 2}, 0)
    assert fed.n_classes == 5 and fed.info["cycle"] == cycle
    for i, held in enumerate(label_sets(fed)):
        j = int(fed.true_clusters[i])
        assert held == {j, (j + 1) % 5}
    check_rules(fed, data, relabel=lambda k, y: np.searchsorted(cycle, y))


def test_cyclic_classes_fewer_clusters_spread_out(ds: Dataset) -> None:
    fed = build_federation(ds, {"kind": "cyclic_classes", "clients": 5, "clusters": 5}, 0)
    assert fed.info["starts"] == [0, 2, 4, 6, 8]
    assert label_sets(fed)[4] == {8, 9, 0}


@pytest.mark.parametrize("options,message", [
    ({"clusters": 11, "clients": 11}, "11 clusters needs at least 11 classes"),
    ({"classes_per_client": 11}, r"classes_per_client must be in 1..10"),
    ({"classes": [1, 1, 2]}, "distinct labels present"),
])
def test_cyclic_classes_bad_options(ds: Dataset, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(ds, {"kind": "cyclic_classes", "clients": 10, **options}, 0)


# ---------------------------------------------------------------- quantity skew


@pytest.fixture(scope="module")
def large() -> Dataset:
    return tagged(n_train=60000, n_test=6000)


def test_quantity_skew_lognormal_sizes(large: Dataset) -> None:
    fed = build_federation(large, {"kind": "iid", "clients": 300, "quantity_skew": 1.0}, 0)
    sizes = fed.train_sizes()
    assert sizes.sum() == (60000 // 300) * 300  # the same total, shared unevenly
    assert 0.85 < np.log(sizes).std() < 1.15
    assert fed.info["quantity_skew"] == {"sigma": 1.0, "min_samples": 1}
    # Test shares follow the same weights.
    tests = np.array([len(c.test_y) for c in fed.clients])
    assert np.corrcoef(np.log(sizes), np.log(tests))[0, 1] > 0.95
    assert_disjoint(indices(fed, "train"))
    narrow = build_federation(large, {"kind": "iid", "clients": 300,
                                      "quantity_skew": {"sigma": 0.3}}, 0).train_sizes()
    assert np.log(narrow).std() < 0.4


def test_quantity_skew_min_samples_and_seed(ds: Dataset) -> None:
    scenario = {"kind": "iid", "clients": 40, "quantity_skew": {"sigma": 2.5, "min_samples": 8}}
    a = build_federation(ds, scenario, 1).train_sizes()
    assert a.min() >= 8 and a.max() > 5 * a.min() and a.sum() <= len(ds.train_y)
    np.testing.assert_array_equal(a, build_federation(ds, scenario, 1).train_sizes())
    assert not np.array_equal(a, build_federation(ds, scenario, 2).train_sizes())


def test_quantity_skew_composes_without_changing_label_draws(ds: Dataset) -> None:
    base = {"kind": "label_skew", "clients": 20, "labels_per_client": 2}
    plain = build_federation(ds, base, 3)
    skewed = build_federation(ds, {**base, "quantity_skew": 1.5}, 3)
    assert plain.info["label_sets"] == skewed.info["label_sets"]
    assert np.log(skewed.train_sizes()).std() > 3 * np.log(plain.train_sizes()).std()
    shards = build_federation(ds, {"kind": "shards", "clients": 20, "quantity_skew": 1.0}, 3)
    assert shards.train_sizes().sum() == len(ds.train_y) and shards.train_sizes().std() > 10
    dirichlet = build_federation(ds, {"kind": "dirichlet", "clients": 10, "alpha": 100.0,
                                      "quantity_skew": 1.5, "min_size": 1}, 3)
    assert dirichlet.train_sizes().max() > 3 * dirichlet.train_sizes().min()


@pytest.mark.parametrize("value,message", [
    (0, "sigma must be a number > 0"),
    (-1.0, "sigma must be a number > 0"),
    ({"sigma": 1.0, "min_samples": 0}, "min_samples must be a whole number >= 1"),
    ({"spread": 1.0}, r"scenario.quantity_skew.spread"),
    ({"min_samples": 500}, "cannot split"),
])
def test_quantity_skew_bad(ds: Dataset, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(ds, {"kind": "iid", "clients": 10, "quantity_skew": value}, 0)


# ---------------------------------------------------------------- common options


@pytest.mark.parametrize("scenario,message", [
    ({"kind": "iid", "test": "global"}, "unknown scenario.test 'global'; valid: split"),
    ({"kind": "rotation", "clusters": 2, "clients_per_cluster": [3, 2]},
     r"\[3, 2\] must have scenario.clusters=2 entries summing to scenario.clients=4"),
    ({"kind": "rotation", "clusters": 2, "clients_per_cluster": [4, 0]}, "whole numbers >= 1"),
    ({"kind": "rotation", "clusters": 2, "labels": {"kind": "zipf"}},
     "unknown label partition 'zipf'; valid label partitions: dirichlet, iid"),
    ({"kind": "rotation", "clusters": 2, "labels": {"kind": "dirichlet", "beta": 1}},
     r"scenario.labels.beta"),
    ({"kind": "rotation", "clusters": 2, "labels": "dirichlet"}, "must be a mapping"),
    ({"kind": "label_swap", "clusters": 2, "labels": {"kind": "label_skew"}},
     "exactly one of labels_per_client"),
    ({"kind": "iid", "samples_per_client": 2.5}, "samples_per_client must be a whole number"),
])
def test_common_option_errors(ds: Dataset, scenario: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_federation(ds, {"clients": 4, **scenario}, 0)


def test_label_skew_ignores_clusters_with_a_hint(ds: Dataset,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        fed = build_federation(ds, {"kind": "label_skew", "clients": 6, "clusters": 3,
                                    "labels_per_client": 2}, 0)
    np.testing.assert_array_equal(fed.true_clusters, np.zeros(6))
    assert "label_groups" in caplog.text


# ---------------------------------------------------------------- every scenario


EVERY = {
    "iid": {"kind": "iid", "clients": 6},
    "label_skew": {"kind": "label_skew", "clients": 6, "labels_per_client": 2},
    "label_groups": {"kind": "label_groups", "clients": 6, "clusters": 3},
    "dirichlet": {"kind": "dirichlet", "clients": 6, "alpha": 0.5},
    "shards": {"kind": "shards", "clients": 6},
    "label_swap": {"kind": "label_swap", "clients": 6, "clusters": 2},
    "label_permutation": {"kind": "label_permutation", "clients": 6, "clusters": 2},
    "rotation": {"kind": "rotation", "clients": 6, "clusters": 3},
    "invert": {"kind": "invert", "clients": 6, "clusters": 2},
    "mix": {"kind": "mix", "clients": 8, "clusters": 4},
    "topics": {"kind": "topics", "clients": 8, "clusters": 4},
    "writers": {"kind": "writers", "clients": 6},
    "cyclic_classes": {"kind": "cyclic_classes", "clients": 10, "clusters": 5},
    "corrupted": {"kind": "corrupted", "clients": 6, "clusters": 3},
    "mixture": {"kind": "mixture", "clients": 6, "clusters": 2},
}


def data_for(kind: str, sources: Dataset, ds: Dataset) -> Dataset:
    if kind == "writers":
        return writer_dataset()
    return sources if kind in ("mix", "topics") else ds


def test_every_registered_scenario_is_covered() -> None:
    assert set(SCENARIOS) == set(EVERY)


@pytest.mark.parametrize("kind", sorted(EVERY))
def test_every_scenario_seeded_and_json_info(kind: str, sources: Dataset, ds: Dataset) -> None:
    data = data_for(kind, sources, ds)
    a = build_federation(data, EVERY[kind], 11)
    assert_same_federation(a, build_federation(data, EVERY[kind], 11))
    b = build_federation(data, EVERY[kind], 12)
    assert any(not np.array_equal(ca.train_x, cb.train_x)
               for ca, cb in zip(a.clients, b.clients, strict=True))
    assert json.loads(json.dumps(a.info)) == a.info
    if kind == "mixture":   # the dominant source: linear shares put source 1 first
        assert a.true_clusters.tolist() == [1, 1, 1, 0, 0, 0]
    else:
        assert a.true_clusters.tolist() == sorted(a.true_clusters.tolist())  # contiguous
    assert all(len(c.train_y) > 0 and len(c.test_y) > 0 for c in a.clients)


@pytest.mark.parametrize("kind", sorted(set(EVERY) - {"writers"}))
def test_every_scenario_with_quantity_skew(kind: str, sources: Dataset, ds: Dataset) -> None:
    data = data_for(kind, sources, ds)
    scenario = {**EVERY[kind], "quantity_skew": {"sigma": 1.0, "min_samples": 3}}
    if kind == "dirichlet":
        scenario["min_size"] = 3
    fed = build_federation(data, scenario, 0)
    sizes = fed.train_sizes()
    assert sizes.min() >= 3 and sizes.max() > 1.5 * sizes.min()
    assert sizes.sum() <= len(data.train_y) * (2 if kind == "rotation" else 1)


@pytest.mark.parametrize("kind", sorted(set(EVERY) - {"corrupted"}))
def test_every_scenario_takes_the_overlays(kind: str, sources: Dataset, ds: Dataset) -> None:
    """A corruption and label noise over any scenario: the same true clusters, one second
    grouping each, clean test labels, and facts that stay JSON."""
    data = data_for(kind, sources, ds)
    plain = build_federation(data, EVERY[kind], 3)
    fed = build_federation(data, {**EVERY[kind], "corruption": {"kinds": ["none", "contrast"]},
                                  "label_noise": {"rate": 0.5, "share": 1.0}}, 3)
    n = fed.num_clients
    np.testing.assert_array_equal(fed.true_clusters, plain.true_clusters)
    assert fed.groupings["corruption"].tolist() == [i % 2 for i in range(n)]
    assert fed.groupings["label_noise"].tolist() == [1] * n
    assert json.loads(json.dumps(fed.info)) == fed.info
    for f, c in zip(fed.clients, plain.clients, strict=True):
        np.testing.assert_array_equal(f.test_y, c.test_y)
        assert (f.train_y != c.train_y).mean() == pytest.approx(0.5, abs=1 / len(c.train_y))


def test_materialised_digits_values_stay_in_range() -> None:
    digits = load_dataset("digits")
    fed = build_federation(digits, {"kind": "invert", "clients": 4, "clusters": 2,
                                    "labels": {"kind": "shards"}}, 0)
    for c in fed.clients:
        assert c.train_x.dtype == np.float32 and 0 <= c.train_x.min() and c.train_x.max() <= 1


def test_mix_normalize_uses_each_sources_constants_from_the_pacfl_code() -> None:
    from clusterfed.data.transforms import AUTHORS_NORMALISATION
    names = ["usps", "cifar10", "svhn", "fashion_mnist"]
    data = tagged(n_groups=4, meta={"groups": names})
    scenario = {"kind": "mix", "clients": 4, "clusters": 4}
    plain = build_federation(data, scenario, 0)
    normed = build_federation(data, {**scenario, "normalize": True}, 0)
    for i in range(4):
        mean, std = AUTHORS_NORMALISATION[names[int(plain.true_clusters[i])]]
        shape = (1, -1) + (1,) * (plain.clients[i].train_x.ndim - 2)
        for split in ("train_x", "test_x"):
            x = getattr(plain.clients[i], split)
            expected = (x - np.reshape(mean, shape)) / np.reshape(std, shape)
            np.testing.assert_allclose(getattr(normed.clients[i], split), expected, rtol=1e-5,
                                       atol=1e-5)
    assert normed.info["normalize"]["svhn"] == AUTHORS_NORMALISATION["svhn"]
    with pytest.raises(ConfigError, match="no constants for fmnist"):
        build_federation(tagged(n_groups=4, meta={"groups": NAMES}),
                         {**scenario, "normalize": True}, 0)

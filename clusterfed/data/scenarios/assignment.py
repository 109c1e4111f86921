"""Client assignment: which samples, transform and true cluster each client gets.

`Assignment` puts clients in true clusters (contiguous blocks) and sizes their shares;
the label partitions share a pool of samples out among its clients (`fill`); a scenario's
`ScenarioPlan` lists the result per client (`plan_clients`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from clusterfed.data import partition as part
from clusterfed.data.datasets import Dataset
from clusterfed.data.transforms import (
    is_image,
)
from clusterfed.errors import ConfigError
from clusterfed.registry import Registry, accepted_keys, check_keys

log = logging.getLogger("clusterfed")


class Transform(Protocol):
    def apply_x(self, x: np.ndarray) -> np.ndarray: ...
    def apply_y(self, y: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class ClientSpec:
    """One client as a scenario describes it: which samples, which transform, which cluster.

    `train_extra` / `test_extra`, if given, apply after `transform` to the train / test data:
    the client's own additions (overlays: a corruption with its own draws for each split,
    label noise on the training labels only), not its cluster's transform.
    """

    train_idx: np.ndarray
    test_idx: np.ndarray
    transform: Transform
    cluster: int
    train_extra: Transform | None = None
    test_extra: Transform | None = None



@dataclass(frozen=True)
class ScenarioPlan:
    """Per-client specs, JSON-serialisable facts, the label count if the scenario relabels, and
    named true groupings beside the clusters (one entry per client; `Federation.groupings`)."""

    clients: list[ClientSpec]
    info: dict[str, Any] = field(default_factory=dict)
    n_classes: int | None = None
    groupings: dict[str, np.ndarray] = field(default_factory=dict)



@dataclass(frozen=True)
class Assignment:
    """Clients, true clusters (contiguous blocks of clients) and how client shares are sized.

    `weights` are the quantity-skew sizes (None: equal shares); `test` is the test-data rule.
    `membership`, where given, is every client's cluster instead of the blocks (the clients
    placed after a drift, `drift.py`).
    """

    clients: int
    clusters: int
    samples_per_client: int | None = None
    test_samples_per_client: int | None = None
    test: str = "split"
    cluster_sizes: tuple[int, ...] | None = None
    weights: np.ndarray | None = field(default=None, compare=False, repr=False)
    min_samples: int = 1
    membership: tuple[int, ...] | None = None

    def cluster_of(self, client: int) -> int:
        if self.membership is not None:
            return self.membership[client]
        if self.cluster_sizes is None:
            return client * self.clusters // self.clients
        return int(np.searchsorted(np.cumsum(self.cluster_sizes), client, side="right"))

    def members(self, cluster: int) -> list[int]:
        return [i for i in range(self.clients) if self.cluster_of(i) == cluster]

    def weights_of(self, members: Sequence[int]) -> np.ndarray | None:
        return None if self.weights is None else self.weights[list(members)]

    def sizes(self, available: int, members: Sequence[int], per_part: int | None, what: str
              ) -> np.ndarray:
        """Share sizes for `members`: `per_part` each (default: all evenly), or quantity-skewed.

        With quantity skew the total stays the same (per_part x clients) and is split in
        proportion to the clients' weights, each share at least `min_samples`.
        """
        parts = len(members)
        if per_part is None:
            per_part = available // parts
        if per_part < 1 or per_part * parts > available:
            raise ConfigError(
                f"cannot give {parts} clients {per_part} {what} samples each: "
                f"the data have {available}"
            )
        if self.weights is None:
            return np.full(parts, per_part, dtype=np.int64)
        return part.split_sizes(per_part * parts, self.weights[list(members)], self.min_samples)

    def split(self, indices: np.ndarray, members: Sequence[int], per_part: int | None, what: str
              ) -> list[np.ndarray]:
        """Cut shuffled indices into disjoint consecutive shares, one per member."""
        ends = np.cumsum(self.sizes(len(indices), members, per_part, what))
        return [indices[e - n:e] for e, n in zip(ends, np.diff(np.concatenate([[0], ends])),
                                                 strict=True)]

    def train_test(self, dataset: Dataset, rng: np.random.Generator
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Disjoint random train and test shares, one per client, drawn from the whole dataset."""
        everyone = range(self.clients)
        train = self.split(rng.permutation(len(dataset.train_y)), everyone,
                           self.samples_per_client, "train")
        test = self.split(rng.permutation(len(dataset.test_y)), everyone,
                          self.test_samples_per_client, "test")
        return train, test


# ---------------------------------------------------------------- label partitions


@dataclass(frozen=True)
class Pool:
    """Samples (dataset indices) that a set of clients share out among themselves."""

    train: np.ndarray
    test: np.ndarray
    members: list[int]


@dataclass(frozen=True)
class Split:
    """A label partition's result: positions into the pool's train samples, per member."""

    train: list[np.ndarray]
    skewed: bool  # labels differ by design: test shares then follow each client's histogram
    label_sets: list[list[int]] | None = None
    info: dict[str, Any] = field(default_factory=dict)


PartitionFn = Callable[..., Split]
LABEL_PARTITIONS: Registry[PartitionFn] = Registry("label partition")
_POSITIONAL = {"y", "classes", "members", "assign", "rng"}


def _subsample(y: np.ndarray, members: Sequence[int], assign: Assignment,
               rng: np.random.Generator) -> np.ndarray | None:
    """With samples_per_client, a random pool of clients x samples_per_client positions."""
    if assign.samples_per_client is None:
        return None
    n = assign.samples_per_client * len(members)
    if assign.samples_per_client < 1 or n > len(y):
        raise ConfigError(f"cannot give {len(members)} clients {assign.samples_per_client} "
                          f"train samples each: the data have {len(y)}")
    return rng.permutation(len(y))[:n]


def label_sets_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
                      assign: Assignment, rng: np.random.Generator,
                      sets: Sequence[np.ndarray]) -> Split:
    """Clients owning label sets: each label split among its owners, or fixed sizes per client."""
    sizes = part.class_sizes(y, classes)
    if assign.samples_per_client is None:
        counts = part.label_set_counts(sets, classes, sizes, assign.weights_of(members))
    else:
        totals = assign.sizes(len(y), members, assign.samples_per_client, "train")
        counts = part.label_set_counts(sets, classes, sizes, totals=totals)
    return Split(part.take_by_counts(y, counts, classes, rng), True,
                 [[int(c) for c in s] for s in sets])


@LABEL_PARTITIONS.register("iid")
def iid_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int], assign: Assignment,
               rng: np.random.Generator) -> Split:
    return Split(assign.split(rng.permutation(len(y)), members, assign.samples_per_client,
                              "train"), False)


@LABEL_PARTITIONS.register("label_skew")
def label_skew_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
                      assign: Assignment, rng: np.random.Generator, *,
                      labels_per_client: int | None = None, label_fraction: float | None = None
                      ) -> Split:
    k = labels_per_client_of(len(classes), labels_per_client, label_fraction)
    split = label_sets_split(y, classes, members, assign, rng,
                              part.random_label_sets(len(members), classes, k, rng))
    return replace(split, info={"labels_per_client": k})


@LABEL_PARTITIONS.register("dirichlet")
def dirichlet_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
                     assign: Assignment, rng: np.random.Generator, *,
                     alpha: float | None = None, min_size: int = 10) -> Split:
    alpha = dirichlet_alpha(alpha)
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise ConfigError(f"dirichlet min_size must be a whole number >= 0, got {min_size!r}")
    sub = _subsample(y, members, assign, rng)
    ys = y if sub is None else y[sub]
    counts, tries = part.dirichlet_counts(part.class_sizes(ys, classes), len(members), alpha,
                                          rng, min_size=min_size,
                                          weights=assign.weights_of(members))
    pos = part.take_by_counts(ys, counts, classes, rng)
    if sub is not None:
        pos = [np.sort(sub[p]) for p in pos]
    return Split(pos, True, info={"alpha": alpha, "min_size": min_size, "draws": tries})


@LABEL_PARTITIONS.register("shards")
def shards_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
                  assign: Assignment, rng: np.random.Generator, *,
                  shards_per_client: int = 2) -> Split:
    if isinstance(shards_per_client, bool) or not isinstance(shards_per_client, int) \
            or shards_per_client < 1:
        raise ConfigError(f"shards_per_client must be a whole number >= 1, "
                          f"got {shards_per_client!r}")
    sub = _subsample(y, members, assign, rng)
    ys = y if sub is None else y[sub]
    pos, size = part.shard_partition(ys, len(members), shards_per_client, rng,
                                     assign.weights_of(members))
    if sub is not None:
        pos = [np.sort(sub[p]) for p in pos]
    sets = [[int(c) for c in np.unique(y[p])] for p in pos]
    return Split(pos, True, sets, {"shards_per_client": shards_per_client, "shard_size": size})


def labels_per_client_of(n_classes: int, labels_per_client: int | None,
                         label_fraction: float | None) -> int:
    """k labels per client from exactly one of a count or PACFL's fraction of the labels."""
    if (labels_per_client is None) == (label_fraction is None):
        raise ConfigError("label skew needs exactly one of labels_per_client (a count) and "
                          "label_fraction (PACFL's share of the labels, e.g. 0.2)")
    if label_fraction is not None:
        if isinstance(label_fraction, bool) or not isinstance(label_fraction, int | float) \
                or not 0 < label_fraction <= 1:
            raise ConfigError(f"label_fraction is a fraction in (0, 1] (0.2 for PACFL's 20 %), "
                              f"got {label_fraction!r}")
        return max(1, int(round(label_fraction * n_classes)))
    if isinstance(labels_per_client, bool) or not isinstance(labels_per_client, int) \
            or labels_per_client < 1:
        raise ConfigError(f"labels_per_client must be a whole number >= 1, "
                          f"got {labels_per_client!r}")
    if labels_per_client > n_classes:
        raise ConfigError(f"labels_per_client={labels_per_client} is more than the "
                          f"{n_classes} labels the data have")
    return labels_per_client


def dirichlet_alpha(alpha: Any) -> float:
    if alpha is None:
        raise ConfigError(
            "scenario 'dirichlet' needs alpha > 0, the concentration of each label's split over "
            "the clients (0.1 in PACFL; small alpha: few labels per client, large alpha "
            "approaches iid); inside label_swap, rotation, label_permutation, invert, mix or "
            "topics clusters write scenario.labels: {kind: dirichlet, alpha: A}"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
        raise ConfigError(f"the Dirichlet alpha must be a number > 0, got {alpha!r}")
    return float(alpha)


def label_partition(raw: Mapping[str, Any] | None, what: str = "scenario.labels"
                    ) -> tuple[PartitionFn, dict[str, Any]]:
    """`{kind: dirichlet, alpha: 0.5}` -> the partition with its options bound, and its info."""
    if raw is None:
        raw = {"kind": "iid"}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{what} must be a mapping such as {{kind: dirichlet, alpha: 0.5}}, "
                          f"got {raw!r}")
    options = dict(raw)
    kind = str(options.pop("kind", "iid"))
    fn = LABEL_PARTITIONS.get(kind)
    check_keys(what, options, (accepted_keys(fn) or set()) - _POSITIONAL)
    return functools.partial(fn, **options), {"kind": kind, **options}


# ---------------------------------------------------------------- filling pools


def need_class_labels(dataset: Dataset, what: str) -> None:
    if dataset.train_y.ndim != 1:
        raise ConfigError(f"{what} needs one class label per sample; dataset {dataset.name} has "
                          f"sequence targets of shape {dataset.train_y.shape}")


def need_images(dataset: Dataset, what: str) -> None:
    if not is_image(dataset.train_x):
        raise ConfigError(f"{what} transforms images; dataset {dataset.name} holds "
                          f"{dataset.train_x.dtype} inputs of shape {dataset.train_x.shape}")


def whole_pool(dataset: Dataset, members: Sequence[int]) -> Pool:
    return Pool(np.arange(len(dataset.train_y)), np.arange(len(dataset.test_y)), list(members))


def fill(dataset: Dataset, assign: Assignment, rng: np.random.Generator, pools: Sequence[Pool],
         partition: PartitionFn) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    """Run `partition` inside each pool, then give each client its test data by `assign.test`.

    Returns per-client train and test dataset indices and the partition's info (per-pool
    facts such as Dirichlet draws become lists over pools; label sets a per-client list).
    """
    n = assign.clients
    train: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    test: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    label_sets: list[list[int]] = [[] for _ in range(n)]
    info: dict[str, Any] = {}
    any_sets = False
    for pool in pools:
        y = dataset.train_y[pool.train]
        classes = np.unique(y) if y.ndim == 1 else np.zeros(0, np.int64)
        split = partition(y, classes, pool.members, assign, rng)
        for member, pos in zip(pool.members, split.train, strict=True):
            train[member] = pool.train[pos]
        for member, share in zip(pool.members, _test_shares(dataset, assign, rng, pool,
                                                            classes, split), strict=True):
            test[member] = share
        if split.label_sets is not None:
            any_sets = True
            for member, labels in zip(pool.members, split.label_sets, strict=True):
                label_sets[member] = labels
        for key, value in split.info.items():
            if key == "draws":
                info.setdefault("dirichlet_draws", []).append(value)
            else:
                info[key] = value
    if any_sets:
        info["label_sets"] = label_sets
    return train, test, info


def _test_shares(dataset: Dataset, assign: Assignment, rng: np.random.Generator, pool: Pool,
                 classes: np.ndarray, split: Split) -> list[np.ndarray]:
    members = pool.members
    if assign.test == "all":
        return [pool.test] * len(members)
    train_y = [dataset.train_y[pool.train[p]] for p in split.train]
    if assign.test == "by_labels":
        need_class_labels(dataset, "scenario.test=by_labels")
        pool_y = dataset.test_y[pool.test]
        return [pool.test[np.isin(pool_y, np.unique(ty))] for ty in train_y]
    if not split.skewed:
        return [pool.test[p] for p in assign.split(rng.permutation(len(pool.test)), members,
                                                   assign.test_samples_per_client, "test")]
    test_y = dataset.test_y[pool.test]
    counts = np.stack([part.class_sizes(ty, classes) for ty in train_y])
    wanted = part.matched_test_counts(counts, part.class_sizes(test_y, classes),
                                      assign.test_samples_per_client)
    return [pool.test[p] for p in part.take_by_counts(test_y, wanted, classes, rng, "test")]


def plan_clients(assign: Assignment, train: Sequence[np.ndarray], test: Sequence[np.ndarray],
          transforms: Callable[[int], Transform], info: dict[str, Any],
          n_classes: int | None = None) -> ScenarioPlan:
    specs = [ClientSpec(tr, te, transforms(assign.cluster_of(i)), assign.cluster_of(i))
             for i, (tr, te) in enumerate(zip(train, test, strict=True))]
    return ScenarioPlan(specs, info, n_classes)


def warn_single_cluster(assign: Assignment, kind: str, hint: str = "") -> None:
    if assign.clusters > 1:
        log.warning("scenario '%s' has a single true cluster; scenario.clusters=%d is ignored%s",
                    kind, assign.clusters, hint)


def one_cluster(assign: Assignment) -> Assignment:
    return replace(assign, clusters=1, cluster_sizes=None, membership=None)


def labels_info(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {} if spec == {"kind": "iid"} else {"labels": dict(spec)}

"""Scenarios: how a dataset becomes a federation of clients with known true clusters.

A scenario is a registered function `(dataset, *, assign, rng, **own_options) -> ScenarioPlan`.
True clusters are contiguous blocks of clients (`scenario.clients_per_cluster` sets their
sizes; default as even as possible). The label mathematics live in `partition.py`.

| kind              | rule (spec section)                                                       |
|-------------------|---------------------------------------------------------------------------|
| iid               | uniform random disjoint shares; 1 true cluster                            |
| label_skew        | each client holds `labels_per_client` labels, or `label_fraction` of them |
|                   | (PACFL 4.3 "#label{k}", NIID-Bench): client i owns label i mod K plus k-1 |
|                   | random others; each label's samples are split among its owners; 1 cluster |
| label_groups      | cluster j owns its own label set (a window of a seeded label order, of    |
|                   | `labels_per_group`, consecutive groups sharing `overlap` labels, or       |
|                   | explicit `group_labels`); its clients split those labels' samples         |
| dirichlet         | per label, proportions over clients ~ Dir(`alpha`), NIID-Bench balance    |
|                   | trick, redrawn until every client has `min_size` (10) (PACFL 4.3); 1 cl.  |
| shards            | sort by label, n_clients x `shards_per_client` (2) equal shards, random   |
|                   | owners (FL+HC A7, McMahan); 1 true cluster                                |
| label_swap        | cluster j swaps its own label pair, pairs disjoint (CFL A10, FL+HC A8)    |
| label_permutation | cluster j applies its own random permutation of all labels (CFL 4.3,      |
|                   | Eqs. 52/53)                                                               |
| rotation          | cluster j rotates images by 360 j / k degrees (IFCA, LCFL 4.2b);          |
|                   | `replicate`: each rotation has its own copy of the data                   |
| invert            | cluster j has its pixels inverted (x -> 255 - x) when `inverted[j]`,      |
|                   | default j odd: k = 2 gives cluster 1 inverted; k > 2 alternates           |
| mix               | cluster j = source dataset `groups[j]` (dataset groups, PACFL MIX-4)      |
| topics            | cluster j = topic j (AG News, CFL 4.4): groups, else the class label      |
| writers           | natural clients: one client per dataset group with its own train and test |
|                   | samples (FEMNIST writers, Shakespeare roles; FL+HC A6)                    |
| cyclic_classes    | client in cluster j holds `classes_per_client` (3) consecutive classes of |
|                   | the cycle from position j L / k (FedProx FEMNIST, LCFL 4.2a)              |

Common options (every scenario, `COMMON_KEYS`):

- `samples_per_client` / `test_samples_per_client`: fixed shares instead of everything split
  (for `dirichlet` and `shards` the first sets the pool size, clients x samples_per_client).
- `quantity_skew: SIGMA` or `{sigma, min_samples}`: client sizes proportional to
  exp(N(0, sigma^2)) draws (seeded by the run seed), applied wherever client shares are cut
  (`Assignment.sizes`, `label_set_counts`, `dirichlet_counts`, `shard_partition`).
  `min_samples` bounds client totals where they are set directly (random shares,
  samples_per_client totals, shards); per-label splits and Dirichlet use `min_size` instead.
  FedProx's lognormal(4, 1) + 5 FEMNIST sizes are, up to normalisation, `samples_per_client:
  86, quantity_skew: {sigma: 1, min_samples: 6}` (90 % of 95 for training, 2 per class).
- `test` (default `split`): `split` gives each client a disjoint test share that follows its
  training data: random for iid shares, or each label's test samples split in proportion to
  the clients' training counts of it where labels are skewed (FL+HC A6); `by_labels` gives
  every test sample of every label the client holds (PACFL 4.3 `local_view`); `all` gives the
  client's whole test pool (the whole test set, CFL Eq. 53; the source dataset's test split
  for `mix`, MIX-4). Test data always get the client's own transform.

Composition: the transform scenarios (`label_swap`, `label_permutation`, `rotation`,
`invert`) and the grouped ones (`mix`, `topics`) take `labels: {kind: K, ...}`, a label
partition applied inside each pool of samples (the whole data, a rotation's copy, a source
dataset) among that pool's clients: `iid` (default), `label_skew`, `dirichlet` or `shards`
with the same options as the scenarios of those names, over the labels present in the pool,
e.g. Dirichlet inside rotation clusters (CFL's reference code):
`{kind: rotation, clusters: 2, angles: [0, 180], labels: {kind: dirichlet, alpha: 1.0}}`.
Quantity-skew weights come from their own random stream, so adding quantity skew leaves,
for example, the label sets that `label_skew` draws for a seed unchanged.
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
    AUTHORS_NORMALISATION,
    Identity,
    Invert,
    LabelMap,
    LabelSwap,
    Normalize,
    Rotate,
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
    """One client as a scenario describes it: which samples, which transform, which cluster."""

    train_idx: np.ndarray
    test_idx: np.ndarray
    transform: Transform
    cluster: int


@dataclass(frozen=True)
class ClientData:
    """One client's materialised data: float32 inputs in [0, 1], int64 labels."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    @property
    def num_train(self) -> int:
        return len(self.train_y)


@dataclass(frozen=True)
class Federation:
    clients: list[ClientData]
    true_clusters: np.ndarray
    n_classes: int
    input_shape: tuple[int, ...]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def train_sizes(self) -> np.ndarray:
        return np.array([c.num_train for c in self.clients], dtype=np.int64)


@dataclass(frozen=True)
class ScenarioPlan:
    """Per-client specs, JSON-serialisable facts, and the label count if the scenario relabels."""

    clients: list[ClientSpec]
    info: dict[str, Any] = field(default_factory=dict)
    n_classes: int | None = None


ScenarioFn = Callable[..., ScenarioPlan]
SCENARIOS: Registry[ScenarioFn] = Registry("scenario")
COMMON_KEYS = {"kind", "clients", "clusters", "samples_per_client", "test_samples_per_client",
               "test", "quantity_skew", "clients_per_cluster"}
TEST_MODES = ("split", "by_labels", "all")


def build_federation(dataset: Dataset, scenario: dict[str, Any], seed: int) -> Federation:
    """Build the federation that `scenario` (the config's scenario section) describes."""
    scenario = dict(scenario)
    kind = scenario.pop("kind", None)
    fn = SCENARIOS.get(str(kind))
    own = accepted_keys(fn) or set()
    check_keys("scenario", scenario, (own - {"dataset", "assign", "rng"}) | COMMON_KEYS)
    if "clients" not in scenario:
        raise ConfigError("scenario.clients is required: the number of clients")
    clients = int(scenario.pop("clients"))
    clusters = int(scenario.pop("clusters", 1))
    if clients < 1:
        raise ConfigError(f"scenario.clients must be at least 1, got {clients}")
    if clusters < 1:
        raise ConfigError(f"scenario.clusters must be at least 1, got {clusters}")
    if clusters > clients:
        raise ConfigError(
            f"scenario.clusters={clusters} is more than scenario.clients={clients}: "
            "every true cluster needs at least one client"
        )
    test = scenario.pop("test", None) or "split"
    if test not in TEST_MODES:
        raise ConfigError(f"unknown scenario.test {test!r}; valid: {', '.join(TEST_MODES)}")
    skew = _quantity_skew(scenario.pop("quantity_skew", None))
    sizes = _cluster_sizes(scenario.pop("clients_per_cluster", None), clients, clusters)
    weights = None
    if skew is not None:
        # Its own stream: turning quantity skew on does not change the other random draws.
        weights = part.lognormal_weights(clients, skew["sigma"],
                                         np.random.default_rng([seed, 0x5CE7, 1]))
    assign = Assignment(
        clients, clusters,
        _count(scenario.pop("samples_per_client", None), "samples_per_client"),
        _count(scenario.pop("test_samples_per_client", None), "test_samples_per_client"),
        test=test, cluster_sizes=sizes, weights=weights,
        min_samples=skew["min_samples"] if skew else 1,
    )
    rng = np.random.default_rng([seed, 0x5CE7])
    plan = fn(dataset, assign=assign, rng=rng, **scenario)
    info = {**plan.info, "test": test}
    if skew is not None:
        info["quantity_skew"] = skew
    if sizes is not None and len({spec.cluster for spec in plan.clients}) == len(sizes):
        info["clients_per_cluster"] = list(sizes)
    return materialise(dataset, replace(plan, info=info))


def materialise(dataset: Dataset, plan: ScenarioPlan) -> Federation:
    out = []
    for spec in plan.clients:
        t = spec.transform
        out.append(ClientData(
            train_x=_to_float(t.apply_x(dataset.train_x[spec.train_idx])),
            train_y=t.apply_y(dataset.train_y[spec.train_idx]).astype(np.int64),
            test_x=_to_float(t.apply_x(dataset.test_x[spec.test_idx])),
            test_y=t.apply_y(dataset.test_y[spec.test_idx]).astype(np.int64),
        ))
    true = np.array([s.cluster for s in plan.clients], dtype=np.int64)
    n_classes = plan.n_classes if plan.n_classes is not None else dataset.n_classes
    return Federation(out, true, n_classes, dataset.input_shape, plan.info)


def _to_float(x: np.ndarray) -> np.ndarray:
    """uint8 images -> float32 in [0, 1]; floats -> float32; integer tokens stay int64."""
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int64)
    return x.astype(np.float32)


# ---------------------------------------------------------------- common options


def _count(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"scenario.{key} must be a whole number, got {value!r}")
    return int(value)


def _quantity_skew(raw: Any) -> dict[str, Any] | None:
    """`quantity_skew: SIGMA` or `{sigma: S, min_samples: M}` -> checked values, or None."""
    if raw is None or raw is False:
        return None
    if isinstance(raw, Mapping):
        check_keys("scenario.quantity_skew", raw, {"sigma", "min_samples"})
        sigma, minimum = raw.get("sigma", 1.0), raw.get("min_samples", 1)
    else:
        sigma, minimum = raw, 1
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or not sigma > 0:
        raise ConfigError(f"scenario.quantity_skew sigma must be a number > 0 (the spread of "
                          f"log client sizes), got {sigma!r}")
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
        raise ConfigError(f"scenario.quantity_skew min_samples must be a whole number >= 1, "
                          f"got {minimum!r}")
    return {"sigma": float(sigma), "min_samples": int(minimum)}


def _cluster_sizes(raw: Any, clients: int, clusters: int) -> tuple[int, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in raw):
        raise ConfigError(f"scenario.clients_per_cluster must be a list of whole numbers >= 1, "
                          f"got {raw!r}")
    if len(raw) != clusters or sum(raw) != clients:
        raise ConfigError(
            f"scenario.clients_per_cluster {list(raw)} must have scenario.clusters={clusters} "
            f"entries summing to scenario.clients={clients}"
        )
    return tuple(int(v) for v in raw)


@dataclass(frozen=True)
class Assignment:
    """Clients, true clusters (contiguous blocks of clients) and how client shares are sized.

    `weights` are the quantity-skew sizes (None: equal shares); `test` is the test-data rule.
    """

    clients: int
    clusters: int
    samples_per_client: int | None = None
    test_samples_per_client: int | None = None
    test: str = "split"
    cluster_sizes: tuple[int, ...] | None = None
    weights: np.ndarray | None = field(default=None, compare=False, repr=False)
    min_samples: int = 1

    def cluster_of(self, client: int) -> int:
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


def _label_sets_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
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
def _iid_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int], assign: Assignment,
               rng: np.random.Generator) -> Split:
    return Split(assign.split(rng.permutation(len(y)), members, assign.samples_per_client,
                              "train"), False)


@LABEL_PARTITIONS.register("label_skew")
def _label_skew_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
                      assign: Assignment, rng: np.random.Generator, *,
                      labels_per_client: int | None = None, label_fraction: float | None = None
                      ) -> Split:
    k = labels_per_client_of(len(classes), labels_per_client, label_fraction)
    split = _label_sets_split(y, classes, members, assign, rng,
                              part.random_label_sets(len(members), classes, k, rng))
    return replace(split, info={"labels_per_client": k})


@LABEL_PARTITIONS.register("dirichlet")
def _dirichlet_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
                     assign: Assignment, rng: np.random.Generator, *,
                     alpha: float | None = None, min_size: int = 10) -> Split:
    alpha = _dirichlet_alpha(alpha)
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
def _shards_split(y: np.ndarray, classes: np.ndarray, members: Sequence[int],
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


def _dirichlet_alpha(alpha: Any) -> float:
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


def _need_class_labels(dataset: Dataset, what: str) -> None:
    if dataset.train_y.ndim != 1:
        raise ConfigError(f"{what} needs one class label per sample; dataset {dataset.name} has "
                          f"sequence targets of shape {dataset.train_y.shape}")


def _need_images(dataset: Dataset, what: str) -> None:
    if not is_image(dataset.train_x):
        raise ConfigError(f"{what} transforms images; dataset {dataset.name} holds "
                          f"{dataset.train_x.dtype} inputs of shape {dataset.train_x.shape}")


def _whole(dataset: Dataset, members: Sequence[int]) -> Pool:
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
        _need_class_labels(dataset, "scenario.test=by_labels")
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


def _plan(assign: Assignment, train: Sequence[np.ndarray], test: Sequence[np.ndarray],
          transforms: Callable[[int], Transform], info: dict[str, Any],
          n_classes: int | None = None) -> ScenarioPlan:
    specs = [ClientSpec(tr, te, transforms(assign.cluster_of(i)), assign.cluster_of(i))
             for i, (tr, te) in enumerate(zip(train, test, strict=True))]
    return ScenarioPlan(specs, info, n_classes)


def _single_cluster(assign: Assignment, kind: str, hint: str = "") -> None:
    if assign.clusters > 1:
        log.warning("scenario '%s' has a single true cluster; scenario.clusters=%d is ignored%s",
                    kind, assign.clusters, hint)


def _one_cluster(assign: Assignment) -> Assignment:
    return replace(assign, clusters=1, cluster_sizes=None)


# ---------------------------------------------------------------- scenarios: one cluster


@SCENARIOS.register("iid")
def iid(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator) -> ScenarioPlan:
    """Uniformly random disjoint shares; one true cluster."""
    _single_cluster(assign, "iid")
    assign = _one_cluster(assign)
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             _iid_split)
    return _plan(assign, train, test, lambda _: Identity(), info)


@SCENARIOS.register("label_skew")
def label_skew(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
               labels_per_client: int | None = None, label_fraction: float | None = None
               ) -> ScenarioPlan:
    """Each client holds k labels (PACFL 4.3, NIID-Bench `#label{k}`); one true cluster.

    Exactly one of `labels_per_client` and `label_fraction` (k = round(fraction x labels)).
    PACFL tests a client on every test sample of its labels: `test: by_labels`.
    """
    _need_class_labels(dataset, "scenario 'label_skew'")
    _single_cluster(assign, "label_skew", " (label_groups gives label skew with true clusters)")
    assign = _one_cluster(assign)
    partition = functools.partial(_label_skew_split, labels_per_client=labels_per_client,
                                  label_fraction=label_fraction)
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             partition)
    return _plan(assign, train, test, lambda _: Identity(), info)


@SCENARIOS.register("dirichlet")
def dirichlet(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
              alpha: float | None = None, min_size: int = 10) -> ScenarioPlan:
    """Label proportions ~ Dir(alpha) per label over clients (PACFL 4.3, NIID-Bench labeldir).

    Redrawn until every client holds at least `min_size` samples (NIID-Bench's 10); one true
    cluster. With quantity skew, each client's proportion is scaled by its weight.
    """
    _need_class_labels(dataset, "scenario 'dirichlet'")
    alpha = _dirichlet_alpha(alpha)
    _single_cluster(assign, "dirichlet")
    assign = _one_cluster(assign)
    partition = functools.partial(_dirichlet_split, alpha=alpha, min_size=min_size)
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             partition)
    return _plan(assign, train, test, lambda _: Identity(), info)


@SCENARIOS.register("shards")
def shards(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
           shards_per_client: int = 2) -> ScenarioPlan:
    """McMahan's pathological split (FL+HC A7): label-sorted shards, 2 per client by default.

    Shards may straddle a label boundary, so a client can hold 1 to 4 labels; one true
    cluster (FL+HC: "no strictly pre-defined clusters").
    """
    _need_class_labels(dataset, "scenario 'shards'")
    _single_cluster(assign, "shards")
    assign = _one_cluster(assign)
    partition = functools.partial(_shards_split, shards_per_client=shards_per_client)
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             partition)
    return _plan(assign, train, test, lambda _: Identity(), info)


# ---------------------------------------------------------------- scenarios: label sets per cluster


@SCENARIOS.register("label_groups")
def label_groups(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
                 group_labels: Sequence[Sequence[int]] | None = None,
                 labels_per_group: int | None = None, overlap: int = 0) -> ScenarioPlan:
    """Cluster j's clients all hold the labels of group j: label skew with a true clustering.

    Groups are windows of `labels_per_group` labels of a seeded label order, consecutive
    groups sharing `overlap` labels (0: disjoint; default size: as many as fit), or
    `group_labels` explicitly. Each label's samples are split among all clients holding it.
    """
    _need_class_labels(dataset, "scenario 'label_groups'")
    classes = np.unique(dataset.train_y)
    k = assign.clusters
    if group_labels is not None:
        if labels_per_group is not None or overlap:
            raise ConfigError("scenario.group_labels lists the groups itself; "
                              "leave out labels_per_group and overlap")
        groups = [np.sort(np.asarray(g, dtype=np.int64)) for g in group_labels]
        if len(groups) != k:
            raise ConfigError(f"scenario.group_labels has {len(groups)} groups for {k} clusters")
        for g in groups:
            if len(g) == 0 or len(set(g.tolist())) != len(g) or not np.isin(g, classes).all():
                raise ConfigError(f"each of scenario.group_labels must be distinct labels of the "
                                  f"data ({classes.min()}..{classes.max()}), got {g.tolist()}")
    else:
        if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
            raise ConfigError(f"scenario.overlap must be a whole number >= 0, got {overlap!r}")
        if labels_per_group is None:
            labels_per_group = (len(classes) + (k - 1) * overlap) // k
        groups = part.window_label_sets(rng.permutation(classes), k, labels_per_group, overlap)
    sets = [groups[assign.cluster_of(i)] for i in range(assign.clients)]
    partition = functools.partial(_label_sets_split, sets=sets)
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             partition)
    info["group_labels"] = [[int(c) for c in g] for g in groups]
    return _plan(assign, train, test, lambda _: Identity(), info)


@SCENARIOS.register("cyclic_classes")
def cyclic_classes(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
                   classes: Sequence[int] | None = None, classes_per_client: int = 3
                   ) -> ScenarioPlan:
    """FedProx's FEMNIST rule (LCFL 4.2a): consecutive classes of a cycle per client.

    The cycle is `classes` (default: every label); a client of cluster j holds the
    `classes_per_client` classes from cycle position j L / k on (with k = L = 10 clusters this
    is FedProx's {u, u+1, u+2} mod 10, group = cluster). Given `classes`, labels are renumbered
    0..L-1 in cycle order (FedProx's 10-class head for the letters a-j). Sizes: use
    samples_per_client with quantity_skew for FedProx's lognormal sizes.
    """
    _need_class_labels(dataset, "scenario 'cyclic_classes'")
    present = np.unique(dataset.train_y)
    relabel = classes is not None
    if classes is None:
        cycle = present
    else:
        cycle = np.asarray(list(classes), dtype=np.int64)
        if len(cycle) == 0 or len(set(cycle.tolist())) != len(cycle) \
                or not np.isin(cycle, present).all():
            raise ConfigError(f"scenario.classes must be distinct labels present in the data, "
                              f"got {list(classes)}")
    k, n = assign.clusters, len(cycle)
    if k > n:
        raise ConfigError(f"cyclic_classes with {k} clusters needs at least {k} classes in the "
                          f"cycle; it has {n}")
    starts = [assign.cluster_of(i) * n // k for i in range(assign.clients)]
    sets = part.cyclic_label_sets(starts, cycle, classes_per_client)
    pool = Pool(np.flatnonzero(np.isin(dataset.train_y, cycle)),
                np.flatnonzero(np.isin(dataset.test_y, cycle)), list(range(assign.clients)))
    train, test, info = fill(dataset, assign, rng, [pool],
                             functools.partial(_label_sets_split, sets=sets))
    info["cycle"] = [int(c) for c in cycle]
    info["starts"] = [j * n // k for j in range(k)]
    if not relabel:
        return _plan(assign, train, test, lambda _: Identity(), info)
    table = np.full(dataset.n_classes, -1, dtype=np.int64)
    table[cycle] = np.arange(n)
    relabelled = LabelMap(tuple(int(v) for v in table))
    info["label_sets"] = [[int(table[c]) for c in s] for s in info["label_sets"]]
    return _plan(assign, train, test, lambda _: relabelled, info, n_classes=n)


# ---------------------------------------------------------------- scenarios: transforms per cluster


@SCENARIOS.register("label_swap")
def label_swap(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
               pairs: Sequence[Sequence[int]] | None = None,
               labels: Mapping[str, Any] | None = None) -> ScenarioPlan:
    """Cluster j swaps its own label pair in train and test (CFL A10, FL+HC A8): pairs disjoint."""
    k = assign.clusters
    partition, spec = label_partition(labels)
    if pairs is None:
        if 2 * k > dataset.n_classes:
            raise ConfigError(
                f"label_swap with {k} clusters needs {2 * k} distinct labels for {k} disjoint "
                f"pairs; dataset {dataset.name} has {dataset.n_classes}"
            )
        pairs = rng.permutation(dataset.n_classes)[: 2 * k].reshape(k, 2).tolist()
    pairs = [[int(a), int(b)] for a, b in pairs]
    if len(pairs) != k:
        raise ConfigError(f"scenario.pairs has {len(pairs)} pairs for {k} clusters")
    flat = [label for pair in pairs for label in pair]
    if len(set(flat)) != len(flat) or not all(0 <= v < dataset.n_classes for v in flat):
        raise ConfigError(f"scenario.pairs must be disjoint labels in 0..{dataset.n_classes - 1}")
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             partition)
    return _plan(assign, train, test, lambda c: LabelSwap(*pairs[c]),
                 {**info, "pairs": pairs, **_labels_info(spec)})


@SCENARIOS.register("label_permutation")
def label_permutation(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
                      permutations: Sequence[Sequence[int]] | None = None,
                      labels: Mapping[str, Any] | None = None) -> ScenarioPlan:
    """Cluster j relabels y -> P_j[y] with its own random permutation P_j (CFL 4.3).

    Permutations are distinct (redrawn on a repeat). CFL tests every client on the whole
    test set with its permutation applied (Eq. 53): `test: all`.
    """
    k, n = assign.clusters, dataset.n_classes
    partition, spec = label_partition(labels)
    if permutations is None:
        perms: list[list[int]] = []
        for _ in range(k):
            p = rng.permutation(n).tolist()
            # A repeat is all but impossible for 10 labels; with very few labels allow it.
            for _ in range(100):
                if p not in perms:
                    break
                p = rng.permutation(n).tolist()
            perms.append(p)
    else:
        perms = [[int(v) for v in p] for p in permutations]
        if len(perms) != k:
            raise ConfigError(f"scenario.permutations has {len(perms)} permutations for "
                              f"{k} clusters")
        for p in perms:
            if sorted(p) != list(range(n)):
                raise ConfigError(f"each of scenario.permutations must be a permutation of "
                                  f"0..{n - 1}, got {p}")
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             partition)
    maps = [LabelMap(tuple(p)) for p in perms]
    return _plan(assign, train, test, lambda c: maps[c],
                 {**info, "permutations": perms, **_labels_info(spec)})


@SCENARIOS.register("rotation")
def rotation(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
             angles: Sequence[float] | None = None, replicate: bool = False,
             labels: Mapping[str, Any] | None = None) -> ScenarioPlan:
    """Cluster j rotates its images by angle j (default 360 j / k degrees, counter-clockwise).

    With `replicate`, each rotation has its own copy of the whole dataset, split among that
    cluster's clients (IFCA's and LCFL's construction); else all clients share one split.
    """
    _need_images(dataset, "scenario 'rotation'")
    k = assign.clusters
    angles = [360.0 * j / k for j in range(k)] if angles is None else [float(a) for a in angles]
    if len(angles) != k:
        raise ConfigError(f"scenario.angles has {len(angles)} angles for {k} clusters")
    partition, spec = label_partition(labels)
    if replicate:
        pools = [_whole(dataset, assign.members(j)) for j in range(k)]
    else:
        pools = [_whole(dataset, range(assign.clients))]
    train, test, info = fill(dataset, assign, rng, pools, partition)
    return _plan(assign, train, test, lambda c: Rotate(angles[c]),
                 {**info, "angles": angles, "replicate": bool(replicate), **_labels_info(spec)})


@SCENARIOS.register("invert")
def invert(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
           inverted: Sequence[bool] | None = None,
           labels: Mapping[str, Any] | None = None) -> ScenarioPlan:
    """Pixel inversion, a covariate shift: cluster j's images become 255 - x if inverted[j].

    Default: odd clusters are inverted (k = 2: cluster 1). With k > 2 the clusters alternate,
    so clusters of the same parity share a distribution; give them different label skews
    (e.g. another scenario) or use k = 2.
    """
    _need_images(dataset, "scenario 'invert'")
    k = assign.clusters
    flags = [j % 2 == 1 for j in range(k)] if inverted is None else [bool(v) for v in inverted]
    if len(flags) != k:
        raise ConfigError(f"scenario.inverted has {len(flags)} entries for {k} clusters")
    if k > 2 and inverted is None:
        log.warning("scenario 'invert' with %d clusters alternates inversion: clusters of the "
                    "same parity have the same distribution", k)
    partition, spec = label_partition(labels)
    train, test, info = fill(dataset, assign, rng, [_whole(dataset, range(assign.clients))],
                             partition)
    return _plan(assign, train, test, lambda c: Invert() if flags[c] else Identity(),
                 {**info, "inverted": flags, **_labels_info(spec)})


def _labels_info(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {} if spec == {"kind": "iid"} else {"labels": dict(spec)}


# ---------------------------------------------------------------- scenarios: dataset groups


def _group_pools(dataset: Dataset, assign: Assignment, groups: Sequence[int] | None, kind: str,
                 labels_as_groups: bool) -> tuple[list[Pool], dict[str, Any]]:
    """One pool per cluster: the samples of group groups[j] (train and test)."""
    if dataset.train_groups is not None and dataset.test_groups is not None:
        train_g, test_g, source = dataset.train_groups, dataset.test_groups, "groups"
        names = dataset.meta.get("groups")
    elif labels_as_groups and dataset.train_y.ndim == 1:
        # Without groups, a topic is the class label (AG News classification).
        train_g, test_g, source, names = dataset.train_y, dataset.test_y, "labels", None
    else:
        raise ConfigError(
            f"scenario '{kind}' needs a dataset with per-sample groups (train_groups and "
            f"test_groups, e.g. one source dataset per group); dataset {dataset.name} has none"
        )
    available = np.unique(train_g)
    k = assign.clusters
    if groups is None:
        if len(available) != k:
            raise ConfigError(
                f"scenario '{kind}': dataset {dataset.name} has {len(available)} {source} "
                f"but scenario.clusters={k}; set scenario.clusters={len(available)} or choose "
                f"{k} of them with scenario.groups"
            )
        chosen = [int(g) for g in available]
    else:
        chosen = [int(g) for g in groups]
        if len(chosen) != k:
            raise ConfigError(f"scenario.groups has {len(chosen)} entries for {k} clusters")
        if len(set(chosen)) != k or not np.isin(chosen, available).all():
            raise ConfigError(f"scenario.groups must be distinct {source} of the data "
                              f"({available.tolist()}), got {chosen}")
    pools = [Pool(np.flatnonzero(train_g == g), np.flatnonzero(test_g == g), assign.members(j))
             for j, g in enumerate(chosen)]
    info: dict[str, Any] = {"groups": chosen, "group_source": source}
    if names is not None:
        info["group_names"] = [str(names[g]) if 0 <= g < len(names) else str(g)
                               for g in chosen]
    return pools, info


def _grouped(dataset: Dataset, assign: Assignment, rng: np.random.Generator,
             groups: Sequence[int] | None, labels: Mapping[str, Any] | None, kind: str, *,
             labels_as_groups: bool, normalize: bool = False) -> ScenarioPlan:
    """Cluster j draws from pool `groups[j]` (a source dataset, a topic), untransformed, or
    normalised by its source's constants in the PACFL code."""
    partition, spec = label_partition(labels)
    pools, info = _group_pools(dataset, assign, groups, kind, labels_as_groups=labels_as_groups)
    train, test, more = fill(dataset, assign, rng, pools, partition)
    transforms: list[Transform] = [Identity()] * assign.clusters
    if normalize:
        names = info.get("group_names", [])
        unknown = sorted(set(names) - set(AUTHORS_NORMALISATION)) or (
            [] if names else ["(unnamed groups)"])
        if unknown:
            raise ConfigError(f"scenario.normalize: no constants for {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(AUTHORS_NORMALISATION))}")
        transforms = [Normalize(*AUTHORS_NORMALISATION[name]) for name in names]
        info["normalize"] = {name: AUTHORS_NORMALISATION[name] for name in names}
    return _plan(assign, train, test, lambda j: transforms[j], {**more, **info,
                                                                 **_labels_info(spec)})


@SCENARIOS.register("mix")
def mix(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
        groups: Sequence[int] | None = None, labels: Mapping[str, Any] | None = None,
        normalize: bool = False) -> ScenarioPlan:
    """One source dataset per cluster (PACFL MIX-4): cluster j's clients share group j.

    Needs a dataset with groups (e.g. MIX-4's source id). MIX-4's 500 samples per client, 50
    per class is `samples_per_client: 500, labels: {kind: label_skew, label_fraction: 1.0}`;
    its test set, the source's whole test split, is `test: all`; its client counts
    14/32/26/28 are `clients_per_cluster`. `normalize: true` normalises each source's images
    by its per-channel constants in the PACFL code (training and signatures alike, as there).
    """
    return _grouped(dataset, assign, rng, groups, labels, "mix", labels_as_groups=False,
                    normalize=bool(normalize))


@SCENARIOS.register("topics")
def topics(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
           groups: Sequence[int] | None = None, labels: Mapping[str, Any] | None = None
           ) -> ScenarioPlan:
    """Cluster j = topic j (CFL 4.4, AG News): its clients hold disjoint articles of that topic.

    Topics are the dataset's groups, or its class labels where it has none.
    """
    return _grouped(dataset, assign, rng, groups, labels, "topics", labels_as_groups=True)


@SCENARIOS.register("writers")
def writers(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
            min_samples: int = 1, select: str = "random") -> ScenarioPlan:
    """Natural clients: scenario.clients groups (writers, roles), each with its own samples.

    Eligible groups have at least `min_samples` train and one test sample; `select` takes a
    seeded random subset (FL+HC: 367 random writers) or the `first` by group id. Each client
    keeps its own test samples; samples_per_client / test_samples_per_client cap them. True
    clusters: 0 for all, or `dataset.meta["group_clusters"][group]` where the data define them.
    """
    if dataset.train_groups is None or dataset.test_groups is None:
        raise ConfigError(f"scenario 'writers' needs a dataset with per-sample groups (writers "
                          f"or roles, train_groups and test_groups); dataset {dataset.name} "
                          f"has none")
    if assign.test != "split":
        raise ConfigError("scenario 'writers' tests each client on its own held-out samples; "
                          "scenario.test must be 'split'")
    if assign.weights is not None or assign.cluster_sizes is not None:
        raise ConfigError("scenario 'writers' has natural client sizes and clusters; "
                          "quantity_skew and clients_per_cluster do not apply")
    if select not in ("random", "first"):
        raise ConfigError(f"scenario.select must be 'random' or 'first', got {select!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
        raise ConfigError(f"scenario.min_samples must be a whole number >= 1, "
                          f"got {min_samples!r}")
    train_by, train_n = _by_group(dataset.train_groups)
    test_by, test_n = _by_group(dataset.test_groups)
    eligible = np.array(sorted(g for g, n in train_n.items()
                               if n >= min_samples and test_n.get(g, 0) >= 1), dtype=np.int64)
    if assign.clients > len(eligible):
        raise ConfigError(
            f"scenario 'writers' asks for {assign.clients} clients, but dataset {dataset.name} "
            f"has {len(eligible)} groups with at least {min_samples} train samples and a test "
            f"sample"
        )
    chosen = (np.sort(rng.choice(eligible, assign.clients, replace=False))
              if select == "random" else eligible[:assign.clients])
    natural = dataset.meta.get("group_clusters")
    if natural is None:
        if assign.clusters > 1:
            log.warning("dataset %s defines no clusters of its groups; scenario.clusters=%d is "
                        "ignored", dataset.name, assign.clusters)
        cluster = {int(g): 0 for g in chosen}
    else:
        raw = {int(g): int(natural[g]) for g in chosen}
        ids = {c: j for j, c in enumerate(sorted(set(raw.values())))}
        cluster = {g: ids[c] for g, c in raw.items()}
    # Contiguous true clusters, as every scenario has them.
    chosen = sorted((int(g) for g in chosen), key=lambda g: (cluster[g], g))
    specs = []
    for g in chosen:
        tr = _cap(train_by[g], assign.samples_per_client, rng)
        te = _cap(test_by[g], assign.test_samples_per_client, rng)
        specs.append(ClientSpec(tr, te, Identity(), cluster[g]))
    info: dict[str, Any] = {"writers": chosen}
    names = dataset.meta.get("groups")
    if names is not None:
        info["writer_names"] = [str(names[g]) if 0 <= g < len(names) else str(g)
                                for g in chosen]
    return ScenarioPlan(specs, info)


def _by_group(groups: np.ndarray) -> tuple[dict[int, np.ndarray], dict[int, int]]:
    """Sample indices of each group, from one stable sort instead of a scan per group."""
    order = np.argsort(groups, kind="stable")
    ids, starts, counts = np.unique(groups[order], return_index=True, return_counts=True)
    by = {int(g): order[s:s + n] for g, s, n in zip(ids, starts, counts, strict=True)}
    return by, {int(g): int(n) for g, n in zip(ids, counts, strict=True)}


def _cap(indices: np.ndarray, limit: int | None, rng: np.random.Generator) -> np.ndarray:
    if limit is None or len(indices) <= limit:
        return np.sort(indices)
    return np.sort(rng.choice(indices, limit, replace=False))

"""Scenarios: how a dataset becomes a federation of clients with known true clusters."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from clusterfed.data.datasets import Dataset
from clusterfed.data.transforms import Identity, LabelSwap, Rotate
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
    clients: list[ClientSpec]
    info: dict[str, Any] = field(default_factory=dict)


ScenarioFn = Callable[..., ScenarioPlan]
SCENARIOS: Registry[ScenarioFn] = Registry("scenario")
COMMON_KEYS = {"kind", "clients", "clusters", "samples_per_client", "test_samples_per_client"}


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
    assign = Assignment(
        clients, clusters,
        scenario.pop("samples_per_client", None), scenario.pop("test_samples_per_client", None),
    )
    rng = np.random.default_rng([seed, 0x5CE7])
    plan = fn(dataset, assign=assign, rng=rng, **scenario)
    return materialise(dataset, plan)


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
    return Federation(out, true, dataset.n_classes, dataset.input_shape, plan.info)


def _to_float(x: np.ndarray) -> np.ndarray:
    """uint8 images -> float32 in [0, 1]; floats -> float32; integer tokens stay int64."""
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int64)
    return x.astype(np.float32)


@dataclass(frozen=True)
class Assignment:
    """Clients, true clusters (contiguous blocks of clients) and per-client sample counts."""

    clients: int
    clusters: int
    samples_per_client: int | None = None
    test_samples_per_client: int | None = None

    def cluster_of(self, client: int) -> int:
        return client * self.clusters // self.clients

    def split(self, indices: np.ndarray, parts: int, per_part: int | None, what: str
              ) -> list[np.ndarray]:
        """Split shuffled indices into `parts` disjoint shares, `per_part` each or all evenly."""
        if per_part is None:
            per_part = len(indices) // parts
        if per_part < 1 or per_part * parts > len(indices):
            raise ConfigError(
                f"cannot give {parts} clients {per_part} {what} samples each: "
                f"the data have {len(indices)}"
            )
        return [indices[i * per_part:(i + 1) * per_part] for i in range(parts)]

    def train_test(self, dataset: Dataset, rng: np.random.Generator
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Disjoint random train and test shares, one per client, drawn from the whole dataset."""
        train = self.split(rng.permutation(len(dataset.train_y)), self.clients,
                           self.samples_per_client, "train")
        test = self.split(rng.permutation(len(dataset.test_y)), self.clients,
                          self.test_samples_per_client, "test")
        return train, test


@SCENARIOS.register("iid")
def iid(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator) -> ScenarioPlan:
    """Uniformly random disjoint shares; one true cluster."""
    if assign.clusters > 1:
        log.warning("scenario 'iid' has a single true cluster; scenario.clusters=%d is ignored",
                    assign.clusters)
    train, test = assign.train_test(dataset, rng)
    return ScenarioPlan([ClientSpec(tr, te, Identity(), 0)
                         for tr, te in zip(train, test, strict=True)])


@SCENARIOS.register("label_swap")
def label_swap(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
               pairs: Sequence[Sequence[int]] | None = None) -> ScenarioPlan:
    """Cluster j swaps its own label pair in train and test (CFL A10, FL+HC A8): pairs disjoint."""
    k = assign.clusters
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
    train, test = assign.train_test(dataset, rng)
    specs = []
    for i, (tr, te) in enumerate(zip(train, test, strict=True)):
        c = assign.cluster_of(i)
        specs.append(ClientSpec(tr, te, LabelSwap(*pairs[c]), c))
    return ScenarioPlan(specs, {"pairs": pairs})


@SCENARIOS.register("rotation")
def rotation(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
             angles: Sequence[float] | None = None, replicate: bool = False) -> ScenarioPlan:
    """Cluster j rotates its images by angle j (default 360 j / k degrees).

    With `replicate`, each rotation has its own copy of the whole dataset, split among that
    cluster's clients (IFCA's and LCFL's construction); else all clients share one split.
    """
    k = assign.clusters
    angles = [360.0 * j / k for j in range(k)] if angles is None else [float(a) for a in angles]
    if len(angles) != k:
        raise ConfigError(f"scenario.angles has {len(angles)} angles for {k} clusters")
    if replicate:
        train: list[np.ndarray] = []
        test: list[np.ndarray] = []
        for j in range(k):
            members = sum(1 for i in range(assign.clients) if assign.cluster_of(i) == j)
            sub = Assignment(members, 1, assign.samples_per_client, assign.test_samples_per_client)
            tr, te = sub.train_test(dataset, rng)
            train += tr
            test += te
    else:
        train, test = assign.train_test(dataset, rng)
    specs = [ClientSpec(tr, te, Rotate(angles[assign.cluster_of(i)]), assign.cluster_of(i))
             for i, (tr, te) in enumerate(zip(train, test, strict=True))]
    return ScenarioPlan(specs, {"angles": angles})

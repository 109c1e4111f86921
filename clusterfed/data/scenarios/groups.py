"""Scenarios by the dataset's own groups: mix (MIX-4's source datasets), topics (AG News)
and writers (natural clients: FEMNIST writers, Shakespeare roles).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clusterfed.data.datasets import Dataset
from clusterfed.data.scenarios.assignment import (
    Assignment,
    ClientSpec,
    Pool,
    ScenarioPlan,
    Transform,
    fill,
    label_partition,
    labels_info,
    plan_clients,
)
from clusterfed.data.scenarios.building import SCENARIOS
from clusterfed.data.transforms import (
    AUTHORS_NORMALISATION,
    Identity,
    Normalize,
)
from clusterfed.errors import ConfigError

log = logging.getLogger("clusterfed")


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
    return plan_clients(assign, train, test, lambda j: transforms[j], {**more, **info,
                                                                 **labels_info(spec)})


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

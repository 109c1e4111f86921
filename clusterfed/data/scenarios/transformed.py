"""Scenarios by a transform per true cluster: label_swap, label_permutation (the same
inputs labelled otherwise), rotation, invert, corrupted (other inputs for the same labels).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from clusterfed.data.datasets import Dataset
from clusterfed.data.scenarios.assignment import (
    Assignment,
    ScenarioPlan,
    fill,
    label_partition,
    labels_info,
    need_images,
    plan_clients,
    whole_pool,
)
from clusterfed.data.scenarios.building import SCENARIOS
from clusterfed.data.scenarios.overlays import (
    corruption_extras,
    corruptions_of,
    with_extras,
)
from clusterfed.data.transforms import (
    Identity,
    Invert,
    LabelMap,
    LabelSwap,
    Rotate,
)
from clusterfed.errors import ConfigError

log = logging.getLogger("clusterfed")


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
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    return plan_clients(assign, train, test, lambda c: LabelSwap(*pairs[c]),
                 {**info, "pairs": pairs, **labels_info(spec)})


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
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    maps = [LabelMap(tuple(p)) for p in perms]
    return plan_clients(assign, train, test, lambda c: maps[c],
                 {**info, "permutations": perms, **labels_info(spec)})


@SCENARIOS.register("rotation")
def rotation(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
             angles: Sequence[float] | None = None, replicate: bool = False,
             labels: Mapping[str, Any] | None = None) -> ScenarioPlan:
    """Cluster j rotates its images by angle j (default 360 j / k degrees, counter-clockwise).

    With `replicate`, each rotation has its own copy of the whole dataset, split among that
    cluster's clients (IFCA's and LCFL's construction); else all clients share one split.
    """
    need_images(dataset, "scenario 'rotation'")
    k = assign.clusters
    angles = [360.0 * j / k for j in range(k)] if angles is None else [float(a) for a in angles]
    if len(angles) != k:
        raise ConfigError(f"scenario.angles has {len(angles)} angles for {k} clusters")
    partition, spec = label_partition(labels)
    if replicate:
        pools = [whole_pool(dataset, assign.members(j)) for j in range(k)]
    else:
        pools = [whole_pool(dataset, range(assign.clients))]
    train, test, info = fill(dataset, assign, rng, pools, partition)
    return plan_clients(assign, train, test, lambda c: Rotate(angles[c]),
                 {**info, "angles": angles, "replicate": bool(replicate), **labels_info(spec)})


@SCENARIOS.register("invert")
def invert(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
           inverted: Sequence[bool] | None = None,
           labels: Mapping[str, Any] | None = None) -> ScenarioPlan:
    """Pixel inversion, a covariate shift: cluster j's images become 255 - x if inverted[j].

    Default: odd clusters are inverted (k = 2: cluster 1). With k > 2 the clusters alternate,
    so clusters of the same parity share a distribution; give them different label skews
    (e.g. another scenario) or use k = 2.
    """
    need_images(dataset, "scenario 'invert'")
    k = assign.clusters
    flags = [j % 2 == 1 for j in range(k)] if inverted is None else [bool(v) for v in inverted]
    if len(flags) != k:
        raise ConfigError(f"scenario.inverted has {len(flags)} entries for {k} clusters")
    if k > 2 and inverted is None:
        log.warning("scenario 'invert' with %d clusters alternates inversion: clusters of the "
                    "same parity have the same distribution", k)
    partition, spec = label_partition(labels)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    return plan_clients(assign, train, test, lambda c: Invert() if flags[c] else Identity(),
                 {**info, "inverted": flags, **labels_info(spec)})


# Cluster j's corruption by default: clean first, then the CIFAR-10-C families in turn.
DEFAULT_CORRUPTIONS = ("none", "gaussian_noise", "gaussian_blur", "contrast", "brightness",
                       "impulse_noise", "pixelate", "shot_noise", "defocus_blur",
                       "speckle_noise")


@SCENARIOS.register("corrupted")
def corrupted(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
              kinds: Sequence[str] | None = None, severity: int | Sequence[int] = 3,
              table: str = "cifar10_c", labels: Mapping[str, Any] | None = None
              ) -> ScenarioPlan:
    """Cluster j's images carry corruption kinds[j] at its severity (CIFAR-10-C, MNIST-C),
    train and test: a feature shift generated from the clean data (`corruptions.py`).

    Default kinds: `none` (clean), gaussian_noise, gaussian_blur, contrast, ... (the first k
    of DEFAULT_CORRUPTIONS); `severity` one for all or one per cluster; `table` the published
    parameters (`cifar10_c`, `mnist_c`). The random draws are seeded per (seed, client).
    """
    need_images(dataset, "scenario 'corrupted'")
    k = assign.clusters
    if kinds is None:
        if k > len(DEFAULT_CORRUPTIONS):
            raise ConfigError(f"scenario 'corrupted' has {len(DEFAULT_CORRUPTIONS)} default "
                              f"corruptions for {k} clusters; list scenario.kinds (a kind at "
                              f"several severities counts once per severity)")
        kinds = list(DEFAULT_CORRUPTIONS[:k])
    corruptions = corruptions_of(kinds, severity, table, "scenario")
    if len(corruptions.kinds) != k:
        raise ConfigError(f"scenario.kinds has {len(corruptions.kinds)} corruptions for {k} "
                          f"clusters")
    # A child stream: the draws that share out the data stay those of the other transform
    # scenarios, and a plan again (drift) gets the same corruption draws.
    seed = (int(rng.spawn(1)[0].integers(2 ** 63)),)
    partition, spec = label_partition(labels)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    plan = plan_clients(assign, train, test, lambda _: Identity(),
                        {**info, "corruption": corruptions.facts(), **labels_info(spec)})
    # The corruption is each client's extra (as the overlay's), seeded per client and split.
    clusters = [c.cluster for c in plan.clients]
    extras = corruption_extras(clusters, corruptions, seed)
    return replace(plan, clients=with_extras(plan.clients, extras))

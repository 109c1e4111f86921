"""Scenarios by the labels clients hold: iid, label_skew, dirichlet, shards (one true
cluster) and label_groups, cyclic_classes (a label set per true cluster).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from clusterfed.data import partition as part
from clusterfed.data.datasets import Dataset
from clusterfed.data.scenarios.assignment import (
    Assignment,
    Pool,
    ScenarioPlan,
    dirichlet_alpha,
    dirichlet_split,
    fill,
    iid_split,
    label_sets_split,
    label_skew_split,
    need_class_labels,
    one_cluster,
    plan_clients,
    shards_split,
    warn_single_cluster,
    whole_pool,
)
from clusterfed.data.scenarios.building import SCENARIOS
from clusterfed.data.transforms import (
    Identity,
    LabelMap,
)
from clusterfed.errors import ConfigError


@SCENARIOS.register("iid")
def iid(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator) -> ScenarioPlan:
    """Uniformly random disjoint shares; one true cluster."""
    warn_single_cluster(assign, "iid")
    assign = one_cluster(assign)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             iid_split)
    return plan_clients(assign, train, test, lambda _: Identity(), info)


@SCENARIOS.register("label_skew")
def label_skew(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
               labels_per_client: int | None = None, label_fraction: float | None = None
               ) -> ScenarioPlan:
    """Each client holds k labels (PACFL 4.3, NIID-Bench `#label{k}`); one true cluster.

    Exactly one of `labels_per_client` and `label_fraction` (k = round(fraction x labels)).
    PACFL tests a client on every test sample of its labels: `test: by_labels`.
    """
    need_class_labels(dataset, "scenario 'label_skew'")
    warn_single_cluster(assign, "label_skew", " (label_groups gives label skew with true clusters)")
    assign = one_cluster(assign)
    partition = functools.partial(label_skew_split, labels_per_client=labels_per_client,
                                  label_fraction=label_fraction)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    return plan_clients(assign, train, test, lambda _: Identity(), info)


@SCENARIOS.register("dirichlet")
def dirichlet(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
              alpha: float | None = None, min_size: int = 10) -> ScenarioPlan:
    """Label proportions ~ Dir(alpha) per label over clients (PACFL 4.3, NIID-Bench labeldir).

    Redrawn until every client holds at least `min_size` samples (NIID-Bench's 10); one true
    cluster. With quantity skew, each client's proportion is scaled by its weight.
    """
    need_class_labels(dataset, "scenario 'dirichlet'")
    alpha = dirichlet_alpha(alpha)
    warn_single_cluster(assign, "dirichlet")
    assign = one_cluster(assign)
    partition = functools.partial(dirichlet_split, alpha=alpha, min_size=min_size)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    return plan_clients(assign, train, test, lambda _: Identity(), info)


@SCENARIOS.register("shards")
def shards(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
           shards_per_client: int = 2) -> ScenarioPlan:
    """McMahan's pathological split (FL+HC A7): label-sorted shards, 2 per client by default.

    Shards may straddle a label boundary, so a client can hold 1 to 4 labels; one true
    cluster (FL+HC: "no strictly pre-defined clusters").
    """
    need_class_labels(dataset, "scenario 'shards'")
    warn_single_cluster(assign, "shards")
    assign = one_cluster(assign)
    partition = functools.partial(shards_split, shards_per_client=shards_per_client)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    return plan_clients(assign, train, test, lambda _: Identity(), info)


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
    need_class_labels(dataset, "scenario 'label_groups'")
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
    partition = functools.partial(label_sets_split, sets=sets)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    info["group_labels"] = [[int(c) for c in g] for g in groups]
    return plan_clients(assign, train, test, lambda _: Identity(), info)


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
    need_class_labels(dataset, "scenario 'cyclic_classes'")
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
                             functools.partial(label_sets_split, sets=sets))
    info["cycle"] = [int(c) for c in cycle]
    info["starts"] = [j * n // k for j in range(k)]
    if not relabel:
        return plan_clients(assign, train, test, lambda _: Identity(), info)
    table = np.full(dataset.n_classes, -1, dtype=np.int64)
    table[cycle] = np.arange(n)
    relabelled = LabelMap(tuple(int(v) for v in table))
    info["label_sets"] = [[int(table[c]) for c in s] for s in info["label_sets"]]
    return plan_clients(assign, train, test, lambda _: relabelled, info, n_classes=n)

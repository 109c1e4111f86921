"""Overlays: common options that lay a second true grouping over any scenario's clients.

- `corruption: {kinds: [none, gaussian_noise], severity: 3, table: cifar10_c}`: client i
  has the corruption kinds[i mod G] (G kinds; `none` is clean) at its severity, on its train
  and test images: the grouping `corruption`, crossed with the contiguous true clusters.
- `label_noise: {rate: 0.2, share: 0.5, flip: symmetric, clusters: [..]}`: in each true
  cluster (or those listed), a seeded `share` of the clients have round(rate n) of their n
  training labels flipped (`transforms.flip_labels`); test labels stay clean. The grouping
  `label_noise`: 1 noisy, 0 clean.

The clusters stay the truth methods are scored against; `Federation.groupings` keeps these
beside them. An overlay is a client's extra (`ClientSpec.train_extra` / `test_extra`), applied
after its cluster's transform, and decided once from the scenario's first plan: under
`scenario.drift` a drifting client keeps its corruption and noise. Each overlay draws from its
own stream of the run seed (and per client), so adding one leaves every other draw of the
scenario unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from clusterfed.data.corruptions import CORRUPTIONS, SEVERITIES, TABLES
from clusterfed.data.datasets import Dataset
from clusterfed.data.scenarios.assignment import (
    ClientSpec,
    ScenarioPlan,
    Transform,
    need_class_labels,
    need_images,
)
from clusterfed.data.transforms import Chain, Corrupt, NoisyLabels
from clusterfed.errors import ConfigError
from clusterfed.registry import check_keys

CLEAN = "none"
CORRUPTION_STREAM = 0xC022
LABEL_NOISE_STREAM = 0x1AB1
FLIPS = ("symmetric", "pair")


@dataclass(frozen=True)
class Corruptions:
    """Corruption groups: group g is kinds[g] at severities[g] (0 for `none`) of `table`."""

    kinds: tuple[str, ...]
    severities: tuple[int, ...]
    table: str

    def facts(self) -> dict[str, Any]:
        return {"kinds": list(self.kinds), "severities": list(self.severities),
                "table": self.table}


def corruptions_of(kinds: Any, severity: Any, table: Any, what: str) -> Corruptions:
    """Checked corruption groups from a config's `kinds`, `severity` (one, or one per kind)
    and `table`."""
    if table not in TABLES:
        raise ConfigError(f"{what}.table must be one of {', '.join(TABLES)}, got {table!r}")
    known = [CLEAN, *CORRUPTIONS]
    if (isinstance(kinds, str) or not isinstance(kinds, Sequence) or not kinds
            or not all(k in known for k in kinds)):
        raise ConfigError(f"{what}.kinds must be a list of corruptions from "
                          f"{', '.join(known)}; got {kinds!r}")
    raw = list(severity) if isinstance(severity, Sequence) and not isinstance(severity, str) \
        else [severity] * len(kinds)
    if len(raw) != len(kinds) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s in SEVERITIES for s in raw):
        raise ConfigError(f"{what}.severity must be a severity in 1..5, or a list of one per "
                          f"kind ({len(kinds)}), got {severity!r}")
    severities = tuple(0 if k == CLEAN else int(s) for k, s in zip(kinds, raw, strict=True))
    groups = list(zip(kinds, severities, strict=True))
    if len(set(groups)) != len(groups):
        raise ConfigError(f"{what}: each group needs its own corruption or severity; "
                          f"got {groups}")
    return Corruptions(tuple(str(k) for k in kinds), severities, str(table))


Extras = tuple[list[Transform | None], list[Transform | None]]   # per client: train, test


def corruption_extras(groups: Sequence[int], corruptions: Corruptions, seed: Sequence[int]
                      ) -> Extras:
    """Client i's corruption of group groups[i], for its train and test images; draws seeded
    by (seed, i, split)."""
    train: list[Transform | None] = []
    test: list[Transform | None] = []
    for i, g in enumerate(groups):
        kind, severity = corruptions.kinds[g], corruptions.severities[g]
        clean = kind == CLEAN
        train.append(None if clean else Corrupt(kind, severity, (*seed, i, 0), corruptions.table))
        test.append(None if clean else Corrupt(kind, severity, (*seed, i, 1), corruptions.table))
    return train, test


def with_extras(specs: Sequence[ClientSpec], extras: Extras) -> list[ClientSpec]:
    """The clients with `extras` applied after what they already have."""
    return [replace(spec, train_extra=_then(spec.train_extra, train),
                    test_extra=_then(spec.test_extra, test))
            for spec, train, test in zip(specs, *extras, strict=True)]


def _then(first: Transform | None, second: Transform | None) -> Transform | None:
    if first is None or second is None:
        return second if first is None else first
    return Chain((first, second))


@dataclass(frozen=True)
class Overlays:
    """Per-client extras, their facts and groupings, decided once (from the scenario's first
    plan) and laid over any plan of it: a drifting client keeps its corruption and noise."""

    extras: Extras | None = None
    info: dict[str, Any] = field(default_factory=dict)
    groupings: dict[str, np.ndarray] = field(default_factory=dict)

    def apply(self, plan: ScenarioPlan) -> ScenarioPlan:
        if self.extras is None:
            return plan
        return replace(plan, clients=with_extras(plan.clients, self.extras),
                       info={**plan.info, **self.info},
                       groupings={**plan.groupings, **self.groupings})


def _corruption_overlay(dataset: Dataset, plan: ScenarioPlan, raw: Any, seed: int) -> Overlays:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"scenario.corruption must be a mapping such as {{kinds: [none, "
                          f"gaussian_noise], severity: 3}}, got {raw!r}")
    check_keys("scenario.corruption", raw, {"kinds", "severity", "table"})
    need_images(dataset, "scenario.corruption")
    if "corruption" in plan.info:
        raise ConfigError("scenario 'corrupted' sets each cluster's corruption itself; leave "
                          "out scenario.corruption")
    if "normalize" in plan.info:
        raise ConfigError("scenario.corruption acts on pixel values in [0, 1]; it does not "
                          "combine with normalize")
    corruptions = corruptions_of(raw.get("kinds"), raw.get("severity", 3),
                                 raw.get("table", "cifar10_c"), "scenario.corruption")
    groups = [i % len(corruptions.kinds) for i in range(len(plan.clients))]
    return Overlays(corruption_extras(groups, corruptions, (seed, CORRUPTION_STREAM)),
                    {"corruption": {**corruptions.facts(), "groups": groups}},
                    {"corruption": np.asarray(groups, dtype=np.int64)})


def _fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"scenario.label_noise.{key} must be a number in (0, 1], "
                          f"got {value!r}")
    return float(value)


def _label_noise_overlay(dataset: Dataset, plan: ScenarioPlan, raw: Any, n_classes: int,
                         seed: int) -> Overlays:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"scenario.label_noise must be a mapping such as {{rate: 0.2, "
                          f"share: 0.5}}, got {raw!r}")
    check_keys("scenario.label_noise", raw, {"rate", "share", "flip", "clusters"})
    need_class_labels(dataset, "scenario.label_noise")
    if "rate" not in raw:
        raise ConfigError("scenario.label_noise.rate is required: the share of a noisy "
                          "client's training labels that are flipped")
    rate, share = _fraction(raw["rate"], "rate"), _fraction(raw.get("share", 0.5), "share")
    flip = raw.get("flip", "symmetric")
    if flip not in FLIPS:
        raise ConfigError(f"scenario.label_noise.flip must be one of {', '.join(FLIPS)}, "
                          f"got {flip!r}")
    if n_classes < 2:
        raise ConfigError("scenario.label_noise needs at least 2 labels to flip between")
    true = np.array([s.cluster for s in plan.clients], dtype=np.int64)
    clusters = raw.get("clusters")
    chosen_clusters = np.unique(true) if clusters is None else clusters
    if (isinstance(chosen_clusters, str) or not isinstance(chosen_clusters, Sequence | np.ndarray)
            or not all(isinstance(j, int | np.integer) and not isinstance(j, bool)
                       and j in true for j in chosen_clusters)):
        raise ConfigError(f"scenario.label_noise.clusters must list true clusters "
                          f"({', '.join(str(int(j)) for j in np.unique(true))}), "
                          f"got {clusters!r}")
    rng = np.random.default_rng([seed, LABEL_NOISE_STREAM])
    noisy = np.zeros(len(true), dtype=np.int64)
    for j in sorted({int(j) for j in chosen_clusters}):
        members = np.flatnonzero(true == j)
        noisy[rng.choice(members, int(round(share * len(members))), replace=False)] = 1
    train: list[Transform | None] = [
        NoisyLabels(rate, str(flip), n_classes, (seed, LABEL_NOISE_STREAM, i)) if noisy[i]
        else None for i in range(len(true))]
    info = {"label_noise": {"rate": rate, "share": share, "flip": flip,
                            "clusters": sorted({int(j) for j in chosen_clusters}),
                            "noisy_clients": np.flatnonzero(noisy).tolist()}}
    return Overlays((train, [None] * len(true)), info, {"label_noise": noisy})


def make_overlays(dataset: Dataset, plan: ScenarioPlan, *, corruption: Any, label_noise: Any,
                  seed: int) -> Overlays:
    """The corruption, then the label noise, decided for the clients of `plan` (None: not
    asked)."""
    parts = []
    if corruption is not None:
        parts.append(_corruption_overlay(dataset, plan, corruption, seed))
    if label_noise is not None:
        n_classes = plan.n_classes if plan.n_classes is not None else dataset.n_classes
        parts.append(_label_noise_overlay(dataset, plan, label_noise, n_classes, seed))
    if not parts:
        return Overlays()
    n = len(plan.clients)
    train, test = [None] * n, [None] * n
    for part in parts:
        assert part.extras is not None
        train = [_then(a, b) for a, b in zip(train, part.extras[0], strict=True)]
        test = [_then(a, b) for a, b in zip(test, part.extras[1], strict=True)]
    return Overlays((train, test), {k: v for part in parts for k, v in part.info.items()},
                    {k: v for part in parts for k, v in part.groupings.items()})

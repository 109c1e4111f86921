"""Overlays: common options that lay a second true grouping over any scenario's clients.

- `corruption: {kinds: [none, gaussian_noise], severity: 3, table: cifar10_c}`: client i
  has the corruption kinds[i mod G] (G kinds; `none` is clean) at its severity, on its train
  and test images: the grouping `corruption`, crossed with the contiguous true clusters.
- `label_noise: {rate: 0.2, share: 0.5, flip: symmetric, clusters: [..]}`: in each true
  cluster (or those listed), a seeded `share` of the clients have round(rate n) of their n
  training labels flipped (`transforms.flip_labels`); test labels stay clean. The grouping
  `label_noise`: 1 noisy, 0 clean.

The clusters stay the truth methods are scored against; `Federation.groupings` keeps these
beside them. Each overlay draws from its own stream of the run seed (and per client), so
adding one leaves every other draw of the scenario unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from clusterfed.data.corruptions import CORRUPTIONS, SEVERITIES, TABLES
from clusterfed.data.datasets import Dataset
from clusterfed.data.scenarios.assignment import (
    ClientSpec,
    ScenarioPlan,
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


def corrupt_clients(specs: Sequence[ClientSpec], groups: Sequence[int], corruptions: Corruptions,
                    seed: Sequence[int]) -> list[ClientSpec]:
    """Client i's images (train and test) after its own transform get the corruption of group
    groups[i]; draws seeded by (seed, i, split)."""
    out = []
    for i, (spec, g) in enumerate(zip(specs, groups, strict=True)):
        kind, severity = corruptions.kinds[g], corruptions.severities[g]
        if kind == CLEAN:
            out.append(spec)
            continue
        test = spec.transform if spec.test_transform is None else spec.test_transform
        out.append(replace(
            spec,
            transform=Chain((spec.transform, Corrupt(kind, severity, (*seed, i, 0),
                                                     corruptions.table))),
            test_transform=Chain((test, Corrupt(kind, severity, (*seed, i, 1),
                                                corruptions.table)))))
    return out


def _corruption_overlay(dataset: Dataset, plan: ScenarioPlan, raw: Any, seed: int
                        ) -> ScenarioPlan:
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
    specs = corrupt_clients(plan.clients, groups, corruptions, (seed, CORRUPTION_STREAM))
    info = {**plan.info, "corruption": {**corruptions.facts(), "groups": groups}}
    return replace(plan, clients=specs, info=info,
                   groupings={**plan.groupings, "corruption": np.asarray(groups)})


def _fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"scenario.label_noise.{key} must be a number in (0, 1], "
                          f"got {value!r}")
    return float(value)


def _label_noise_overlay(dataset: Dataset, plan: ScenarioPlan, raw: Any, n_classes: int,
                         seed: int) -> ScenarioPlan:
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
    specs, flipped = [], []
    for i, spec in enumerate(plan.clients):
        if not noisy[i]:
            specs.append(spec)
            flipped.append(0)
            continue
        noise = NoisyLabels(rate, str(flip), n_classes, (seed, LABEL_NOISE_STREAM, i))
        test = spec.transform if spec.test_transform is None else spec.test_transform
        specs.append(replace(spec, transform=Chain((spec.transform, noise)), test_transform=test))
        flipped.append(int(round(rate * len(spec.train_idx))))
    info = {**plan.info, "label_noise": {
        "rate": rate, "share": share, "flip": flip,
        "clusters": sorted({int(j) for j in chosen_clusters}),
        "noisy_clients": np.flatnonzero(noisy).tolist(), "flipped": flipped}}
    return replace(plan, clients=specs, info=info,
                   groupings={**plan.groupings, "label_noise": noisy})


def apply_overlays(dataset: Dataset, plan: ScenarioPlan, *, corruption: Any, label_noise: Any,
                   seed: int) -> ScenarioPlan:
    """The plan with the corruption, then the label noise, laid over it (None: not asked)."""
    if corruption is not None:
        plan = _corruption_overlay(dataset, plan, corruption, seed)
    if label_noise is not None:
        n_classes = plan.n_classes if plan.n_classes is not None else dataset.n_classes
        plan = _label_noise_overlay(dataset, plan, label_noise, n_classes, seed)
    return plan

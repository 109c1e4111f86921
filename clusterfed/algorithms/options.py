"""Option groups that several methods share, each declared once with its constraints.

`ClusterCount` is how a method chooses its number of clusters K (the YAML key `k_choice:`):
fixed, or from the data by one of the selectors of `clustering/selectors.py` on the
method's own clustering features. Configs written before the group set its options flat on
the method (`algorithm.k`, `algorithm.k_max`, `algorithm.min_silhouette`, and a method's own
name for K such as PACFL's `n_clusters`); `grouped_options` moves them into the group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from clusterfed.clustering import selectors
from clusterfed.clustering.precomputed import NO_STRUCTURE
from clusterfed.registry import accepted_keys

GROUP = "k_choice"
# The flat keys the group replaces; a method may name K otherwise (`K_ALIASES`).
FLAT_KEYS = ("k", "k_max", "min_silhouette")
# Each selector's own parameters among the group's fields.
SELECTOR_PARAMS = {"silhouette": ("min_silhouette",), "eigengap": ("neighbours",),
                   "gap": ("references",), "davies_bouldin": (),
                   "hdbscan": ("min_cluster_size",),
                   "hdbscan_silhouette": ("min_cluster_size", "min_silhouette"),
                   "silhouette_gap": ("references", "min_silhouette"),
                   "silhouette_gap_width": ("references", "min_silhouette")}


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ClusterCount:
    """The number of clusters K: fixed (`k`), or from the data by `selector` (`k: null`)."""

    k: int | None = None           # K fixed; null: from the data, by the selector
    k_max: int = 10                # the most clusters a selector considers
    # silhouette: the most clusters whose every one reaches min_silhouette; eigengap of the
    # affinity graph; gap statistic; davies_bouldin (never one cluster); hdbscan;
    # hdbscan_silhouette (whichever of the two finds more clusters); silhouette_gap (the
    # silhouette's clusters, else the gap statistic's); silhouette_gap_width (the silhouette's
    # clusters, else, where the gap statistic finds some, the widest mean silhouette's). A
    # method may default to another (PACFL: hdbscan_silhouette; IFCA, FL+HC:
    # silhouette_gap_width)
    selector: str = "silhouette"
    # silhouette: a cluster's least mean silhouette, below it one cluster; null: the best
    # mean silhouette over k = 2..k_max (never one cluster), where a method allows it
    min_silhouette: float | None = NO_STRUCTURE
    neighbours: int = 3            # eigengap: each client's scale, its distance to this neighbour
    references: int = 10           # gap, silhouette_gap(_width): uniform reference data sets
    min_cluster_size: int = 3      # hdbscan(_silhouette): the fewest clients of a cluster
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {"selector": selectors.SELECTORS}

    def __post_init__(self) -> None:
        if self.selector not in selectors.SELECTORS:
            raise ValueError(f"{GROUP}.selector must be one of "
                             f"{', '.join(selectors.SELECTORS)}, got {self.selector!r}")
        if self.k is not None and (not _whole(self.k) or self.k < 1):
            raise ValueError(f"{GROUP}.k must be a whole number >= 1 or null, got {self.k!r}")
        if self.k is not None and self.selector != "silhouette":
            raise ValueError(f"{GROUP}.selector {self.selector!r} chooses K from the data, "
                             f"but {GROUP}.k fixes it at {self.k}: set one")
        if not _whole(self.k_max) or self.k_max < 2:
            raise ValueError(f"{GROUP}.k_max must be a whole number >= 2, got {self.k_max!r}")
        if self.min_silhouette is not None and (
                isinstance(self.min_silhouette, bool)
                or not isinstance(self.min_silhouette, int | float)
                or not -1.0 <= self.min_silhouette <= 1.0):
            raise ValueError(f"{GROUP}.min_silhouette must be in [-1, 1] or null, "
                             f"got {self.min_silhouette!r}")
        for name, least in (("neighbours", 1), ("references", 1), ("min_cluster_size", 2)):
            value = getattr(self, name)
            if not _whole(value) or value < least:
                raise ValueError(f"{GROUP}.{name} must be a whole number >= {least}, "
                                 f"got {value!r}")

    @classmethod
    def of(cls, value: ClusterCount | Mapping[str, Any] | None,
           default: ClusterCount | None = None) -> ClusterCount:
        """The group from a config's mapping (or itself); the keys it leaves out come from
        `default`, the method's own group (else the class's defaults); a mapping that fixes
        `k` takes no selector from it. An unknown key fails naming it."""
        if isinstance(value, cls):
            return value
        base = default if default is not None else cls()
        if value is None:
            return base
        if not isinstance(value, Mapping):
            raise ValueError(f"{GROUP} must be a mapping of its options, got {value!r}")
        known = [f.name for f in fields(cls)]
        for key in value:
            if key not in known:
                raise ValueError(f"unknown option {GROUP}.{key}; valid: {', '.join(known)}")
        inherited = {name: getattr(base, name) for name in known}
        if value.get("k") is not None and "selector" not in value:
            inherited["selector"] = cls().selector
        return cls(**{**inherited, **value})

    @property
    def params(self) -> dict[str, Any]:
        """The selector's own parameters."""
        return {name: getattr(self, name) for name in SELECTOR_PARAMS[self.selector]}

    def choose(self, d: np.ndarray, labels_for_k: Callable[[int], np.ndarray]) -> np.ndarray:
        """K from the distance matrix d by the selector: labels 0..K-1 by first appearance;
        `labels_for_k(k)` is the method's own clustering into k."""
        return selectors.select(self.selector, d, labels_for_k, self.k_max, self.params)


# The default of the methods that cut one round of every client's updates of one model (IFCA
# with k from the data, FL+HC): the silhouette rule; where it finds no cluster, the gap
# statistic says whether there are any and the widest mean silhouette how many. With label
# skew inside clusters the clusters' silhouettes fall under the rule's 0.25 while the gap
# statistic still sees the clusters, but its own K cuts a large cluster into several; on the
# clean tier the rule's clusters stand (docs/benchmark.md, "Selectors for the update-based
# methods").
UPDATES_K_CHOICE = ClusterCount(selector="silhouette_gap_width")


def grouped_options(options: Mapping[str, Any], aliases: Mapping[str, str] | None = None
                    ) -> dict[str, Any]:
    """A method's options with the flat keys of the group (and the method's `aliases` of
    them, e.g. {"n_clusters": "k"}) moved into `k_choice`; a key set both ways fails."""
    names = {**{key: key for key in FLAT_KEYS}, **(aliases or {})}
    out = dict(options)
    flat = {names[key]: out.pop(key) for key in list(out) if key in names}
    if not flat:
        return out
    group = out.get(GROUP)
    if isinstance(group, ClusterCount):
        group = {f.name: getattr(group, f.name) for f in fields(group)}
    group = dict(group or {})
    for key, value in flat.items():
        if key in group:
            raise ValueError(f"{key} is set twice, flat and as {GROUP}.{key}; keep "
                             f"{GROUP}.{key}")
        group[key] = value
    out[GROUP] = group
    return out


def options_for(cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` as method `cls` takes them: where it has the group, the flat keys (and its
    `k_aliases`) moved into `k_choice`; a key set both ways fails."""
    if GROUP not in (accepted_keys(cls) or ()):
        return dict(options)
    return grouped_options(options, getattr(cls, "k_aliases", None))

"""Building a federation from a dataset and the config's scenario section.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from clusterfed.data import partition as part
from clusterfed.data.datasets import Dataset
from clusterfed.data.federation import ClientData, Federation
from clusterfed.data.scenarios.assignment import Assignment, ClientSpec, ScenarioPlan
from clusterfed.data.scenarios.drift import drift_spec, drifted
from clusterfed.data.scenarios.overlays import make_overlays
from clusterfed.data.transforms import Chain
from clusterfed.errors import ConfigError
from clusterfed.registry import Registry, accepted_keys, check_keys

ScenarioFn = Callable[..., ScenarioPlan]
SCENARIOS: Registry[ScenarioFn] = Registry("scenario")
COMMON_KEYS = {"kind", "clients", "clusters", "samples_per_client", "test_samples_per_client",
               "test", "quantity_skew", "clients_per_cluster", "drift", "corruption",
               "label_noise"}
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
    drift = scenario.pop("drift", None)
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
    corruption, label_noise = scenario.pop("corruption", None), scenario.pop("label_noise", None)

    def scenario_plan(assign: Assignment) -> ScenarioPlan:
        # The same stream each time: a plan again draws its clusters' parameters alike (drift).
        return fn(dataset, assign=assign, rng=np.random.default_rng([seed, 0x5CE7]), **scenario)

    first = scenario_plan(assign)
    # Decided once from the first plan: a drifting client keeps its corruption and noise.
    overlays = make_overlays(dataset, first, corruption=corruption, label_noise=label_noise,
                             seed=seed)

    def planned(assign: Assignment) -> ScenarioPlan:
        return overlays.apply(scenario_plan(assign))

    plan = overlays.apply(first)
    info = {**plan.info, "test": test}
    if skew is not None:
        info["quantity_skew"] = skew
    if sizes is not None and len({spec.cluster for spec in plan.clients}) == len(sizes):
        info["clients_per_cluster"] = list(sizes)
    federation = materialise(dataset, replace(plan, info=info))
    if drift is None:
        return federation
    spec = drift_spec(drift, federation.true_clusters, np.random.default_rng([seed, 0x5CE7, 2]))
    return drifted(federation, plan, spec, assign, planned,
                   lambda client: client_data(dataset, client), str(kind))


def client_data(dataset: Dataset, spec: ClientSpec) -> ClientData:
    """One client's arrays: its samples under its transform, then its extras (overlays)."""
    train, test = spec.transform, spec.transform
    if spec.train_extra is not None:
        train = Chain((train, spec.train_extra))
    if spec.test_extra is not None:
        test = Chain((test, spec.test_extra))
    return ClientData(
        train_x=_to_float(train.apply_x(dataset.train_x[spec.train_idx])),
        train_y=train.apply_y(dataset.train_y[spec.train_idx]).astype(np.int64),
        test_x=_to_float(test.apply_x(dataset.test_x[spec.test_idx])),
        test_y=test.apply_y(dataset.test_y[spec.test_idx]).astype(np.int64),
    )


def materialise(dataset: Dataset, plan: ScenarioPlan) -> Federation:
    out = [client_data(dataset, spec) for spec in plan.clients]
    true = np.array([s.cluster for s in plan.clients], dtype=np.int64)
    n_classes = plan.n_classes if plan.n_classes is not None else dataset.n_classes
    groupings = {name: np.asarray(g, dtype=np.int64) for name, g in plan.groupings.items()}
    return Federation(out, true, n_classes, dataset.input_shape, plan.info,
                      groupings=groupings)


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

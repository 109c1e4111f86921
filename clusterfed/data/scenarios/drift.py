"""Drift over time: from a round on, some clients hold data of another true cluster.

FlexCFL's client-level distribution shift (Duan et al., IEEE TPDS 2022): mid-training, some
clients' data switch to another group's distribution and a clustered method must migrate
them. The authors' code swaps data between random clients with a probability every round;
here the switch is one event at one round, so every round's truth is known and its
clustering can be scored against it (ARI before and after the switch).

`scenario.drift: {round: R, clients: N | fraction | [ids], to: next | J | [J per client]}`
applies to every scenario that places clients in true clusters. The scenario is planned
twice from the same seed: as configured (before R), and with the drifting clients placed in
their new clusters (`Assignment.membership`). A scenario draws its clusters' parameters
(label pairs, permutations, angles, label groups) before it shares out the data, so both plans
give each cluster the same distribution (checked here on the clusters' transforms). A drifting
client takes its data from the second plan: samples drawn as that plan gives them to a client
of the new cluster, under the new cluster's transform (its label map, its angle), train and
test alike; they may overlap other clients' samples. Every other client keeps its arrays.
What the server knows before round 0 (`Setup.num_samples`) stays the first phase's counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from clusterfed.data.federation import ClientData, Drift, Federation
from clusterfed.data.scenarios.assignment import Assignment, ClientSpec, ScenarioPlan
from clusterfed.errors import ConfigError
from clusterfed.registry import check_keys

DRIFT_KEYS = {"round", "clients", "to"}
# Facts of a plan's info that describe clients, not clusters: they change when clients move.
PER_CLIENT_FACTS = {"label_sets", "dirichlet_draws"}


@dataclass(frozen=True)
class DriftSpec:
    """Checked `scenario.drift`: the first round on the new data (1-based), who drifts, where."""

    round: int
    clients: tuple[int, ...]      # sorted client ids
    before: tuple[int, ...]       # their true cluster before the round
    to: tuple[int, ...]           # and from it on

    def truth_after(self, truth: np.ndarray) -> np.ndarray:
        after = truth.copy()
        after[list(self.clients)] = self.to
        return after

    def info(self) -> dict[str, Any]:
        return {"round": self.round, "clients": list(self.clients), "from": list(self.before),
                "to": list(self.to)}


def drift_spec(raw: Any, truth: np.ndarray, rng: np.random.Generator) -> DriftSpec:
    """`scenario.drift` checked against the scenario's true clusters; `rng` draws the drifting
    clients when a count or a fraction is given."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"scenario.drift must be a mapping such as {{round: 10, clients: 0.2, "
                          f"to: next}}, got {raw!r}")
    check_keys("scenario.drift", raw, DRIFT_KEYS)
    k = int(truth.max()) + 1 if len(truth) else 0
    if k < 2 or (truth < 0).any():
        raise ConfigError("scenario.drift moves clients to another true cluster: the scenario "
                          f"needs at least 2 true clusters, it has {max(k, 0)} (use label_swap, "
                          "rotation, label_groups, ... with scenario.clusters >= 2)")
    first = raw.get("round")
    if isinstance(first, bool) or not isinstance(first, int) or first < 2:
        raise ConfigError(f"scenario.drift.round is the first round (1-based) on the new data, "
                          f"a whole number >= 2; got {first!r}")
    clients = _drifting(raw.get("clients"), len(truth), rng)
    before = tuple(int(truth[i]) for i in clients)
    to = _targets(raw.get("to", "next"), before, k)
    spec = DriftSpec(first, clients, before, to)
    after = spec.truth_after(truth)
    empty = sorted(set(range(k)) - set(after.tolist()))
    if empty:
        raise ConfigError(f"scenario.drift would leave true cluster(s) {empty} without clients; "
                          f"drift fewer clients or name them (scenario.drift.clients: [ids])")
    return spec


def _drifting(raw: Any, n: int, rng: np.random.Generator) -> tuple[int, ...]:
    """The drifting clients: a count or a fraction (drawn at random), or a list of ids."""
    if raw is None:
        raise ConfigError("scenario.drift.clients is required: a count, a fraction in (0, 1) "
                          "or a list of client ids")
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        ids = [v for v in raw]
        if not ids or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n
                              for v in ids) or len(set(ids)) != len(ids):
            raise ConfigError(f"scenario.drift.clients must be distinct client ids in 0..{n - 1}, "
                              f"got {list(raw)}")
        return tuple(sorted(int(v) for v in ids))
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ConfigError(f"scenario.drift.clients must be a count, a fraction in (0, 1) or a "
                          f"list of client ids, got {raw!r}")
    if isinstance(raw, float):
        if not 0 < raw < 1:
            raise ConfigError(f"scenario.drift.clients as a fraction must be in (0, 1), got {raw}")
        count = max(1, int(round(raw * n)))
    else:
        count = int(raw)
    if not 1 <= count <= n:
        raise ConfigError(f"scenario.drift.clients: cannot drift {count} of {n} clients")
    return tuple(sorted(int(i) for i in rng.choice(n, count, replace=False)))


def _targets(raw: Any, before: Sequence[int], k: int) -> tuple[int, ...]:
    """Each drifting client's new cluster: `next` (j -> j + 1 mod k), one cluster for all,
    or one per client; never the cluster it is in."""
    if raw == "next":
        return tuple((c + 1) % k for c in before)
    if isinstance(raw, int) and not isinstance(raw, bool):
        to = [raw] * len(before)
    elif isinstance(raw, Sequence) and not isinstance(raw, str):
        to = list(raw)
        if len(to) != len(before):
            raise ConfigError(f"scenario.drift.to lists {len(to)} clusters for "
                              f"{len(before)} drifting clients")
    else:
        raise ConfigError(f"scenario.drift.to must be 'next', a true cluster or a list of them "
                          f"(one per drifting client), got {raw!r}")
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < k for c in to):
        raise ConfigError(f"scenario.drift.to must name true clusters 0..{k - 1}, got {raw!r}")
    if any(c == b for c, b in zip(to, before, strict=True)):
        raise ConfigError(f"scenario.drift.to must move each client to another cluster; the "
                          f"clients are in {list(before)}, the targets {list(to)}")
    return tuple(int(c) for c in to)


def drifted(before: Federation, plan: ScenarioPlan, spec: DriftSpec, assign: Assignment,
            replan: Callable[[Assignment], ScenarioPlan],
            client_data: Callable[[ClientSpec], ClientData], kind: str) -> Federation:
    """`before` (the federation `plan` made) with its drift: `replan` plans the scenario again
    with the drifting clients in their new clusters; they take that plan's data."""
    truth = spec.truth_after(before.true_clusters)
    again = replan(replace(assign, membership=tuple(int(c) for c in truth)))
    if [s.cluster for s in again.clients] != truth.tolist():
        raise ConfigError(f"scenario '{kind}' sets its clients' true clusters itself (natural "
                          f"clusters): scenario.drift does not apply to it")
    if again.n_classes != plan.n_classes:
        raise ConfigError(f"scenario '{kind}' relabels to {again.n_classes} labels when planned "
                          f"again, {plan.n_classes} before: scenario.drift cannot use it")
    changed = [f"the transform of cluster {j}" for j in range(int(truth.max()) + 1)
               if next(s.transform for s in plan.clients if s.cluster == j)
               != next(s.transform for s in again.clients if s.cluster == j)]
    changed += [f"info {key!r}" for key in sorted(plan.info.keys() & again.info.keys())
                if key not in PER_CLIENT_FACTS and plan.info[key] != again.info[key]]
    if changed:
        raise ConfigError(f"scenario '{kind}' planned again with the drifting clients moved "
                          f"changed {', '.join(changed)}: it draws its clusters' parameters "
                          f"after sharing out the data, so scenario.drift cannot use it")
    clients = list(before.clients)
    for i in spec.clients:
        clients[i] = client_data(again.clients[i])
    info = {**before.info, "drift": spec.info()}
    # Second groupings (a corruption, noisy labels) belong to the clients: they stay.
    after = Federation(clients, truth, before.n_classes, before.input_shape, info,
                       groupings=before.groupings)
    return replace(before, info=info, drift=Drift(spec.round, spec.clients, after))


def refuse_drift(config: Mapping[str, Any], where: str,
                 federation: Federation | None = None) -> None:
    """scenario.drift switches the clients' data at a round, which only the simulator's own
    executors do (rebuilt on the new data); refuse it where the data stay put."""
    if config.get("scenario", {}).get("drift") is not None or (
            federation is not None and federation.drift is not None):
        raise ConfigError(f"scenario.drift is not supported {where}: the clients' data switch "
                          f"at a round only in the simulator with its own executor "
                          f"(run.executor); drop scenario.drift or run `clusterfed run`")

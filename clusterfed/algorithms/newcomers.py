"""Newcomers for any algorithm: clients that sit the federation out and arrive at one round.

PACFL's Table 3 protocol (pacfl.md 2.6), for the methods that have no arrival rule of their
own: the listed clients are never trained before `join_round` (each round's sample skips them,
as PACFL's own newcomers); in round `join_round` (0-based) each one receives a model and, with
`finetune`, trains it locally once (Alg. 3 line 6; nothing goes back to the server), or
`finetune_rounds` times in a row, each a round's local training from where the last ended with
a fresh optimiser (the authors' SOLO trains its unseen clients 5 such times: rounds=5 in
unseen_clients/solo.sh). That round is the newcomers' alone: the federation does not train in
it, and after it the newcomers stay out of the federation (the table's clients are unseen), so
a run normally ends there.

Which model a newcomer receives (`join`):
- "least_loss" (default): the model of least loss on the newcomer's training data among the
  models the federation shares: IFCA's cluster estimate (Ghosh et al. Alg. 1 line 3), for every
  method whose view has fewer models than old clients and at least two. A view of one model
  (FedAvg and friends) or of a model a client (LG-FedAvg's, Local's) has nothing to choose:
  there it is "served".
- "served": the model the algorithm serves any client it has never trained (its `clusters`).
A mixture method (FedEM, FedRC) keeps its own weights for the newcomer under "served"; under
"least_loss" the newcomer is served its least-loss model alone.

Methods with their own arrival rule (class attribute `own_newcomers`: PACFL, CFL) are not
wrapped; `build_algorithm` hands them the clients and the round as their options instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from clusterfed.algorithms.base import Algorithm, ClusterView, RoundContext, Setup, Update
from clusterfed.errors import ConfigError
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

# How a newcomer gets its model (the module docstring); the config's `newcomers.join`.
JOIN_RULES = ("least_loss", "served")

NOT_JOINED = -1


@serialisable
@dataclass(frozen=True)
class NewcomersState:
    base: Any
    # Per newcomer (in `clients` order): the index into the base view's models it was given
    # by "least_loss", NOT_JOINED before arrival or where the base serves it.
    given: np.ndarray
    # Between the fine-tuning steps of the arrival round (finetune_rounds > 1): each newcomer's
    # model so far, in `clients` order; None otherwise.
    tuned: np.ndarray | None = None
    tuned_rounds: int = 0


def newcomer_ids(config: Mapping[str, Any]) -> list[int]:
    """The run's newcomers: the `newcomers` section's, else its algorithm's own option."""
    section = config.get("newcomers") or {}
    return [int(c) for c in (section.get("clients")
                             or config.get("algorithm", {}).get("newcomers") or [])]


def newcomer_figures(record: Mapping[str, Any], ids: Sequence[int]) -> dict[str, Any]:
    """The newcomers' mean accuracies in an evaluated record (or a summary's `final`): their
    own models' and, where scored, their served models' (`cluster_per_client_accuracy`)."""
    figures: dict[str, Any] = {"clients": list(ids), "mean_accuracy": float(
        np.mean(np.asarray(record["per_client_accuracy"])[list(ids)]))}
    if record.get("cluster_per_client_accuracy"):
        figures["cluster_mean_accuracy"] = float(np.mean(
            np.asarray(record["cluster_per_client_accuracy"])[list(ids)]))
    return figures


@dataclass(frozen=True)
class Newcomers:
    """`base` run without `clients` until `join_round`, when they arrive (module docstring)."""

    base: Algorithm[Any]
    clients: tuple[int, ...]
    join_round: int
    finetune: bool = True
    join: str = "least_loss"
    finetune_rounds: int = 1
    late: frozenset[int] = field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        if self.join not in JOIN_RULES:
            raise ValueError(f"join must be one of {', '.join(JOIN_RULES)}, got {self.join!r}")
        if not self.clients or self.join_round < 1:
            raise ValueError("newcomers need at least one client and a join_round >= 1")
        if self.finetune_rounds < 1:
            raise ValueError(f"finetune_rounds must be at least 1, got {self.finetune_rounds}")
        object.__setattr__(self, "late", frozenset(self.clients))

    def __getattr__(self, name: str) -> Any:
        # The base's optional parts (adaptation, soft_assignment, sees, ...) are the run's.
        if name.startswith("__") or name in ("base", "late"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def init(self, setup: Setup) -> NewcomersState:
        for c in self.clients:
            if not 0 <= c < setup.num_clients:
                raise ConfigError(f"newcomer {c} does not exist (there are "
                                  f"{setup.num_clients} clients)")
        if len(self.late) == setup.num_clients:
            raise ConfigError("every client is a newcomer: nobody federates before they arrive")
        return NewcomersState(self.base.init(setup),
                              np.full(len(self.clients), NOT_JOINED, dtype=np.int64))

    # The federation, without the newcomers --------------------------------------------------

    def _federation(self, ctx: RoundContext) -> RoundContext:
        return replace(ctx, sampled=ctx.sampled[~np.isin(ctx.sampled, self.clients)])

    def _candidates(self, view: ClusterView) -> np.ndarray:
        """The models a newcomer chooses from by loss: all of a view of shared models, none
        of a view with one model or one a client."""
        old = len(view.assignment) - len(self.late)
        if self.join != "least_loss" or not 2 <= len(view.models) < old:
            return np.zeros(0, dtype=np.int64)
        return np.arange(len(view.models))

    def plan(self, state: NewcomersState, ctx: RoundContext) -> list[ClientTask]:
        if ctx.round != self.join_round:
            # A base that plans beyond the sample (Local's every client, IFCA's selection
            # round) still never reaches a newcomer: they are not there.
            return [t for t in self.base.plan(state.base, self._federation(ctx))
                    if t.client not in self.late]
        view = self.base.clusters(state.base)
        candidates = self._candidates(view)
        if ctx.step == 0 and len(candidates):
            return [ClientTask(c, TaskKind.LOSSES, view.models[candidates],
                               meta={"newcomer": 1}) for c in self.clients]
        if not self.finetune:
            return []
        starts = self._starts(state)
        return [ClientTask(c, TaskKind.TRAIN, starts[i], ctx.train,
                           {"newcomer": 1, "finetune": 1}) for i, c in enumerate(self.clients)]

    def _starts(self, state: NewcomersState) -> list[np.ndarray]:
        """Where each newcomer's next fine-tuning starts: the model it was given, then where its
        last fine-tuning ended."""
        if state.tuned is not None:
            return list(state.tuned)
        served = self.clusters(state)
        return [served.models[served.assignment[c]] for c in self.clients]

    def update(self, state: NewcomersState, ctx: RoundContext,
               results: Sequence[ClientResult]) -> Update:
        if ctx.round != self.join_round:
            upd = self.base.update(state.base, self._federation(ctx), results)
            return replace(upd, state=replace(state, base=upd.state))
        losses = {r.client: r.losses for r in results if r.kind is TaskKind.LOSSES}
        if losses:   # the arrival's first step: each newcomer's least-loss shared model
            candidates = self._candidates(self.base.clusters(state.base))
            given = state.given.copy()
            for i, c in enumerate(self.clients):
                if c in losses and losses[c] is not None:
                    given[i] = int(candidates[int(np.argmin(losses[c]))])
            event = {"type": "newcomers", "rule": "least_loss", "clients": list(self.clients),
                     "candidates": candidates.tolist(), "given": given.tolist(),
                     "losses": [np.round(np.asarray(losses[c]), 6).tolist() if c in losses
                                else None for c in self.clients]}
            return Update(replace(state, given=given),
                          {"newcomers": {"joined": int(np.sum(given != NOT_JOINED))}},
                          [event], round_done=not self.finetune)
        trained = {r.client: r for r in results if r.kind is TaskKind.TRAIN}
        events = [] if ctx.step else [{"type": "newcomers", "rule": "served",
                                       "clients": list(self.clients)}]
        done = state.tuned_rounds + 1
        metrics = {"newcomers": {"finetuned": len(trained), "finetune_round": done}}
        if done >= self.finetune_rounds:
            return Update(replace(state, tuned=None, tuned_rounds=0), metrics, events)
        starts = self._starts(state)
        # A newcomer whose training failed keeps its start (the runtime drops non-finite results).
        tuned = np.stack([starts[i] + trained[c].update if c in trained
                          and trained[c].update is not None else starts[i]
                          for i, c in enumerate(self.clients)])
        return Update(replace(state, tuned=tuned, tuned_rounds=done), metrics, events,
                      round_done=False)

    def clusters(self, state: NewcomersState) -> ClusterView:
        view = self.base.clusters(state.base)
        joined = state.given != NOT_JOINED
        if not joined.any():
            return view
        ids = np.asarray(self.clients)[joined]
        assignment = view.assignment.copy()
        assignment[ids] = state.given[joined]
        weights = None
        if view.weights is not None:   # served its one model alone
            weights = view.weights.copy()
            weights[ids] = np.eye(len(view.models))[state.given[joined]]
        return ClusterView(view.models, assignment, weights)

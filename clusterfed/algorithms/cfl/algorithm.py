"""CFL: Clustered Federated Learning (Sattler, Müller, Samek, 2020).

Algorithm 5 is the engine: every cluster runs FedAvg in lock-step rounds; a cluster whose mean
update is small (the FL objective is near a stationary point, Eq. 32) while some client's
update is still large (Eq. 33) is bipartitioned by the cosine similarity of its members'
updates (Algorithm 1), and the split is kept if the separation test holds
(gamma_max < sqrt((1 - alpha_cross_max) / 2), Eq. 39). Clusters are never merged.

Every split is recorded in the parameter tree (Section V-C): each node keeps its members, the
model it split from and the round; each edge keeps the pre-split updates of the child's
members (Eq. 47), which route newcomers down the tree (Algorithm 4, index typo fixed).

Spec choices (../shared/specs/cfl.md, section 7): weighted averaging by default (A1); absolute
or scale-free split thresholds (A2); gamma_max 0.1 (A3); the optimal bipartition, or complete
linkage as in the authors' code (A7); splits only when every member of the cluster reported
this round (A9) is `split_on="fresh"`; by default every member's latest update is tested
instead (`"latest"`, the spec's other option), so that a cluster larger than a round's sample
can split, as the PACFL authors' copy of CFL does. After a split each child applies its own
members' mean update (A6). Algorithm
3 (train each cluster to its own stationary point, then test) is `mode="alg3"`: the same
engine, with each child restarting from theta*_parent as the recursion does (A5).

Defaults that find the clusters (an extension): the paper assumes a noise bound gamma_max and
thresholds eps1/eps2 read off a plot. By default the trigger is the scale-free norm rule (A2)
and a bipartition is kept only if the gamma estimated from the similarities themselves
(`cfl_math.estimated_gamma`, Eq. 38 read backwards) is below `gamma_ratio` of Eq. 39's bound,
on the similarity averaged over `similarity_memory` rounds: noise in one round's updates does
not persist, a cluster structure does. `acceptance="fixed"` is the paper's test (the paper
presets use it). Once a bipartition is kept, each side is tested again in the same round on
the similarities centred on it (`split_into="groups"`, the default with "estimated"), so a
federation of several clusters splits in one round instead of one split per settled cluster,
which under partial participation may take longer than the run; `split_into="two"` is the
paper's, which the paper presets (and acceptance "fixed") use (measured: docs/benchmark.md).

Under partial participation (split_on "latest") a round's test sees most members' updates
repeated from earlier tests, and tested every round a settled cluster of one distribution
sooner or later draws a bipartition past the margin by chance (MNIST label swap, 30 %: a true
cluster of 10 split 6 / 4 at round 42). Such a split stands only once bipartitions that nest
(one side of one inside a side of the other, as cuts of one tree of groups are) have been
accepted on `confirmations` tests of the cluster in a row; noise draws crossing ones.

What it can see: incongruent distributions, which no one model fits together, so that the
clients' updates still point apart at the joint model's stationary point: concept shift
(label swaps, permutations). Label groups are congruent in the paper's sense (Fig. 7: digits
0-4 and 5-9 need no split), and rotations are for a model of enough capacity; CFL splits
them when the model or the training budget leaves them apart, but makes no claim there
(measured in docs/benchmark.md: it may split a small cluster once more, or stop one split
short).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from clusterfed.algorithms.aggregate import (
    Weighting,
    aggregation_weights,
    weighted_mean,
)
from clusterfed.algorithms.base import (
    ALGORITHMS,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    check_choices,
)
from clusterfed.algorithms.cfl import maths as cfl_math
from clusterfed.algorithms.cfl.cache import latest_gram, latest_updates, remember_updates
from clusterfed.algorithms.cfl.memory import remember_similarity
from clusterfed.algorithms.cfl.tree import (
    join_leaf,
    leaf_index,
    path_models,
    remove_clients,
    route_one_level,
    split_leaf,
)
from clusterfed.clustering.similarity import (
    cosine_from_gram,
    cosine_similarity_matrix,
)
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

NOT_JOINED = -1
# split_into "groups" tests a side again only from this size: centring m directions pulls
# their cosines down by about 1/(m-1), which on a few clients shows pairs that are not there
# (MNIST label swap at 30 % participation split a side of 4 into 2 + 2).
MIN_CENTRED_SIDE = 6


@serialisable
@dataclass(frozen=True)
class Node:
    """A node of the parameter tree: a cluster CFL computed at some point."""

    members: np.ndarray                  # client ids
    parent: int                          # -1 for the root
    children: tuple[int, ...] = ()
    split_round: int = -1                # the round it split in (0-based), -1 while a leaf
    model: np.ndarray | None = None      # theta*_v: the model its children split from
    edge_updates: np.ndarray | None = None  # Delta_e of the edge parent -> node (Eq. 47)


@serialisable
@dataclass(frozen=True)
class CFLState:
    nodes: tuple[Node, ...]
    leaves: np.ndarray                   # node ids of the current clusters
    models: np.ndarray                   # (len(leaves), d): the current cluster models
    client_node: np.ndarray              # each client's leaf, or its place while routed
    joined: np.ndarray                   # bool: takes part in training
    last_split: np.ndarray               # per leaf: the round it was created (-1: initial)
    max_norms: dict[int, np.ndarray] = field(default_factory=dict)  # per leaf, recent rounds
    streaks: dict[int, int] = field(default_factory=dict)  # per leaf: rounds criteria held
    # Per leaf: the similarity matrix averaged over recent rounds (acceptance "estimated"),
    # and how many rounds it holds.
    similarities: dict[int, np.ndarray] = field(default_factory=dict)
    similarity_rounds: dict[int, int] = field(default_factory=dict)
    # Per leaf, split_on "latest": each reporting member's latest update here, by client (a
    # round replaces its reporters' rows without copying every member's: 0.2 GB at 10,000
    # clients of a 5,000-parameter model), and per member (member order) the round it was
    # made (-1: none yet) and its sample count.
    latest_updates: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    latest_rounds: dict[int, np.ndarray] = field(default_factory=dict)
    latest_samples: dict[int, np.ndarray] = field(default_factory=dict)
    # ... and the Gram matrix of those updates (member order), kept from the first round a
    # split is tested on them so that a round recomputes only its reporters' rows.
    latest_grams: dict[int, np.ndarray] = field(default_factory=dict)
    # split_on "fresh": whether this run has said that a partial round blocks the split test
    # (kept here, not in the warnings registry, which other libraries' filters reset).
    warned_partial: bool = False
    # split_on "latest", partial rounds: per leaf, the side (client ids) holding the first
    # member of the bipartition accepted on the leaf's last tests, and on how many in a row.
    accepted_sides: dict[int, np.ndarray] = field(default_factory=dict)
    accepted_count: dict[int, int] = field(default_factory=dict)


PARTIAL_ROUND_WARNING = (
    "CFL with split_on=fresh tests a split only on a round where every member of the cluster "
    "reports (spec A9), and some did not: under partial participation a cluster larger than "
    "a round's sample never splits. split_on=latest (the default) tests each member's latest "
    "update instead.")


@ALGORITHMS.register("cfl", report=".report")
@dataclass(frozen=True)
class CFL:
    eps1: float | None = None           # split when the cluster's mean update norm is below
    eps2: float | None = None           # ... and its largest client update norm is above
    rho: float | None = 0.25            # scale-free rule (A2): mean_norm / max_norm < rho
    stagnation_window: int = 5          # ... and the max norm has not fallen over this many
    stagnation_tolerance: float = 0.1   # ... rounds by more than this fraction
    # Which bipartitions are kept: "estimated" (default) tests Eq. 39 with gamma estimated
    # from the similarities (gamma_hat < gamma_ratio x bound); "fixed" is the paper's test
    # with the assumed gamma_max, which the paper presets use.
    acceptance: str = "estimated"
    gamma_ratio: float = 0.95
    similarity_memory: int = 5          # "estimated": rounds the similarity is averaged over
    gamma_max: float = 0.1              # Eq. 39 ("fixed"); 0 accepts every split (authors' code)
    bipartition: str = "optimal"        # Algorithm 1, or "complete" linkage (authors' code)
    weighting: Weighting = "samples"    # FedAvg weights (A1); "uniform" as Algorithm 5 prints
    mode: str = "alg5"                  # "alg3": children restart from theta*_parent (A5, A6)
    warmup_rounds: int = 0              # no split before this round (0-based)
    min_rounds_between_splits: int = 0  # per cluster, since the split that created it
    min_split_size: int = 2             # clusters smaller than this never split (A8)
    # "groups": an accepted bipartition's sides are tested again at once, on the same
    # similarities centred on each side (`cfl_math.centred_similarity`), and split while the
    # test holds, so the clusters come in one round; "two": one bipartition, each child
    # tested only after it settles (the paper's Algorithm 5, the paper presets'). "groups"
    # needs acceptance "estimated" (a fixed gamma_max would accept a split of the centred
    # noise of one distribution). None (default): "groups" with "estimated", else "two".
    split_into: str | None = None
    min_child_size: int = 1             # reject bipartitions with a smaller side
    # split_on "latest": a test on a partial round (most members' latest updates repeated
    # from earlier tests) splits only once nesting bipartitions have been accepted on this many
    # of the leaf's tests in a row, each with new reports; noise draws crossing ones.
    # None: 3 with split_into "groups", 1 with "two" (the paper's test, unchanged).
    confirmations: int | None = None
    patience: int = 1                   # rounds in a row the norm criteria must hold (A4)
    similarity_from: str = "updates"    # or "gradients": full-batch gradients (Figs. 5, 6)
    # A9: "fresh" splits only on a round where every member reports (the paper assumes full
    # participation); "latest" tests every member's latest update at the cluster, stale by up
    # to the rounds since it was made (logged as `oldest_update`), once each member has one.
    # None (default): "latest", or "fresh" with similarity_from "gradients" (a gradient is
    # taken at this round's model). Whole rounds test on their own updates either way.
    split_on: str | None = None
    newcomers: Sequence[int] = ()       # clients that join late, routed by Algorithm 4
    join_round: int = 0
    leavers: Sequence[int] = ()         # clients that leave for good at leave_round
    leave_round: int = 0
    sees: ClassVar[frozenset[str]] = frozenset({"concept"})
    toy_mixture_options: ClassVar[dict[str, Any]] = {"rounds": 30}
    own_newcomers: ClassVar[bool] = True   # Alg. 4: the `newcomers` section sets its own
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {
        "bipartition": ("optimal", "complete"), "mode": ("alg5", "alg3"),
        "acceptance": ("estimated", "fixed"), "split_into": ("groups", "two"),
        "similarity_from": ("updates", "gradients"), "split_on": ("fresh", "latest")}
    newcomer_set: frozenset[int] = field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        if self.split_on is None:
            object.__setattr__(self, "split_on",
                               "fresh" if self.similarity_from == "gradients" else "latest")
        if self.split_into is None:
            object.__setattr__(self, "split_into",
                               "groups" if self.acceptance == "estimated" else "two")
        check_choices(self, self._kinds)
        aggregation_weights(np.ones(1), self.weighting)
        if self.split_into == "groups" and self.acceptance != "estimated":
            raise ValueError("split_into='groups' tests the sides on their estimated noise: "
                             "use acceptance='estimated', or split_into='two'")
        if (self.eps1 is None) != (self.eps2 is None):
            raise ValueError("give both eps1 and eps2 (absolute rule) or neither")
        if not 0.0 <= self.gamma_max < 1.0:
            raise ValueError("gamma_max must be in [0, 1)")
        if not 0.0 < self.gamma_ratio <= 1.0:
            raise ValueError("gamma_ratio must be in (0, 1]")
        if self.similarity_memory < 1:
            raise ValueError("similarity_memory must be at least 1 round")
        if self.min_split_size < 2:
            raise ValueError("min_split_size must be at least 2")
        if self.patience < 1:
            raise ValueError("patience must be at least 1")
        if self.confirmations is None:
            object.__setattr__(self, "confirmations", 3 if self.split_into == "groups" else 1)
        if isinstance(self.confirmations, bool) or not isinstance(self.confirmations, int) \
                or self.confirmations < 1:
            raise ValueError("confirmations must be at least 1")
        if self.split_on == "latest" and self.similarity_from == "gradients":
            raise ValueError("split_on='latest' tests cached updates; similarity_from="
                             "'gradients' needs every member's gradient at this round's model")
        object.__setattr__(self, "newcomer_set", frozenset(int(c) for c in self.newcomers))

    # init / plan ---------------------------------------------------------------------------

    def init(self, setup: Setup) -> CFLState:
        n = setup.num_clients
        for c in [*self.newcomers, *self.leavers]:
            if not 0 <= int(c) < n:
                raise ValueError(f"client {c} does not exist (there are {n})")
        joined = np.ones(n, dtype=bool)
        joined[list(self.newcomer_set)] = False
        root = Node(members=np.flatnonzero(joined), parent=-1)
        return CFLState(nodes=(root,), leaves=np.array([0]), models=setup.initial_params[None],
                        client_node=np.zeros(n, dtype=np.int64), joined=joined,
                        last_split=np.array([-1]))

    def plan(self, state: CFLState, ctx: RoundContext) -> list[ClientTask]:
        if ctx.step == 0:
            state = self._population_changes(state, ctx.round)
        tasks = []
        for c in ctx.sampled.tolist():
            if ctx.step == 0 and state.joined[c]:
                k = leaf_index(state, int(state.client_node[c]))
                meta = {"leaf": int(state.leaves[k])}
                tasks.append(ClientTask(c, TaskKind.TRAIN, state.models[k], ctx.train, meta))
                if self.similarity_from == "gradients":   # Eq. 50, at the same model
                    tasks.append(ClientTask(c, TaskKind.GRADIENT, state.models[k], meta=meta))
        for c in self._routing(state, ctx):
            node = state.nodes[int(state.client_node[c])]
            tasks.append(ClientTask(c, TaskKind.TRAIN, node.model, ctx.train,
                                    {"route": int(state.client_node[c])}))
        return tasks

    def _routing(self, state: CFLState, ctx: RoundContext) -> list[int]:
        """Newcomers still descending the tree (they train on every level, Algorithm 4)."""
        if ctx.round < self.join_round:
            return []
        return [c for c in sorted(self.newcomer_set) if not state.joined[c]
                and state.nodes[int(state.client_node[c])].children]

    def _population_changes(self, state: CFLState, rnd: int) -> CFLState:
        """Newcomers standing at a leaf join it; leavers leave (both at their rounds)."""
        if rnd == self.join_round:
            for c in sorted(self.newcomer_set):
                if not state.joined[c] and not state.nodes[int(state.client_node[c])].children:
                    state = join_leaf(state, c, int(state.client_node[c]))
        if rnd == self.leave_round and self.leavers:
            state = remove_clients(state, [int(c) for c in self.leavers])
        return state

    # update ----------------------------------------------------------------------------------

    def update(self, state: CFLState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        if ctx.step == 0:
            state = self._population_changes(state, ctx.round)
        metrics: dict[str, Any] = {}
        events: list[dict[str, Any]] = []
        by_leaf: dict[int, list[ClientResult]] = {}
        gradients: dict[int, dict[int, np.ndarray]] = {}
        routed = []
        for r in results:
            if "route" in r.meta:
                routed.append(r)
            elif r.kind is TaskKind.GRADIENT:
                gradients.setdefault(int(r.meta["leaf"]), {})[r.client] = r.update
            else:
                by_leaf.setdefault(int(r.meta["leaf"]), []).append(r)
        norms, diagnostics = {}, {}
        for leaf in state.leaves.tolist():
            group = by_leaf.get(leaf)
            if group:
                state, info, new_events, diag = self._cluster_round(
                    state, leaf, group, gradients.get(leaf, {}), ctx.round)
                norms[str(leaf)] = info
                events += new_events
                if diag:
                    diagnostics[str(leaf)] = diag
        if norms:
            metrics["cfl"] = norms
        for r in routed:
            state, event = route_one_level(state, r.client, int(r.meta["route"]), r.update)
            events.append(event)
        pending = ctx.round >= self.join_round and self._routing(state, ctx)
        return Update(state, metrics, events, round_done=not pending, diagnostics=diagnostics)

    def _cluster_round(self, state: CFLState, leaf: int, results: list[ClientResult],
                       gradients: dict[int, np.ndarray], rnd: int
                       ) -> tuple[CFLState, dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        """FedAvg inside one cluster, then the split test of Algorithm 5 (lines 14-22)."""
        k = leaf_index(state, leaf)
        results = sorted(results, key=lambda r: r.client)
        clients = np.array([r.client for r in results])
        updates = np.stack([r.update for r in results])
        samples = np.array([r.num_samples for r in results])
        weights = aggregation_weights(samples, self.weighting)
        mean_update = weighted_mean(updates, weights)
        mean_norm, max_norm = _norms(mean_update, updates)
        info: dict[str, Any] = {"mean_norm": mean_norm, "max_norm": max_norm,
                                "clients": len(results)}
        members = state.nodes[leaf].members
        everyone = len(results) == len(members)
        if (self.split_on == "fresh" and not everyone and len(members) >= self.min_split_size
                and not state.warned_partial):
            warnings.warn(PARTIAL_ROUND_WARNING, stacklevel=2)   # once a run
            state = replace(state, warned_partial=True)
        # What the split is tested on: this round's updates, or (split_on "latest", once every
        # member has reported here) each member's latest one, norms (Eqs. 32, 33) included.
        split_clients, split_updates, split_weights = clients, updates, weights
        test_mean_norm, test_max_norm = mean_norm, max_norm
        from_latest = False
        # The cache starts at the leaf's first partial round: until then every member's
        # latest update is this round's, and a whole-participation run keeps none.
        if self.split_on == "latest" and not (everyone and leaf not in state.latest_updates):
            state, complete = remember_updates(state, leaf, clients, updates, samples, rnd)
            if everyone:   # the test runs on this round's updates; the Gram would go stale
                state = replace(state, latest_grams={
                    v: g for v, g in state.latest_grams.items() if v != leaf})
            if complete and not everyone:
                split_updates, latest_samples, made = latest_updates(state, leaf)
                split_clients, from_latest, everyone = members, True, True
                split_weights = aggregation_weights(latest_samples, self.weighting)
                test_mean_norm, test_max_norm = _norms(
                    weighted_mean(split_updates, split_weights), split_updates)
                info.update(latest_mean_norm=test_mean_norm, latest_max_norm=test_max_norm,
                            oldest_update=int(rnd - made.min()))
        history = np.append(state.max_norms.get(leaf, np.zeros(0)), test_max_norm)
        history = history[-(self.stagnation_window + 1):]
        state = replace(state, max_norms={**state.max_norms, leaf: history})
        # The bipartition of this round's signals, logged every round (Figs. 5, 6, 8).
        bipartition, diagnostics = None, {}
        signals = (np.stack([gradients[c] for c in clients.tolist()])
                   if self.similarity_from == "gradients" and set(clients.tolist()) <= set(
                       gradients) else updates)
        if len(results) >= 2:
            similarity = cosine_similarity_matrix(signals)
            bipartition = self._bipartition(similarity)
            info.update(alpha_cross_max=bipartition[2], gamma_bound=cfl_math.gamma_max(
                bipartition[2]))
            diagnostics = {"similarity": similarity, "members": clients}
        tested, ready = diagnostics.get("similarity"), True
        if from_latest:
            state, gram = latest_gram(state, leaf, split_updates,
                                      np.searchsorted(members, clients))
            tested = cosine_from_gram(gram)
            bipartition = self._bipartition(tested)
        if self.acceptance == "estimated" and tested is not None and everyone:
            # Noise in one round's similarities averages out over rounds; a true cluster
            # structure persists. The split is tested on the average.
            state, tested, ready = remember_similarity(state, leaf, tested,
                                                       self.similarity_memory)
            bipartition = self._bipartition(tested)
        # One noisy round must not split a cluster when patience asks for several (A4).
        held = everyone and self._wants_split(state, k, len(members), test_mean_norm, history,
                                              rnd)
        streak = state.streaks.get(leaf, 0) + 1 if held else 0
        state = replace(state, streaks={**state.streaks, leaf: streak})
        events = []
        if held and ready and streak >= self.patience and bipartition is not None:
            split, event = self._try_split(tested, bipartition, split_clients)
            if from_latest:
                state, split = self._confirmed(state, leaf, split, split_clients, event)
            if tested is not diagnostics.get("similarity") and not from_latest:
                # the event shows this round's similarity too
                event["averaged_similarity"] = event["similarity"]
                event["similarity"] = np.round(diagnostics["similarity"], 5).tolist()
            event.update({"type": "split" if split else "split_rejected", "node": leaf,
                          "mean_norm": test_mean_norm, "max_norm": test_max_norm})
            events.append(event)
            if split is not None:
                state = split_leaf(state, leaf, split, split_updates, split_weights, rnd,
                                   restart=self.mode == "alg3")
                event["children"] = list(state.nodes[leaf].children)
                if self.split_into == "groups":
                    state, more = self._split_children(state, leaf, tested, split,
                                                       split_updates, split_weights, rnd)
                    events += more
                return state, info, events, diagnostics
        models = state.models.copy()
        models[k] = models[k] + mean_update
        return replace(state, models=models), info, events, diagnostics

    def _split_children(self, state: CFLState, node: int, similarity: np.ndarray,
                        parts: tuple[np.ndarray, np.ndarray], updates: np.ndarray,
                        weights: np.ndarray, rnd: int) -> tuple[CFLState, list[dict[str, Any]]]:
        """split_into "groups": test each side of an accepted split on its members' centred
        similarities and split it too where the test holds, down to sides that hold."""
        events: list[dict[str, Any]] = []
        for child, part in zip(state.nodes[node].children, parts, strict=True):
            part = np.sort(part)   # the child's members, in order
            if len(part) < max(self.min_split_size, 2 * self.min_child_size, MIN_CENTRED_SIDE):
                continue
            centred = cfl_math.centred_similarity(similarity[np.ix_(part, part)])
            # Each member's update as seen from the child's model (the child's mean removed).
            own = updates[part] - weighted_mean(updates[part], weights[part])[None]
            split, event = self._try_split(centred, self._bipartition(centred),
                                           state.nodes[child].members)
            event.update({"type": "split" if split else "split_rejected", "node": child,
                          "within_split_of": node})
            events.append(event)
            if split is not None:
                state = split_leaf(state, child, split, own, weights[part], rnd,
                                   restart=self.mode == "alg3")
                event["children"] = list(state.nodes[child].children)
                state, more = self._split_children(state, child, centred, split, own,
                                                   weights[part], rnd)
                events += more
        return state, events

    def _confirmed(self, state: CFLState, leaf: int,
                   split: tuple[np.ndarray, np.ndarray] | None, clients: np.ndarray,
                   event: dict[str, Any]) -> tuple[CFLState, tuple[np.ndarray, ...] | None]:
        """A split accepted on a partial round stands once bipartitions that nest (cuts of
        one tree of groups: several true groups may be cut off in turn) have been accepted on
        `confirmations` tests of the leaf in a row (counted here)."""
        if split is None:
            count, side = 0, None
        else:
            side = cfl_math.map_to_clients(clients, split[0])
            previous = state.accepted_sides.get(leaf)
            nested = previous is not None and cfl_math.bipartitions_nest(clients, previous, side)
            count = state.accepted_count.get(leaf, 0) + 1 if nested else 1
        sides = {v: x for v, x in state.accepted_sides.items() if v != leaf}
        counts = {v: n for v, n in state.accepted_count.items() if v != leaf}
        if side is not None:
            sides[leaf], counts[leaf] = side, count
        state = replace(state, accepted_sides=sides, accepted_count=counts)
        if split is not None and count < self.confirmations:
            event["reason"] = f"accepted on {count} of {self.confirmations} tests in a row"
            return state, None
        return state, split

    def _bipartition(self, similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Algorithm 1 (or complete linkage) and its alpha_cross_max (Eqs. 25, 17)."""
        if self.bipartition == "optimal":
            part_a, part_b = cfl_math.optimal_bipartition(similarity)
        else:
            part_a, part_b = cfl_math.complete_linkage_bipartition(similarity)
        return part_a, part_b, cfl_math.alpha_cross_max(similarity, part_a, part_b)

    def _wants_split(self, state: CFLState, k: int, size: int, mean_norm: float,
                     max_norms: np.ndarray, rnd: int) -> bool:
        if size < self.min_split_size or rnd < self.warmup_rounds:
            return False
        if state.last_split[k] >= 0 and rnd - state.last_split[k] < self.min_rounds_between_splits:
            return False
        if self.eps1 is not None and self.eps2 is not None:
            return cfl_math.norm_split_test(mean_norm, float(max_norms[-1]), self.eps1,
                                            self.eps2)  # Eqs. 32, 33
        if self.rho is None:        # no norm gate: the similarity test alone decides
            return True
        return cfl_math.scale_free_split_test(mean_norm, max_norms, ratio=self.rho,
                                              window=self.stagnation_window,
                                              tolerance=self.stagnation_tolerance)

    def _try_split(self, similarity: np.ndarray,
                   bipartition: tuple[np.ndarray, np.ndarray, float], clients: np.ndarray
                   ) -> tuple[tuple[np.ndarray, np.ndarray] | None, dict[str, Any]]:
        """The gamma_max acceptance test (Eq. 39) of this round's bipartition."""
        part_a, part_b, alpha = bipartition
        event: dict[str, Any] = {
            "alpha_cross_max": alpha, "gamma_bound": cfl_math.gamma_max(alpha),
            "members": clients.tolist(),
            "parts": [cfl_math.map_to_clients(clients, p).tolist() for p in (part_a, part_b)],
            "similarity": np.round(similarity, 5).tolist(),
        }
        small = min(len(part_a), len(part_b)) < self.min_child_size
        gamma_hat = cfl_math.estimated_gamma(similarity, part_a, part_b)
        event["gamma_hat"] = gamma_hat
        if self.acceptance == "estimated":
            separated = cfl_math.split_is_separated(similarity, part_a, part_b,
                                                    self.gamma_ratio)
        else:
            separated = cfl_math.split_is_admissible(alpha, self.gamma_max)
        if separated and not small:
            return (part_a, part_b), event
        event["reason"] = ("child too small" if small else "gamma_max test failed"
                           if self.acceptance == "fixed" else "estimated gamma test failed")
        return None, event

    # views -----------------------------------------------------------------------------------

    def path_models(self, state: CFLState, client: int) -> list[np.ndarray]:
        """The models on the client's root-to-leaf path, the FL model first."""
        return path_models(state, client)

    def clusters(self, state: CFLState) -> ClusterView:
        """Leaf models for members; a client not yet joined is served its current node's model."""
        extra_nodes = sorted({int(n) for n, j in zip(state.client_node, state.joined,
                                                     strict=True) if not j}
                             - set(state.leaves.tolist()))
        models = state.models
        if extra_nodes:
            models = np.concatenate([models, np.stack([state.nodes[n].model
                                                       for n in extra_nodes])])
        index = {int(n): i for i, n in enumerate([*state.leaves.tolist(), *extra_nodes])}
        return ClusterView(models, np.array([index[int(n)] for n in state.client_node]))


def _norms(mean_update: np.ndarray, updates: np.ndarray) -> tuple[float, float]:
    """The mean update's norm and the largest client update's (Eqs. 32, 33)."""
    return (float(np.linalg.norm(mean_update.astype(np.float64))),
            cfl_math.max_update_norm(updates))

"""IFCA: the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin, Ramchandran, 2020).

k cluster models theta_1..theta_k. Each round t (Algorithm 1):

  step 0  every sampled client i receives all k models and reports its training loss under
          each, F_i(theta_j); its cluster identity is j_hat = argmin_j F_i(theta_j) (line 6).
  step 1  option II, model averaging (default): client i runs LocalUpdate(theta_j_hat, gamma,
          tau) (Algorithm 2: local SGD, here `train`'s epochs or steps) and returns the result;
          the server sets theta_j to the mean of the models returned by the clients that chose j.
          option I, gradient averaging: client i returns its gradient g_i at theta_j_hat; the
          server steps theta_j <- theta_j - gamma / m * sum_{i chose j} g_i, with m the
          round's participants (the paper's m machines all take part).
  A cluster that no client chose keeps its model.

The paper's client takes the argmin itself and sends the one-hot s_i with its model; here the
server takes it from the k losses the client reports (a LOSSES task, step 0). The choice is the
same; the server sees k scalars more.

Initialisation (spec lcfl.md A16): the k models start apart, by k independent draws of the
model's own init scheme (`initialisation: random`, as the authors' MNIST code does) or by Gaussian
perturbations of one model (`perturbed`). `identical` starts them equal, as fl-sim (LCFL's code)
does: every loss ties and argmin sends every client to cluster 0, so IFCA collapses to FedAvg.
With `restarts` R > 1, R independent sets of k models run side by side for the first
`restart_rounds` rounds after any warm-up (each client picks and trains one model in every set);
then the set with the lowest loss sum_i n_i min_j F_i(theta_j) / sum_i n_i over that round's
clients is kept.

`warmup_rounds` W > 0 is the authors' "trained initialisation" (their FEMNIST code): the
clients are split into k random groups of equal size (one split per set), and for the first W
rounds each sampled client trains its group's model with no choice; IFCA's choices start at
round W, from k models that all learnt something.

k from the data (`k_choice: {k: null}`, the default; an extension, the paper fixes k): the
federation first trains one model for `select_round` rounds (FedAvg, as the warm-up above with
one group); then every client trains it once and the server clusters those updates as FL+HC's
default does (average linkage on cosine distances, cut into the K the k_choice selector
chooses, by default `silhouette_gap_width`, as FL+HC's: `selection.clusters_of_updates`, shared
with FedEM and FedRC, which cut the same way).
Each cluster found starts its model from the global model plus its members' mean update, and
IFCA goes on from those k models, every client choosing its model by loss each round as above.
This start is the authors' trained initialisation with groups found in the data instead of
drawn at random, which also spares IFCA the random starts that, with k given, make restarts
necessary. For `hold_rounds` (5) rounds after the clustering round each sampled client trains
its found cluster's model without choosing, as in that warm-up: the models freshly split from
one model differ little at first, and under label skew inside the clusters the first choices
by loss can undo the clusters found (docs/benchmark.md, "IFCA's hold"); `hold_rounds: 0`
lets the choices start at once.

With k given, the k models start the same way by default (`initialisation: updates`, an
extension): one model for `select_round` rounds, then every client's update, cut into k
clusters by the same average linkage on cosine distances. Random starts (`random`, the
paper's, with 3 restarts unless `restarts` says otherwise) often merge two clusters, and a
model nobody chooses never trains again (rotated MNIST, docs/benchmark.md "Realistic
federations: method fixes"); the paper presets name `initialisation: random`.

What it can see: any shift that makes one model's training loss differ between clients:
concept, feature and label shift (with k from the data; with k given and random starts it
often merges label-swap clusters, see above).

`clusters()` serves each client the model of its latest choice. A client never sampled yet has
no choice: it is served the cluster most clients chose so far (the one trained on most data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from clusterfed.algorithms.aggregate import Weighting, aggregation_weights, cluster_fedavg
from clusterfed.algorithms.base import (
    ALGORITHMS,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    check_choices,
)
from clusterfed.algorithms.choices import NEVER, initial_models, served_clusters
from clusterfed.algorithms.options import UPDATES_K_CHOICE, ClusterCount
from clusterfed.algorithms.selection import clusters_of_updates
from clusterfed.clustering.metrics import one_hot
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

_GROUP_TAG = 0x6A0B


@serialisable
@dataclass(frozen=True)
class IFCAState:
    models: np.ndarray        # (R, k, d): R candidate sets of k models; R = 1 after selection
    choice: np.ndarray        # (R, n): each client's latest cluster identity per set, -1 never
    chosen_round: np.ndarray  # (n,): the round of each client's latest choice, -1 never
    objective: np.ndarray     # (R,): each set's loss over the latest round's clients
    groups: np.ndarray        # (R, n): the random groups of the warm-up rounds
    selected: bool = True     # k from the data: whether it has been chosen yet


# The mathematics, as pure functions --------------------------------------------------------


def cluster_identities(losses: np.ndarray) -> np.ndarray:
    """j_hat = argmin_j F_i(theta_j) per row of an (m, k) loss matrix; ties go to the lowest j."""
    return np.argmin(losses, axis=-1)


def clustering_objective(losses: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_i w_i min_j F_i(theta_j) / sum_i w_i for (m, ..., k) losses: one value per set."""
    mins = losses.min(axis=-1)
    w = np.asarray(weights, dtype=np.float64)
    return np.tensordot(w / w.sum(), mins, axes=(0, 0))


def gradient_step(models: np.ndarray, gradients: np.ndarray, choice: np.ndarray,
                  weights: np.ndarray, lr: float, scale: str) -> np.ndarray:
    """Option I: theta_j <- theta_j - gamma sum_i s_ij w_i g_i / W.

    scale 'participants': W = sum of all participants' weights (the paper's gamma / m with
    unit weights); 'cluster': W = sum over the clients that chose j (a mean gradient step).
    """
    w = np.asarray(weights, dtype=np.float64)
    s = one_hot(choice, len(models)) * w[:, None]   # s_i (Algorithm 1, line 7)
    sums = s.T @ gradients.astype(np.float64)
    if scale == "participants":
        norm = np.full(len(models), w.sum())
    elif scale == "cluster":
        norm = s.sum(axis=0)
    else:
        raise ValueError(f"gradient_scale must be 'participants' or 'cluster', got {scale!r}")
    chosen = s.sum(axis=0) > 0
    out = models.astype(np.float64)
    out[chosen] -= lr * sums[chosen] / norm[chosen, None]
    return out.astype(np.float32)


def random_groups(num_clients: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A random split of the clients into k groups of sizes differing by at most one."""
    groups = np.empty(num_clients, dtype=np.int64)
    groups[rng.permutation(num_clients)] = np.arange(num_clients) % k
    return groups


# The algorithm ------------------------------------------------------------------------------

# Rounds a start from updates holds its clusters (measured, docs/benchmark.md, "IFCA's hold").
HOLD_ROUNDS = 5


@ALGORITHMS.register("ifca", report=".report")
@dataclass(frozen=True)
class IFCA:
    # k cluster models; k null: from the data, by the selector on the updates of round
    # select_round's one model (module docstring)
    k_choice: ClusterCount = UPDATES_K_CHOICE
    select_round: int = 10              # starts from updates: one model until this round
    aggregate: str = "models"           # option II; "gradients": option I
    gradient_scale: str = "participants"  # option I: gamma / m over participants, or "cluster"
    weighting: Weighting = "samples"    # w_i: local sample counts, or "uniform" (the paper's)
    # "updates" (k given: k clusters of one round of updates after select_round rounds of one
    # model) | "random" (the paper's) | "perturbed" | "identical" (the bug); not `init`, which
    # is the method. k from the data always starts from updates.
    initialisation: str = "updates"
    init_noise: float = 0.01            # perturbed: std as a fraction of the model's RMS
    restarts: int | None = None         # R sets of k models tried side by side; None: 3
                                        # for random starts, 1 for starts from updates
    restart_rounds: int = 3             # ... for this many rounds (after any warm-up), then
                                        # the set with the lowest loss is kept
    warmup_rounds: int = 0              # rounds of training k random groups (authors' FEMNIST)
    # Starts from updates: rounds after the clustering round in which each sampled client
    # trains its found cluster's model without choosing, so the models part before the
    # choices by loss start (under label skew the first choices can undo the clusters);
    # None: HOLD_ROUNDS for starts from updates, 0 for the others (which refuse more).
    hold_rounds: int | None = None
    # With k given and random starts, the k-means-like choice keeps merging the toy mixture's
    # label-swap clusters (a model that leaves the loss plateau first wins every client; one
    # nobody chose never trains again: docs/reproductions/ifca.md); with k from the data the
    # models start from the clusters of one round of updates and keep them.
    sees: ClassVar[frozenset[str]] = frozenset({"concept", "feature", "label"})
    toy_mixture_options: ClassVar[dict[str, Any] | None] = {"rounds": 14}
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {
        "aggregate": ("models", "gradients"), "gradient_scale": ("participants", "cluster"),
        "initialisation": ("updates", "random", "perturbed", "identical")}

    def __post_init__(self) -> None:
        check_choices(self, self._kinds)
        aggregation_weights(np.ones(1), self.weighting)
        object.__setattr__(self, "k_choice", ClusterCount.of(self.k_choice, UPDATES_K_CHOICE))
        if self.restarts is not None and (not isinstance(self.restarts, int)
                                          or self.restarts < 1):
            raise ValueError(f"restarts must be a positive integer, got {self.restarts!r}")
        if self.sets > 1 and self.restart_rounds < 1:
            raise ValueError("restart_rounds must be at least 1 when restarts > 1")
        if self.from_updates and (self.sets > 1 or self.warmup_rounds):
            raise ValueError("IFCA starting from clusters of updates (k: null, or initialisation:"
                             " updates) takes no restarts or warmup_rounds: give k with "
                             "initialisation: random for those")
        if self.from_updates and (not isinstance(self.select_round, int)
                                  or self.select_round < 0):
            raise ValueError(f"select_round must be an integer >= 0, got {self.select_round!r}")
        if self.hold_rounds is not None and (not isinstance(self.hold_rounds, int)
                                             or self.hold_rounds < 0):
            raise ValueError(f"hold_rounds must be an integer >= 0, got {self.hold_rounds!r}")
        if self.hold_rounds and not self.from_updates:
            raise ValueError("hold_rounds holds the clusters found in the updates: it needs a "
                             "start from updates (k: null, or initialisation: updates); random "
                             "starts take warmup_rounds")
        if not isinstance(self.warmup_rounds, int) or self.warmup_rounds < 0:
            raise ValueError(f"warmup_rounds must be an integer >= 0, got {self.warmup_rounds!r}")
        if not self.init_noise >= 0:
            raise ValueError(f"init_noise must be >= 0, got {self.init_noise!r}")

    @property
    def from_updates(self) -> bool:
        """Whether the k models start from clusters of one round of updates of one model."""
        return self.k_choice.k is None or self.initialisation == "updates"

    @property
    def sets(self) -> int:
        """R: candidate sets (restarts); by default 3 for random starts, else 1."""
        if self.restarts is not None:
            return self.restarts
        return 1 if self.from_updates else 3

    @property
    def holds(self) -> int:
        """Rounds the found clusters train their models before the choices by loss start."""
        if self.hold_rounds is not None:
            return self.hold_rounds
        return HOLD_ROUNDS if self.from_updates else 0

    @property
    def _warm_rounds(self) -> int:
        """Rounds in which clients train their group's model without choosing."""
        return self.select_round if self.from_updates else self.warmup_rounds

    def _held(self, state: IFCAState, ctx: RoundContext) -> bool:
        """Whether clients train their group's model without choosing this round: the warm-up,
        or a hold round after the clusters of updates were found (`state.groups`)."""
        if ctx.round < self._warm_rounds:
            return True
        return state.selected and self.from_updates and \
            ctx.round <= self.select_round + self.holds

    def init(self, setup: Setup) -> IFCAState:
        r, n = self.sets, setup.num_clients
        k = 1 if self.from_updates else int(self.k_choice.k or 1)
        # Starts from updates begin with the one initial model; the clusters come later.
        models = (setup.initial_params[None].astype(np.float32) if self.from_updates else
                  initial_models(setup, r * k, self.initialisation, self.init_noise))
        groups = np.stack([random_groups(n, k, np.random.default_rng(
            [setup.seed, i, _GROUP_TAG])) for i in range(r)])
        return IFCAState(models=models.reshape(r, k, -1),
                         choice=np.full((r, n), NEVER, dtype=np.int64),
                         chosen_round=np.full(n, NEVER, dtype=np.int64),
                         objective=np.full(r, np.nan), groups=groups,
                         selected=not self.from_updates)

    def plan(self, state: IFCAState, ctx: RoundContext) -> list[ClientTask]:
        if ctx.step == 0 and self._held(state, ctx):
            return self._training(state, ctx, ctx.sampled, state.groups)
        if ctx.step == 0 and not state.selected:   # every client trains the one model
            return self._training(state, ctx, np.arange(state.choice.shape[1]), state.groups)
        if ctx.step == 0:   # line 3: broadcast every model (of every candidate set)
            every = state.models.reshape(-1, state.models.shape[-1])
            return [ClientTask(int(c), TaskKind.LOSSES, every) for c in ctx.sampled]
        # Clients whose losses were rejected this round sit step 1 out.
        return self._training(state, ctx, np.flatnonzero(state.chosen_round == ctx.round),
                              state.choice)

    def _training(self, state: IFCAState, ctx: RoundContext, clients: np.ndarray,
                  clusters: np.ndarray) -> list[ClientTask]:
        """Each client trains (or takes the gradient of) model clusters[r, c] of every set r.

        Only the served set's model is the client's own (for the 'local' protocols).
        """
        kind = TaskKind.TRAIN if self.aggregate == "models" else TaskKind.GRADIENT
        spec = ctx.train if kind is TaskKind.TRAIN else None
        served = _lead(state)
        tasks = []
        for c in clients.tolist():
            for r in range(len(state.models)):
                j = int(clusters[r, c])
                tasks.append(ClientTask(c, kind, state.models[r, j], spec, {"set": r, "cluster": j},
                                        own_model=r == served))
        return tasks

    def update(self, state: IFCAState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        if ctx.step == 0 and not state.selected and ctx.round >= self._warm_rounds:
            return self._select(state, ctx, results)
        if ctx.step == 0 and self._held(state, ctx):
            # Warm-up or hold: a client's cluster is its group; it trains that model at once.
            clients = np.array(sorted({x.client for x in results}), dtype=np.int64)
            choice = state.choice.copy()
            choice[:, clients] = state.groups[:, clients]
            chosen_round = state.chosen_round.copy()
            chosen_round[clients] = ctx.round
            state = replace(state, choice=choice, chosen_round=chosen_round)
            update = self._aggregate(state, ctx, results)
            event: dict[str, Any] = {"type": "ifca_choices", "warmup": True,
                                     "clients": clients.tolist(),
                                     "clusters": state.groups[0, clients].tolist()}
            if len(state.models) > 1:
                event["candidate_clusters"] = state.groups[:, clients].tolist()
            sizes = np.bincount(state.groups[0, clients],
                                minlength=state.models.shape[1]).tolist()
            return replace(update, events=[event],
                           metrics={"ifca": {"cluster_sizes": sizes, "warmup": True}})
        if ctx.step == 0:
            return self._choose(state, ctx, results)
        return self._aggregate(state, ctx, results)

    def _choose(self, state: IFCAState, ctx: RoundContext, results: Sequence[ClientResult]
                ) -> Update:
        """Step 0: each reporting client's cluster identity in every set (line 6)."""
        if not results:
            return Update(state, round_done=False)
        sets, k = state.models.shape[:2]
        clients = np.array([r.client for r in results])
        losses = np.stack([r.losses for r in results]).reshape(len(results), sets, k)
        weights = aggregation_weights(np.array([r.num_samples for r in results]), self.weighting)
        ids = cluster_identities(losses)                          # (m, R)
        objective = clustering_objective(losses, weights)         # (R,)
        previous = state.choice[:, clients].copy()
        choice = state.choice.copy()
        choice[:, clients] = ids.T
        chosen_round = state.chosen_round.copy()
        chosen_round[clients] = ctx.round
        state = replace(state, choice=choice, chosen_round=chosen_round, objective=objective)
        events: list[dict[str, Any]] = []
        if sets > 1 and ctx.round >= self._warm_rounds + self.restart_rounds:
            best = int(np.argmin(objective))
            events.append({"type": "ifca_restart_selected", "set": best,
                           "objective": [round(float(v), 6) for v in objective]})
            state = replace(state, models=state.models[best:best + 1],
                            choice=state.choice[best:best + 1],
                            objective=objective[best:best + 1],
                            groups=state.groups[best:best + 1])
            previous, ids = previous[best:best + 1], ids[:, best:best + 1]
        lead = _lead(state)
        event: dict[str, Any] = {"type": "ifca_choices", "clients": clients.tolist(),
                                 "clusters": ids[:, lead].tolist()}
        if len(state.models) > 1:
            event["candidate_clusters"] = ids.T.tolist()
        events.append(event)
        metrics = {"ifca": {
            "cluster_sizes": np.bincount(ids[:, lead], minlength=k).tolist(),
            "switched": int(np.sum((previous[lead] != NEVER) & (previous[lead] != ids[:, lead]))),
            "objective": float(state.objective[lead]),
            **({"candidate_objective": [float(v) for v in state.objective]}
               if len(state.models) > 1 else {})}}
        return Update(state, metrics, events, round_done=False)

    def _select(self, state: IFCAState, ctx: RoundContext, results: Sequence[ClientResult]
                ) -> Update:
        """Cluster every client's update of the one model (FL+HC's rule, or into k when k is
        given); each cluster's model starts at the global model plus its members' mean update."""
        results = sorted(results, key=lambda x: x.client)
        if not results:
            return Update(state)
        clients = np.array([x.client for x in results], dtype=np.int64)
        weights = aggregation_weights(np.array([x.num_samples for x in results]), self.weighting)
        found = clusters_of_updates(state.models[0, 0], np.stack([x.update for x in results]),
                                    weights, self.k_choice)
        labels, models = found.labels, found.models
        if self.k_choice.k is not None and len(models) < self.k_choice.k:
            # Fewer distinct directions than k (tied updates): the rest start from FedAvg's.
            mean = cluster_fedavg(state.models[0, :1], np.stack([x.update for x in results]),
                                  np.zeros(len(results), dtype=np.int64), weights)
            models = np.concatenate([models, np.repeat(mean, self.k_choice.k - len(models),
                                                       axis=0)])
        n = state.choice.shape[1]
        choice = np.full((1, n), NEVER, dtype=np.int64)
        choice[0, clients] = labels
        chosen_round = state.chosen_round.copy()
        chosen_round[clients] = ctx.round
        state = replace(state, models=models[None].astype(np.float32), choice=choice,
                        chosen_round=chosen_round, groups=served_clusters(choice[0])[None],
                        selected=True)
        event = {"type": "ifca_k_selected", "k": found.num_clusters, "clients": clients.tolist(),
                 "labels": labels.tolist(), "tree": np.round(found.linkage, 8).tolist()}
        sizes = np.bincount(labels, minlength=found.num_clusters).tolist()
        return Update(state, {"ifca": {"cluster_sizes": sizes, "k_selected": found.num_clusters}},
                      [event, {"type": "ifca_choices", "clients": clients.tolist(),
                               "clusters": labels.tolist()}])

    def _aggregate(self, state: IFCAState, ctx: RoundContext, results: Sequence[ClientResult]
                   ) -> Update:
        """Step 1: per-cluster model averaging (option II) or gradient step (option I)."""
        models = state.models.copy()
        for r in range(len(models)):
            own = sorted((x for x in results if int(x.meta["set"]) == r), key=lambda x: x.client)
            if not own:
                continue
            vectors = np.stack([x.update for x in own])
            choice = np.array([int(x.meta["cluster"]) for x in own])
            weights = aggregation_weights(np.array([x.num_samples for x in own]), self.weighting)
            if self.aggregate == "models":
                # Option II: theta_j <- sum_i s_ij w_i (theta_j + Delta_i) / sum_i s_ij w_i,
                # averaged as updates: the same mean with less rounding.
                models[r] = cluster_fedavg(models[r], vectors, choice, weights)
            else:
                models[r] = gradient_step(models[r], vectors, choice, weights, ctx.train.lr,
                                          self.gradient_scale)
        return Update(replace(state, models=models))

    def clusters(self, state: IFCAState) -> ClusterView:
        lead = _lead(state)
        return ClusterView(state.models[lead], served_clusters(state.choice[lead]))


def _lead(state: IFCAState) -> int:
    """The candidate set with the lowest latest objective (the only one after selection)."""
    if len(state.objective) == 1 or np.isnan(state.objective).all():
        return 0
    return int(np.nanargmin(state.objective))

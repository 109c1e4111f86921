"""FlexCFL: Flexible Clustered Federated Learning (Duan, Liu, Ji, Wu, Liang, Chen, Tan,
"Flexible Clustered Federated Learning for Client-Level Data Distribution Shift", IEEE TPDS
2022, arXiv 2108.09749), built on FedGroup (Duan et al., arXiv 2010.06870).

m groups, each with its model w_g. Every pre-training starts from the initial model w_0.

  Group cold start (round 0): alpha * m of the clients pre-train from w_0 and send their updates
      dW = [dw_1 .. dw_n] (d x n). A truncated SVD dW ~ U_m S_m V_m^T gives m directions u_k;
      each client is described by its decomposed cosine similarities
      DCS_i = (cos(dw_i, u_1), .., cos(dw_i, u_m)), and EDC(i, j) = ||DCS_i - DCS_j||_2 / m is
      the Euclidean distance of those descriptions. K-means++ on the DCS gives the groups; a
      group's model is w_0 plus its members' mean update, and that mean update is its
      direction dw_g.
  Client cold start: a newcomer (a sampled client in no group) pre-trains from w_0 and joins
      the group whose direction is most similar: argmin_g (1 - cos(dw_new, dw_g)) / 2.
  Intra-group aggregation: each group's sampled clients train from w_g; FedAvg within the
      group (weights: local sample counts), and dw_g becomes the group's aggregated update.
  Inter-group aggregation (optional, eta = `group_lr` > 0): dw_g <- dw_g + eta sum_{h != g}
      dw_h / ||dw_h|| over the groups that trained this round (`inter_group: updates`);
      the authors' code mixes the models instead, w_g <- (w_g + eta sum_{h != g} w_h / ||w_h||)
      / (1 + eta sum_{h != g} 1 / ||w_h||) (`inter_group: params`).
  Client migration: a client whose data drifted no longer fits its group; it is cold-started
      again (pre-trains from w_0 and joins the most similar group) when next sampled.

Computation: cos(dw_i, u_k) = s_k V_ik / ||dw_i||, so the DCS come from the n x n Gram matrix
of the updates (its eigenvectors are V, its eigenvalues s^2), never from a d x n SVD; singular
directions' signs are arbitrary and change no distance.

Deviations, and why:
- The number of groups (the paper fixes m). Default `k: null`: K-means on the DCS of m = k
  directions for each k = 2..k_max, and k is the most groups of which each has a mean
  silhouette of at least `min_silhouette` on one EDC matrix, that of k_max directions (so
  every k is judged on the same distances; `precomputed.substantial_clusters`, as IFCA and
  FL+HC choose theirs), else one group. `k: K` is the paper's rule.
- Where pre-training starts. Default `warmup_rounds: 5`: the federation first trains one model
  by FedAvg for that many rounds and w_0 is that model; the paper pre-trains from the initial
  model (`warmup_rounds: 0`). Measured on the benchmark's digits MLP: updates from the random
  initial model separate rotations and label groups but not label swaps (ARI 0.43 with the
  true k = 4), while after five FedAvg rounds the EDC groups recover all three.
- The pre-training set. The paper draws alpha * m clients from all; here they are (up to
  alpha * m, alpha * k_max with k from the data) sampled clients, so a round asks only sampled
  clients; the others join later by client cold start. Under sampling one round's sample holds
  too few members of each cluster (30 % of 40 clients in 4 clusters: one cluster had a single
  member and was merged), so the pre-training updates, all from w_0 and so comparable, are
  pooled over `pretrain_rounds` rounds (default ceil(n / clients a round), fewer once alpha * m
  clients have pre-trained); the federation does not train meanwhile.
  Pre-training is one round of the run's local training (`train`); the authors' code
  (morningD/FlexCFL, flearn/trainer/fedgroup.py) pre-trains 50 mini-batch steps at the
  client's batch size (`pretrain(init_params, iterations=50)`), whatever the local epochs.
- Migration trigger. The paper migrates a client when the Wasserstein distance between its old
  and new label distributions passes a threshold; the server never sees a client's labels
  (no task carries a label histogram), so the trigger here is a temperature rule on what the
  server sees, after the temperature of the authors' earlier FedGroup code (the FlexCFL code,
  flearn/client.py `check_distribution_shift`, follows the paper instead: the client compares
  the Wasserstein distance of its current and recorded training-label counts with (0.2 / L)
  times its training size): after each training, a client whose cosine dissimilarity to
  its group's aggregated update is above the group's mean loses one degree, else gains one
  (at most `max_temperature`); at zero it is cold-started when next sampled
  (`migration: false` turns it off).
- The group direction a newcomer is compared with: `direction: latest`, the group's latest
  aggregated update, or `total`, w_g - w_0 (the group's whole path from where the newcomer's
  pre-training starts). The authors' code (flearn/trainer/fedgroup.py `client_cold_start`)
  compares a newcomer with the group's `opt_updates`, its members' mean pre-training update
  from the group cold start, which training never changes; only a client re-assigned after a
  re-clustering is compared with the latest update. That fixed direction is not an option here.

What it can see: whatever makes updates from w_0 point apart: concept, feature and label shift.

`clusters()` serves each client its group's model; a client in no group is served the group
most clients are in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from clusterfed.algorithms.aggregate import (
    Weighting,
    aggregation_weights,
    cluster_fedavg,
    results_fedavg,
)
from clusterfed.algorithms.base import (
    ALGORITHMS,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    check_choices,
)
from clusterfed.algorithms.choices import served_clusters
from clusterfed.algorithms.options import ClusterCount
from clusterfed.clustering.kmeans import kmeans_labels
from clusterfed.clustering.similarity import gram_matrix
from clusterfed.state import serialisable
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

NONE = -1
_PRETRAIN_TAG = 0xF1EC


@serialisable
@dataclass(frozen=True)
class FlexCFLState:
    models: np.ndarray       # (m, d) group models; (1, d) w_0 before the group cold start
    directions: np.ndarray   # (m, d) each group's latest update dw_g
    group: np.ndarray        # (n,) each client's group; -1: none yet
    cold: np.ndarray         # (n,) bool: cold-start when next sampled (newcomers, migrants)
    temperature: np.ndarray  # (n,) migration temperature
    initial: np.ndarray      # (d,) w_0, where every pre-training starts
    seed: int
    grouped: bool = False    # whether the group cold start has happened
    # Before it, under sampling: the pre-training updates pooled over rounds (client ids,
    # updates, sample counts; a client sampled again replaces its row) and rounds pooled.
    pool_clients: np.ndarray | None = None
    pool_updates: np.ndarray | None = None
    pool_samples: np.ndarray | None = None
    pool_rounds: int = 0


# The mathematics, as pure functions --------------------------------------------------------


def decomposed_cosine_similarity(updates: np.ndarray, m: int) -> np.ndarray:
    """DCS (n, m): cos(dw_i, u_k) with u_1..u_m the top left singular vectors of dW = updates^T.

    From the Gram matrix G = dW^T dW = V S^2 V^T: dw_i . u_k = (dW^T dW v_k / s_k)_i = s_k V_ik.
    Directions with a zero singular value (m above the rank) give 0.
    """
    gram = gram_matrix(updates)
    values, vectors = np.linalg.eigh(gram)
    order = np.argsort(values)[::-1][:m]
    s = np.sqrt(np.clip(values[order], 0.0, None))
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    inverse = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return vectors[:, order] * s[None, :] * inverse[:, None]


def edc_matrix(dcs: np.ndarray) -> np.ndarray:
    """EDC(i, j) = ||DCS_i - DCS_j||_2 / m, the Euclidean distance of the descriptions."""
    diff = dcs[:, None, :] - dcs[None, :, :]
    return np.sqrt((diff**2).sum(axis=-1)) / dcs.shape[1]


def cosine_dissimilarity(vectors: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """(1 - cos(v_i, d_g)) / 2 in [0, 1] for each row of `vectors` (n, d) and `directions`
    (m, d): (n, m). A zero vector has cosine 0 with everything (dissimilarity 1/2)."""
    v = np.asarray(vectors, dtype=np.float64)
    g = np.asarray(directions, dtype=np.float64)
    vn, gn = np.linalg.norm(v, axis=1), np.linalg.norm(g, axis=1)
    scale = np.outer(vn, gn)
    cos = np.divide(v @ g.T, scale, out=np.zeros_like(scale), where=scale > 0)
    return (1.0 - np.clip(cos, -1.0, 1.0)) / 2.0


def cold_start_groups(updates: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Each newcomer's group: argmin_g (1 - cos(dw_new, dw_g)) / 2; ties to the lowest g."""
    return np.argmin(cosine_dissimilarity(updates, directions), axis=1).astype(np.int64)


def group_labels(updates: np.ndarray, count: ClusterCount, seed: int) -> np.ndarray:
    """The group cold start's clustering: K-means++ on the DCS of m = k directions; k null:
    m by the selector (by default the most groups whose every one is substantial)."""
    def labels_for(m: int) -> np.ndarray:
        return kmeans_labels(decomposed_cosine_similarity(updates, m), m, seed)

    if count.k is not None:
        return labels_for(min(count.k, len(updates)))
    # One matrix judges every k: EDC over k_max directions (all the structure K-means may see).
    judge = edc_matrix(decomposed_cosine_similarity(updates, min(count.k_max, len(updates))))
    return count.choose(judge, labels_for)


def pool_pretraining(pool: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                     clients: np.ndarray, updates: np.ndarray, samples: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pooled pre-training updates (client ids sorted, updates, sample counts) with this
    round's added; a client already pooled keeps only its newest update (both start at w_0)."""
    if pool is None:
        return clients.copy(), updates.copy(), samples.copy()
    old = ~np.isin(pool[0], clients)
    ids = np.concatenate([pool[0][old], clients])
    order = np.argsort(ids, kind="stable")
    return (ids[order], np.concatenate([pool[1][old], updates])[order],
            np.concatenate([pool[2][old], samples])[order])


def pretrain_rounds(num_clients: int, sampled: int) -> int:
    """Rounds the group cold start pools: one full participation's worth of reports,
    ceil(n / sampled), which reaches 1 - 1/e (63 %) of the clients under uniform sampling."""
    return -(-num_clients // max(sampled, 1))


def inter_group_updates(updates: np.ndarray, eta: float) -> np.ndarray:
    """dw_g + eta sum_{h != g} dw_h / ||dw_h|| for the (m, d) updates of the groups that
    trained (the paper's inter-group aggregation); a zero update adds nothing."""
    u = np.asarray(updates, dtype=np.float64)
    norms = np.linalg.norm(u, axis=1)
    unit = np.divide(u, norms[:, None], out=np.zeros_like(u), where=norms[:, None] > 0)
    others = unit.sum(axis=0)[None, :] - unit
    return (u + eta * others).astype(np.float32)


def inter_group_params(models: np.ndarray, eta: float) -> np.ndarray:
    """The authors' code: w_g <- (w_g + eta sum_{h != g} w_h / ||w_h||) / (1 + eta sum_{h != g}
    1 / ||w_h||), for the (m, d) models of the groups that trained."""
    w = np.asarray(models, dtype=np.float64)
    inverse = 1.0 / np.linalg.norm(w, axis=1)
    out = np.empty_like(w)
    for g in range(len(w)):
        weights = eta * inverse
        weights[g] = 1.0
        out[g] = weights @ w / weights.sum()
    return out.astype(np.float32)


def step_temperature(temperature: np.ndarray, client_bias: np.ndarray, group_bias: np.ndarray,
                     max_temperature: int) -> np.ndarray:
    """The authors' 'step' rule: one degree down where a client's dissimilarity to its group is
    above the group's mean, else one up (at most the maximum); zero stays zero."""
    t = np.asarray(temperature, dtype=np.int64)
    moved = np.where(client_bias > group_bias, t - 1, np.minimum(t + 1, max_temperature))
    return np.where(t <= 0, t, moved).astype(np.int64)


# The algorithm ------------------------------------------------------------------------------


@ALGORITHMS.register("flexcfl")
@dataclass(frozen=True)
class FlexCFL:
    # m groups (k_choice.k); null: from the data, by the selector (module docstring)
    k_choice: ClusterCount = ClusterCount()
    warmup_rounds: int = 5               # FedAvg rounds before the group cold start (paper: 0)
    pretrain_scale: int = 20             # alpha: the group cold start clusters alpha * m clients
    # Rounds of sampled clients' pre-training pooled for the group cold start, or fewer once
    # alpha * m clients have pre-trained (the paper's cold-start set); None: ceil(n / clients
    # a round), one round under full participation. One round's sample of a sampled
    # federation holds too few members of each cluster to group them.
    pretrain_rounds: int | None = None
    group_lr: float = 0.0                # eta, inter-group aggregation; 0: none
    inter_group: str = "updates"         # the paper's mixing of updates, or "params" (code)
    direction: str = "total"             # a group's direction: w_g - w_0, or "latest" update
    migration: bool = True               # cold-start drifted clients again (temperature rule)
    max_temperature: int = 4             # rounds above the group's mean before migrating
    weighting: Weighting = "samples"     # intra-group FedAvg weights: samples | uniform
    sees: ClassVar[frozenset[str]] = frozenset({"concept", "feature", "label"})
    toy_mixture_options: ClassVar[dict[str, Any] | None] = {"rounds": 8}
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {
        "inter_group": ("updates", "params"), "direction": ("latest", "total")}

    def __post_init__(self) -> None:
        check_choices(self, self._kinds)
        aggregation_weights(np.ones(1), self.weighting)
        if isinstance(self.warmup_rounds, bool) or not isinstance(self.warmup_rounds, int) \
                or self.warmup_rounds < 0:
            raise ValueError(f"warmup_rounds must be an integer >= 0, got {self.warmup_rounds!r}")
        object.__setattr__(self, "k_choice", ClusterCount.of(self.k_choice))
        for name in ("pretrain_scale", "max_temperature", "pretrain_rounds"):
            value = getattr(self, name)
            if value is None and name == "pretrain_rounds":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.group_lr >= 0:
            raise ValueError(f"group_lr (eta) must be >= 0, got {self.group_lr!r}")

    @property
    def cold_start_size(self) -> int:
        """alpha * m: the pre-trained clients the group cold start clusters (m: k, else k_max)."""
        return self.pretrain_scale * (self.k_choice.k or self.k_choice.k_max)

    def init(self, setup: Setup) -> FlexCFLState:
        n, first = setup.num_clients, setup.initial_params.astype(np.float32)
        return FlexCFLState(first[None].copy(), np.zeros((1, len(first)), np.float32),
                            np.full(n, NONE, dtype=np.int64), np.ones(n, dtype=bool),
                            np.full(n, self.max_temperature, dtype=np.int64), first, setup.seed)

    def _warming(self, state: FlexCFLState, ctx: RoundContext) -> bool:
        return not state.grouped and ctx.round < self.warmup_rounds

    def _pretraining(self, state: FlexCFLState, ctx: RoundContext) -> np.ndarray:
        """The sampled clients that pre-train at step 0 (every one before the group cold start)."""
        if ctx.step > 0 or self._warming(state, ctx):
            return np.zeros(0, dtype=np.int64)
        return ctx.sampled[state.cold[ctx.sampled]] if state.grouped else ctx.sampled

    def plan(self, state: FlexCFLState, ctx: RoundContext) -> list[ClientTask]:
        if self._warming(state, ctx):   # FedAvg; its model becomes w_0
            return [ClientTask(int(c), TaskKind.TRAIN, state.initial, ctx.train)
                    for c in ctx.sampled]
        cold = self._pretraining(state, ctx)
        if len(cold):
            return [ClientTask(int(c), TaskKind.TRAIN, state.initial, ctx.train,
                               {"phase": "pretrain"}, own_model=False) for c in cold]
        return [ClientTask(int(c), TaskKind.TRAIN, state.models[state.group[c]], ctx.train,
                           {"group": int(state.group[c])})
                for c in ctx.sampled if state.group[c] != NONE]

    def update(self, state: FlexCFLState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        results = sorted(results, key=lambda x: x.client)
        if self._warming(state, ctx):
            initial = results_fedavg(state.initial[None], results, [0] * len(results),
                                     self.weighting)
            return Update(replace(state, models=initial, initial=initial[0]))
        if len(self._pretraining(state, ctx)):
            return self._cold_start(state, ctx, results)
        return self._aggregate(state, results)

    def _cold_start(self, state: FlexCFLState, ctx: RoundContext,
                    results: Sequence[ClientResult]) -> Update:
        """Step 0: the group cold start (first time), then the newcomers' client cold start."""
        events: list[dict[str, Any]] = []
        metrics: dict[str, Any] = {}
        clients = np.array([x.client for x in results], dtype=np.int64)
        updates = np.stack([x.update for x in results]) if results else np.zeros((0, 1))
        samples = np.array([x.num_samples for x in results], dtype=np.int64)
        if not state.grouped and len(results):
            state, pooled = self._pool(state, ctx, clients, updates, samples)
            if pooled is None:
                return Update(state, {"flexcfl": {"pooled": len(state.pool_clients)}},
                              [{"type": "flexcfl_pooled", "clients": clients.tolist()}])
            clients, updates, samples = pooled
        rest = np.ones(len(clients), dtype=bool)
        if not state.grouped and len(clients):
            state, chosen, event = self._group_cold_start(state, ctx, clients, updates, samples)
            rest[chosen] = False
            events.append(event)
            metrics["k_selected"] = len(state.models)
        if state.grouped and rest.any():
            directions = state.directions if self.direction == "latest" \
                else state.models - state.initial[None]
            joined = cold_start_groups(updates[rest], directions)
            group, cold, temperature = state.group.copy(), state.cold.copy(), \
                state.temperature.copy()
            moved = clients[rest]
            migrated = [int(c) for c, g in zip(moved, joined, strict=True)
                        if group[c] != NONE and group[c] != g]
            group[moved], cold[moved], temperature[moved] = joined, False, self.max_temperature
            state = replace(state, group=group, cold=cold, temperature=temperature)
            events.append({"type": "flexcfl_cold_start", "clients": moved.tolist(),
                           "groups": joined.tolist(), "migrated": migrated})
        metrics["cold_started"] = int(len(results))
        return Update(state, {"flexcfl": metrics}, events, round_done=False)

    def _pool(self, state: FlexCFLState, ctx: RoundContext, clients: np.ndarray,
              updates: np.ndarray, samples: np.ndarray
              ) -> tuple[FlexCFLState, tuple[np.ndarray, ...] | None]:
        """Pool this round's pre-training; the pool once it holds `pretrain_rounds` rounds or
        alpha * m clients."""
        previous = None if state.pool_clients is None else (
            state.pool_clients, state.pool_updates, state.pool_samples)
        pool = pool_pretraining(previous, clients, updates, samples)
        rounds = state.pool_rounds + 1
        wanted = self.pretrain_rounds or pretrain_rounds(len(state.group), len(ctx.sampled))
        if rounds < wanted and len(pool[0]) < self.cold_start_size:
            return replace(state, pool_clients=pool[0], pool_updates=pool[1],
                           pool_samples=pool[2], pool_rounds=rounds), None
        return replace(state, pool_clients=None, pool_updates=None, pool_samples=None,
                       pool_rounds=rounds), pool

    def _group_cold_start(self, state: FlexCFLState, ctx: RoundContext, clients: np.ndarray,
                          updates: np.ndarray, samples: np.ndarray
                          ) -> tuple[FlexCFLState, np.ndarray, dict[str, Any]]:
        """K-means on the DCS of alpha * m pre-trained clients: the groups and their models."""
        size = self.cold_start_size
        rng = np.random.default_rng([state.seed, ctx.round, _PRETRAIN_TAG])
        chosen = np.sort(rng.permutation(len(clients))[:size])
        labels = group_labels(updates[chosen], self.k_choice, state.seed)
        m = int(labels.max()) + 1
        weights = aggregation_weights(samples[chosen], self.weighting)
        base = np.repeat(state.initial[None], m, axis=0)
        models = cluster_fedavg(base, updates[chosen], labels, weights)
        group, cold = state.group.copy(), state.cold.copy()
        group[clients[chosen]], cold[clients[chosen]] = labels, False
        state = replace(state, models=models, directions=models - base, group=group, cold=cold,
                        grouped=True)
        event = {"type": "flexcfl_groups", "clients": clients[chosen].tolist(),
                 "groups": labels.tolist(), "k": m}
        return state, chosen, event

    def _aggregate(self, state: FlexCFLState, results: Sequence[ClientResult]) -> Update:
        """Intra-group FedAvg, the optional inter-group aggregation, and the migration rule."""
        if not results:
            return Update(state)
        clients = np.array([x.client for x in results], dtype=np.int64)
        groups = np.array([int(x.meta["group"]) for x in results], dtype=np.int64)
        updates = np.stack([x.update for x in results])
        weights = aggregation_weights(np.array([x.num_samples for x in results]), self.weighting)
        models = cluster_fedavg(state.models, updates, groups, weights)
        trained = np.unique(groups)
        directions = state.directions.copy()
        directions[trained] = models[trained] - state.models[trained]
        if self.group_lr > 0 and len(trained) > 1:
            if self.inter_group == "updates":
                directions[trained] = inter_group_updates(directions[trained], self.group_lr)
                models[trained] = state.models[trained] + directions[trained]
            else:
                mixed = inter_group_params(models[trained], self.group_lr)
                directions[trained] += mixed - models[trained]
                models[trained] = mixed
        state = replace(state, models=models, directions=directions)
        metrics: dict[str, Any] = {"group_sizes": np.bincount(
            state.group[state.group != NONE], minlength=len(models)).tolist()}
        events: list[dict[str, Any]] = []
        if self.migration:
            state, leaving = self._migrate(state, clients, groups, updates)
            metrics["migrating"] = len(leaving)
            if leaving:
                events.append({"type": "flexcfl_migrating", "clients": leaving})
        return Update(state, {"flexcfl": metrics}, events)

    def _migrate(self, state: FlexCFLState, clients: np.ndarray, groups: np.ndarray,
                 updates: np.ndarray) -> tuple[FlexCFLState, list[int]]:
        """Each client's dissimilarity to its group's aggregated update against the group's
        mean; a client whose temperature reaches zero is cold-started when next sampled."""
        client_bias = cosine_dissimilarity(updates, state.directions)[np.arange(len(groups)),
                                                                     groups]
        group_bias = np.array([client_bias[groups == g].mean() for g in groups])
        temperature = state.temperature.copy()
        temperature[clients] = step_temperature(temperature[clients], client_bias, group_bias,
                                                self.max_temperature)
        cold = state.cold.copy()
        leaving = clients[temperature[clients] <= 0]
        cold[leaving] = True
        return replace(state, temperature=temperature, cold=cold), leaving.tolist()

    def clusters(self, state: FlexCFLState) -> ClusterView:
        return ClusterView(state.models, served_clusters(state.group))

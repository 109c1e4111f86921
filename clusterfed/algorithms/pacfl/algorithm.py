"""PACFL: clustered FL by principal angles between client data subspaces (Vahidian, Morafah,
Wang, Kungurtsev, Chen, Shah, Lin; AAAI 2023).

Algorithm 1. Before federation (in round 0, beside the sampled clients' first training of
theta_0, which needs no cluster) every client sends its data signature U_p, the top-p left
singular vectors of its data; the server forms the proximity matrix A (Eq. 2 or Eq. 3) and
clusters it once by hierarchical clustering with threshold beta (degrees), so the number of
clusters comes from beta. Every cluster starts from theta_0 and runs FedAvg over its
members among the round's sampled clients (|D_k|-weighted, line 24 over participants); a
cluster with no sampled member keeps its model.

Newcomers (Algorithms 2 and 3): at `join_round` the late clients send their signatures; A is
extended with the old-new and new-new blocks (PME, corrected), and each newcomer receives its
cluster's model and fine-tunes on it locally (Alg. 3 line 6, optional). Which cluster (spec 7,
#12-13): by default (`newcomer_rule: nearest`) old clients keep their clusters and a newcomer
joins the cluster at the least mean angle (UPGMA) if that angle is within beta (or, with the
cut chosen otherwise, within the height of the first clustering's cut), else starts a new
cluster from theta_0; `newcomer_rule: rerun` is Alg. 3 line 4: HC is rerun with the same cut
and a newcomer joins the old cluster most of its rerun cluster's old members hold, and with
`reassign_existing` the rerun's clustering is adopted for everyone.

Spec choices (../shared/specs/pacfl.md section 7): per-class signatures of raw, uncentred
pixels, p = 3 (#1-3); `min_pair` with |.| (#4, #24; `absolute: false` is the authors' code);
beta in degrees (#7); scipy's weighted linkage, the code's "average" (#8); all clients at
t = 0 (#10); global sampling (#11); participants' |D_k| weights (#14). The default cut is
chosen from A itself (`precomputed.substantial_clusters`); the presets pin n_clusters or beta.

What it can see: differences in the clients' inputs, per class: feature shift (rotations,
other sources) and label shift (other label sets). Not concept shift: a label swap leaves
every client's images, hence its signature, as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from clusterfed.algorithms.aggregate import Weighting, aggregation_weights, results_fedavg
from clusterfed.algorithms.base import (
    ALGORITHMS,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    check_choices,
)
from clusterfed.algorithms.options import ClusterCount
from clusterfed.algorithms.pacfl import principal_angles as pa
from clusterfed.clustering import precomputed as pc
from clusterfed.state import serialisable
from clusterfed.tasks import SVD_METHODS, ClientResult, ClientTask, SignatureSpec, TaskKind

UNASSIGNED = -1
NO_PARAMS = np.zeros(0, dtype=np.float32)


DEFAULT_K_CHOICE = ClusterCount(selector="hdbscan_silhouette")


@serialisable
@dataclass(frozen=True)
class PACFLState:
    initial: np.ndarray             # theta_0: every cluster starts from it (Alg. 1 line 12)
    models: np.ndarray              # (Z, d) cluster models; (0, d) until clustered
    assignment: np.ndarray          # (N,) cluster of each client; -1 until it has one
    clustered: np.ndarray           # client ids in the order of the proximity matrix's rows
    proximity: np.ndarray           # (m, m) A in degrees
    signatures: tuple[np.ndarray, ...] = ()  # in `clustered` order; kept only for PME
    seed: int = 0
    threshold: float = float("nan")  # degrees: beta, or the height of the first cut


@ALGORITHMS.register("pacfl", report=".report")
@dataclass(frozen=True)
class PACFL:
    # The cut: at beta degrees (the paper's rule; the code's default 3.5), into k_choice.k
    # (an extension; the old key n_clusters), or (neither given, the default) by the
    # k_choice selector on A: by default, of HDBSCAN's clusters of A and the tree's cut into
    # the most clusters, up to k_max, whose every cluster has a mean silhouette on A of at
    # least min_silhouette (else one), the one with more clusters (beta depends on the data's
    # dimension, p and the measure; neither rule does). HDBSCAN keeps 3-5-client feature
    # clusters apart that the silhouette's floor merges (docs/benchmark.md, "Selectors").
    beta: float | None = None            # HC threshold in degrees
    linkage: str = "weighted"            # or average / complete / single
    k_choice: ClusterCount = DEFAULT_K_CHOICE
    measure: str = "min_pair"            # or principal_min / ordered_sum / principal_sum
    absolute: bool = True                # min_pair without |.|: the authors' code
    p: int = 3                           # singular vectors per block
    budget: int | None = None            # per class: share this many by the code's Dir rule
    signature: str = "per_class"         # or "whole": one SVD of all the client's data
    center: bool = False                 # subtract each block's mean sample first
    mean: Sequence[float] | None = None  # per-channel normalisation before the SVD (MIX-4)
    std: Sequence[float] | None = None
    svd: str = "auto"                    # exact / randomized / auto (randomised when large)
    weighting: Weighting = "samples"     # FedAvg weights inside a cluster
    newcomers: Sequence[int] = ()        # clients that arrive at join_round (Algs. 2, 3)
    join_round: int = 0
    newcomer_rule: str = "nearest"       # or "rerun" (Alg. 3 line 4)
    reassign_existing: bool = False      # rerun: let it move old clients between clusters
    finetune_newcomers: bool = True      # Alg. 3 line 6: train once locally on arrival
    # Not claimed: label swaps keep each client's images, hence its signature (see docs/methods.md).
    sees: ClassVar[frozenset[str]] = frozenset({"feature", "label"})
    toy_mixture_options: ClassVar[dict[str, Any] | None] = None
    own_newcomers: ClassVar[bool] = True   # Algs. 2-3: the `newcomers` section sets its own
    k_aliases: ClassVar[dict[str, str]] = {"n_clusters": "k"}   # configs before `k_choice`
    _kinds: ClassVar[dict[str, tuple[str, ...]]] = {
        "linkage": pc.LINKAGES, "measure": pa.MEASURES, "signature": ("per_class", "whole"),
        "svd": SVD_METHODS, "newcomer_rule": ("nearest", "rerun")}
    newcomer_set: frozenset[int] = field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        check_choices(self, self._kinds)
        aggregation_weights(np.ones(1), self.weighting)
        if self.beta is not None and not self.beta >= 0:
            raise ValueError(f"beta (degrees) must be >= 0, got {self.beta}")
        object.__setattr__(self, "k_choice", ClusterCount.of(self.k_choice, DEFAULT_K_CHOICE))
        if self.p < 1:
            raise ValueError(f"p must be at least 1, got {self.p}")
        if self.budget is not None and (self.budget < 1 or self.signature != "per_class"):
            raise ValueError("budget shares vectors among classes: a positive count, with "
                             "signature: per_class")
        if self.measure == "ordered_sum" and self.signature == "per_class":
            raise ValueError("measure ordered_sum (Eq. 3) pairs vectors in identical order, "
                             "which per-class stacks do not share: use signature: whole or "
                             "measure: principal_sum")
        if self.reassign_existing and self.newcomer_rule != "rerun":
            raise ValueError("reassign_existing moves old clients by the rerun of HC: "
                             "set newcomer_rule: rerun")
        if self.newcomers and self.join_round < 1:
            raise ValueError("newcomers arrive after the federation starts: join_round >= 1")
        object.__setattr__(self, "newcomer_set", frozenset(int(c) for c in self.newcomers))

    # init / plan ---------------------------------------------------------------------------

    def init(self, setup: Setup) -> PACFLState:
        for c in self.newcomers:
            if not 0 <= int(c) < setup.num_clients:
                raise ValueError(f"newcomer {c} does not exist (there are {setup.num_clients})")
        d = len(setup.initial_params)
        return PACFLState(initial=setup.initial_params.copy(),
                          models=np.zeros((0, d), dtype=np.float32),
                          assignment=np.full(setup.num_clients, UNASSIGNED, dtype=np.int64),
                          clustered=np.zeros(0, dtype=np.int64), proximity=np.zeros((0, 0)),
                          seed=setup.seed)

    def _signers(self, state: PACFLState, ctx: RoundContext) -> list[int]:
        """Who sends a signature in this step: everyone before round 1's training, newcomers
        at their arrival; nobody otherwise. Signatures are uploads of clients arriving, not
        sampled work."""
        if ctx.step != 0:
            return []
        if len(state.models) == 0:
            return [c for c in range(len(state.assignment)) if c not in self.newcomer_set]
        if ctx.round == self.join_round:
            return [c for c in sorted(self.newcomer_set) if state.assignment[c] == UNASSIGNED]
        return []

    def _signature_spec(self, state: PACFLState) -> SignatureSpec:
        return SignatureSpec(p=self.p, per_class=self.signature == "per_class",
                             center=self.center, mean=self.mean, std=self.std, svd=self.svd,
                             seed=state.seed, budget=self.budget)

    def plan(self, state: PACFLState, ctx: RoundContext) -> list[ClientTask]:
        signers = self._signers(state, ctx)
        spec = self._signature_spec(state)
        signatures = [ClientTask(c, TaskKind.SIGNATURE, NO_PARAMS, signature=spec)
                      for c in signers]
        if len(state.models) == 0:
            # Round 0: every cluster starts from theta_0 (Alg. 1 line 12), so the sampled
            # clients train it while the signatures are clustered, in the same step.
            return signatures + [ClientTask(c, TaskKind.TRAIN, state.initial, ctx.train)
                                 for c in ctx.sampled.tolist() if c not in self.newcomer_set]
        if signatures:   # newcomers arrive: their clusters first, training in the next step
            return signatures
        joining = ctx.round == self.join_round and bool(self.newcomer_set)
        tasks = []
        for c in ctx.sampled.tolist():
            z = int(state.assignment[c])
            if z != UNASSIGNED and not (joining and c in self.newcomer_set):
                tasks.append(ClientTask(c, TaskKind.TRAIN, state.models[z], ctx.train,
                                        {"cluster": z}))
        if joining and self.finetune_newcomers:
            # Alg. 3 line 6: the newcomer personalises its cluster's model; nothing goes back.
            for c in sorted(self.newcomer_set):
                z = int(state.assignment[c])
                tasks.append(ClientTask(c, TaskKind.TRAIN, state.models[z], ctx.train,
                                        {"cluster": z, "finetune": 1}))
        return tasks

    # update ----------------------------------------------------------------------------------

    def update(self, state: PACFLState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        signed = sorted((r for r in results if r.kind is TaskKind.SIGNATURE),
                        key=lambda r: r.client)
        if signed and len(state.models) > 0:
            return self._admit(state, signed)
        metrics: dict[str, Any] = {}
        events: list[dict[str, Any]] = []
        if signed:
            state, metrics, event = self._cluster(state, signed)
            events.append(event)
        state, trained = self._aggregate(state, results)
        return Update(state, {"pacfl": {**metrics, **trained}}, events)

    def _cut(self, proximity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tree = pa.linkage_tree(proximity, self.linkage)
        n = len(proximity)
        if self.beta is not None or self.k_choice.k is not None:
            return tree, pa.cut_tree(tree, n, self.beta, self.k_choice.k)
        labels = self.k_choice.choose(proximity, lambda k: pa.cut_tree(tree, n, n_clusters=k))
        return tree, pc.first_appearance_labels(labels)

    def _clustering_event(self, kind: str, ids: np.ndarray, proximity: np.ndarray,
                          tree: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
        return {"type": kind, "clients": ids.tolist(), "beta": self.beta,
                "n_clusters": self.k_choice.k,
                "linkage": self.linkage, "measure": self.measure,
                "proximity": np.round(proximity, 4).tolist(),
                "tree": np.round(tree, 6).tolist(), "labels": labels.tolist()}

    def _cluster(self, state: PACFLState, signed: list[ClientResult]
                 ) -> tuple[PACFLState, dict[str, Any], dict[str, Any]]:
        """Alg. 1 lines 7-12: A from every signature, HC(A, beta), theta_0 for every cluster."""
        ids = np.array([r.client for r in signed], dtype=np.int64)
        signatures = [np.asarray(r.signature, dtype=np.float64) for r in signed]
        proximity = pa.proximity_matrix(signatures, self.measure, self.absolute)
        tree, labels = self._cut(proximity)
        assignment = state.assignment.copy()
        assignment[ids] = labels
        z = int(labels.max()) + 1
        threshold = self.beta if self.beta is not None else pa.cut_threshold(tree, z)
        state = replace(state, models=np.tile(state.initial, (z, 1)), assignment=assignment,
                        clustered=ids, proximity=proximity, threshold=float(threshold),
                        signatures=tuple(signatures) if self.newcomer_set else ())
        metrics = {"clusters": z, "signature_floats": int(sum(s.size for s in signatures))}
        return state, metrics, self._clustering_event("pacfl_clustering", ids, proximity, tree,
                                                      labels)

    def _admit(self, state: PACFLState, signed: list[ClientResult]) -> Update:
        """Alg. 3: PME (Alg. 2) with the cross block, then a cluster for each newcomer."""
        new_ids = np.array([r.client for r in signed], dtype=np.int64)
        new_signatures = [np.asarray(r.signature, dtype=np.float64) for r in signed]
        proximity = pa.extend_proximity(state.proximity, state.signatures, new_signatures,
                                        self.measure, self.absolute)
        ids = np.concatenate([state.clustered, new_ids])
        if self.newcomer_rule == "nearest":
            assignment, models, event = self._join_nearest(state, ids, proximity)
        else:
            assignment, models, event = self._join_rerun(state, ids, proximity)
        state = replace(state, models=np.stack(models).astype(np.float32),
                        assignment=assignment, clustered=ids, proximity=proximity,
                        signatures=(*state.signatures, *new_signatures))
        event.update(newcomers=new_ids.tolist(), assignment=assignment[ids].tolist())
        metrics = {"pacfl": {"clusters": len(models),
                             "signature_floats": int(sum(s.size for s in new_signatures))}}
        return Update(state, metrics, [event], round_done=False)

    def _join_nearest(self, state: PACFLState, ids: np.ndarray, proximity: np.ndarray
                      ) -> tuple[np.ndarray, list[np.ndarray], dict[str, Any]]:
        """Spec #12: old clients stay; each newcomer, in order, joins the cluster at the least
        mean angle if within the threshold, else a new cluster from theta_0 that later
        newcomers may join."""
        m = len(state.clustered)
        assignment = state.assignment.copy()
        models = list(state.models)
        labels = assignment[ids[:m]]
        angles = []
        for j in range(m, len(ids)):
            to_clusters = pa.mean_distance_to_clusters(proximity[j, :j], labels, len(models))
            z = int(np.argmin(to_clusters))
            angles.append(float(to_clusters[z]))
            if not to_clusters[z] <= state.threshold:
                z = len(models)
                models.append(state.initial)
            assignment[ids[j]] = z
            labels = np.append(labels, z)
        event = {"type": "pacfl_newcomers", "rule": "nearest", "clients": ids.tolist(),
                 "threshold": state.threshold, "nearest_angle": np.round(angles, 4).tolist(),
                 "proximity": np.round(proximity, 4).tolist(), "old_moved": 0}
        return assignment, models, event

    def _join_rerun(self, state: PACFLState, ids: np.ndarray, proximity: np.ndarray
                    ) -> tuple[np.ndarray, list[np.ndarray], dict[str, Any]]:
        """Alg. 3 line 4: HC rerun on the extended A with the same cut."""
        tree, labels = self._cut(proximity)
        m = len(state.clustered)
        previous = np.concatenate([state.assignment[state.clustered],
                                   np.full(len(ids) - m, UNASSIGNED)])
        source = pa.match_clusters(previous, labels)   # each rerun cluster's old cluster
        assignment = state.assignment.copy()
        models = list(state.models)
        if self.reassign_existing:
            models = [state.models[s] if s >= 0 else state.initial for s in source]
            assignment[ids] = labels
        else:
            fresh: dict[int, int] = {}
            for j, c in enumerate(ids[m:].tolist()):
                h = int(labels[m + j])
                if source[h] >= 0:
                    assignment[c] = source[h]
                else:   # no old client is similar enough: a new cluster from theta_0
                    if h not in fresh:
                        fresh[h] = len(models)
                        models.append(state.initial)
                    assignment[c] = fresh[h]
        event = self._clustering_event("pacfl_newcomers", ids, proximity, tree, labels)
        event.update(rule="rerun", old_moved=int(np.sum(source[labels[:m]] != previous[:m])))
        return assignment, models, event

    def _aggregate(self, state: PACFLState, results: Sequence[ClientResult]
                   ) -> tuple[PACFLState, dict[str, Any]]:
        """Alg. 1 lines 23-25: |D_k|-weighted FedAvg inside each cluster over its participants."""
        train = [r for r in results if r.kind is TaskKind.TRAIN]
        finetuned = sum(1 for r in train if r.meta.get("finetune"))
        # A client without a cluster (e.g. its signature was rejected) adds to no model.
        group = sorted((r for r in train if not r.meta.get("finetune")
                        and state.assignment[r.client] != UNASSIGNED), key=lambda r: r.client)
        clusters = [int(state.assignment[r.client]) for r in group]
        models = results_fedavg(state.models, group, clusters, self.weighting)
        trained = len(group)
        d = models.shape[1]
        # Per round: one model down per training client, one up unless it only fine-tunes.
        metrics = {"clusters_trained": len(set(clusters)), "clients_trained": trained,
                   "finetuned": finetuned, "down_floats": (trained + finetuned) * d,
                   "up_floats": trained * d}
        return replace(state, models=models), metrics

    # views -----------------------------------------------------------------------------------

    def clusters(self, state: PACFLState) -> ClusterView:
        """Cluster models; clients without a cluster yet (before clustering, newcomers not
        arrived) are served theta_0 as one extra entry."""
        waiting = state.assignment == UNASSIGNED
        if not waiting.any():
            return ClusterView(state.models, state.assignment.copy())
        models = np.concatenate([state.models, state.initial[None]])
        assignment = np.where(waiting, len(state.models), state.assignment)
        return ClusterView(models, assignment)

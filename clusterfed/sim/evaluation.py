"""Evaluation protocols and the per-round accuracy record."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from clusterfed.algorithms.base import ClusterView
from clusterfed.clustering.metrics import has_truth, truth_scores
from clusterfed.sim.executor import Executor
from clusterfed.tasks import ClientTask, TaskKind, TrainSpec, match_results, numbered

log = logging.getLogger("clusterfed")


def evaluate_clients(executor: Executor, view: ClusterView,
                     own_models: dict[int, np.ndarray] | None) -> np.ndarray:
    """(loss, accuracy) per client.

    protocol 'cluster' (own_models None): each client's cluster model on its test data.
    protocol 'local': each client's own last locally trained model; a client not yet trained
    falls back to its cluster model.
    """
    n = len(view.assignment)
    out = np.zeros((n, 2))
    own_models = own_models or {}
    # Clients served by the same cluster model are evaluated together.
    for k in np.unique(view.assignment):
        members = [int(c) for c in np.flatnonzero(view.assignment == k) if int(c) not in own_models]
        if members:
            out[members] = executor.evaluate(view.models[k], members)
    for c, params in own_models.items():
        out[c] = executor.evaluate(params, [c])[0]
    return out


# The (round, step) seed slot of test-time adaptation: far from any algorithm's sub-steps.
ADAPTATION_STEP = 2**31 - 1


def evaluate_adapted(executor: Executor, view: ClusterView, spec: TrainSpec, round_index: int
                     ) -> np.ndarray:
    """(loss, accuracy) per client of its served model after `spec`'s local training.

    The training runs as TRAIN tasks (batch order seeded by round and client, so a resumed run
    gives the same figures); a client whose result is not finite is tested unadapted. A client
    whose result never came (a silent node) is not scored: NaN, as in any evaluation it misses.
    """
    n = len(view.assignment)
    tasks = numbered([ClientTask(c, TaskKind.TRAIN, view.models[view.assignment[c]], spec)
                      for c in range(n)], 0)
    out = np.full((n, 2), np.nan)
    for task, result in match_results(tasks, executor.run(tasks, round_index, ADAPTATION_STEP)):
        params = task.params
        if result.is_finite() and result.update is not None:
            params = (params + result.update).astype(np.float32)
        else:
            log.warning("client %d: test-time adaptation gave non-finite values; tested "
                        "unadapted", task.client)
        out[task.client] = executor.evaluate(params, [task.client])[0]
    return out


def sampled_local_accuracy(executor: Executor, view: ClusterView,
                           previous: dict[int, np.ndarray], sampled: np.ndarray,
                           test_sizes: np.ndarray) -> float:
    """LCFL's authors' figure (lcfl.md 4.4, D8): protocol 'sampled_local'.

    Each of the round's sampled clients scores the model it held before the round's training
    (its previous local model; its cluster model if it has not trained yet) on its test data;
    the clients' accuracies are averaged weighted by their test samples.
    """
    sampled = np.asarray(sampled, dtype=np.int64)
    if len(sampled) == 0:
        return float("nan")
    acc = np.array([executor.evaluate(previous[c] if c in previous
                                      else view.models[view.assignment[c]], [c])[0, 1]
                    for c in sampled.tolist()])
    weights = np.asarray(test_sizes, dtype=np.float64)[sampled]
    return float(acc @ weights / weights.sum()) if weights.sum() > 0 else float(acc.mean())


def least_test_loss(executor: Executor, view: ClusterView) -> tuple[np.ndarray, np.ndarray]:
    """Protocol 'min_test_loss' (the IFCA authors' test): every client scores every model on
    its test data and reports the figures of the one with the least loss. Returns (loss,
    accuracy) per client and the chosen model per client."""
    n = len(view.assignment)
    everyone = list(range(n))
    scores = np.stack([executor.evaluate(model, everyone) for model in view.models])  # (K, n, 2)
    chosen = np.argmin(scores[:, :, 0], axis=0)
    return scores[chosen, np.arange(n)], chosen


def best_of_path(executor: Executor, algorithm: Any, state: Any, view: ClusterView
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Protocol 'best_of_path': each client's best model on its root-to-leaf path.

    Each model on the path (an algorithm's `path_models(state, client)`, most general first;
    just the cluster model for algorithms without a tree) is scored on the client's held-out
    validation data; the client reports the test figures of the best, ties going to the more
    specialised model. Returns (loss, accuracy) per client and the chosen depth per client.
    """
    n = len(view.assignment)
    out, depth = np.zeros((n, 2)), np.zeros(n, dtype=np.int64)
    paths = getattr(algorithm, "path_models", None)
    for c in range(n):
        models = paths(state, c) if paths else [view.models[view.assignment[c]]]
        scores = [executor.evaluate(m, [c], split="validation")[0, 1] for m in models]
        best = len(scores) - 1 - int(np.argmax(scores[::-1]))
        depth[c] = best
        out[c] = executor.evaluate(models[best], [c])[0]
    return out, depth


def evaluated_mean(values: np.ndarray) -> float:
    """The mean over the clients evaluated (NaN: a client a remote runtime could not reach)."""
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if len(kept) else float("nan")


def truth_figures(accuracy: np.ndarray, found: np.ndarray, true_clusters: np.ndarray
                  ) -> dict[str, Any]:
    """The figures of a record that need the true clusters: ARI, NMI and the mean accuracy
    of each true cluster; each None where the truth is unknown (own data)."""
    per_true = None
    if has_truth(true_clusters):
        per_true = {str(int(k)): evaluated_mean(accuracy[true_clusters == k])
                    for k in np.unique(true_clusters)}
    return {"per_true_cluster_accuracy": per_true, **truth_scores(true_clusters, found)}


def round_record(per_client: np.ndarray, view: ClusterView, true_clusters: np.ndarray,
                 target_accuracy: float | None = None) -> dict[str, Any]:
    """Accuracy and clustering figures of one evaluation, JSON-ready.

    With a target accuracy, also the share of clients at or above it (FL+HC's second metric).
    A client a remote runtime could not evaluate has NaN figures: the means are over the
    clients evaluated, and `unevaluated_clients` lists the others. Without a truth, `ari`,
    `nmi` and `per_true_cluster_accuracy` are None (null in metrics.jsonl).
    """
    acc = per_client[:, 1]
    found = view.assignment
    truth = truth_figures(acc, found, true_clusters)
    missing = np.flatnonzero(np.isnan(per_client).any(axis=1))
    evaluated = acc[~np.isnan(acc)]
    extra = {} if target_accuracy is None else {
        "clients_at_target": float(np.mean(evaluated >= target_accuracy - 1e-9))
        if len(evaluated) else float("nan")}
    record = {
        "mean_accuracy": evaluated_mean(acc),
        "mean_loss": evaluated_mean(per_client[:, 0]),
        "per_client_accuracy": [round(float(a), 6) for a in acc],
        "per_client_loss": [round(float(v), 6) for v in per_client[:, 0]],
        "per_cluster_accuracy": {str(int(k)): evaluated_mean(acc[found == k])
                                 for k in np.unique(found)},
        "per_true_cluster_accuracy": truth["per_true_cluster_accuracy"],
        "n_clusters": view.num_clusters,
        "ari": truth["ari"],
        "nmi": truth["nmi"],
        **extra,
    }
    if len(missing):
        record["unevaluated_clients"] = missing.tolist()
    return record

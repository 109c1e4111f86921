"""The evaluation protocols: a registry of name -> planner of tasks and scorer of their results.

A protocol plans EVALUATE tasks (and TRAIN tasks for test-time adaptation) like an algorithm
plans its own, phase by phase; the runtime numbers and runs them through its executor (the
simulator's, or the Flower executor's nodes) and hands back the matched (task, result) pairs;
the scorer turns them into the round's metrics. A client whose result never came (a silent
node) is not scored: its figures are NaN and every mean is over the clients that answered.
No torch here: the same code serves every runtime.

Consecutive EVALUATE tasks that hold the same array (one model sent to many clients) are scored
together by the in-process executors; a planner that wants a client scored alone gives its task
an array of its own (`np.ndarray.view`, no copy).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from clusterfed.algorithms.base import ClusterView
from clusterfed.clustering.metrics import evaluated_mean
from clusterfed.errors import ConfigError
from clusterfed.sim.evaluation import round_record
from clusterfed.tasks import ClientResult, ClientTask, TaskKind, TrainSpec

log = logging.getLogger("clusterfed")

Pairs = list[tuple[ClientTask, ClientResult]]
# Runs one phase's tasks: numbers them, executes them, returns the matched pairs.
Runner = Callable[[Sequence[ClientTask]], Pairs]

# The (round, step) seed slot of test-time adaptation: far from any algorithm's sub-steps.
ADAPTATION_STEP = 2**31 - 1


@dataclass(frozen=True)
class EvalContext:
    """What a protocol may know after a round: the algorithm's view, never the data."""

    view: ClusterView
    true_clusters: np.ndarray
    test_sizes: np.ndarray                       # what the executor (or the nodes) describe
    target_accuracy: float | None = None
    own_models: Mapping[int, np.ndarray] | None = None   # 'local': each client's last model
    previous_models: Mapping[int, np.ndarray] = field(default_factory=dict)  # 'sampled_local'
    sampled: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    also_cluster: bool = False
    adaptation: TrainSpec | None = None          # test-time adaptation ('cluster', 'local')
    path_models: Callable[[int], list[np.ndarray]] | None = None   # 'best_of_path'
    split: str = "test"        # eval.split: the data the figures are scored on

    @property
    def n(self) -> int:
        return len(self.view.assignment)


class EvaluationProtocol(Protocol):
    def plan(self, ev: EvalContext, done: Sequence[Pairs]) -> list[ClientTask] | None:
        """The next phase's tasks, given the earlier phases' pairs; None when done."""

    def score(self, ev: EvalContext, done: Sequence[Pairs]) -> dict[str, Any]:
        """The metrics of the phases' pairs."""


def run_protocol(protocol: EvaluationProtocol, ev: EvalContext, run: Runner) -> dict[str, Any]:
    done: list[Pairs] = []
    while (tasks := protocol.plan(ev, done)) is not None:
        done.append(run(tasks))
    return protocol.score(ev, done)


# Pieces every protocol uses -----------------------------------------------------------------

def _task(client: int, params: np.ndarray, part: str, split: str = "test", **more: int
          ) -> ClientTask:
    return ClientTask(int(client), TaskKind.EVALUATE, params, meta={"part": part, **more},
                      split=split)


def served_tasks(ev: EvalContext, own: Mapping[int, np.ndarray] | None, part: str
                 ) -> list[ClientTask]:
    """Each client's cluster model (clients served alike together), or its own model when it
    has one ('local'), on its `ev.split` data."""
    own = own or {}
    tasks = []
    for k in np.unique(ev.view.assignment):
        model = ev.view.models[k]   # one array for the cluster's members: scored together
        tasks += [_task(c, model, part, ev.split) for c in np.flatnonzero(ev.view.assignment == k)
                  if int(c) not in own]
    return tasks + [_task(c, params, part, ev.split) for c, params in own.items()]


def served_its_cluster_model(ev: EvalContext) -> np.ndarray:
    """(n,) bool: the clients the 'local' protocol served their cluster model (no own model,
    or one equal to it: SOLO's own models are its 'clusters'), whose cluster figures are their
    served ones and need no second pass."""
    own = ev.own_models or {}
    return np.array([c not in own or np.array_equal(own[c], ev.view.models[k])
                     for c, k in enumerate(ev.view.assignment)], dtype=bool)


def has_figures(result: ClientResult) -> bool:
    """A result that scored something: figures over at least one test sample (a client
    without test data answers 0s over none, which would pull every mean down)."""
    return result.losses is not None and result.num_samples > 0


def figures(ev: EvalContext, pairs: Pairs, part: str) -> np.ndarray:
    """(loss, accuracy) per client from the pairs of one part; NaN where none answered or the
    client holds no test sample."""
    out = np.full((ev.n, 2), np.nan)
    for task, result in pairs:
        if task.meta.get("part") == part and has_figures(result):
            out[task.client] = (result.losses[0], result.accuracies[0])
    return out


# The protocols --------------------------------------------------------------------------------

class Served:
    """'cluster': each client's cluster model. 'local': each client's own last trained model
    (its cluster model before it trains), and with `also_cluster` the cluster models too.
    An algorithm's test-time adaptation replaces either: each client fine-tunes its served
    model (TRAIN tasks, seeded by round and client) and is tested on the result."""

    def __init__(self, local: bool) -> None:
        self.local = local

    def plan(self, ev: EvalContext, done: Sequence[Pairs]) -> list[ClientTask] | None:
        if ev.adaptation is not None:
            if not done:
                return served_tasks(ev, None, "served") + [
                    ClientTask(c, TaskKind.TRAIN, ev.view.models[ev.view.assignment[c]],
                               ev.adaptation) for c in range(ev.n)]
            return self._adapted(done[0], ev.split) if len(done) == 1 else None
        if done:
            return None
        tasks = served_tasks(ev, ev.own_models if self.local else None, "served")
        if self.local and ev.also_cluster:
            alike = served_its_cluster_model(ev)
            tasks += [t for t in served_tasks(ev, None, "cluster") if not alike[t.client]]
        return tasks

    @staticmethod
    def _adapted(pairs: Pairs, split: str) -> list[ClientTask]:
        tasks = []
        for task, result in pairs:
            if task.kind is not TaskKind.TRAIN:
                continue
            params = task.params
            if result.is_finite() and result.update is not None:
                params = (params + result.update).astype(np.float32)
            else:
                log.warning("client %d: test-time adaptation gave non-finite values; tested "
                            "unadapted", task.client)
            tasks.append(_task(task.client, params.view(), "adapted", split))
        return tasks

    def score(self, ev: EvalContext, done: Sequence[Pairs]) -> dict[str, Any]:
        if ev.adaptation is not None:
            adapted = figures(ev, done[1] if len(done) > 1 else [], "adapted")
            record = round_record(adapted, ev.view, ev.true_clusters, ev.target_accuracy)
            record["served_mean_accuracy"] = evaluated_mean(figures(ev, done[0], "served")[:, 1])
            return record
        served = figures(ev, done[0], "served")
        record = round_record(served, ev.view, ev.true_clusters, ev.target_accuracy)
        if self.local and ev.also_cluster:
            acc = figures(ev, done[0], "cluster")[:, 1]
            alike = served_its_cluster_model(ev)
            acc[alike] = served[alike, 1]
            record.update({"cluster_mean_accuracy": evaluated_mean(acc),
                           "cluster_per_client_accuracy": [round(float(a), 6) for a in acc]})
        return record


def sampled_local_mean(accuracy: Mapping[int, float], test_sizes: np.ndarray) -> float:
    """LCFL's authors' figure (lcfl.md 4.4, D8): the sampled clients' accuracies weighted by
    their test samples, over the clients that answered."""
    if not accuracy:
        return float("nan")
    acc = np.array(list(accuracy.values()))
    weights = np.asarray(test_sizes, dtype=np.float64)[list(accuracy)]
    return float(acc @ weights / weights.sum()) if weights.sum() > 0 else float(acc.mean())


class SampledLocal:
    """'sampled_local': the 'local' protocol's figures, and as the headline each of the
    round's sampled clients scoring the model it held before the round's training (its
    previous local model; its cluster model if it had not trained) on its test data."""

    def plan(self, ev: EvalContext, done: Sequence[Pairs]) -> list[ClientTask] | None:
        if done:
            return None
        sampled = [int(c) for c in np.asarray(ev.sampled, dtype=np.int64)]
        return served_tasks(ev, ev.own_models, "served") + [
            _task(c, (ev.previous_models[c] if c in ev.previous_models
                      else ev.view.models[ev.view.assignment[c]]).view(), "sampled", ev.split)
            for c in sampled]

    def score(self, ev: EvalContext, done: Sequence[Pairs]) -> dict[str, Any]:
        record = round_record(figures(ev, done[0], "served"), ev.view, ev.true_clusters,
                              ev.target_accuracy)
        record["local_mean_accuracy"] = record["mean_accuracy"]
        accuracy = {t.client: float(r.accuracies[0]) for t, r in done[0]
                    if t.meta.get("part") == "sampled" and r.accuracies is not None}
        record["mean_accuracy"] = sampled_local_mean(accuracy, ev.test_sizes)
        return record


def least_loss(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, n, 2) (loss, accuracy) of every model on every client -> each client's figures of
    the model with the least loss, and that model (NaN figures where a client is missing)."""
    chosen = np.argmin(np.where(np.isnan(scores[:, :, 0]), np.inf, scores[:, :, 0]), axis=0)
    out = scores[chosen, np.arange(scores.shape[1])]
    out[np.isnan(scores).any(axis=(0, 2))] = np.nan
    return out, chosen


class LeastTestLoss:
    """'min_test_loss' (the IFCA authors' test): every client scores every model on its test
    data and reports the figures of the one with the least loss; the served figures too."""

    def plan(self, ev: EvalContext, done: Sequence[Pairs]) -> list[ClientTask] | None:
        if done:
            return None
        tasks = [_task(c, model, "model", ev.split, k=k) for k, model in enumerate(ev.view.models)
                 for c in range(ev.n)]
        return tasks + served_tasks(ev, None, "served")

    def score(self, ev: EvalContext, done: Sequence[Pairs]) -> dict[str, Any]:
        scores = np.full((len(ev.view.models), ev.n, 2), np.nan)
        for task, result in done[0]:
            if task.meta.get("part") == "model" and has_figures(result):
                scores[int(task.meta["k"]), task.client] = (result.losses[0],
                                                            result.accuracies[0])
        chosen_figures, chosen = least_loss(scores)
        record = round_record(chosen_figures, ev.view, ev.true_clusters, ev.target_accuracy)
        answered = ~np.isnan(chosen_figures).any(axis=1)
        served = figures(ev, done[0], "served")
        record.update({"served_mean_accuracy": evaluated_mean(served[:, 1]),
                       "test_chose_served": float(np.mean(
                           chosen[answered] == ev.view.assignment[answered]))
                       if answered.any() else float("nan")})
        return record


class BestOfPath:
    """'best_of_path': each model on a client's root-to-leaf path (an algorithm's
    `path_models`, most general first; the cluster model for algorithms without a tree) is
    scored on the client's held-out validation data; the client reports the test figures of
    the best, ties going to the more specialised model; the leaf (served) figures too."""

    @staticmethod
    def _path(ev: EvalContext, c: int) -> list[np.ndarray]:
        if ev.path_models is not None:
            return ev.path_models(c)
        return [ev.view.models[ev.view.assignment[c]]]

    @staticmethod
    def _best(ev: EvalContext, pairs: Pairs) -> dict[int, int]:
        """Each client's chosen depth, for the clients that answered for every path model."""
        scores: dict[int, dict[int, float]] = {}
        for task, result in pairs:
            scores.setdefault(task.client, {})[int(task.meta["depth"])] = \
                float(result.accuracies[0])
        best = {}
        for c, by_depth in scores.items():
            if len(by_depth) == len(BestOfPath._path(ev, c)):
                values = [by_depth[i] for i in range(len(by_depth))]
                best[c] = len(values) - 1 - int(np.argmax(values[::-1]))
        return best

    def plan(self, ev: EvalContext, done: Sequence[Pairs]) -> list[ClientTask] | None:
        if not done:
            return [_task(c, m.view(), "path", "validation", depth=i)
                    for c in range(ev.n) for i, m in enumerate(self._path(ev, c))]
        if len(done) == 1:
            best = self._best(ev, done[0])
            return [_task(c, self._path(ev, c)[d].view(), "best")
                    for c, d in sorted(best.items())] + served_tasks(ev, None, "served")
        return None

    def score(self, ev: EvalContext, done: Sequence[Pairs]) -> dict[str, Any]:
        best = self._best(ev, done[0])
        record = round_record(figures(ev, done[1], "best"), ev.view, ev.true_clusters,
                              ev.target_accuracy)
        leaf = figures(ev, done[1], "served")
        record.update({"leaf_mean_accuracy": evaluated_mean(leaf[:, 1]),
                       "chosen_path_depth": [best.get(c, -1) for c in range(ev.n)]})
        return record


def no_mixture_message(algorithm: str) -> str:
    return (f"eval.protocol=mixture needs a method with mixture weights (fedem, fedrc); "
            f"{algorithm} serves one model per client")


def mixture_tasks(view: ClusterView, part: str, split: str = "test") -> list[ClientTask]:
    """Each client's EVALUATE task of its mixture: the view's models it weighs, stacked, with
    its weights. A model of weight 0 is not sent (fewer bytes, the same mixture); clients that
    weigh the same models share one array (with every model: the view's own, no copy)."""
    if view.weights is None:
        raise ConfigError(no_mixture_message("this algorithm"))
    stacks: dict[tuple[int, ...], np.ndarray] = {}
    tasks = []
    for c, row in enumerate(np.asarray(view.weights, dtype=np.float64)):
        kept = tuple(np.flatnonzero(row > 0).tolist())
        if kept not in stacks:
            stacks[kept] = view.models if len(kept) == len(view.models) else \
                view.models[list(kept)]
        weights = row[list(kept)]
        tasks.append(ClientTask(c, TaskKind.EVALUATE, stacks[kept], meta={"part": part},
                                mixture=weights / weights.sum(), split=split))
    return tasks


class Mixture:
    """'mixture' (FedEM's and FedRC's prediction): each client tested with its mixture
    p(y | x) = sum_m w_c,m p(y | x, theta_m) of the view's models, weighted by the view's
    mixture weights; the client computes it (the server sees its loss and accuracy only).
    The served models' figures too (`served_mean_accuracy`). Methods without mixture weights
    are refused (ConfigError)."""

    def plan(self, ev: EvalContext, done: Sequence[Pairs]) -> list[ClientTask] | None:
        if done:
            return None
        return mixture_tasks(ev.view, "mixture", ev.split) + served_tasks(ev, None, "served")

    def score(self, ev: EvalContext, done: Sequence[Pairs]) -> dict[str, Any]:
        record = round_record(figures(ev, done[0], "mixture"), ev.view, ev.true_clusters,
                              ev.target_accuracy)
        record["served_mean_accuracy"] = evaluated_mean(figures(ev, done[0], "served")[:, 1])
        return record


PROTOCOLS: dict[str, EvaluationProtocol] = {
    "cluster": Served(local=False),
    "local": Served(local=True),
    "sampled_local": SampledLocal(),
    "min_test_loss": LeastTestLoss(),
    "best_of_path": BestOfPath(),
    "mixture": Mixture(),
}

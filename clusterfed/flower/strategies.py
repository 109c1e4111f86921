"""clusterfed's clustered methods as Flower strategies, for any Flower app.

A Flower user swaps `FedAvg` for `CFL` (or `FLHC`, `IFCA`, `FeSEM`, `FlexCFL`, `PACFL`) and
keeps their ServerApp and ClientApp. The strategy speaks Flower's standard message convention:
a `train` message carries the model in `"arrays"` and the settings in `"config"` and is
answered with the trained `"arrays"` and a `"metrics"` record holding `"num-examples"`; an
`evaluate` message is answered with `"eval_loss"` (and whatever else, such as `"eval_acc"`)
and `"num-examples"`. clusterfed's own extras travel in the config under keys that start with
`clusterfed-`; a ClientApp that ignores them works.

The server logic is the registered algorithm's own `init / plan / update / clusters`, the same
code the simulator and clusterfed's own Flower app run: a planned TRAIN task becomes a `train`
message; a LOSSES task (IFCA's per-model losses) becomes one `evaluate` message a model, whose
`"eval_loss"` is that model's loss (the client's evaluation data, where the simulator scores its
training data: see docs/flower-strategies.md); a SIGNATURE task (PACFL's) becomes a
`query.clusterfed_signature` message, which the handler of `clusterfed.flower.queries` that the
user registers answers. Methods whose clients must send more (gradients, LCFL's cross losses on
a subsample, per-sample losses) are not offered here.

Clients are the nodes connected when the run starts (at least `min_available_nodes`), numbered
0..n-1 in the order of their sorted node ids; nodes that connect later take no part. Each round
samples `fraction_train` of them with the simulator's seeded sampler (`sample_clients`).
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import (
    aggregate_metricrecords,
    log_strategy_start_info,
)

from clusterfed.algorithms.base import Algorithm, ClusterView, RoundContext, Setup
from clusterfed.algorithms.cfl.algorithm import CFL as CFLAlgorithm
from clusterfed.algorithms.fesem.algorithm import FeSEM as FeSEMAlgorithm
from clusterfed.algorithms.flexcfl.algorithm import FlexCFL as FlexCFLAlgorithm
from clusterfed.algorithms.flhc.algorithm import FLHC as FLHCAlgorithm
from clusterfed.algorithms.ifca.algorithm import IFCA as IFCAAlgorithm
from clusterfed.algorithms.options import options_for
from clusterfed.algorithms.pacfl.algorithm import PACFL as PACFLAlgorithm
from clusterfed.errors import ClusterfedError
from clusterfed.flower.arrays import Layout, flatten, layout_of, unflatten
from clusterfed.flower.queries import SIGNATURE
from clusterfed.flower.wire import check_result, decode_result, encode_task
from clusterfed.sampling import clients_per_round, sample_clients
from clusterfed.tasks import ClientResult, ClientTask, TaskKind, TrainSpec, numbered

# clusterfed's extras in a message's config (a ClientApp may ignore them).
STEP_KEY = "clusterfed-step"     # the step within the round (methods with several phases)
TASK_KEY = "clusterfed-task"     # what the reply is for: "train", "losses" or "evaluate"
MODEL_KEY = "clusterfed-model"   # losses: which of the candidate models this message holds
CLUSTER_KEY = "clusterfed-cluster"  # evaluate: the cluster whose model this is
ROUND_KEY = "server-round"       # Flower's own key, as FedAvg sets it
TRAIN_LOSS_KEY = "train_loss"    # Flower's templates' training loss metric, if sent
EVAL_LOSS_KEY = "eval_loss"      # Flower's templates' evaluation loss metric
_EVAL_SAMPLE_TAG = 0xE7A1


@dataclass
class ClusteredResult(Result):
    """Flower's `Result`, plus the clusters: `arrays` is the model serving the most clients;
    `cluster_arrays[k]` is cluster k's model; `assignment` maps each node id to its cluster;
    `node_ids[c]` is client c's node (clients are the sorted node ids)."""

    cluster_arrays: list[ArrayRecord] = field(default_factory=list)
    assignment: dict[int, int] = field(default_factory=dict)
    node_ids: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        sizes = np.bincount(list(self.assignment.values()) or [0],
                            minlength=len(self.cluster_arrays)).tolist()
        return (super().__repr__() + f"\nClusters: {len(self.cluster_arrays)}, "
                f"sizes {sizes} (nodes: ClusteredResult.assignment)\n")


@dataclass
class _Step:
    """The tasks of one step and the messages that carry them."""

    tasks: list[ClientTask]
    messages: list[Message] = field(default_factory=list)
    task_of: list[int] = field(default_factory=list)   # message i carries tasks[task_of[i]]


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


class ClusteredStrategy(Strategy):
    """A clusterfed algorithm driven over Flower's Grid with Flower's message convention.

    `algorithm`: any clusterfed algorithm whose clients only train and score models and send
    signatures (its `plan` yields TRAIN, LOSSES on the training data, and SIGNATURE tasks).
    The other arguments mean what FedAvg's do; `seed` seeds the client sampling (and the
    algorithm's own draws).
    """

    def __init__(self, algorithm: Algorithm[Any], *, fraction_train: float = 1.0,
                 fraction_evaluate: float = 1.0, min_available_nodes: int = 2,
                 weighted_by_key: str = "num-examples", arrayrecord_key: str = "arrays",
                 configrecord_key: str = "config", seed: int = 0) -> None:
        if not 0 < fraction_train <= 1 or not 0 <= fraction_evaluate <= 1:
            raise ClusterfedError("fraction_train is in (0, 1], fraction_evaluate in [0, 1]")
        self.algorithm = algorithm
        self.fraction_train = float(fraction_train)
        self.fraction_evaluate = float(fraction_evaluate)
        self.min_available_nodes = int(min_available_nodes)
        self.weighted_by_key = weighted_by_key
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key
        self.seed = int(seed)
        self.node_ids: list[int] = []    # client index -> node id
        self.layout: Layout | None = None
        self.state: Any = None
        self._ctx: RoundContext | None = None
        self._step: _Step | None = None
        self._round_done = True
        self._next_id = 0
        self._train_replies: list[RecordDict] = []
        self._evaluated: list[int] = []

    # Set-up ---------------------------------------------------------------------------------

    def summary(self) -> None:
        log(INFO, "\t├──> %s (clusterfed): %s", type(self).__name__, self.algorithm)
        log(INFO, "\t├──> Sampling: fraction train (%.2f) | evaluate (%.2f), seed %d",
            self.fraction_train, self.fraction_evaluate, self.seed)
        log(INFO, "\t└──> Minimum nodes at the start: %d", self.min_available_nodes)

    def join(self, grid: Grid, poll: float = 1.0) -> list[int]:
        """Wait for `min_available_nodes` nodes; they are the clients, by sorted node id."""
        while len(nodes := sorted(int(n) for n in grid.get_node_ids())) \
                < self.min_available_nodes:
            log(INFO, "Waiting for nodes to connect: %d connected (minimum required: %d).",
                len(nodes), self.min_available_nodes)
            time.sleep(poll)
        self.node_ids = nodes
        log(INFO, "%d nodes are the clients 0..%d (by sorted node id)", len(nodes),
            len(nodes) - 1)
        return nodes

    def init(self, grid: Grid, initial_arrays: ArrayRecord) -> None:
        """Take the connected nodes as the clients and start the algorithm's state."""
        self.join(grid)
        self.layout = layout_of(initial_arrays)
        n = len(self.node_ids)
        setup = Setup(num_clients=n, initial_params=flatten(initial_arrays, self.layout),
                      num_samples=np.zeros(n, dtype=np.int64), seed=self.seed)
        try:
            self.state = self.algorithm.init(setup)
        except ValueError as err:
            raise ClusterfedError(f"{type(self).__name__}: {err}") from err

    # Training -------------------------------------------------------------------------------

    def _context(self, server_round: int, config: ConfigRecord) -> RoundContext:
        lr = config.get("lr", 0.1)
        train = TrainSpec(lr=float(lr) if isinstance(lr, int | float) and lr > 0 else 0.1,
                          batch_size=1)   # the clients' own; a method that reads lr reads this
        sampled = sample_clients(self.seed, server_round - 1, len(self.node_ids),
                                 self.fraction_train)
        return RoundContext(server_round - 1, sampled, train)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The messages of the round's next step (`arrays` is unused: each cluster has its own
        model, held by the strategy)."""
        if self._round_done:
            self._ctx = self._context(server_round, config)
            self._next_id, self._round_done = 0, False
            self._train_replies = []
        assert self._ctx is not None and self.layout is not None
        tasks = numbered(self.algorithm.plan(self.state, self._ctx), self._next_id)
        self._next_id += len(tasks)
        step = _Step(tasks)
        base = {**dict(config), ROUND_KEY: server_round, STEP_KEY: self._ctx.step}
        for i, task in enumerate(tasks):
            for kind, content in self._contents(task, base):
                step.messages.append(Message(content, self.node_ids[task.client], kind,
                                             group_id=str(server_round)))
                step.task_of.append(i)
        self._step = step
        return step.messages

    def _contents(self, task: ClientTask, base: Mapping[str, Any]
                  ) -> list[tuple[str, RecordDict]]:
        """A task's messages (type, content): one for TRAIN, one a candidate model for LOSSES,
        a `query.clusterfed_signature` for SIGNATURE (clusterfed.flower.queries answers it)."""
        assert self.layout is not None
        if task.kind is TaskKind.TRAIN:
            return [("train", self._content(task.params, {**base, TASK_KEY: "train"}))]
        if task.kind is TaskKind.LOSSES and (task.loss is None or task.loss.data == "train"
                                             and not task.loss.per_sample
                                             and task.loss.max_samples is None):
            rows = np.atleast_2d(task.params)
            return [("evaluate", self._content(row, {**base, TASK_KEY: "losses",
                                                     MODEL_KEY: j}))
                    for j, row in enumerate(rows)]
        if task.kind is TaskKind.SIGNATURE:
            return [(f"query.{SIGNATURE}",
                     encode_task(task, int(base[ROUND_KEY]) - 1, int(base[STEP_KEY]), ""))]
        raise ClusterfedError(
            f"{type(self).__name__} planned a {task.kind.value} task, which Flower's train and "
            f"evaluate replies cannot answer; see docs/flower-strategies.md for the methods "
            f"offered as strategies")

    def _content(self, params: np.ndarray, config: Mapping[str, Any]) -> RecordDict:
        assert self.layout is not None
        return RecordDict({self.arrayrecord_key: unflatten(params, self.layout),
                           self.configrecord_key: ConfigRecord(
                               {k: _plain(v) for k, v in config.items()})})

    def _replies_by_message(self, replies: Iterable[Message]) -> dict[str, Message]:
        out = {}
        for reply in replies:
            if reply.has_error():
                log(WARNING, "node %d sent an error: %s", reply.metadata.src_node_id,
                    reply.error.reason)
                continue
            out[reply.metadata.reply_to_message_id] = reply
        return out

    def _result(self, task: ClientTask, replies: list[Message | None]) -> ClientResult | None:
        """The ClientResult of a task's replies, or None (logged) if one is missing or bad."""
        node = self.node_ids[task.client]
        if any(r is None for r in replies):
            log(WARNING, "no reply from node %d (client %d): left out of this step", node,
                task.client)
            return None
        try:
            if task.kind is TaskKind.SIGNATURE:
                return self._signature(task, replies[0])   # type: ignore[arg-type]
            metrics = [r.content.metric_records[self._metrics_key(r)] for r in replies]
            num_samples = int(metrics[0][self.weighted_by_key])
            if task.kind is TaskKind.TRAIN:
                assert self.layout is not None
                trained = flatten(replies[0].content.array_records[self.arrayrecord_key],
                                  self.layout)
                update = trained - task.params
                if not np.isfinite(update).all():
                    raise ValueError("its model holds NaN or Inf")
                loss = float(metrics[0].get(TRAIN_LOSS_KEY, math.nan))
                return ClientResult(task.client, TaskKind.TRAIN, num_samples,
                                    update=update.astype(np.float32), loss=loss,
                                    meta=dict(task.meta), task_id=task.id)
            losses = np.array([float(m[EVAL_LOSS_KEY]) for m in metrics])
            if not np.isfinite(losses).all():
                raise ValueError("a loss is NaN or Inf")
            return ClientResult(task.client, TaskKind.LOSSES, num_samples, losses=losses,
                                meta=dict(task.meta), task_id=task.id)
        except (KeyError, TypeError, ValueError) as err:
            log(WARNING, "rejected the %s reply of node %d (client %d): %s", task.kind.value,
                node, task.client, err)
            return None

    @staticmethod
    def _signature(task: ClientTask, reply: Message) -> ClientResult:
        result = decode_result(reply.content)
        problem = check_result(task, result)
        if problem is not None:
            raise ValueError(problem)
        return result

    @staticmethod
    def _metrics_key(reply: Message) -> str:
        keys = list(reply.content.metric_records)
        if len(keys) != 1:
            raise ValueError(f"a reply holds one MetricRecord, this one {len(keys)}")
        return keys[0]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Update the algorithm with this step's replies; the model serving the most clients
        and the round's aggregated train metrics once the round is done, else (None, None)."""
        assert self._step is not None and self._ctx is not None
        by_id = self._replies_by_message(replies)
        grouped: dict[int, list[Message | None]] = {}
        for message, i in zip(self._step.messages, self._step.task_of, strict=True):
            grouped.setdefault(i, []).append(by_id.get(message.metadata.message_id))
        results = []
        for i, got in grouped.items():
            result = self._result(self._step.tasks[i], got)
            if result is not None:
                results.append(result)
                if result.kind is TaskKind.TRAIN:
                    self._train_replies.append(got[0].content)   # type: ignore[union-attr]
        update = self.algorithm.update(self.state, self._ctx, results)
        self.state = update.state
        if not update.round_done:
            self._ctx = RoundContext(self._ctx.round, self._ctx.sampled, self._ctx.train,
                                     self._ctx.step + 1)
            return None, None
        self._round_done = True
        view = self.algorithm.clusters(self.state)
        log(INFO, "\t├──> %d clusters, sizes %s", len(view.models),
            np.bincount(view.assignment, minlength=len(view.models)).tolist())
        metrics = (aggregate_metricrecords(self._train_replies, self.weighted_by_key)
                   if self._train_replies else None)
        return self._served(view), metrics

    @property
    def round_done(self) -> bool:
        return self._round_done

    # Evaluation -----------------------------------------------------------------------------

    def view(self) -> ClusterView:
        return self.algorithm.clusters(self.state)

    def _served(self, view: ClusterView) -> ArrayRecord:
        assert self.layout is not None
        counts = np.bincount(view.assignment, minlength=len(view.models))
        return unflatten(view.models[int(np.argmax(counts))], self.layout)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Each sampled client gets its cluster's model (`arrays` is unused)."""
        n = len(self.node_ids)
        if self.fraction_evaluate == 0:
            self._evaluated = []
            return []
        count = clients_per_round(self.fraction_evaluate, n)
        rng = np.random.default_rng([self.seed, server_round, _EVAL_SAMPLE_TAG])
        self._evaluated = (list(range(n)) if count >= n
                           else sorted(rng.choice(n, size=count, replace=False).tolist()))
        view = self.view()
        messages = []
        for c in self._evaluated:
            k = int(view.assignment[c])
            content = self._content(view.models[k], {**dict(config), ROUND_KEY: server_round,
                                                     TASK_KEY: "evaluate", CLUSTER_KEY: k})
            messages.append(Message(content, self.node_ids[c], "evaluate",
                                    group_id=str(server_round)))
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        records = []
        for reply in replies:
            if reply.has_error():
                log(WARNING, "node %d sent an error: %s", reply.metadata.src_node_id,
                    reply.error.reason)
            elif self.weighted_by_key in next(iter(reply.content.metric_records.values()), {}):
                records.append(reply.content)
        return aggregate_metricrecords(records, self.weighted_by_key) if records else None

    # The run --------------------------------------------------------------------------------

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> ClusteredResult:
        """Run `num_rounds` rounds, as FedAvg.start does; the result adds the clusters.

        A round may take several steps (message exchanges): IFCA's losses before training,
        FL+HC's clustering round. `evaluate_fn` is called with each cluster's model; the
        round's ServerApp-side MetricRecord holds, for each metric, a list over the clusters.
        """
        log(INFO, "Starting %s strategy:", type(self).__name__)
        log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        self.summary()
        log(INFO, "")
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        self.init(grid, initial_arrays)
        result = ClusteredResult(arrays=initial_arrays)
        began = time.time()
        if evaluate_fn:
            self._evaluate_centrally(evaluate_fn, 0, result)
        for current in range(1, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", current, num_rounds)
            while True:
                replies = grid.send_and_receive(
                    messages=self.configure_train(current, result.arrays, train_config, grid),
                    timeout=timeout)
                arrays, metrics = self.aggregate_train(current, replies)
                if self.round_done:
                    break
            if arrays is not None:
                result.arrays = arrays
            if metrics is not None:
                log(INFO, "\t└──> Aggregated MetricRecord: %s", metrics)
                result.train_metrics_clientapp[current] = metrics
            replies = grid.send_and_receive(
                messages=self.configure_evaluate(current, result.arrays, evaluate_config, grid),
                timeout=timeout)
            evaluated = self.aggregate_evaluate(current, replies)
            if evaluated is not None:
                log(INFO, "\t└──> Aggregated MetricRecord: %s", evaluated)
                result.evaluate_metrics_clientapp[current] = evaluated
            if evaluate_fn:
                self._evaluate_centrally(evaluate_fn, current, result)
        self._finish(result)
        log(INFO, "")
        log(INFO, "Strategy execution finished in %.2fs", time.time() - began)
        log(INFO, "")
        log(INFO, "Final results:")
        log(INFO, "")
        for line in io.StringIO(str(result)):
            log(INFO, "\t%s", line.strip("\n"))
        log(INFO, "")
        return result

    def _evaluate_centrally(self, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None],
                            server_round: int, result: ClusteredResult) -> None:
        """evaluate_fn on every cluster's model: one list a metric, cluster by cluster."""
        assert self.layout is not None
        records = [evaluate_fn(server_round, unflatten(model, self.layout))
                   for model in self.view().models]
        if any(r is None for r in records):
            return
        keys = list(records[0])   # type: ignore[arg-type]
        merged = MetricRecord({k: [float(r[k]) for r in records] for k in keys})  # type: ignore[index]
        log(INFO, "\t└──> ServerApp-side MetricRecord (a value per cluster): %s", merged)
        result.evaluate_metrics_serverapp[server_round] = merged

    def _finish(self, result: ClusteredResult) -> None:
        assert self.layout is not None
        view = self.view()
        result.cluster_arrays = [unflatten(m, self.layout) for m in view.models]
        result.assignment = {node: int(view.assignment[c]) for c, node in enumerate(self.node_ids)}
        result.node_ids = list(self.node_ids)
        result.arrays = self._served(view)


def _strategy(name: str, algorithm: type, doc: str) -> type[ClusteredStrategy]:
    """A strategy class for one clusterfed algorithm: its options are keyword arguments
    beside FedAvg's (fraction_train, fraction_evaluate, min_available_nodes, ...)."""
    strategy_options = ("fraction_train", "fraction_evaluate", "min_available_nodes",
                        "weighted_by_key", "arrayrecord_key", "configrecord_key", "seed")

    def __init__(self: ClusteredStrategy, **options: Any) -> None:
        own = {k: options.pop(k) for k in strategy_options if k in options}
        try:
            # the flat keys (k=4, min_silhouette=...) as in a config's algorithm section
            method = algorithm(**options_for(algorithm, options))
        except (TypeError, ValueError) as err:
            raise ClusterfedError(f"{name}: {err}") from err
        ClusteredStrategy.__init__(self, method, **own)

    return type(name, (ClusteredStrategy,), {"__init__": __init__, "__doc__": doc,
                                             "__module__": __name__})


CFL = _strategy("CFL", CFLAlgorithm, "CFL (Sattler et al.): clusterfed.algorithms.cfl's "
                "options as keyword arguments. Train replies only.")
FLHC = _strategy("FLHC", FLHCAlgorithm, "FL+HC (Briggs et al.): clusterfed.algorithms.flhc's "
                 "options as keyword arguments. Train replies only.")
IFCA = _strategy("IFCA", IFCAAlgorithm, "IFCA (Ghosh et al.): clusterfed.algorithms.ifca's "
                 "options as keyword arguments. Train replies, and evaluate replies for its "
                 "per-model losses (`eval_loss`).")
FeSEM = _strategy("FeSEM", FeSEMAlgorithm, "FeSEM (Xie et al.): clusterfed.algorithms.fesem's "
                  "options as keyword arguments. Train replies only.")
FlexCFL = _strategy("FlexCFL", FlexCFLAlgorithm, "FlexCFL (Duan et al.): "
                    "clusterfed.algorithms.flexcfl's options as keyword arguments. Train "
                    "replies only.")
PACFL = _strategy("PACFL", PACFLAlgorithm, "PACFL (Vahidian et al.): "
                  "clusterfed.algorithms.pacfl's options as keyword arguments. Train replies, "
                  "and one signature query a client before round 1: register "
                  "clusterfed.flower.queries.signature_query on the ClientApp.")

STRATEGIES: dict[str, type[ClusteredStrategy]] = {
    "cfl": CFL, "flhc": FLHC, "ifca": IFCA, "fesem": FeSEM, "flexcfl": FlexCFL,
    "pacfl": PACFL}

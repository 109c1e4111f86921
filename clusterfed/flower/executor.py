"""The Flower executor: the simulator's Executor protocol over a Flower Grid.

Each task goes to the SuperNode that serves its client. Flower's node ids are random per run,
so the executor asks every node which partition it serves and what its data is like
(`query.hello`), refuses the nodes that do not fit the run (`membership`), and keeps the map;
the members are the clients 0..M-1 in partition order, sampled by id by the simulator's own
seeded generator, never by node. Every task names the partition it is meant for.

When the nodes hold the privacy secret, only they can map the initial models into P-space: the
executor asks one of them (`query.initial`).

A step waits at most `reply_timeout` seconds. A client whose node did not answer in time, whose
node sent an error, or that no node serves is left out of the step and logged as an event; its
node is dropped from the map until it answers a new hello, so a restarted SuperNode (a new node
id) rejoins in a later round. A reply with a wrong shape or NaN/Inf is rejected and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from clusterfed.data.federation import ClientData, Federation
from clusterfed.errors import ClusterfedError
from clusterfed.flower import membership, wire
from clusterfed.sim.build import InitialModels
from clusterfed.tasks import ClientResult, ClientTask, TaskKind, match_results, numbered

log = logging.getLogger("clusterfed.flower")


class FlowerExecutor:
    """Runs client tasks on Flower SuperNodes, one client per node."""

    def __init__(self, grid: Grid, config: Mapping[str, Any], *, reply_timeout: float = 600.0,
                 join_timeout: float = 300.0, poll_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.grid = grid
        # A config the server cannot run (a secret file named, no agreement) fails here,
        # before any node is asked anything.
        self.expected = membership.expected_from_config(config)
        self.config_json = wire.config_json(config)
        self.reply_timeout = float(reply_timeout)
        self.join_timeout = float(join_timeout)
        self.poll_interval = float(poll_interval)
        self.clock, self.sleep = clock, sleep
        self.node_of: dict[int, int] = {}          # client -> node id
        self.catalog: dict[int, dict[str, Any]] = {}  # client -> what its node described
        self.partitions: list[int] = []            # client -> its node's partition
        self.admission: membership.Admission | None = None
        self._heard: dict[int, tuple[int, dict[str, Any]]] = {}  # before admission: partition
        #                                                           -> (node id, its facts)
        self._initial: dict[int, np.ndarray] = {}  # initial model draws the nodes sent
        self._refused: set[int] = set()            # node ids refused
        self._hellos: dict[str, int] = {}          # pending hello message id -> node id
        self._hello_errors: dict[int, str] = {}    # node id -> why its hello failed
        self._events: list[dict[str, Any]] = []
        self._round = 0                            # 1-based round of the latest tasks

    # Discovery ------------------------------------------------------------------------------

    def _ttl(self) -> float:
        return max(self.reply_timeout, self.join_timeout) + 60.0

    def _discover(self) -> None:
        """Say hello to every node that serves no known client and has no hello pending.

        A node whose hello failed, or that was refused, is not asked again (a restarted
        SuperNode has a new id).
        """
        known = (set(self.node_of.values()) | set(self._hellos.values())
                 | set(self._hello_errors) | {n for n, _ in self._heard.values()}
                 | self._refused)
        new = [int(n) for n in self.grid.get_node_ids() if int(n) not in known]
        if not new:
            return
        for node in new:
            mid = self._push(Message(wire.encode_hello(self.config_json), node, wire.HELLO,
                                     ttl=self._ttl(), group_id="hello"))
            if mid:
                self._hellos[mid] = node

    def _push(self, message: Message) -> str | None:
        """Push one message; its id, or None when the SuperLink refused it.

        One at a time: a Grid may drop refused messages from its answer to a batch, which would
        leave the ids of the rest unattributable.
        """
        ids = list(self.grid.push_messages([message]))
        return ids[0] if ids and ids[0] else None

    def _take_hello(self, reply: Message) -> None:
        node = self._hellos.pop(reply.metadata.reply_to_message_id)
        if reply.has_error():
            self._hello_errors[node] = reply.error.reason
            log.warning("node %d could not join: %s", node, reply.error.reason)
            return
        facts = dict(reply.content.config_records[wire.FIELDS])
        partition = int(facts["partition"])
        if self.admission is None:
            self._heard[partition] = (node, facts)    # a later hello (a restart) replaces it
            return
        # After the start: a restarted node rejoins if it still fits.
        problem = (membership.hello_problem(facts, self.expected, self.admission.reference)
                   if partition in self.partitions else
                   f"partition {partition} is not in this run's federation (refused, or not "
                   f"there when the run started)")
        if problem is not None:
            self._refuse(partition, node, problem)
            return
        client = self.partitions.index(partition)
        previous = self.node_of.get(client)
        self.node_of[client] = node
        self.catalog[client] = facts
        if previous != node and self._round > 0:
            log.info("client %d joined on node %d", client, node)
            self._events.append({"round": self._round, "type": "client_joined", "client": client,
                                 "node": node})

    def _refuse(self, partition: int, node: int, reason: str) -> None:
        log.warning("refused node %d (partition %d): %s", node, partition, reason)
        self._refused.add(node)
        self._events.append({"round": self._round, "type": "node_refused",
                             "partition": partition, "node": node, "reason": reason})

    def _pull_hellos(self) -> None:
        if self._hellos:
            for reply in self.grid.pull_messages(list(self._hellos)):
                self._take_hello(reply)

    def join(self) -> None:
        """Wait until a node has said hello for every partition (at most join_timeout), then
        admit those that fit the run and refuse the others (one `node_refused` event each)."""
        deadline = self.clock() + self.join_timeout
        wanted = set(range(self.expected.clients))
        while True:
            self._discover()
            self._pull_hellos()
            if wanted <= set(self._heard):
                break
            if self.clock() > deadline:
                raise ClusterfedError(self._join_failure(sorted(wanted - set(self._heard))))
            self.sleep(self.poll_interval)
        admission = membership.admit({p: f for p, (_, f) in self._heard.items()},
                                     self.expected)
        for partition, reason in admission.refused.items():
            self._refuse(partition, self._heard[partition][0], reason)
        if not admission.members:
            raise ClusterfedError("every node was refused: " + "; ".join(
                f"partition {p}: {why}" for p, why in admission.refused.items()))
        self.admission = admission
        self.partitions = list(admission.members)
        for client, partition in enumerate(self.partitions):
            self.node_of[client], self.catalog[client] = self._heard[partition]
        self._heard.clear()
        if self.partitions != list(range(self.expected.clients)):
            log.warning("the federation is partitions %s, as clients 0..%d", self.partitions,
                        len(self.partitions) - 1)
            self._events.append({"round": 0, "type": "members", "partitions": self.partitions})
        if self.expected.privacy and not admission.reference.secret_id:
            log.warning("run.privacy: no node holds a privacy-secret-file, so the transform "
                        "comes from the run config, which the server holds: it hides nothing "
                        "from the server (see docs/flower.md)")

    def _join_failure(self, missing: list[int]) -> str:
        told = [f"partition {p}: {f['problem']}" for p, (_, f) in sorted(self._heard.items())
                if "problem" in f]
        errors = [f"node {n}: {e}" for n, e in self._hello_errors.items()]
        return (f"after {self.join_timeout:.0f} s, no node has said hello for partitions "
                f"{missing} of the federation's {self.expected.clients}"
                + (f"; nodes that cannot serve: {'; '.join(told)}" if told else "")
                + (f"; errors: {'; '.join(errors)}" if errors else ""))

    @property
    def node_secrets(self) -> bool:
        """Whether the nodes hold the privacy secret (the server cannot map models then)."""
        return (self.admission is not None and self.expected.privacy
                and bool(self.admission.reference.secret_id))

    def federation(self) -> Federation:
        """A data-free stand-in for the federation: what the server may know of it."""
        if self.admission is None or not self.catalog:
            raise ClusterfedError("no node has joined: call join() first")
        reference = self.admission.reference
        n = len(self.catalog)
        shape = reference.input_shape or tuple(int(s) for s in self.catalog[0]["input_shape"])
        n_classes = reference.n_classes or 1 + max(
            max(self.catalog[c].get("classes", [0]), default=0) for c in range(n))
        empty = ClientData(np.zeros((0, *shape), np.float32), np.zeros(0, np.int64),
                           np.zeros((0, *shape), np.float32), np.zeros(0, np.int64))
        return Federation([empty] * n,
                          np.array([int(self.catalog[c]["true_cluster"]) for c in range(n)]),
                          int(n_classes), tuple(shape), {"runtime": "flower"})

    def initial_models(self) -> InitialModels:
        """The initial model and its further draws in P-space, asked of a node (they hold the
        privacy secret); each draw once, then remembered."""
        first = self._initial_draw(0)

        def draw(index: int) -> np.ndarray:
            return first.copy() if index == 0 else self._initial_draw(index, first.size)

        return first, draw

    def _initial_draw(self, index: int, size: int | None = None) -> np.ndarray:
        if index not in self._initial:
            for client in sorted(self.node_of):   # any member answers; the next if it fails
                replies = self._exchange([(client, wire.INITIAL, wire.encode_initial(
                    index, self.config_json))], ["initial"])
                if 0 not in replies:
                    continue
                try:
                    vector = wire.decode_vector(replies[0].content)
                except (KeyError, TypeError, ValueError):
                    vector = np.zeros(0)
                if vector.ndim == 1 and vector.dtype.kind == "f" and vector.size \
                        and (size is None or vector.size == size) and np.isfinite(vector).all():
                    self._initial[index] = vector.astype(np.float32, copy=False)
                    break
                self._events.append({"round": self._round, "type": "rejected_result",
                                     "client": client, "task": "initial",
                                     "reason": "not a finite vector of the model's size"})
            else:
                raise ClusterfedError(f"no node sent initial model {index}: see the events")
        return self._initial[index].copy()

    # The Executor protocol -----------------------------------------------------------------

    def _partition(self, client: int) -> int | None:
        return self.partitions[client] if 0 <= client < len(self.partitions) else None

    def _sizes(self, key: str) -> np.ndarray:
        """A per-client count the nodes described on joining (the server holds no data)."""
        return np.array([int(self.catalog[c][key]) for c in range(len(self.catalog))],
                        dtype=np.int64)

    def train_sizes(self) -> np.ndarray:
        return self._sizes("num_train")

    def test_sizes(self) -> np.ndarray:
        return self._sizes("num_test")

    def drain_events(self) -> list[dict[str, Any]]:
        """Events since the last call (missing clients, rejected replies, joins)."""
        events, self._events = self._events, []
        return events

    def _missing(self, client: int, what: str, reason: str) -> None:
        log.warning("round %d: no %s result from client %d: %s", self._round, what, client, reason)
        self._events.append({"round": self._round, "type": "missing_client", "client": client,
                             "task": what, "reason": reason})

    def _exchange(self, requests: Sequence[tuple[int, str, Any]], what: Sequence[str]
                  ) -> dict[int, Message]:
        """Send (client, message type, content) requests; the replies that came, by request.

        Clients with no node, error replies and timeouts are logged as missing; a node that
        timed out is dropped from the map until it answers a new hello.
        """
        self._discover()
        self._pull_hellos()
        pending: dict[str, int] = {}
        sent_to: dict[int, int] = {}
        for i, (client, mtype, content) in enumerate(requests):
            if client not in self.node_of:
                self._missing(client, what[i], "no node serves this client")
                continue
            sent_to[i] = self.node_of[client]
            mid = self._push(Message(content, sent_to[i], mtype, ttl=self._ttl(),
                                     group_id=str(self._round)))
            if mid:
                pending[mid] = i
            else:
                self._missing(client, what[i], "the SuperLink refused the message")
        replies: dict[int, Message] = {}
        deadline = self.clock() + self.reply_timeout
        while pending:
            for reply in self.grid.pull_messages(list(pending) + list(self._hellos)):
                mid = reply.metadata.reply_to_message_id
                if mid in self._hellos:
                    self._take_hello(reply)
                    continue
                i = pending.pop(mid, None)
                if i is None:
                    continue
                if reply.has_error():
                    self._missing(requests[i][0], what[i], f"error: {reply.error.reason}")
                else:
                    replies[i] = reply
            if not pending:
                break
            if self.clock() > deadline:
                for i in pending.values():
                    client = requests[i][0]
                    self._missing(client, what[i],
                                  f"no reply within {self.reply_timeout:g} s")
                    if self.node_of.get(client) == sent_to[i]:   # not if it rejoined meanwhile
                        del self.node_of[client]
                break
            self.sleep(self.poll_interval)
        return replies

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]:
        """The results that came back in time and passed the checks, in task order."""
        self._round = round_index + 1
        requests = [(t.client, wire.TASK,
                     wire.encode_task(t, round_index, step, self.config_json,
                                      self._partition(t.client))) for t in tasks]
        replies = self._exchange(requests, [t.kind.value for t in tasks])
        results = []
        for i, task in enumerate(tasks):
            if i not in replies:
                continue
            try:
                result = wire.decode_result(replies[i].content)
                problem = wire.check_result(task, result)
            except (KeyError, ValueError, TypeError) as err:
                result, problem = None, f"malformed reply: {err}"
            if problem is None:
                results.append(result)
                continue
            log.warning("round %d: rejected the %s result of client %d: %s", self._round,
                        task.kind.value, task.client, problem)
            self._events.append({"round": self._round, "type": "rejected_result",
                                 "client": task.client, "task": task.kind.value,
                                 "reason": problem})
        return results

    def evaluate(self, params: np.ndarray, clients: Sequence[int], split: str = "test"
                 ) -> np.ndarray:
        """(loss, accuracy) per listed client, as EVALUATE tasks; NaN for a client that did
        not answer."""
        tasks = numbered([ClientTask(int(c), TaskKind.EVALUATE, params, split=split)
                          for c in clients], 0)
        out = np.full((len(tasks), 2), np.nan)
        for i, (_, result) in enumerate(match_results(tasks, self.run(tasks, self._round - 1))):
            out[i] = (result.losses[0], result.accuracies[0])
        return out

"""The Flower executor: the simulator's Executor protocol over a Flower Grid.

Each task goes to the SuperNode that serves its client. Flower's node ids are random per run,
so the executor asks every node which client (partition) it serves (`query.hello`) and keeps
the map; clients are sampled by id by the simulator's own seeded generator, never by node.

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

from clusterfed.client.tasks import ClientResult, ClientTask
from clusterfed.data.scenarios import ClientData, Federation
from clusterfed.errors import ClusterfedError
from clusterfed.flower import wire

log = logging.getLogger("clusterfed.flower")


class FlowerExecutor:
    """Runs client tasks on Flower SuperNodes, one client per node."""

    def __init__(self, grid: Grid, config: Mapping[str, Any], *, reply_timeout: float = 600.0,
                 join_timeout: float = 300.0, poll_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.grid = grid
        self.config_json = wire.config_json(config)
        self.reply_timeout = float(reply_timeout)
        self.join_timeout = float(join_timeout)
        self.poll_interval = float(poll_interval)
        self.clock, self.sleep = clock, sleep
        self.node_of: dict[int, int] = {}          # client (partition) -> node id
        self.catalog: dict[int, dict[str, Any]] = {}  # client -> what its node described
        self._hellos: dict[str, int] = {}          # pending hello message id -> node id
        self._hello_errors: dict[int, str] = {}    # node id -> why its hello failed
        self._events: list[dict[str, Any]] = []
        self._round = 0                            # 1-based round of the latest tasks

    # Discovery ------------------------------------------------------------------------------

    def _ttl(self) -> float:
        return max(self.reply_timeout, self.join_timeout) + 60.0

    def _discover(self) -> None:
        """Say hello to every node that serves no known client and has no hello pending.

        A node whose hello failed is not asked again (a restarted SuperNode has a new id).
        """
        known = (set(self.node_of.values()) | set(self._hellos.values())
                 | set(self._hello_errors))
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
        client = int(facts["partition"])
        previous = self.node_of.get(client)
        self.node_of[client] = node
        self.catalog[client] = facts
        if previous != node and self._round > 0:
            log.info("client %d joined on node %d", client, node)
            self._events.append({"round": self._round, "type": "client_joined", "client": client,
                                 "node": node})

    def _pull_hellos(self) -> None:
        if self._hellos:
            for reply in self.grid.pull_messages(list(self._hellos)):
                self._take_hello(reply)

    def join(self) -> None:
        """Wait until a node serves each of the federation's clients (at most join_timeout)."""
        deadline = self.clock() + self.join_timeout
        while True:
            self._discover()
            self._pull_hellos()
            counts = {int(f["num_clients"]) for f in self.catalog.values()}
            if len(counts) > 1:
                raise ClusterfedError(f"the nodes build different federations: client counts "
                                      f"{sorted(counts)}; give them all the same scenario")
            if counts and set(self.catalog) == set(range(counts.pop())):
                return
            if self.clock() > deadline:
                errors = "; ".join(f"node {n}: {e}" for n, e in self._hello_errors.items())
                raise ClusterfedError(
                    f"after {self.join_timeout:.0f} s, nodes serve clients "
                    f"{sorted(self.catalog)}, not all of the federation's"
                    + (f"; errors: {errors}" if errors else ""))
            self.sleep(self.poll_interval)

    def federation(self) -> Federation:
        """A data-free stand-in for the federation: what the server may know of it."""
        if not self.catalog:
            raise ClusterfedError("no node has joined: call join() first")
        first = self.catalog[0]
        shape = tuple(int(s) for s in first["input_shape"])
        empty = ClientData(np.zeros((0, *shape), np.float32), np.zeros(0, np.int64),
                           np.zeros((0, *shape), np.float32), np.zeros(0, np.int64))
        n = len(self.catalog)
        return Federation([empty] * n,
                          np.array([int(self.catalog[c]["true_cluster"]) for c in range(n)]),
                          int(first["n_classes"]), shape, {"runtime": "flower"})

    # The Executor protocol -----------------------------------------------------------------

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
                     wire.encode_task(t, round_index, step, self.config_json)) for t in tasks]
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
        """(loss, accuracy) per listed client; NaN for a client that did not answer."""
        requests = [(int(c), wire.EVALUATE,
                     wire.encode_evaluate(params, int(c), split, self.config_json))
                    for c in clients]
        replies = self._exchange(requests, [f"evaluate_{split}"] * len(requests))
        out = np.full((len(requests), 2), np.nan)
        for i, reply in replies.items():
            try:
                metrics = reply.content.metric_records[wire.METRICS]
                pair = np.array([float(metrics["loss"]), float(metrics["accuracy"])])
            except (KeyError, TypeError, ValueError):
                pair = np.full(2, np.nan)
            if np.isfinite(pair).all():
                out[i] = pair
                continue
            self._events.append({"round": self._round, "type": "rejected_result",
                                 "client": requests[i][0], "task": f"evaluate_{split}",
                                 "reason": "loss or accuracy missing, NaN or Inf"})
        return out

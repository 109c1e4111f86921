"""An in-process Flower Grid for the Flower runtime's fast tests: no processes, no sockets.

Each node is a partition id served by a ClientApp called in this process (clusterfed's own,
`clusterfed.flower.client_app.app`, unless given), with a node config of its own
(`add_node(p, {"data-path": ...})`) and the run config given.
A node can be made silent (it never answers: a crashed SuperNode) or given a `tamper` function
that rewrites its replies (a faulty or malicious client).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from clusterfed.flower.client_app import app as client_app


class LoopbackGrid(Grid):
    def __init__(self, partitions: Iterable[int], app: ClientApp = client_app,
                 run_config: Mapping[str, Any] | None = None,
                 node_config: Mapping[str, Any] | None = None) -> None:
        # What a real flwr-serverapp process sets before the ServerApp builds messages.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self._ids = itertools.count(1000)
        self.app, self.run_config = app, dict(run_config or {})
        self.nodes: dict[int, int] = {}             # node id -> partition
        self.node_configs: dict[int, dict] = {}     # node id -> its node config
        self.serving = False                        # True while a node handles a message
        self.silent: set[int] = set()
        self.tamper: dict[int, Callable[[Message], Message]] = {}
        self._replies: dict[str, Message] = {}
        # Each node's context.state, which a SuperNode keeps for the run across messages.
        self.states: dict[int, RecordDict] = {}
        self._mids = itertools.count()
        self.pushed = 0
        self.fail_after: int | None = None          # raise on the push after this many
        for p in partitions:
            self.add_node(p, dict(node_config or {}))

    def add_node(self, partition: int, node_config: dict | None = None) -> int:
        """A new node (a new id, as a restarted SuperNode gets) serving `partition`."""
        node = next(self._ids)
        self.nodes[node] = partition
        self.node_configs[node] = {"partition-id": partition, **(node_config or {})}
        return node

    def node_of(self, partition: int) -> int:
        return max(n for n, p in self.nodes.items() if p == partition)

    # Grid -----------------------------------------------------------------------------------

    def set_run(self, run: object) -> None:  # pragma: no cover - not used by the executor
        pass

    @property
    def run(self) -> object:  # pragma: no cover
        return None

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:  # pragma: no cover
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            if self.fail_after is not None and self.pushed >= self.fail_after:
                raise ConnectionError("the SuperLink went away")
            self.pushed += 1
            mid = f"m{next(self._mids)}"
            msg.metadata.__dict__["_message_id"] = mid
            node = msg.metadata.dst_node_id
            ids.append(mid)
            if node not in self.nodes or node in self.silent:
                continue
            context = Context(run_id=1, node_id=node, node_config=self.node_configs[node],
                              state=self.states.setdefault(node, RecordDict()),
                              run_config=dict(self.run_config))
            self.serving = True
            try:
                reply = self.app(msg, context)
            finally:
                self.serving = False
            if node in self.tamper:
                reply = self.tamper[node](reply)
            self._replies[mid] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self._replies.pop(m) for m in list(message_ids) if m in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:  # pragma: no cover
        return self.pull_messages(self.push_messages(messages))

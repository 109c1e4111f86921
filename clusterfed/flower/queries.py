"""Client-side handlers for the strategies whose clients send more than train and evaluate
replies: a Flower user registers one on their ClientApp, built from their own data loader.

PACFL (`clusterfed.flower.strategies.PACFL`) asks each client once for its data signature,
PACFL's per-class principal vectors, in a `query.clusterfed_signature` message:

    from clusterfed.flower.queries import SIGNATURE, signature_query

    app.query(SIGNATURE)(signature_query(lambda context: load_data(
        context.node_config["partition-id"], context.node_config["num-partitions"])[0]))

The handler computes the signature with clusterfed's own client code (`signature_result`, what
the simulator's clients run) from every batch the loader yields; the task and the reply travel
in clusterfed's wire format (`clusterfed.flower.wire`), which the strategy decodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from flwr.app import Context, Message

from clusterfed.client.work import signature_result
from clusterfed.flower.wire import decode_task, encode_result

SIGNATURE = "clusterfed_signature"   # the query's action: its message type is query.<this>

Handler = Callable[[Message, Context], Message]


def _tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def inputs_and_labels(batches: Iterable[Any], input_key: str = "img", label_key: str = "label"
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """All the (inputs, labels) a loader yields: batches that are (inputs, labels, ...)
    sequences, as a TensorDataset's, or mappings read by key, as Flower Datasets' are."""
    xs, ys = [], []
    for batch in batches:
        if isinstance(batch, Mapping):
            x, y = batch[input_key], batch[label_key]
        elif isinstance(batch, Sequence) and len(batch) >= 2:
            x, y = batch[0], batch[1]
        else:
            raise ValueError("a batch is (inputs, labels) or a mapping with "
                             f"{input_key!r} and {label_key!r}, got {type(batch).__name__}")
        xs.append(_tensor(x))
        ys.append(_tensor(y))
    if not xs:
        raise ValueError("the data loader yielded no batch: a signature needs data")
    return torch.cat(xs), torch.cat(ys)


def signature_query(load: Callable[[Context], Iterable[Any]], *, input_key: str = "img",
                    label_key: str = "label") -> Handler:
    """A query handler answering PACFL's signature request from `load(context)`'s batches
    (the client's training data, as the simulator's clients use theirs)."""

    def handler(msg: Message, context: Context) -> Message:
        task, _, _, _ = decode_task(msg.content)
        x, y = inputs_and_labels(load(context), input_key, label_key)
        return Message(content=encode_result(signature_result(task, x, y)), reply_to=msg)

    return handler

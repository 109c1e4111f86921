"""Test samples that several clients hold, scored once per model.

PACFL's `test: by_labels` tests a client on every test image of its labels: 100 clients of 3
labels out of 10 hold 300,000 test rows of 10,000 distinct images. A model served to many of
them (FedAvg's global model, a cluster's model) goes through each distinct image once here, and
each client's figures are sums over its own rows. Whole test sets held alike (`test: all`) are
caught earlier and more cheaply by the client runtime (`ClientRuntime._distinct`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from clusterfed.client.batched import sample_scores
from clusterfed.models.flat import FlatModel

Data = tuple[torch.Tensor, torch.Tensor]
# Pooling pays where the distinct samples are at most this share of the rows scored: it adds
# a gather of the distinct rows and a sum per client to the forward passes it saves.
MAX_DISTINCT_SHARE = 0.5


@dataclass(frozen=True)
class SharedTests:
    """The clients' distinct test samples, and which of them each client's rows are."""

    x: torch.Tensor              # (distinct, ...) inputs
    y: torch.Tensor              # (distinct, ...) targets
    rows: list[np.ndarray]       # per client: the pool index of each of its test rows

    @property
    def size(self) -> int:
        return len(self.y)


def _row_keys(x: torch.Tensor, y: torch.Tensor) -> list[bytes]:
    """A digest per sample of its input and target bytes (equal samples, equal keys)."""
    xa = np.ascontiguousarray(x.detach().cpu().numpy()).reshape(len(x), -1)
    ya = np.ascontiguousarray(y.detach().cpu().numpy()).reshape(len(y), -1)
    keys = []
    for xi, yi in zip(xa, ya, strict=True):
        digest = hashlib.blake2b(xi, digest_size=16)
        digest.update(yi)
        keys.append(digest.digest())
    return keys


def shared_tests(test: Sequence[Data], set_keys: Sequence[bytes] | None = None,
                 max_share: float = MAX_DISTINCT_SHARE) -> SharedTests | None:
    """The pool of the clients' test samples, or None where it cannot pay: the distinct
    samples are more than `max_share` of the rows of the distinct test sets, or the clients'
    samples differ in shape or type (sequences of several lengths: they cannot be stacked).

    `set_keys`: a digest of each client's whole test set (`client.runtime.test_key`); a set
    held alike by several clients counts once, as the runtime scores it once (`test: all`).
    """
    kinds = {(tuple(x.shape[1:]), x.dtype, tuple(y.shape[1:]), y.dtype)
             for x, y in test if len(y)}
    if len(kinds) != 1:
        return None
    first: dict[bytes, int] = {}
    rows: list[np.ndarray] = []
    introduced: list[tuple[int, list[int]]] = []   # (client, its rows first seen there)
    seen_sets: dict[bytes, int] = {}
    total = 0
    for c, (x, y) in enumerate(test):
        if set_keys is not None:
            if set_keys[c] in seen_sets:
                rows.append(rows[seen_sets[set_keys[c]]])
                continue
            seen_sets[set_keys[c]] = c
        total += len(y)
        ids = np.empty(len(y), dtype=np.int64)
        new: list[int] = []
        for i, key in enumerate(_row_keys(x, y) if len(y) else []):
            if key not in first:
                first[key] = len(first)
                new.append(i)
            ids[i] = first[key]
        rows.append(ids)
        if new:
            introduced.append((c, new))
    if len(first) > max_share * total:
        return None
    # Pool order is first-seen order: client by client, row by row, as `first` numbered them.
    x = torch.cat([test[c][0][torch.as_tensor(new)] for c, new in introduced])
    y = torch.cat([test[c][1][torch.as_tensor(new)] for c, new in introduced])
    return SharedTests(x, y, rows)


def evaluate_shared(model: FlatModel, params: torch.Tensor, pool: SharedTests,
                    clients: Sequence[int], max_share: float = MAX_DISTINCT_SHARE
                    ) -> np.ndarray | None:
    """(loss, accuracy) of one model on each listed client's test data, each distinct sample
    through the model once; None where the clients' distinct samples are more than
    `max_share` of their rows (scoring client by client costs less)."""
    held = [pool.rows[c] for c in clients]
    total = sum(len(r) for r in held)
    used = np.unique(np.concatenate(held)) if total else np.zeros(0, dtype=np.int64)
    if len(used) > max_share * total:
        return None
    index = torch.as_tensor(used, device=pool.y.device)
    loss, hits, scored = sample_scores(model, params, pool.x[index], pool.y[index])
    where = np.full(pool.size, -1, dtype=np.int64)
    where[used] = np.arange(len(used))
    out = np.zeros((len(clients), 2))
    for i, r in enumerate(held):
        at = where[r]
        count = max(scored[at].sum(), 1.0)
        out[i] = loss[at].sum() / count, hits[at].sum() / count
    return out

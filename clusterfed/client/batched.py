"""Evaluation in large batches: one model over many clients' data, many models over one's.

The sequential path scores one model on one client at a time; with 10,000 clients of a
few test images each that is 10,000 tiny forward passes. Here the clients served by one model
are scored together: their data are cut into chunks of about `rows` samples regardless of
client boundaries, and per-sample losses are summed back to their owners. Many models over one
client's data (IFCA's and LCFL's loss of every cluster model, an EVALUATE of several models)
run as one `vmap` over the stacked parameters. Both return what
`clusterfed.client.work.evaluate` returns, client by client and model by model, to float
tolerance (summation order differs).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap

from clusterfed.client.work import IGNORE_INDEX, chunk_rows
from clusterfed.models.flat import FlatModel

Data = tuple[torch.Tensor, torch.Tensor]
# Samples a model at least, per vmap call over many models.
MIN_ROWS = 256


def chunk_scores(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's summed loss and correct count (float64) from (m, rows, classes, ...)
    logits of m models on the same targets."""
    m = logits.shape[0]
    expanded = target.expand(m, *target.shape)
    per = F.cross_entropy(logits.flatten(0, 1), expanded.flatten(0, 1),
                          reduction="none").reshape(m, -1)
    hits = (logits.argmax(2) == expanded).reshape(m, -1).sum(1)
    return per.sum(1).double(), hits.double()


def _row_sums(per_target: torch.Tensor) -> torch.Tensor:
    """(rows, ...) -> (rows,): one total per sample (a sequence's tokens summed)."""
    return per_target.reshape(per_target.shape[0], -1).sum(1)


def _scored_counts(data: Sequence[Data]) -> np.ndarray:
    """Targets that count per client, at least 1 (as `client.work.scored`)."""
    return np.array([max(int((y != IGNORE_INDEX).sum()), 1) for _, y in data], dtype=np.float64)


def _chunks(data: Sequence[Data], rows: int
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(x, y, owner) chunks of about `rows` samples over all clients' data, in client order.

    A chunk never mixes input shapes (sequences of different lengths go to separate chunks).
    """
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    owners: list[torch.Tensor] = []
    size = 0
    shape: tuple[int, ...] | None = None

    def flush() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = (torch.cat(xs), torch.cat(ys), torch.cat(owners))
        xs.clear(), ys.clear(), owners.clear()
        return out

    for i, (x, y) in enumerate(data):
        for start in range(0, len(y), rows):
            px, py = x[start:start + rows], y[start:start + rows]
            if xs and (size + len(py) > rows or tuple(px.shape[1:]) != shape):
                yield flush()
                size = 0
            shape = tuple(px.shape[1:])
            xs.append(px)
            ys.append(py)
            owners.append(torch.full((len(py),), i, dtype=torch.long, device=py.device))
            size += len(py)
    if xs:
        yield flush()


@torch.no_grad()
def evaluate_clients(model: FlatModel, params: torch.Tensor, data: Sequence[Data],
                     rows: int | None = None) -> np.ndarray:
    """(loss, accuracy) of one model on each client's (x, y), in large mixed batches.

    `rows`: samples per forward pass (default: the sequential chunk of about 1,000 targets,
    taken from the first non-empty client).
    """
    n = len(data)
    out = np.zeros((n, 2))
    if n == 0:
        return out
    if rows is None:
        first = next((y for _, y in data if len(y)), None)
        rows = chunk_rows(first) if first is not None else 1
    device = params.device
    loss_sum = torch.zeros(n, dtype=torch.float64, device=device)
    correct = torch.zeros(n, dtype=torch.float64, device=device)
    for x, y, owner in _chunks(data, rows):
        logits = model(params, x)
        per = F.cross_entropy(logits, y, reduction="none")   # 0 at ignored targets
        loss_sum.index_add_(0, owner, _row_sums(per).double())
        correct.index_add_(0, owner, _row_sums(logits.argmax(1) == y).double())
    scored = _scored_counts(data)
    out[:, 0] = loss_sum.cpu().numpy() / scored
    out[:, 1] = correct.cpu().numpy() / scored
    return out


@torch.no_grad()
def sample_scores(model: FlatModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                  rows: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each sample's summed loss, correct count and scored targets (float64 arrays), one model
    over (x, y) in chunks of `rows` samples (default: the sequential chunk)."""
    n = len(y)
    loss = torch.zeros(n, dtype=torch.float64, device=params.device)
    hits = torch.zeros(n, dtype=torch.float64, device=params.device)
    step = rows or chunk_rows(y)
    for start in range(0, n, step):
        logits = model(params, x[start:start + step])
        target = y[start:start + step]
        per = F.cross_entropy(logits, target, reduction="none")   # 0 at ignored targets
        loss[start:start + step] = _row_sums(per).double()
        hits[start:start + step] = _row_sums(logits.argmax(1) == target).double()
    counted = _row_sums(y != IGNORE_INDEX).double() if n else loss
    return loss.cpu().numpy(), hits.cpu().numpy(), counted.cpu().numpy()


@torch.no_grad()
def evaluate_models(model: FlatModel, stacked: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                    rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(losses, accuracies) of each of k models (rows of `stacked`) on one client's (x, y).

    One vmap per chunk of models and chunk of data; a call holds about `rows` samples in all
    (default: the sequential chunk), so memory stays that of one chunk. The models go in
    chunks small enough that each call still sees MIN_ROWS samples a model: with k in the
    thousands (LCFL's all-pairs exchange), one image per call would cost a call per image.
    """
    k = stacked.shape[0]
    budget = rows or chunk_rows(y)
    per_call = max(1, budget // MIN_ROWS)
    loss_sum = torch.zeros(k, dtype=torch.float64, device=stacked.device)
    correct = torch.zeros(k, dtype=torch.float64, device=stacked.device)
    forward = vmap(model, in_dims=(0, None))
    for first in range(0, k if len(y) else 0, per_call):
        part = stacked[first:first + per_call]
        m = part.shape[0]
        step = max(1, budget // m)
        for start in range(0, len(y), step):
            target = y[start:start + step]
            loss, hits = chunk_scores(forward(part, x[start:start + step]), target)
            loss_sum[first:first + m] += loss
            correct[first:first + m] += hits
    scored = float(max(int((y != IGNORE_INDEX).sum()), 1))
    return loss_sum.cpu().numpy() / scored, correct.cpu().numpy() / scored

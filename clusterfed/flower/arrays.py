"""A Flower ArrayRecord (a model's named tensors) as clusterfed's flat float32 vector, and back.

clusterfed's algorithms work on one flat vector a model; a Flower app's models travel as an
ArrayRecord of named arrays (a PyTorch state dict, in order). The layout (each array's name,
shape and dtype, in order) turns a vector back into a record the app's ClientApp loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord


@dataclass(frozen=True)
class Layout:
    """The arrays of a record, in order: (name, shape, dtype) each."""

    entries: tuple[tuple[str, tuple[int, ...], str], ...]

    @property
    def size(self) -> int:
        return sum(int(np.prod(shape, dtype=np.int64)) for _, shape, _ in self.entries)


def layout_of(record: ArrayRecord) -> Layout:
    return Layout(tuple((name, tuple(int(s) for s in a.numpy().shape), str(a.numpy().dtype))
                        for name, a in record.items()))


def flatten(record: ArrayRecord, layout: Layout) -> np.ndarray:
    """The record's arrays, in the layout's order, as one float32 vector.

    A record that does not hold the layout's arrays and shapes (another model) is refused.
    """
    names = [name for name, _, _ in layout.entries]
    if list(record.keys()) != names:
        raise ValueError(f"the arrays are {list(record.keys())[:5]}..., expected the model's "
                         f"{names[:5]}...")
    parts = []
    for name, shape, _ in layout.entries:
        array = record[name].numpy()
        if tuple(array.shape) != shape:
            raise ValueError(f"array {name!r} has shape {tuple(array.shape)}, expected {shape}")
        parts.append(np.asarray(array, dtype=np.float32).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def unflatten(vector: np.ndarray, layout: Layout) -> ArrayRecord:
    """The ArrayRecord of a flat vector: the layout's names, shapes and dtypes."""
    if vector.shape != (layout.size,):
        raise ValueError(f"a vector of shape {vector.shape} for a model of {layout.size} values")
    arrays, start = {}, 0
    for name, shape, dtype in layout.entries:
        count = int(np.prod(shape, dtype=np.int64))
        part = vector[start:start + count].reshape(shape).astype(dtype)
        arrays[name] = Array(np.ascontiguousarray(part))
        start += count
    return ArrayRecord(arrays)

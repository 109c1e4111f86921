"""Numpy arrays in shared memory, and records flattened to arrays plus small metadata.

The process executor (`sim/processes/`) moves three kinds of data between processes: the
clients' data (once per run), the arrays of a call's tasks (parameters, SCAFFOLD corrections)
and the arrays of its results (updates, losses). Pickling them through a pipe would copy each
array three times; here the writer copies it once into a shared-memory block and the reader
maps it in place. What remains to pickle is a record with each array replaced by its index
(`flatten`): a client number, a TrainSpec, the meta mapping.

Only the process that creates a block unlinks it (`Block.unlink`); others attach and close.
"""

from __future__ import annotations

import copy
import dataclasses
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

# Each array starts on a cache-line boundary (and so on any dtype's alignment).
ALIGN = 64


@dataclass(frozen=True)
class Placed:
    """Where one array sits in a block."""

    offset: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """The arrays written to one block: its name and each array's place, in order."""

    name: str
    arrays: tuple[Placed, ...]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def nbytes_of(arrays: Sequence[np.ndarray]) -> int:
    """The bytes a block needs to hold `arrays`."""
    return sum(_aligned(a.nbytes) for a in arrays)


@contextmanager
def held_interrupts() -> Iterator[None]:
    """SIGINT waits until the block ends (then raises as usual). Between creating a segment
    and registering it, or storing it where `unlink` finds it, Ctrl-C would leak the segment
    until reboot: no one would know its name."""
    if threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class Block:
    """One shared-memory segment, created here (the owner) or attached by name."""

    def __init__(self, memory: shared_memory.SharedMemory, owner: bool) -> None:
        self.memory = memory
        self.owner = owner
        self.closed = False

    @classmethod
    def create(cls, nbytes: int) -> Block:
        with held_interrupts():
            return cls(shared_memory.SharedMemory(create=True, size=max(nbytes, ALIGN)), True)

    @classmethod
    def attach(cls, name: str) -> Block:
        return cls(shared_memory.SharedMemory(name=name), False)

    @property
    def name(self) -> str:
        return self.memory.name

    @property
    def capacity(self) -> int:
        return self.memory.size

    def write(self, arrays: Sequence[np.ndarray]) -> Layout:
        """Copy `arrays` into the block, one after another; the block must be large enough."""
        if nbytes_of(arrays) > self.capacity:
            raise ValueError(f"{nbytes_of(arrays)} bytes do not fit a block of {self.capacity}")
        placed, offset = [], 0
        for a in arrays:
            a = np.asarray(a)
            view = np.ndarray(a.shape, a.dtype, buffer=self.memory.buf, offset=offset)
            view[...] = a
            placed.append(Placed(offset, a.dtype.str, tuple(a.shape)))
            offset += _aligned(a.nbytes)
        return Layout(self.name, tuple(placed))

    def read(self, layout: Layout) -> list[np.ndarray]:
        """Views of the arrays of `layout` (no copies): valid while the block is open."""
        if layout.name != self.name:
            raise ValueError(f"layout of block {layout.name}, read from {self.name}")
        return [np.ndarray(p.shape, np.dtype(p.dtype), buffer=self.memory.buf, offset=p.offset)
                for p in layout.arrays]

    def close(self) -> None:
        """Unmap the block here; a view still alive keeps the mapping until it goes."""
        if self.closed:
            return
        try:
            self.memory.close()
            self.closed = True
        except BufferError:
            pass

    def unlink(self) -> None:
        """Free the segment (owner only); processes that mapped it keep their mappings."""
        self.close()
        if self.owner:
            try:
                self.memory.unlink()
            except FileNotFoundError:
                pass
            self.owner = False


class Mailbox:
    """A block that its owner replaces by a larger one when a write does not fit."""

    def __init__(self) -> None:
        self.block: Block | None = None

    def reserve(self, nbytes: int) -> Block:
        if self.block is None or self.block.capacity < nbytes:
            with held_interrupts():   # the new block is ours before Ctrl-C can strike
                if self.block is not None:
                    self.block.unlink()
                    self.block = None
                # Room to grow, so a slightly larger call does not replace the block again.
                self.block = Block.create(nbytes + nbytes // 4)
        return self.block

    def write(self, arrays: Sequence[np.ndarray]) -> Layout:
        return self.reserve(nbytes_of(arrays)).write(arrays)

    def unlink(self) -> None:
        if self.block is not None:
            self.block.unlink()
            self.block = None


class Reader:
    """A reader's mapping of the latest block a writer named: attached once, replaced on change."""

    def __init__(self) -> None:
        self.block: Block | None = None

    def open(self, name: str) -> Block:
        if self.block is None or self.block.name != name:
            if self.block is not None:
                self.block.close()
            self.block = Block.attach(name)
        return self.block

    def read(self, layout: Layout) -> list[np.ndarray]:
        return self.open(layout.name).read(layout)

    def close(self) -> None:
        if self.block is not None:
            self.block.close()
            self.block = None


# --------------------------------------------------------------------------------------------
# Records <-> (records with array slots, arrays)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """Stands for the array at `index` of the arrays sent beside a flattened record."""

    index: int


def _swap(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """`leaf(obj)` where it replaces `obj`, else `obj` with each field of a (nested) dataclass
    record swapped alike; a record none of whose fields change is returned as it is. Records
    are copied field by field, never validated again, so a frozen record may hold a Slot where
    its type says array."""
    swapped = leaf(obj)
    if swapped is not obj:
        return swapped
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = {f.name: _swap(getattr(obj, f.name), leaf) for f in dataclasses.fields(obj)}
        if all(value is getattr(obj, name) for name, value in changed.items()):
            return obj
        out = copy.copy(obj)
        for name, value in changed.items():
            object.__setattr__(out, name, value)
        return out
    return obj


def flatten(records: Sequence[Any]) -> tuple[list[Any], list[np.ndarray]]:
    """The records with each numpy array field (nested records' too) replaced by a Slot, and
    the arrays. An array shared by several records (every FedAvg task holds the same global
    model) is listed once."""
    arrays: list[np.ndarray] = []
    index: dict[int, int] = {}

    def strip(value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            return value
        if id(value) not in index:
            index[id(value)] = len(arrays)
            arrays.append(value)
        return Slot(index[id(value)])

    return [_swap(r, strip) for r in records], arrays


def unflatten(records: Sequence[Any], arrays: Sequence[np.ndarray]) -> list[Any]:
    """The records of `flatten` with each Slot replaced by its array."""
    return [_swap(r, lambda v: arrays[v.index] if isinstance(v, Slot) else v) for r in records]

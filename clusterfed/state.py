"""Portable serialisation of algorithm state: nested dataclasses, dicts, lists and arrays.

The format is one `.npz` file: every array under its own key, a JSON skeleton that names them
and the format's version. Loading never unpickles, so a checkpoint from an untrusted source is
safe to read.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.errors import ConfigError

# The layout `dumps` writes. Files from before the version key have version 1's layout.
FORMAT_VERSION = 1
_VERSION_KEY = "__format__"
_TYPES: dict[str, type] = {}


def serialisable(cls: type) -> type:
    """Class decorator: lets instances of a dataclass round-trip through `dumps`/`loads`."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass")
    _TYPES[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return cls


def _registered(name: str) -> type:
    """The class a skeleton names. Files written before each method had its own folder name
    a method's state by the module that became the folder, `clusterfed.algorithms.cfl.CFLState`
    for what is now `clusterfed.algorithms.cfl.algorithm.CFLState`."""
    if name not in _TYPES:
        module, _, qualname = name.rpartition(".")
        moved = f"{module}.algorithm.{qualname}"
        if moved in _TYPES:
            return _TYPES[moved]
        raise ConfigError(f"this state holds a {name}, which no loaded module defines")
    return _TYPES[name]


def _encode(obj: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(obj, np.ndarray):
        arrays.append(obj)
        return {"__array__": len(arrays) - 1}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        if name not in _TYPES:
            raise TypeError(f"{name} is not marked @serialisable")
        fields = {f.name: _encode(getattr(obj, f.name), arrays) for f in dataclasses.fields(obj)}
        return {"__dataclass__": name, "fields": fields}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            return {"__intdict__": [[int(k), _encode(v, arrays)] for k, v in obj.items()]}
        return {"__dict__": {k: _encode(v, arrays) for k, v in obj.items()}}
    if isinstance(obj, list | tuple):
        return {"__tuple__" if isinstance(obj, tuple) else "__list__": [
            _encode(v, arrays) for v in obj
        ]}
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if not isinstance(node, dict):
        return node
    if "__array__" in node:
        return arrays[f"a{node['__array__']}"]
    if "__dataclass__" in node:
        cls = _registered(node["__dataclass__"])
        return cls(**{k: _decode(v, arrays) for k, v in node["fields"].items()})
    if "__intdict__" in node:
        return {k: _decode(v, arrays) for k, v in node["__intdict__"]}
    if "__dict__" in node:
        return {k: _decode(v, arrays) for k, v in node["__dict__"].items()}
    if "__tuple__" in node:
        return tuple(_decode(v, arrays) for v in node["__tuple__"])
    return [_decode(v, arrays) for v in node["__list__"]]


def dumps(obj: Any) -> bytes:
    arrays: list[np.ndarray] = []
    skeleton = json.dumps(_encode(obj, arrays))
    buffer = io.BytesIO()
    np.savez(buffer, **{_VERSION_KEY: np.array(FORMAT_VERSION, dtype=np.int64)},
             __skeleton__=np.frombuffer(skeleton.encode(), dtype=np.uint8),
             **{f"a{i}": a for i, a in enumerate(arrays)})
    return buffer.getvalue()


class DamagedState(ValueError):
    """The bytes are not a whole state file (cut short while written, or corrupted)."""


def read_parts(data: bytes) -> tuple[Any, dict[str, np.ndarray]]:
    """(skeleton, arrays) of a state file, every array read: a damaged file raises
    DamagedState here, before any of it is used."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        version = int(arrays.pop(_VERSION_KEY)) if _VERSION_KEY in arrays else 1
        if version > FORMAT_VERSION:
            raise ConfigError(f"this state was saved in format {version}; this clusterfed "
                              f"reads formats up to {FORMAT_VERSION}: update clusterfed to "
                              f"load it")
        skeleton = json.loads(arrays.pop("__skeleton__").tobytes().decode())
    except ConfigError:
        raise
    # What numpy's zip reader and json raise on a cut or altered file.
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError) as err:
        raise DamagedState(f"{type(err).__name__}: {err}") from None
    return skeleton, arrays


def loads(data: bytes) -> Any:
    skeleton, arrays = read_parts(data)
    return _decode(skeleton, arrays)


def save_atomic(path: Path, data: bytes) -> None:
    """Write `data` so that a crash leaves either the old file or the new one, never half.
    The temporary file is the process's own: two commands may write one table side by side."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

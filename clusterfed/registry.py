"""Name -> factory tables for algorithms, datasets, scenarios and models."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from clusterfed.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a name to a factory; unknown names raise a ConfigError listing the valid ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorate

    def get(self, name: str) -> T:
        if name not in self._items:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def accepted_keys(factory: Callable[..., Any]) -> set[str] | None:
    """Keyword names a factory (function or dataclass) takes; None if it takes **kwargs."""
    if dataclasses.is_dataclass(factory):
        return {f.name for f in dataclasses.fields(factory) if f.init}
    params = inspect.signature(factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}


def check_keys(section: str, given: Mapping[str, Any], allowed: set[str] | None) -> None:
    """Raise a ConfigError naming the first key of `given` that `allowed` lacks."""
    if allowed is None:
        return
    for key in given:
        if key not in allowed:
            raise ConfigError(
                f"unknown config key {section}.{key} in section '{section}'; "
                f"valid keys: {', '.join(sorted(allowed)) or '(none)'}"
            )

"""JSON as strict parsers read it: NaN and infinities (a client not evaluated, a mean over no
clients) are written as null, never as the bare `NaN` Python's json module writes."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None (dicts, lists and tuples walked)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of `finite(obj)`; allow_nan=False, so anything missed raises, not writes."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def loads(text: str) -> Any:
    """json.loads that refuses NaN and infinities, as strict parsers do."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)

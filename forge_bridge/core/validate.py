"""Field checks shared by the data model, the store and the environments: each returns the value
(normalised) or raises `SchemaError` naming the field and what was expected."""

from __future__ import annotations

import json
import math
from typing import Any

from forge_bridge.core.errors import SchemaError


def fail(where: str, expected: str, value: Any) -> SchemaError:
    """The error for `where` holding `value` instead of `expected` (the value shown shortened)."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return SchemaError(f"{where}: expected {expected}, got {shown}")


def token_ids(where: str, value: Any) -> list[int]:
    """A list of non-negative ints."""
    if not isinstance(value, (list, tuple)):
        raise fail(where, "a list of non-negative ints", value)
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise fail(f"{where}[{i}]", "a non-negative int (a token id)", v)
    return list(value)


def logprobs(where: str, value: Any) -> list[float]:
    """A list of log-probabilities (floats <= 0, not NaN)."""
    if not isinstance(value, (list, tuple)):
        raise fail(where, "a list of floats", value)
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v > 0:
            raise fail(f"{where}[{i}]", "a log-probability (a float <= 0, not NaN)", v)
        out.append(float(v))
    return out


def finite(where: str, value: Any) -> float:
    """A finite number, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(where, "a finite number", value)
    return float(value)


def boolean(where: str, value: Any) -> bool:
    """A bool (not 0 or 1)."""
    if not isinstance(value, bool):
        raise fail(where, "a bool", value)
    return value


def optional_str(where: str, value: Any) -> str | None:
    """A string or None."""
    if value is not None and not isinstance(value, str):
        raise fail(where, "a string or null", value)
    return value


def json_object(where: str, value: Any) -> dict:
    """A dict that JSON can write."""
    if not isinstance(value, dict):
        raise fail(where, "an object (dict)", value)
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{where}: not JSON-serialisable ({exc})") from None
    return value


__all__ = ["boolean", "fail", "finite", "json_object", "logprobs", "optional_str", "token_ids"]

"""Requests of a public function-calling benchmark, the Berkeley Function Calling Leaderboard
(BFCL v4, Apache 2.0, the PyPI package `bfcl-eval`), as forge-bridge tasks: nobody here wrote them.

- `simple`: `BFCL_v4_simple_python`, one request and one function each, with the accepted values
  of every argument (`possible_answer/`);
- `irrelevance`: `BFCL_v4_irrelevance`, a request the one function offered cannot serve: the
  right reply calls nothing.

The package is read as data (`pip install --no-deps bfcl-eval==2026.3.23`; its code is never
imported). BFCL's schemas use Python type names (`dict`, `float`, `tuple`, `any`): they are turned
into JSON Schema, and dotted function names (`math.factorial`) into names an OpenAI tool may have
(`math_factorial`), as BFCL does for OpenAI-style models. `check_call` is BFCL's AST check,
simplified: one call of the function; every argument it gives is a parameter of the function and
one of the accepted values (strings compared without case, spaces and punctuation; an integer
accepted for a number); an argument left out only where the empty value is accepted.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from forge_bridge.core.errors import ForgeBridgeError

PACKAGE, PIP_SPEC = "bfcl_eval", "bfcl-eval==2026.3.23"
FILES = {"simple": "BFCL_v4_simple_python.json", "irrelevance": "BFCL_v4_irrelevance.json"}
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "int": "integer", "bool": "boolean",
          "str": "string", "list": "array"}


@dataclass(frozen=True)
class BFCLTask:
    """One request: its id, the user's words, the one tool offered, and the accepted calls
    (None for an irrelevance request: no call is right)."""

    id: str
    request: str
    tool: dict
    answer: dict | None


def data_dir() -> Path:
    """The installed package's data folder (found without importing the package's code)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ForgeBridgeError(f"the BFCL requests need the package {PIP_SPEC.split('==')[0]!r}; install it "
                               f"with: pip install --no-deps {PIP_SPEC}")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def tool_name(name: str) -> str:
    """A BFCL function name as an OpenAI tool name (dots are not allowed there)."""
    return name.replace(".", "_")


def json_schema(schema: Any) -> Any:
    """BFCL's parameter schema in JSON Schema: Python type names mapped, `any` left untyped."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k not in ("type", "optional", "properties", "items")}
    kind = schema.get("type")
    if isinstance(kind, str) and kind != "any":
        out["type"] = _TYPES.get(kind, kind)
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {name: json_schema(s) for name, s in schema["properties"].items()}
    if "items" in schema or out.get("type") == "array":
        out["items"] = json_schema(schema.get("items") or {})
    return out


def load(kind: str = "simple", n: int | None = None, seed: int = 0) -> list[BFCLTask]:
    """The requests of `kind`, all or `n` drawn with `seed` (in file order)."""
    folder = data_dir()
    rows = [json.loads(line) for line in (folder / FILES[kind]).read_text().splitlines() if line.strip()]
    answers = {}
    if kind == "simple":
        for line in (folder / "possible_answer" / FILES[kind]).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                answers[row["id"]] = row["ground_truth"][0]
    if n is not None and n < len(rows):
        keep = set(random.Random(seed).sample(range(len(rows)), n))
        rows = [r for i, r in enumerate(rows) if i in keep]
    return [BFCLTask(id=r["id"], request=r["question"][0][-1]["content"], tool=_tool(r["function"][0]),
                     answer=answers.get(r["id"])) for r in rows]


def _tool(function: dict) -> dict:
    return {"type": "function", "function": {
        "name": tool_name(function["name"]), "description": function.get("description", ""),
        "parameters": json_schema(function.get("parameters") or {"type": "dict", "properties": {}})}}


def check_call(task: BFCLTask, calls: Sequence[Any]) -> bool:
    """Whether `calls` is exactly one accepted call (for an irrelevance request: no call at all)."""
    if task.answer is None:
        return not calls
    if len(calls) != 1:
        return False
    name, arguments = _name_and_arguments(calls[0])
    [(expected_name, accepted)] = task.answer.items()
    if name != tool_name(expected_name) or not isinstance(arguments, dict):
        return False
    if any(key not in accepted for key in arguments):
        return False
    for key, values in accepted.items():
        if key not in arguments:
            if "" not in values:
                return False
        elif not any(_same(arguments[key], v) for v in values if v != ""):
            return False
    return True


def _name_and_arguments(call: Any) -> tuple[str, Any]:
    """(name, arguments) of a `ToolCall`, an OpenAI call dict, or a (name, arguments) pair."""
    if isinstance(call, tuple):
        return call
    if isinstance(call, dict):
        call = call.get("function", call)
        name, arguments = call.get("name"), call.get("arguments")
    else:
        name, arguments = call.name, call.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return name, None
    return name, arguments


def _same(given: Any, accepted: Any) -> bool:
    if isinstance(accepted, str) and isinstance(given, str):
        return _standard(given) == _standard(accepted)
    if isinstance(accepted, bool) or isinstance(given, bool):
        return given is accepted
    if isinstance(accepted, (int, float)) and isinstance(given, (int, float)):
        return float(given) == float(accepted) and not (isinstance(accepted, int) and isinstance(given, float)
                                                        and not given.is_integer())
    if isinstance(accepted, list) and isinstance(given, (list, tuple)):
        return len(given) == len(accepted) and all(_same(g, a) for g, a in zip(given, accepted))
    if isinstance(accepted, dict) and isinstance(given, dict):
        return all(k in accepted and any(_same(v, a) for a in (accepted[k] if isinstance(accepted[k], list)
                                                              else [accepted[k]])) for k, v in given.items())
    return given == accepted


def _standard(text: str) -> str:
    """BFCL's string standardisation: no case, no spaces, none of `,./-_*^`."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower()

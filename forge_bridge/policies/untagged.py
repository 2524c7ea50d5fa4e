"""Tool calls written without a format's own markers, as real instruct models often write them.

- `fenced_json`: a Markdown fence (```` ```json ````, ```` ```tool_call ````, or a bare ```` ``` ````)
  holding a call object or a list of them. Qwen2.5-Coder writes its calls so.
- `json`: the whole reply is a call object, a list of them, or several separated by `;`.
- `tool_code`: Python call syntax in a ```` ```tool_code ```` fence, as Gemma 3 writes it:
  `get_rate(base="EUR")`, `print(get_rate(base="EUR"))`, or a list of calls.

Nothing here is a call unless it names a tool the request declares (`names`): JSON that names no
declared tool, and prose around a code sample, stay text. A fence that can only have meant a call
(```` ```tool_call ````, ```` ```tool_code ````, or a JSON object that begins with a declared
tool's name) but cannot be read is kept as text with a `parse_errors` entry, as a malformed
marked call is: the policy's action, for the trainer to see.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Action, ToolCall
from forge_bridge.policies.tagged import action, call_from, json_values, new_call_id, unwrapped

Declared = Mapping[str, Sequence[str]]
"""The tools a request declares: each name with its parameters' names in order."""

JSON_FENCES = {"json", "tool_call", "tool_calls", "", "javascript", "js"}
"""Fence info strings whose body is read as JSON calls (`javascript`: small models label JSON so)."""
MEANT_FENCES = {"tool_call", "tool_calls"}
"""JSON fence info strings that say the body is a call (a `tool_code` fence always does)."""
_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)(?:[ \t][^\n`]*)?\r?$", re.MULTILINE)
_NAMED = re.compile(r'^\s*\[?\s*\{+\s*"(?:name|function)"\s*:\s*(?:\{\s*"name"\s*:\s*)?"([^"\\]+)"')
_CALL_KEYS = re.compile(r'^\s*\[?\s*\{+\s*"(?:name|arguments|parameters|function)"\s*:')
"""How a call object begins, whatever its name: a reply cut there (max_tokens) was writing a call."""


@dataclass(frozen=True)
class Fence:
    """One fenced block: where it starts and ends in the text, its info string and its body."""

    start: int
    end: int
    info: str
    body: str
    closed: bool


def fences(text: str) -> list[Fence]:
    """The top-level fenced blocks of `text` (CommonMark: a fence closes on a line of at least as
    many of the same character; one left open runs to the end). Fences inside a block are its body."""
    found, pos = [], 0
    while (opening := _OPEN.search(text, pos)) is not None:
        marker, info = opening.group(1), opening.group(2).lower()
        body_start = opening.end() + 1
        closing = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*\r?$", re.MULTILINE)
        close = closing.search(text, body_start) if body_start <= len(text) else None
        if close is None:
            found.append(Fence(opening.start(), len(text), info, text[body_start:], False))
            break
        found.append(Fence(opening.start(), close.end(), info, text[body_start:close.start()], True))
        pos = close.end()
    return found


def declared_name(body: str, names: Declared | None) -> bool:
    """Whether `body` begins like a call object to a declared tool (any name when `names` is None)."""
    match = _NAMED.match(body)
    return match is not None and (names is None or match.group(1) in names)


def json_calls(body: str, names: Declared | None, meant: bool, cut: bool = False) -> tuple[list[ToolCall], dict | None]:
    """The calls `body` holds as JSON ([] when it is not calls), or a parse error when it meant
    calls (`meant`; or it begins with a declared tool's name; or, `cut` by max_tokens, it began
    a call object) and cannot be read as them. A call object has `arguments` or `parameters`
    (a tool's schema, with its `description`, is not one)."""
    hinted = meant or declared_name(body, names) or (cut and _CALL_KEYS.match(body) is not None)
    parts = json_values(body.strip())
    if not parts:
        return [], ({"text": body, "error": "tool call is not valid JSON"} if hinted else None)
    values = [v for part in parts for v in _listed(json.loads(part))]
    if not meant and not all(_call_shaped(v) for v in values):
        return [], None  # JSON that is not calls (an answer, a tool's schema): text
    calls = []
    for value in values:
        try:
            calls.append(call_from(value, names))
        except ValueError as exc:
            return [], ({"text": body, "error": str(exc)} if hinted else None)  # else: no declared tool, text
    return calls, None


def _call_shaped(value: object) -> bool:
    value = unwrapped(value)
    return (isinstance(value, dict) and "name" in value and "description" not in value
            and ("arguments" in value or "parameters" in value))


def _listed(value: object) -> list:
    return value if isinstance(value, list) and value else [value]


def parse_fenced(text: str, finish_reason: str | None, names: Declared | None = None,
                 kinds: Sequence[str] = ("fenced_json", "tool_code")) -> Action:
    """Calls in fenced blocks of `kinds` (`fenced_json`: JSON; `tool_code`: Python calls); the text
    outside the fences that held calls is the content."""
    calls, errors, kept, last, read = [], [], [], 0, []
    for fence in fences(text):
        if fence.info in JSON_FENCES and "fenced_json" in kinds:
            cut = not fence.closed and finish_reason == "length"
            found, error = json_calls(fence.body, names, fence.info in MEANT_FENCES, cut)
            kind = "fenced_json"
        elif fence.info == "tool_code" and "tool_code" in kinds:
            found, error = python_calls(fence.body, names)
            kind = "tool_code"
        else:
            continue
        if error is not None:
            errors.append({**error, "text": text[fence.start:fence.end]})
        if found:
            kept.append(text[last:fence.start])
            last = fence.end
            calls += found
            read.append(kind)
    kept.append(text[last:])
    return action("".join(kept), calls, errors, finish_reason, read[0] if read else "")


def parse_json(text: str, finish_reason: str | None, names: Declared | None = None) -> Action:
    """A reply that begins with JSON calls (any text after them is the content); any other reply
    is content."""
    body = text.strip()
    if not body.startswith(("{", "[")):
        return action(text, [], [], finish_reason)
    end = _json_end(body)
    calls, error = json_calls(body[:end] if end else body, names, meant=False, cut=finish_reason == "length")
    if not calls:
        return action(text, [], [error] if error else [], finish_reason)
    return action(body[end:] if end else "", calls, [], finish_reason, "json")


def _json_end(body: str) -> int | None:
    """Where the run of JSON values at the start of `body` ends, when text follows it (None: the
    whole body is JSON, or its start is not)."""
    decoder, pos = json.JSONDecoder(), 0
    while True:
        try:
            _, pos = decoder.raw_decode(body, pos)
        except (json.JSONDecodeError, RecursionError):
            return None
        rest = body[pos:]
        stripped = rest.lstrip().lstrip(";").lstrip()
        if not stripped:
            return None
        if not stripped.startswith(("{", "[")):
            return pos
        pos = len(body) - len(stripped)


def python_calls(body: str, names: Declared | None) -> tuple[list[ToolCall], dict | None]:
    """The calls in Python call syntax (`f(a=1)`, `print(f(a=1))`, `[f(a=1), g()]`), or a parse error."""
    try:
        tree = ast.parse(body.strip())
        calls = [_python_call(node, names) for stmt in tree.body
                 for node in _call_nodes(stmt)]
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else str(exc) or type(exc).__name__
        return [], {"text": body, "error": f"tool call is not a Python call ({reason})"}
    if not calls:
        return [], {"text": body, "error": "tool call is not a Python call (no call)"}
    return calls, None


def _call_nodes(stmt: ast.stmt) -> list[ast.Call]:
    if not isinstance(stmt, ast.Expr):
        raise InvalidArgument(f"a {type(stmt).__name__} statement")
    node = stmt.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
        node = node.args[0] if len(node.args) == 1 else node
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    if not all(isinstance(item, ast.Call) for item in items):
        raise InvalidArgument("an expression that is not a call")
    return cast("list[ast.Call]", items)  # each one a Call: checked above


def _python_call(node: ast.Call, names: Declared | None) -> ToolCall:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None or (names is not None and name not in names):
        raise InvalidArgument(f"calls {ast.unparse(func)!r}, which the request does not declare")
    order = list((names or {}).get(name, ()))
    if len(node.args) > len(order) or any(isinstance(a, ast.Starred) for a in node.args):
        raise InvalidArgument(f"{name}: positional arguments beyond the tool's parameters")
    arguments = dict(zip(order, (ast.literal_eval(a) for a in node.args)))
    for keyword in node.keywords:
        if keyword.arg is None or keyword.arg in arguments:
            raise InvalidArgument(f"{name}: **arguments or an argument given twice")
        arguments[keyword.arg] = ast.literal_eval(keyword.value)
    return ToolCall(id=new_call_id(), name=name,
                    arguments=json.dumps(arguments, ensure_ascii=False, allow_nan=False))  # TypeError: a set, bytes

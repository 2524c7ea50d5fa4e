"""Tool calls in the formats that mark them with tokens of their own, and what every reader shares.

- `hermes` (Qwen, Hermes, the embedded model): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
- `llama3_json` (Llama 3.1-3.3): the reply is `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`, several separated by `;`.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the newer
  `[TOOL_CALLS]name[ARGS]{...}` of later Mistral tokenizers.

Small models write calls imperfectly: a missing closing tag at the end of the generation,
arguments as a JSON string. What can be read unambiguously becomes an OpenAI-format call;
anything else is kept as text and recorded in `parse_errors`, because a malformed call is a
policy action the trainer must see (and penalise), not an exception that kills the agent. Given
`names`, a call to a tool outside them is such a malformed call; `toolcalls.parse` gives none for
these formats: a marked call is a call whatever tool it names, for the agent's framework to refuse.
`toolcalls.parse` chooses the reader; `untagged` reads the calls written without markers.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Action, ToolCall

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def new_call_id() -> str:
    """Letters and digits only: some clients rewrite an id to those before sending its result back
    (OpenClaw drops the `_` of `call_...`), which would leave the result matching no call."""
    return "call" + uuid.uuid4().hex[:24]


def parse_call(body: str, names: Collection[str] | None = None) -> ToolCall:
    """One call from its JSON text; `names`: the tools the request declares (None: any name)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:
        raise InvalidArgument("tool call is not valid JSON (nested too deeply)") from None
    return call_from(data, names)


def unwrapped(data: object) -> object:
    """The call inside OpenAI's `{"type": "function", "function": {...}}`, else `data` itself."""
    if isinstance(data, dict) and isinstance(data.get("function"), dict) and "name" not in data:
        return data["function"]
    return data


def call_from(data: object, names: Collection[str] | None = None) -> ToolCall:
    """One call from a decoded JSON value: `{"name", "arguments"}` or `{"name", "parameters"}`
    (arguments as an object or as a JSON string), or OpenAI's `{"function": {...}}`."""
    data = unwrapped(data)
    if not isinstance(data, dict):
        raise InvalidArgument("tool call must be a JSON object with 'name' and 'arguments'")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("tool call has no 'name' string")
    if names is not None and name not in names:
        raise InvalidArgument(f"tool call names {name!r}, which the request does not declare "
                              f"(declared: {', '.join(sorted(names)) or 'none'})")
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise InvalidArgument("tool call 'arguments' is a string that is not JSON") from None
    if not isinstance(args, dict):
        raise InvalidArgument("tool call 'arguments' must be a JSON object")
    return ToolCall(id=new_call_id(), name=name, arguments=json.dumps(args, ensure_ascii=False, allow_nan=False))


def action(content: str, calls: list[ToolCall], errors: list[dict], finish_reason: str | None,
           call_format: str = "") -> Action:
    """The step's action; `call_format` is recorded only when calls were read."""
    if calls and finish_reason == "stop":
        finish_reason = "tool_calls"
    return Action(content=content.strip(), tool_calls=calls, finish_reason=finish_reason,
                  parse_errors=errors, call_format=call_format if calls else "")


def parse_hermes(text: str, finish_reason: str | None, names: Collection[str] | None = None) -> Action:
    """Split generated text into plain content, well-formed tool calls and parse errors."""
    calls, errors, kept = [], [], []
    last = 0
    for match in TOOL_CALL_BLOCK.finditer(text):
        kept.append(text[last:match.start()])
        last = match.end()
        try:
            calls.append(parse_call(match.group(1).strip(), names))
        except ValueError as exc:
            errors.append({"text": match.group(0), "error": str(exc)})
            kept.append(match.group(0))  # the malformed call stays visible as text
    kept.append(text[last:])
    return action("".join(kept), calls, errors, finish_reason, "hermes")


PYTHON_TAG = "<|python_tag|>"


def json_values(text: str) -> list[str] | None:
    """`text` as a run of JSON values separated by `;` or whitespace, or None when it is not one
    (the raw text of each value, so a bad one is reported as written)."""
    parts: list[str]
    decoder, pos, parts = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
        if pos == len(text):
            return parts
        try:
            _, end = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError):
            return None
        parts.append(text[pos:end])
        pos = end


def parse_llama3_json(text: str, finish_reason: str | None, names: Collection[str] | None = None) -> Action:
    """Llama 3.x JSON tool calls: a reply that is (after an optional `<|python_tag|>`) one or
    more `{"name": ..., "parameters": {...}}` objects; any other reply is plain content. A reply
    is only a failed call when it meant to be one (the tag, or a `"name"` key), so an answer
    that happens to be JSON stays an answer."""
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    body = body.removeprefix(PYTHON_TAG).strip()
    meant = tagged or (body.startswith("{") and re.match(r'\{\s*"name"\s*:', body) is not None)
    if not body.startswith("{"):
        return action(text, [], [], finish_reason) if not tagged else action(
            text, [], [{"text": text, "error": "tool call after <|python_tag|> is not a JSON object"}],
            finish_reason)
    parts = json_values(body)
    if parts is None:
        errors = [{"text": text, "error": "tool call is not valid JSON"}] if meant else []
        return action(text, [], errors, finish_reason)
    if not meant and not all(isinstance(json.loads(p), dict) and "name" in json.loads(p) for p in parts):
        return action(text, [], [], finish_reason)
    calls, errors = [], []
    for part in parts:
        try:
            calls.append(parse_call(part, names))
        except ValueError as exc:
            errors.append({"text": part, "error": str(exc)})
    return action("" if calls and not errors else text, calls, errors, finish_reason, "llama3_json")


TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def parse_mistral(text: str, finish_reason: str | None, names: Collection[str] | None = None) -> Action:
    """Mistral tool calls: content, then `[TOOL_CALLS]` and a JSON list of calls (or, in the
    newer format, `[TOOL_CALLS]name[ARGS]{...}` once per call)."""
    head, sep, rest = text.partition(TOOL_CALLS)
    if not sep:
        return action(text, [], [], finish_reason)
    calls, errors, unread = [], [], []
    for chunk in rest.split(TOOL_CALLS):
        chunk = chunk.strip()
        if ARGS in chunk:  # name[ARGS]{...}
            name, _, args = chunk.partition(ARGS)
            pieces = [json.dumps({"name": name.strip(), "arguments": _raw_json(args)})]
        else:
            try:
                data = json.loads(chunk)
            except json.JSONDecodeError as exc:
                errors.append({"text": TOOL_CALLS + chunk,
                               "error": f"tool call is not valid JSON ({exc.msg} at char {exc.pos})"})
                unread.append(TOOL_CALLS + chunk)
                continue
            pieces = [json.dumps(d) for d in (data if isinstance(data, list) else [data])]
        for piece in pieces:
            try:
                calls.append(parse_call(piece, names))
            except ValueError as exc:
                errors.append({"text": TOOL_CALLS + chunk, "error": str(exc)})
                unread.append(TOOL_CALLS + chunk)
    # what could not be read stays visible as text; the calls that were read do not repeat there
    return action(head + "".join(dict.fromkeys(unread)), calls, errors, finish_reason, "mistral")


def _raw_json(text: str) -> object:
    """The JSON value `text` holds, or the text itself when it is not JSON (reported later)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text

"""Parse tool calls out of generated text, tolerantly, in the format of the model's family.

- `hermes` (Qwen, Hermes, the embedded model): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
- `llama3_json` (Llama 3.1-3.3): the reply is `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`, several separated by `;`.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the newer
  `[TOOL_CALLS]name[ARGS]{...}` of later Mistral tokenizers.

A reasoning block (`<think>...</think>`, Qwen3 / DeepSeek-R1 style) is split off first: it is
kept in `Action.reasoning` and never parsed for calls. Small models write calls imperfectly: a
missing closing tag at the end of the generation, arguments as a JSON string. What can be read
unambiguously becomes an OpenAI-format call; anything else is kept as text and recorded in
`parse_errors`, because a malformed call is a policy action the trainer must see (and
penalise), not an exception that kills the agent.
"""

from __future__ import annotations

import json
import re
import uuid

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Action, ToolCall

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_call(body: str) -> ToolCall:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict):
        raise InvalidArgument("tool call must be a JSON object with 'name' and 'arguments'")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("tool call has no 'name' string")
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise InvalidArgument("tool call 'arguments' is a string that is not JSON") from None
    if not isinstance(args, dict):
        raise InvalidArgument("tool call 'arguments' must be a JSON object")
    return ToolCall(id=new_call_id(), name=name, arguments=json.dumps(args, ensure_ascii=False))


def _action(content: str, calls: list[ToolCall], errors: list[dict], finish_reason: str | None,
            reasoning: str = "") -> Action:
    if calls and finish_reason == "stop":
        finish_reason = "tool_calls"
    return Action(content=content.strip(), tool_calls=calls, finish_reason=finish_reason,
                  parse_errors=errors, reasoning=reasoning)


def parse_hermes(text: str, finish_reason: str | None) -> Action:
    """Split generated text into plain content, well-formed tool calls and parse errors."""
    calls, errors, kept = [], [], []
    last = 0
    for match in TOOL_CALL_BLOCK.finditer(text):
        kept.append(text[last:match.start()])
        last = match.end()
        try:
            calls.append(parse_call(match.group(1).strip()))
        except ValueError as exc:
            errors.append({"text": match.group(0), "error": str(exc)})
            kept.append(match.group(0))  # the malformed call stays visible as text
    kept.append(text[last:])
    return _action("".join(kept), calls, errors, finish_reason)


PYTHON_TAG = "<|python_tag|>"


def _json_objects(text: str) -> list[str] | None:
    """`text` as a run of JSON values separated by `;` or whitespace, or None when it is not one
    (the raw text of each value, so a bad one is reported as written)."""
    decoder, pos, parts = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
        if pos == len(text):
            return parts
        try:
            _, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        parts.append(text[pos:end])
        pos = end


def parse_llama3_json(text: str, finish_reason: str | None) -> Action:
    """Llama 3.x JSON tool calls: a reply that is (after an optional `<|python_tag|>`) one or
    more `{"name": ..., "parameters": {...}}` objects; any other reply is plain content. A reply
    is only a failed call when it meant to be one (the tag, or a `"name"` key), so an answer
    that happens to be JSON stays an answer."""
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    body = body.removeprefix(PYTHON_TAG).strip()
    meant = tagged or (body.startswith("{") and re.match(r'\{\s*"name"\s*:', body) is not None)
    if not body.startswith("{"):
        return _action(text, [], [], finish_reason) if not tagged else _action(
            text, [], [{"text": text, "error": "tool call after <|python_tag|> is not a JSON object"}],
            finish_reason)
    parts = _json_objects(body)
    if parts is None:
        errors = [{"text": text, "error": "tool call is not valid JSON"}] if meant else []
        return _action(text, [], errors, finish_reason)
    if not meant and not all(isinstance(json.loads(p), dict) and "name" in json.loads(p) for p in parts):
        return _action(text, [], [], finish_reason)
    calls, errors = [], []
    for part in parts:
        try:
            calls.append(parse_call(part))
        except ValueError as exc:
            errors.append({"text": part, "error": str(exc)})
    return _action("" if calls and not errors else text, calls, errors, finish_reason)


TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def parse_mistral(text: str, finish_reason: str | None) -> Action:
    """Mistral tool calls: content, then `[TOOL_CALLS]` and a JSON list of calls (or, in the
    newer format, `[TOOL_CALLS]name[ARGS]{...}` once per call)."""
    head, sep, rest = text.partition(TOOL_CALLS)
    if not sep:
        return _action(text, [], [], finish_reason)
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
                calls.append(parse_call(piece))
            except ValueError as exc:
                errors.append({"text": TOOL_CALLS + chunk, "error": str(exc)})
                unread.append(TOOL_CALLS + chunk)
    # what could not be read stays visible as text; the calls that were read do not repeat there
    return _action(head + "".join(dict.fromkeys(unread)), calls, errors, finish_reason)


def _raw_json(text: str) -> object:
    """The JSON value `text` holds, or the text itself when it is not JSON (reported later)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, the rest): a leading `<think>...</think>` block (or an unclosed one, cut by
    max_tokens: all of it is reasoning). Templates that open the block in the prompt leave only
    `...</think>` in the reply; that is split the same way."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        inner = stripped[len(THINK_OPEN):]
        thought, sep, rest = inner.partition(THINK_CLOSE)
        return (thought.strip(), rest) if sep else (inner.strip(), "")
    if THINK_CLOSE in text and THINK_OPEN not in text:
        thought, _, rest = text.partition(THINK_CLOSE)
        return thought.strip(), rest
    return "", text


PARSERS = {"hermes": parse_hermes, "llama3_json": parse_llama3_json, "mistral": parse_mistral}
"""Tool-call formats by name (the names vLLM's `--tool-call-parser` uses)."""

OPENINGS = {"hermes": '<tool_call>\n{"name": "'}
"""How a tool call begins in each format, up to the tool's name (what `Sampling.explore` forces)."""


def parse(text: str, finish_reason: str | None, tool_format: str = "hermes") -> Action:
    """The reasoning block split off, then the tool calls parsed in `tool_format`."""
    if tool_format not in PARSERS:
        raise InvalidArgument(f"tool_format: expected one of {sorted(PARSERS)}, got {tool_format!r}")
    reasoning, rest = split_reasoning(text)
    action = PARSERS[tool_format](rest, finish_reason)
    action.reasoning = reasoning
    return action


def render_calls(content: str, calls: list[tuple[str, dict]], tool_format: str = "hermes") -> str:
    """A reply as a model of that format writes it: `content`, then the (name, arguments) calls;
    `parse` reads it back to the same content and calls."""
    if not calls:
        return content
    if tool_format == "hermes":
        blocks = [f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls]
        return (content + "\n" if content else "") + "\n".join(blocks)
    if tool_format == "llama3_json":  # the format has no room for content beside its calls
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    if tool_format == "mistral":
        return content + TOOL_CALLS + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    raise InvalidArgument(f"tool_format: expected one of {sorted(PARSERS)}, got {tool_format!r}")


def detect_format(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches its model: Mistral's `[TOOL_CALLS]`, Llama
    3's header tokens, else Hermes `<tool_call>` (also the embedded model's)."""
    template = chat_template or ""
    if TOOL_CALLS in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|start_header_id|>" in template or PYTHON_TAG in template:
        return "llama3_json"
    return "hermes"


FORMAT_MARKERS = (TOOL_CALLS, ARGS, PYTHON_TAG, THINK_OPEN, THINK_CLOSE)
"""Tokens a reply is parsed by, kept when a decoder drops the other special tokens."""

"""Parse Hermes-style tool calls out of generated text, tolerantly.

Small models write `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` imperfectly: a
missing closing tag at the end of the generation, single quotes, arguments as a JSON string.
What can be read unambiguously becomes an OpenAI-format call; anything else is kept as text and
recorded in `parse_errors`, because a malformed call is a policy action the trainer must see
(and penalise), not an exception that kills the agent.
"""

from __future__ import annotations

import json
import re
import uuid

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Action, ToolCall

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _parse_one(body: str) -> ToolCall:
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


def parse_hermes(text: str, finish_reason: str | None) -> Action:
    """Split generated text into plain content, well-formed tool calls and parse errors."""
    calls, errors, kept = [], [], []
    last = 0
    for match in _BLOCK.finditer(text):
        kept.append(text[last:match.start()])
        last = match.end()
        try:
            calls.append(_parse_one(match.group(1).strip()))
        except ValueError as exc:
            errors.append({"text": match.group(0), "error": str(exc)})
            kept.append(match.group(0))  # the malformed call stays visible as text
    kept.append(text[last:])
    content = "".join(kept).strip()
    if calls and finish_reason == "stop":
        finish_reason = "tool_calls"
    return Action(content=content, tool_calls=calls, finish_reason=finish_reason, parse_errors=errors)

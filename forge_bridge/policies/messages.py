"""OpenAI-format chat messages as the chat template expects them."""

from __future__ import annotations

import json
from typing import Any

from forge_bridge.core.errors import InvalidArgument

_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: keep the text parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def normalize_messages(messages: list[dict]) -> list[dict]:
    """Plain-string contents and OpenAI-shaped tool calls, so every template renders them."""
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages: expected a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidArgument(f"messages[{i}]: expected an object with a 'role' string, got {m!r}")
        # Only the OpenAI message fields: frameworks add their own (CrewAI's cache_breakpoint),
        # which a server may reject and a template never reads.
        msg = {k: m[k] for k in _FIELDS if m.get(k) not in (None, [])}
        msg["content"] = _text(m.get("content"))
        out.append(msg)
    return out


def template_messages(messages: list[dict]) -> list[dict]:
    """Normalized messages as a chat template renders them: each call's `arguments` an object,
    not the OpenAI API's JSON string, as transformers' templates expect (Qwen's writes
    `arguments | tojson`, which would double-encode a string: the model then sees, and copies,
    `"arguments": "{\\"a\\": 1}"`). vLLM converts them the same way. Arguments that are not a JSON
    object stay as they are."""
    out = []
    for msg in normalize_messages(messages):
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            msg = {**msg, "tool_calls": [_with_object_arguments(call) for call in calls]}
        out.append(msg)
    return out


def prompt_ids(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The prompt token ids a local model is fed for these messages and tools: its chat template
    over `template_messages`, ending where the assistant's reply starts."""
    enc = tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, add_generation_prompt=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def _with_object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(function, dict) or not isinstance(arguments, str):
        return call
    try:
        value = json.loads(arguments)
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": value}} if isinstance(value, dict) else call

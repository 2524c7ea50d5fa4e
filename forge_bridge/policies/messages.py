"""OpenAI-format chat messages as the chat template expects them."""

from __future__ import annotations

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

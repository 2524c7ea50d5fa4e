"""What one step showed the policy and what it did: OpenAI-format messages and tool schemas
(`Observation`), and the text, parsed tool calls and finish reason (`Action`). Part of the data
model; `forge_bridge.core.types` exports them with the rest of it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from forge_bridge.core import validate
from forge_bridge.core.errors import SchemaError


@dataclass
class ToolCall:
    """One tool call in OpenAI format: `arguments` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str

    def __post_init__(self) -> None:
        for name in ("id", "name", "arguments"):
            if not isinstance(getattr(self, name), str):
                raise validate.fail(f"ToolCall.{name}", "a string", getattr(self, name))

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, data: Any, where: str = "ToolCall") -> "ToolCall":
        if not isinstance(data, dict):
            raise validate.fail(where, "a tool call object", data)
        fn = data.get("function")
        if not isinstance(fn, dict):
            raise validate.fail(f"{where}.function", "an object with name and arguments", fn)
        args = fn.get("arguments", "")
        if isinstance(args, dict):
            args = json.dumps(args)
        try:
            return cls(id=data.get("id") or "",
                       name=fn.get("name"),  # type: ignore[arg-type]  # any value: __post_init__ checks it
                       arguments=args)
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None


@dataclass
class Action:
    """What the policy did in one step: its text, its parsed tool calls and why it stopped.

    `parse_errors` keeps malformed tool calls the model wrote (as text plus the reason) so a bad
    call is recorded as such rather than lost or raised into the agent. `reasoning` is a thinking
    block the model wrote before its answer (`<think>...</think>`), kept out of `content` and of
    the tool-call parse; its tokens stay in the completion like every other. `call_format` is the
    format the tool calls were read from (`hermes`, `fenced_json`, `json`, `tool_code`,
    `llama3_json`, `mistral`; empty when there are none, or for a step recorded before it existed).
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    parse_errors: list[dict] = field(default_factory=list)
    reasoning: str = ""
    call_format: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.content, str):
            raise validate.fail("Action.content", "a string", self.content)
        if not isinstance(self.tool_calls, list):
            raise validate.fail("Action.tool_calls", "a list", self.tool_calls)
        self.tool_calls = [
            tc if isinstance(tc, ToolCall) else ToolCall.from_openai(tc, f"Action.tool_calls[{i}]")
            for i, tc in enumerate(self.tool_calls)
        ]
        validate.optional_str("Action.finish_reason", self.finish_reason)
        if not isinstance(self.parse_errors, list) or not all(isinstance(e, dict) for e in self.parse_errors):
            raise validate.fail("Action.parse_errors", "a list of objects", self.parse_errors)
        if not isinstance(self.reasoning, str):
            raise validate.fail("Action.reasoning", "a string", self.reasoning)
        if not isinstance(self.call_format, str):
            raise validate.fail("Action.call_format", "a string", self.call_format)

    @property
    def malformed(self) -> bool:
        """The model tried to call a tool and no call was usable: the agent cannot go on."""
        return bool(self.parse_errors) and not self.tool_calls

    def to_dict(self) -> dict:
        out = {"content": self.content, "tool_calls": [tc.to_openai() for tc in self.tool_calls],
               "finish_reason": self.finish_reason, "parse_errors": self.parse_errors}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.call_format:
            out["call_format"] = self.call_format
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "Action":
        if not isinstance(data, dict):
            raise validate.fail("Action", "an object", data)
        return cls(content=data.get("content") or "", tool_calls=data.get("tool_calls") or [],
                   finish_reason=data.get("finish_reason"), parse_errors=data.get("parse_errors") or [],
                   reasoning=data.get("reasoning") or "", call_format=data.get("call_format") or "")


@dataclass
class Observation:
    """Exactly what the policy was shown: OpenAI-format messages and tool schemas."""

    messages: list[dict]
    tools: list[dict] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.messages, list):
            raise validate.fail("Observation.messages", "a list of message objects", self.messages)
        for i, m in enumerate(self.messages):
            validate.json_object(f"Observation.messages[{i}]", m)
            if not isinstance(m.get("role"), str):
                raise validate.fail(f"Observation.messages[{i}].role", "a role string", m.get("role"))
        if self.tools is not None:
            if not isinstance(self.tools, list):
                raise validate.fail("Observation.tools", "a list of tool schemas or null", self.tools)
            for i, t in enumerate(self.tools):
                validate.json_object(f"Observation.tools[{i}]", t)

    def to_dict(self) -> dict:
        return {"messages": self.messages, "tools": self.tools}

    @classmethod
    def from_dict(cls, data: Any) -> "Observation":
        if not isinstance(data, dict):
            raise validate.fail("Observation", "an object", data)
        return cls(messages=data.get("messages"),  # type: ignore[arg-type]  # any value: __post_init__ checks it
                   tools=data.get("tools"))


__all__ = ["Action", "Observation", "ToolCall"]

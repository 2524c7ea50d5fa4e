"""Environments whose actions are tool calls and whose episode ends with a final answer.

A policy step with tool calls runs each call and observes the results as OpenAI `tool`
messages; a step with no tool call is the final answer, which the task's checker scores. Every
fault the model or a tool can cause (unknown tool, arguments that are not a JSON object or
have the wrong type, a tool that raises, output too long or not UTF-8) becomes an error
observation the model sees and a record in the step's `info`, never an exception into the loop.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from forge_bridge.core.errors import ForgeBridgeError, InvalidArgument, InvalidState, WrongType
from forge_bridge.core.timeouts import call_with_timeout
from forge_bridge.core.types import Action, ToolCall
from forge_bridge.envs.base import Environment, StepResult

_JSON_TYPES: dict[str, type | tuple[type, ...]]
_JSON_TYPES = {"integer": int, "number": (int, float), "string": str, "boolean": bool,
               "object": dict, "array": list}


@dataclass(frozen=True)
class ToolTask:
    """One task for a tool environment: what to ask, and how to judge the end of the episode."""

    id: str
    """Stable identifier (groups rollouts of the same task)."""
    prompt: str
    """The user's request, the first observation."""
    check: Callable[[str, Any], float | bool]
    """(final answer text, environment) -> reward; True/False count as 1/0."""
    setup: Callable[[Any], None] | None = None
    """Prepares the environment after reset (files to start from, service state)."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidArgument(f"ToolTask.id: expected a non-empty string, got {self.id!r}")
        if not isinstance(self.prompt, str):
            raise InvalidArgument(f"ToolTask.prompt: expected a string, got {self.prompt!r}")
        if not callable(self.check):
            raise InvalidArgument(f"ToolTask.check: expected a function (answer, env) -> reward, got {self.check!r}")
        if self.setup is not None and not callable(self.setup):
            raise InvalidArgument(f"ToolTask.setup: expected a function (env) -> None, got {self.setup!r}")


class ToolError(ForgeBridgeError):
    """A tool refused or failed a call; its message is what the model observes, `details`
    (exit code, which limit was hit) go into the step's record."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


def function_schema(name: str, description: str, properties: dict, required: tuple[str, ...]) -> dict:
    """An OpenAI tool schema."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


def parse_arguments(call: ToolCall, schema: dict) -> dict:
    """The call's JSON arguments, checked against the tool's parameter schema."""
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ToolError(f"arguments of {call.name} are not valid JSON: {exc}") from None
    if not isinstance(args, dict):
        raise ToolError(f"arguments of {call.name} must be a JSON object, got {type(args).__name__}")
    params = schema["function"]["parameters"]
    props = params.get("properties", {})
    missing = [p for p in params.get("required", []) if p not in args]
    if missing:
        raise ToolError(f"{call.name}: missing argument(s) {', '.join(missing)}")
    unknown = [a for a in args if a not in props]
    if unknown:
        raise ToolError(f"{call.name}: unknown argument(s) {', '.join(unknown)} (expected {', '.join(props)})")
    for name, value in args.items():
        expected = _JSON_TYPES.get(props[name].get("type"))
        wrong = expected is not None and (not isinstance(value, expected) or (
            isinstance(value, bool) and props[name].get("type") != "boolean"))
        if wrong:
            raise ToolError(f"{call.name}: argument {name!r} must be {props[name]['type']}, "
                            f"got {type(value).__name__} {value!r}")
    return args


def bounded(text: str, limit: int) -> str:
    """Text cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def as_text(value: Any) -> str:
    """A tool's return value as the text the model observes (bytes decoded, invalid UTF-8 replaced)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


class ToolEnvironment(Environment):
    """Base of the tool environments: subclasses provide `tool_functions()` and episode setup."""

    def __init__(self, max_observation_chars: int = 8000, tool_timeout_s: float | None = 60.0) -> None:
        """`tool_timeout_s`: a tool call still running after this long is abandoned and the
        model observes a timeout error (None: wait for ever)."""
        if not isinstance(max_observation_chars, int) or max_observation_chars < 100:
            raise InvalidArgument(f"max_observation_chars: expected an int >= 100, got {max_observation_chars!r}")
        if tool_timeout_s is not None and (isinstance(tool_timeout_s, bool) or not isinstance(
                tool_timeout_s, (int, float)) or tool_timeout_s <= 0):
            raise InvalidArgument(f"tool_timeout_s: expected a number > 0 or None, got {tool_timeout_s!r}")
        self.max_observation_chars, self.tool_timeout_s = max_observation_chars, tool_timeout_s
        self.task: ToolTask | None = None
        self.done = False
        self._functions = self.tool_functions()
        self.tools = [schema for schema, _ in self._functions.values()]

    def tool_functions(self) -> dict[str, tuple[dict, Callable[..., Any]]]:
        """name -> (OpenAI schema, function called with the parsed arguments)."""
        raise NotImplementedError

    def begin(self, task: ToolTask) -> None:
        """Fresh per-episode state (a working directory, say)."""

    def reset(self, task: ToolTask) -> list[dict]:
        if not isinstance(task, ToolTask):
            raise WrongType(f"task: expected a ToolTask, got {type(task).__name__}")
        self.task, self.done = task, False
        self.begin(task)
        if task.setup is not None:
            task.setup(self)
        return [{"role": "user", "content": task.prompt}]

    def step(self, action: Action) -> StepResult:
        if self.task is None or self.done:
            raise InvalidState("step() before reset() or after the episode ended")
        if not action.tool_calls:
            return self._final(action.content)
        observation, results = [], {}
        for call in action.tool_calls:
            result = self.call_tool(call)
            results[call.id] = result
            observation.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                                "content": result["content"]})
        return StepResult(observation=observation, info={"tool_results": results})

    def call_tool(self, call: ToolCall) -> dict:
        """Run one call; a fault becomes an error result the model observes."""
        t0 = time.perf_counter()
        extra: dict[str, Any]
        status, error, extra = "success", None, {}
        try:
            if call.name not in self._functions:
                raise ToolError(f"unknown tool {call.name!r} (tools: {', '.join(self._functions)})")
            schema, fn = self._functions[call.name]
            try:
                value = call_with_timeout(fn, self.tool_timeout_s, **parse_arguments(call, schema))
            except TimeoutError as exc:
                raise ToolError(f"{call.name}: {exc}", timed_out=True) from None
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
                value, extra = value  # a tool may report details (exit code, sizes) for the record
            content = as_text(value)
        except ToolError as exc:
            status, error, extra = "error", str(exc), exc.details
            content = f"error: {exc}"
        except Exception as exc:  # the tool itself crashed: the model sees it, the record keeps it
            status, error = "error", f"{type(exc).__name__}: {exc}"
            content = f"error: {error}"
        return {"name": call.name, "arguments": call.arguments, "status": status, "error": error,
                "content": bounded(content, self.max_observation_chars),
                "latency_s": round(time.perf_counter() - t0, 4), **extra}

    def _final(self, answer: str) -> StepResult:
        self.done = True
        assert self.task is not None  # step() answers only during an episode
        try:
            value = self.task.check(answer, self)
        except Exception as exc:
            raise InvalidArgument(f"the checker of task {self.task.id!r} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidArgument(f"the checker of task {self.task.id!r} must return a finite number or a "
                             f"bool, got {value!r}")
        return StepResult(observation=None, reward=float(value), terminated=True,
                          info={"answer": answer})


__all__ = ["ToolEnvironment", "ToolError", "ToolTask", "as_text", "bounded", "function_schema",
           "parse_arguments"]

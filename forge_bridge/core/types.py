"""The environment-transition data model shared by every adapter, the store and the trainer.

Everything here is plain Python (no torch, no framework) and round-trips through JSON, so a
trajectory recorded by a LangChain agent today is readable by the trainer of a later release.
Objects validate on creation and on load: a bad value raises `SchemaError` naming the field,
because a silently wrong token id would train the model on garbage.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from forge_bridge.core.errors import SchemaError

SCHEMA_VERSION = 2
"""Version of the JSON layout written by `to_dict`; bumped on any incompatible change. Version 1
(end reason, role and truncation kept as `metadata` keys; `Transition.truncated` meaning "hit
max_tokens") is read and migrated by `Trajectory.from_dict` and the store."""

STATUSES = ("incomplete", "complete", "failed", "truncated")
"""`incomplete`: the episode was never closed (still running, or its process died)."""

END_REASONS = ("terminated", "truncated", "policy_fault", "outage", "crashed")
"""Why an episode ended, as the trainer reads it:
- `terminated`: the task ended (a final answer, an end state); trained on.
- `truncated`: a limit cut it (steps, recursion, time, context); trained on with its reward.
- `policy_fault`: the model's own failure (a malformed tool call); trained on, reward 0 if unscored.
- `outage`: the policy could not answer (server down, unusable reply); never trained on.
- `crashed`: the agent or the rollout code raised; never trained on."""

STATUS_OF_END = {"terminated": "complete", "truncated": "truncated", "policy_fault": "failed",
                 "outage": "failed", "crashed": "failed"}
"""The coarse status each end reason is stored under."""

TRAINABLE_ENDS = ("terminated", "truncated", "policy_fault")
"""End reasons whose trajectories carry the policy's own behaviour (see END_REASONS)."""


# --------------------------------------------------------------------------- field checks
def _fail(where: str, expected: str, value: Any) -> SchemaError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return SchemaError(f"{where}: expected {expected}, got {shown}")


def _int_list(where: str, value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise _fail(where, "a list of non-negative ints", value)
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _fail(f"{where}[{i}]", "a non-negative int (a token id)", v)
    return list(value)


def _float_list(where: str, value: Any) -> list[float]:
    if not isinstance(value, (list, tuple)):
        raise _fail(where, "a list of floats", value)
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v > 0:
            raise _fail(f"{where}[{i}]", "a log-probability (a float <= 0, not NaN)", v)
        out.append(float(v))
    return out


def _finite(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, "a finite number", value)
    return float(value)


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "a bool", value)
    return value


def _opt_str(where: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _fail(where, "a string or null", value)
    return value


def _dict(where: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, "an object (dict)", value)
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{where}: not JSON-serialisable ({exc})") from None
    return value


# --------------------------------------------------------------------------- action / observation
@dataclass
class ToolCall:
    """One tool call in OpenAI format: `arguments` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str

    def __post_init__(self) -> None:
        for name in ("id", "name", "arguments"):
            if not isinstance(getattr(self, name), str):
                raise _fail(f"ToolCall.{name}", "a string", getattr(self, name))

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, data: Any, where: str = "ToolCall") -> "ToolCall":
        if not isinstance(data, dict):
            raise _fail(where, "a tool call object", data)
        fn = data.get("function")
        if not isinstance(fn, dict):
            raise _fail(f"{where}.function", "an object with name and arguments", fn)
        args = fn.get("arguments", "")
        if isinstance(args, dict):
            args = json.dumps(args)
        try:
            return cls(id=data.get("id") or "", name=fn.get("name"), arguments=args)
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None


@dataclass
class Action:
    """What the policy did in one step: its text, its parsed tool calls and why it stopped.

    `parse_errors` keeps malformed tool calls the model wrote (as text plus the reason) so a bad
    call is recorded as such rather than lost or raised into the agent. `reasoning` is a thinking
    block the model wrote before its answer (`<think>...</think>`), kept out of `content` and of
    the tool-call parse; its tokens stay in the completion like every other.
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    parse_errors: list[dict] = field(default_factory=list)
    reasoning: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.content, str):
            raise _fail("Action.content", "a string", self.content)
        if not isinstance(self.tool_calls, list):
            raise _fail("Action.tool_calls", "a list", self.tool_calls)
        self.tool_calls = [
            tc if isinstance(tc, ToolCall) else ToolCall.from_openai(tc, f"Action.tool_calls[{i}]")
            for i, tc in enumerate(self.tool_calls)
        ]
        _opt_str("Action.finish_reason", self.finish_reason)
        if not isinstance(self.parse_errors, list) or not all(isinstance(e, dict) for e in self.parse_errors):
            raise _fail("Action.parse_errors", "a list of objects", self.parse_errors)
        if not isinstance(self.reasoning, str):
            raise _fail("Action.reasoning", "a string", self.reasoning)

    @property
    def malformed(self) -> bool:
        """The model tried to call a tool and no call was usable: the agent cannot go on."""
        return bool(self.parse_errors) and not self.tool_calls

    def to_dict(self) -> dict:
        out = {"content": self.content, "tool_calls": [tc.to_openai() for tc in self.tool_calls],
               "finish_reason": self.finish_reason, "parse_errors": self.parse_errors}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "Action":
        if not isinstance(data, dict):
            raise _fail("Action", "an object", data)
        return cls(content=data.get("content") or "", tool_calls=data.get("tool_calls") or [],
                   finish_reason=data.get("finish_reason"), parse_errors=data.get("parse_errors") or [],
                   reasoning=data.get("reasoning") or "")


@dataclass
class Observation:
    """Exactly what the policy was shown: OpenAI-format messages and tool schemas."""

    messages: list[dict]
    tools: list[dict] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.messages, list):
            raise _fail("Observation.messages", "a list of message objects", self.messages)
        for i, m in enumerate(self.messages):
            _dict(f"Observation.messages[{i}]", m)
            if not isinstance(m.get("role"), str):
                raise _fail(f"Observation.messages[{i}].role", "a role string", m.get("role"))
        if self.tools is not None:
            if not isinstance(self.tools, list):
                raise _fail("Observation.tools", "a list of tool schemas or null", self.tools)
            for i, t in enumerate(self.tools):
                _dict(f"Observation.tools[{i}]", t)

    def to_dict(self) -> dict:
        return {"messages": self.messages, "tools": self.tools}

    @classmethod
    def from_dict(cls, data: Any) -> "Observation":
        if not isinstance(data, dict):
            raise _fail("Observation", "an object", data)
        return cls(messages=data.get("messages"), tools=data.get("tools"))


# --------------------------------------------------------------------------- transition
@dataclass
class Transition:
    """One environment step = one model call of the agent, with the exact tokens sampled.

    Token ids and logprobs come from the server that sampled them and are never re-tokenised;
    `adapter` names the adapter version that produced them so stale samples can be weighted.
    `info` holds what happened after the call (tool results keyed by tool_call id, errors,
    latencies, framework metadata).
    """

    observation: Observation
    action: Action
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    adapter: str | None = None
    reward: float = 0.0
    terminated: bool = False
    """Gymnasium's meaning: the last step of an episode whose task ended."""
    truncated: bool = False
    """Gymnasium's meaning: the last step of an episode a limit cut short (a completion that hit
    max_tokens is `action.finish_reason == "length"`, not this)."""
    info: dict = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)
    temperature: float | None = None
    """The sampling temperature the completion was drawn at (None: not known)."""

    def __post_init__(self) -> None:
        if isinstance(self.observation, dict):
            self.observation = Observation.from_dict(self.observation)
        if not isinstance(self.observation, Observation):
            raise _fail("Transition.observation", "an Observation", self.observation)
        if isinstance(self.action, dict):
            self.action = Action.from_dict(self.action)
        if not isinstance(self.action, Action):
            raise _fail("Transition.action", "an Action", self.action)
        self.prompt_token_ids = _int_list("Transition.prompt_token_ids", self.prompt_token_ids)
        self.completion_token_ids = _int_list("Transition.completion_token_ids", self.completion_token_ids)
        self.completion_logprobs = _float_list("Transition.completion_logprobs", self.completion_logprobs)
        if self.completion_logprobs and len(self.completion_logprobs) != len(self.completion_token_ids):
            raise SchemaError(
                f"Transition.completion_logprobs: {len(self.completion_logprobs)} logprobs for "
                f"{len(self.completion_token_ids)} completion tokens (must be equal)")
        _opt_str("Transition.adapter", self.adapter)
        self.reward = _finite("Transition.reward", self.reward)
        _bool("Transition.terminated", self.terminated)
        _bool("Transition.truncated", self.truncated)
        _dict("Transition.info", self.info)
        self.timestamp = _finite("Transition.timestamp", self.timestamp)
        if self.temperature is not None:
            self.temperature = _finite("Transition.temperature", self.temperature)
            if self.temperature < 0:
                raise _fail("Transition.temperature", "a number >= 0 or null", self.temperature)
        if self.terminated and self.truncated:
            raise SchemaError("Transition.terminated/truncated: a step cannot be both")

    @property
    def has_tokens(self) -> bool:
        """Trainable: both sides of the call were recorded as token ids."""
        return bool(self.prompt_token_ids) and bool(self.completion_token_ids)

    def to_dict(self) -> dict:
        return {
            "observation": self.observation.to_dict(), "action": self.action.to_dict(),
            "prompt_token_ids": self.prompt_token_ids, "completion_token_ids": self.completion_token_ids,
            "completion_logprobs": self.completion_logprobs, "adapter": self.adapter,
            "reward": self.reward, "terminated": self.terminated, "truncated": self.truncated,
            "info": self.info, "timestamp": self.timestamp, "temperature": self.temperature,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Transition":
        if not isinstance(data, dict):
            raise _fail("Transition", "an object", data)
        known = {"observation", "action", "prompt_token_ids", "completion_token_ids",
                 "completion_logprobs", "adapter", "reward", "terminated", "truncated", "info",
                 "timestamp", "temperature"}
        unknown = set(data) - known
        if unknown:
            raise SchemaError(f"Transition: unknown field(s) {sorted(unknown)}")
        for required in ("observation", "action"):
            if required not in data:
                raise SchemaError(f"Transition.{required}: missing")
        return cls(**data)


# --------------------------------------------------------------------------- trajectory
def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Trajectory:
    """One episode: the transitions of one agent run on one task, and how it ended.

    What the trainer decides on is typed: `end_reason` (see END_REASONS), `role` (a crew
    participant, trained apart), `excluded` (a reason never to train on it, e.g. an iteration
    interrupted and re-run on resume). `status` is the coarse view of `end_reason`; giving only
    one of the two fills in the other.
    """

    transitions: list[Transition] = field(default_factory=list)
    id: str = field(default_factory=new_id)
    task_id: str | None = None
    group_id: str | None = None
    run_id: str | None = None
    reward: float | None = None
    status: str = "incomplete"
    metadata: dict = field(default_factory=dict)
    end_reason: str | None = None
    """Why the episode ended (None while it is open)."""
    end_detail: str | None = None
    """The human-readable why: the limit hit, the error raised."""
    role: str | None = None
    """The participant whose steps these are (a CrewAI role), or None for a single agent."""
    excluded: str | None = None
    """Why the trainer must never train on this trajectory (None: nothing against it)."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise _fail("Trajectory.id", "a non-empty string", self.id)
        for name in ("task_id", "group_id", "run_id", "end_detail", "role", "excluded"):
            _opt_str(f"Trajectory.{name}", getattr(self, name))
        if self.reward is not None:
            self.reward = _finite("Trajectory.reward", self.reward)
        if self.status not in STATUSES:
            raise _fail("Trajectory.status", f"one of {STATUSES}", self.status)
        if self.end_reason is not None and self.end_reason not in END_REASONS:
            raise _fail("Trajectory.end_reason", f"one of {END_REASONS} or null", self.end_reason)
        if self.end_reason is None and self.status != "incomplete":
            self.end_reason = {"complete": "terminated", "truncated": "truncated",
                               "failed": "crashed"}[self.status]
        elif self.end_reason is not None and self.status == "incomplete":
            self.status = STATUS_OF_END[self.end_reason]
        elif self.end_reason is not None and STATUS_OF_END[self.end_reason] != self.status:
            raise SchemaError(f"Trajectory.status: {self.status!r} does not go with end_reason "
                              f"{self.end_reason!r} (expected {STATUS_OF_END[self.end_reason]!r})")
        _dict("Trajectory.metadata", self.metadata)
        if not isinstance(self.transitions, list):
            raise _fail("Trajectory.transitions", "a list", self.transitions)
        checked = []
        for i, t in enumerate(self.transitions):
            if isinstance(t, dict):
                try:
                    t = Transition.from_dict(t)
                except SchemaError as exc:
                    raise SchemaError(f"Trajectory.transitions[{i}]: {exc}") from None
            if not isinstance(t, Transition):
                raise _fail(f"Trajectory.transitions[{i}]", "a Transition", t)
            checked.append(t)
        self.transitions = checked

    def __len__(self) -> int:
        return len(self.transitions)

    def __iter__(self) -> Iterator[Transition]:
        return iter(self.transitions)

    @property
    def adapters(self) -> set[str | None]:
        return {t.adapter for t in self.transitions}

    @property
    def trainable(self) -> bool:
        """Ended, by the policy's own doing (TRAINABLE_ENDS), and not excluded."""
        return self.end_reason in TRAINABLE_ENDS and self.excluded is None

    @property
    def temperature(self) -> float | None:
        """The behaviour temperature, when every step was sampled at the same known one."""
        temps = {t.temperature for t in self.transitions}
        return temps.pop() if len(temps) == 1 else None

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "id": self.id, "task_id": self.task_id,
            "group_id": self.group_id, "run_id": self.run_id, "reward": self.reward,
            "status": self.status, "end_reason": self.end_reason, "end_detail": self.end_detail,
            "role": self.role, "excluded": self.excluded, "metadata": self.metadata,
            "transitions": [t.to_dict() for t in self.transitions],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any) -> "Trajectory":
        if not isinstance(data, dict):
            raise _fail("Trajectory", "an object", data)
        version = data.get("schema_version")
        if version == 1:
            data = migrate_v1(data)
        elif version != SCHEMA_VERSION:
            raise SchemaError(
                f"Trajectory.schema_version: this forge-bridge reads versions 1 and {SCHEMA_VERSION}, "
                f"got {version!r}")
        fields_ = {k: v for k, v in data.items() if k != "schema_version"}
        known = {"id", "task_id", "group_id", "run_id", "reward", "status", "metadata", "transitions",
                 "end_reason", "end_detail", "role", "excluded"}
        unknown = set(fields_) - known
        if unknown:
            raise SchemaError(f"Trajectory: unknown field(s) {sorted(unknown)}")
        return cls(**fields_)

    @classmethod
    def from_json(cls, text: str) -> "Trajectory":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"Trajectory: not valid JSON ({exc})") from None
        return cls.from_dict(data)


_OUTAGE_ERRORS = ("PolicyError", "PolicyUnavailable", "PolicyResponseError")


def migrate_v1_head(status: str, metadata: dict) -> dict:
    """A version-1 trajectory's typed fields, from the metadata keys version 1 kept them in."""
    metadata = dict(metadata)
    role = metadata.pop("role", None)
    fault = metadata.pop("policy_fault", None)
    truncated = metadata.pop("truncated", None)
    errors = metadata.pop("errors", None) or []
    error = metadata.pop("error", None)
    end, detail = {"complete": ("terminated", None), "incomplete": (None, None),
                   "truncated": ("truncated", truncated), "failed": ("crashed", None)}[status]
    if status == "failed":
        detail = str(error if error is not None else (errors[0] if errors else "failed"))
        end = ("policy_fault" if fault else
               "outage" if detail.split(":")[0].strip() in _OUTAGE_ERRORS else "crashed")
    if errors and status != "failed":
        metadata["errors"] = errors
    return {"end_reason": end, "end_detail": None if detail is None else str(detail),
            "role": None if role is None else str(role), "metadata": metadata}


def migrate_v1_steps(steps: list[dict], end_reason: str | None) -> list[dict]:
    """Version-1 steps: `truncated` meant "hit max_tokens" (kept as the finish reason); the last
    step gets Gymnasium's flags from how the episode ended."""
    steps = [{**s, "truncated": False, "terminated": False} for s in steps]
    if steps and end_reason in ("terminated", "policy_fault"):
        steps[-1]["terminated"] = True
    elif steps and end_reason == "truncated":
        steps[-1]["truncated"] = True
    return steps


def migrate_v1(data: dict) -> dict:
    """A version-1 trajectory dict in the current layout."""
    head = migrate_v1_head(data.get("status", "incomplete"), data.get("metadata") or {})
    steps = data.get("transitions") or []
    if isinstance(steps, list) and all(isinstance(s, dict) for s in steps):
        steps = migrate_v1_steps(steps, head["end_reason"])
    return {**data, **head, "schema_version": SCHEMA_VERSION, "transitions": steps}


@dataclass
class TrajectoryGroup:
    """The N rollouts of one task (by one role, in a crew): GRPO compares returns within it."""

    group_id: str
    task_id: str | None
    trajectories: list[Trajectory]
    role: str | None = None
    """The crew role whose trajectories these are (None: a single agent)."""

    def __post_init__(self) -> None:
        if not isinstance(self.group_id, str) or not self.group_id:
            raise _fail("TrajectoryGroup.group_id", "a non-empty string", self.group_id)
        for i, t in enumerate(self.trajectories):
            if not isinstance(t, Trajectory):
                raise _fail(f"TrajectoryGroup.trajectories[{i}]", "a Trajectory", t)
            if t.group_id != self.group_id:
                raise SchemaError(
                    f"TrajectoryGroup.trajectories[{i}].group_id: {t.group_id!r} is not this "
                    f"group's id {self.group_id!r}")
            if t.role != self.role:
                raise SchemaError(f"TrajectoryGroup.trajectories[{i}].role: {t.role!r} is not this "
                                  f"group's role {self.role!r}")

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def rewards(self) -> list[float | None]:
        return [t.reward for t in self.trajectories]


def group_trajectories(trajectories: Iterable[Trajectory]) -> list[TrajectoryGroup]:
    """Trajectories that share a group id and role, as groups in order of first appearance, each
    in the order given (trajectories without a group id are left out)."""
    groups: dict[tuple[str, str | None], TrajectoryGroup] = {}
    for t in trajectories:
        if t.group_id is None:
            continue
        key = (t.group_id, t.role)
        if key not in groups:
            groups[key] = TrajectoryGroup(t.group_id, t.task_id, [], role=t.role)
        groups[key].trajectories.append(t)
    return list(groups.values())

"""The Environment Abstraction Layer: one interface for anything an agent acts in.

Gymnasium's split between `terminated` (the task reached an end state) and `truncated` (a limit
cut the episode short) is kept because the trainer treats them differently: a truncated
episode's last step did not earn a terminal reward.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from forge_bridge.core.errors import SchemaError
from forge_bridge.core import validate
from forge_bridge.core.types import Action


@dataclass(frozen=True)
class StepResult:
    """What the environment answered to one action."""

    observation: Any
    """What the agent sees next: messages (tool results) or any environment-specific value."""
    reward: float = 0.0
    """Step reward for this action; the outcome reward usually arrives on the last step."""
    terminated: bool = False
    """The task reached an end state (success or failure) and the episode is over."""
    truncated: bool = False
    """A limit (steps, time, context length) ended the episode before the task did."""
    info: dict = field(default_factory=dict)
    """Diagnostics: tool results with their tool_call ids, errors, latencies."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "reward", validate.finite("StepResult.reward", self.reward))
        validate.boolean("StepResult.terminated", self.terminated)
        validate.boolean("StepResult.truncated", self.truncated)
        validate.json_object("StepResult.info", self.info)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Environment(abc.ABC):
    """Something a policy acts in, one model call per step.

    `tools` lists the OpenAI-format tool schemas the environment accepts as actions, so the same
    tool-calling policy drives a terminal, an HTTP API or a wrapped framework agent.
    """

    tools: list[dict] = []

    @abc.abstractmethod
    def reset(self, task: Any) -> Any:
        """Start an episode on `task` and return the first observation."""

    @abc.abstractmethod
    def step(self, action: Action) -> StepResult:
        """Apply one policy action (text and/or tool calls) and report what followed."""

    def close(self) -> None:
        """Release what the environment holds (processes, folders, sockets)."""

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Environment", "StepResult", "SchemaError"]

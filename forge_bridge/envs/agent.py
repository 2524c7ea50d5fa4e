"""A framework agent seen as an `Environment`: each of its model calls is one step.

The agent (a LangChain `create_agent` graph, a CrewAI crew, anything that calls a forge-bridge
`Policy`) is built once on a stand-in policy and run on a thread of its own. When it asks for a
model call, `reset`/`step` return that exact prompt as an `Observation` (messages and tool
schemas); the action passed to `step` is handed back to the agent as the model's answer; the
agent runs its tools and asks again, or finishes, and the task's `check` scores its result. So
an environment-first loop (`HarnessAgent`) drives a framework agent with no code of its own for
it, and the framework's tools, prompts and parsing stay exactly the user's.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.errors import (
    AgentError,
    InvalidArgument,
    InvalidState,
    PolicyUnavailable,
    Unsupported,
    WrongType,
)
from forge_bridge.core.types import Action, Observation
from forge_bridge.envs.base import Environment, StepResult
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling


class _StandIn(Policy):
    """The policy the framework agent is built on: each call waits for the environment's step."""

    def __init__(self, env: "AgentEnvironment") -> None:
        super().__init__()
        self.env = env

    def generate(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling,
                 adapter: str | None) -> PolicyOutput:
        return self.env._model_call(messages, tools)

    def load_version(self, path: Path, version: str) -> None:
        raise Unsupported("the stand-in policy of an AgentEnvironment has no weights")

    def unload_version(self, version: str) -> None:
        pass


class AgentEnvironment(Environment):
    """`build(policy) -> agent` once; `run(agent, task) -> result` per episode; `check(task,
    result) -> reward` at the end. `timeout_s` bounds the wait for the agent's next call."""

    def __init__(self, build: Callable[[Policy], Any], run: Callable[[Any, Any], Any],
                 check: Callable[[Any, Any], float | bool], *, timeout_s: float = 120.0) -> None:
        for name, fn in (("build", build), ("run", run), ("check", check)):
            if not callable(fn):
                raise WrongType(f"{name}: expected a function, got {type(fn).__name__}")
        self.run_agent, self.check, self.timeout_s = run, check, timeout_s
        self.policy = _StandIn(self)
        self.agent = build(self.policy)
        self._events: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._task: Any = None
        self._closed = False

    # ------------------------------------------------------------------ the agent's side
    def _model_call(self, messages: list[dict], tools: list[dict] | None) -> PolicyOutput:
        self._events.put(("call", Observation(messages=messages, tools=tools)))
        action = self._answers.get()
        if action is None:
            raise PolicyUnavailable("the AgentEnvironment was closed or reset during the episode")
        return PolicyOutput(action=action, prompt_token_ids=[], completion_token_ids=[],
                            completion_logprobs=[], version=None)

    def _drive(self, task: Any) -> None:
        try:
            self._events.put(("done", self.run_agent(self.agent, task)))
        except BaseException as exc:  # reported to the loop as the episode's error
            self._events.put(("error", exc))

    # ------------------------------------------------------------------ the environment's side
    def reset(self, task: Any) -> Observation:
        if self._closed:
            raise InvalidState("the AgentEnvironment is closed")
        self._stop_running()
        self._task = task
        self._thread = threading.Thread(target=self._drive, args=(task,), daemon=True, name="agent-env")
        self._thread.start()
        kind, value = self._event()
        if kind == "done":
            self._thread = None
            raise InvalidState("the agent finished without calling the model: nothing to act on")
        return self._result(kind, value).observation

    def step(self, action: Action) -> StepResult:
        if self._thread is None:
            raise InvalidState("step() before reset() or after the episode ended")
        self._answers.put(action)
        return self._result(*self._event())

    def _event(self) -> tuple[str, Any]:
        try:
            return self._events.get(timeout=self.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"the agent made no model call and did not finish within {self.timeout_s} s") from None

    def _result(self, kind: str, value: Any) -> StepResult:
        if kind == "call":
            return StepResult(observation=value)
        self._thread = None
        if kind == "error":
            raise AgentError(f"the agent raised {type(value).__name__}: {value}") from value
        try:
            reward = self.check(self._task, value)
        except Exception as exc:
            raise InvalidArgument(f"check raised {type(exc).__name__}: {exc}") from exc
        if isinstance(reward, bool):
            reward = float(reward)
        return StepResult(observation=None, reward=reward, terminated=True, info={"result": repr(value)[:2000]})

    def _stop_running(self) -> None:
        """Unblock an agent still waiting for a model call (an episode cut short)."""
        if self._thread is not None and self._thread.is_alive():
            self._answers.put(None)
            self._thread.join(timeout=self.timeout_s)
        self._thread = None
        self._events, self._answers = queue.Queue(), queue.Queue()

    def close(self) -> None:
        self._stop_running()
        self._closed = True


__all__ = ["AgentEnvironment"]

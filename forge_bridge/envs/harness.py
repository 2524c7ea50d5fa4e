"""A framework-free agent loop over any `Environment`, recorded like the framework integrations record theirs:

    obs = env.reset(task)
    while not done:
        action = policy(obs)          # one model call = one Transition, exact token ids
        obs, reward, done = env.step(action)

`HarnessAgent` is itself a rollout function (`task -> reward`, recording into the current
episode), so `trainer.train(rollout=HarnessAgent(policy, make_env), tasks=...)` trains in an
environment through the same interface a wrapped LangChain or CrewAI agent uses.

Observations: a list of messages is appended to the conversation (tool results, a user turn);
an `Observation` replaces it (the exact prompt and tools, as a wrapped framework agent builds
them -- see `AgentEnvironment`). Step rewards go onto their steps; the reward of the step that
ends the episode is returned as the outcome, so nothing is counted twice.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from forge_bridge.core.episode import Episode, Recorder, current_episode
from forge_bridge.core.errors import InvalidState, WrongType
from forge_bridge.core.recording import DEFAULT_MAX_MODEL_CALLS, Limits, StepRewards, call_policy
from forge_bridge.core.types import Action, Observation, Trajectory
from forge_bridge.envs.base import Environment
from forge_bridge.policies.base import DEFAULT_SLOT, Policy


def as_messages(observation: Any) -> list[dict]:
    """An environment's observation as chat messages to append."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, dict):
        return [observation]
    if isinstance(observation, list) and all(isinstance(m, dict) for m in observation):
        return list(observation)
    raise WrongType(f"observation: expected messages, a string or an Observation, got {type(observation).__name__}")


def assistant_message(action: Action) -> dict:
    message: dict = {"role": "assistant", "content": action.content}
    if action.tool_calls:
        message["tool_calls"] = [tc.to_openai() for tc in action.tool_calls]
    return message


class HarnessAgent:
    """Tool-calling loop: think -> tool call -> observe -> ... -> final answer."""

    def __init__(self, policy: Policy, env: Environment | Callable[[], Environment], *,
                 system: str | None = None, max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS,
                 slot: str = DEFAULT_SLOT, step_rewards: StepRewards | None = None,
                 **sampling: Any) -> None:
        """`max_model_calls` (default 25; None: no limit) cuts an episode that goes on longer,
        recorded as truncated; tool timeouts are the environment's (`ToolEnvironment`), and so are
        step rewards for what a tool did (`StepResult.reward`); `step_rewards` adds those for
        malformed and repeated calls (default off)."""
        if not isinstance(policy, Policy):
            raise WrongType(f"policy: expected a forge_bridge Policy, got {type(policy).__name__}")
        if not isinstance(env, Environment) and not callable(env):
            raise WrongType(f"env: expected an Environment or a function that makes one, got {type(env).__name__}")
        self.limits = Limits(max_model_calls=max_model_calls)
        self.step_rewards = step_rewards
        self.policy, self.env, self.system = policy, env, system
        self.slot, self.sampling = slot, sampling
        self._shared_lock = threading.Lock()  # one episode at a time on a shared environment

    def __call__(self, task: Any) -> float:
        """Rollout: run `task` inside the current episode; returns the outcome reward."""
        ep = current_episode()
        if ep is None:
            raise InvalidState("HarnessAgent(task) records into the current episode: call it inside "
                               "`with fb.episode(...)` or a trainer, or use run(task) instead")
        if isinstance(self.env, Environment):
            with self._shared_lock:
                return self._loop(self.env, task, ep)
        env = self.env()
        if not isinstance(env, Environment):
            raise WrongType(f"env factory returned {type(env).__name__}, not an Environment")
        try:
            return self._loop(env, task, ep)
        finally:
            env.close()

    def run(self, task: Any, *, recorder: Recorder | None = None, task_id: str | None = None,
            group_id: str | None = None) -> Trajectory:
        """One episode of its own: recorded, scored and finished; returns the trajectory."""
        from forge_bridge.core.episode import episode

        tid = task_id or str(getattr(task, "id", "") or "") or None
        with episode(tid, group_id, recorder=recorder) as ep:
            ep.reward(self(task))
        return ep.trajectory

    def _loop(self, env: Environment, task: Any, ep: Episode) -> float:
        first = env.reset(task)
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages, tools = self._next_prompt(messages, first, env)
        while True:
            out = call_policy(self.policy, ep, messages, tools, source="harness", limits=self.limits,
                              slot=self.slot, sampling=self.sampling, step_rewards=self.step_rewards)
            if out is None:  # the step limit: recorded as truncated
                return 0.0
            if out.action.malformed:  # recorded as the policy's fault; the loop stops, as an agent's does
                return 0.0
            result = env.step(out.action)
            for call_id, outcome in result.info.get("tool_results", {}).items():
                ep.add_tool_result(call_id, outcome)
            extra = {k: v for k, v in result.info.items() if k != "tool_results"}
            if extra:
                ep.update(len(ep.trajectory.transitions) - 1, lambda t: t.info.update(env_info=extra))
            if result.done:
                if result.truncated:
                    ep.truncate(str(result.info.get("reason", "the environment cut the episode")))
                return result.reward
            if result.reward:
                ep.step_reward(result.reward)
            messages, tools = self._next_prompt(messages + [assistant_message(out.action)],
                                                result.observation, env)

    def _next_prompt(self, messages: list[dict], observation: Any, env: Environment
                     ) -> tuple[list[dict], list[dict] | None]:
        if isinstance(observation, Observation):
            return list(observation.messages), observation.tools
        return messages + as_messages(observation), (env.tools or None)


__all__ = ["HarnessAgent", "as_messages", "assistant_message"]

"""CrewAI adapter: record whole crew runs and train one LoRA adapter per role.

`ForgeLLM(policy)` is a CrewAI `BaseLLM`: give it to an `Agent` (`llm=ForgeLLM(policy)`) and
every model call of that agent goes to the policy with native function calling, recorded with
its exact tokens. Inside `with fb.episode(...)`, a `crew.kickoff()` becomes one trajectory per
agent role (children of the episode, tagged with the role), so the trainer can train a shared
adapter or one per role; `role_adapter={"writer": "writer"}` serves each role from its own
policy slot, whose current version is read on every call.

What CrewAI does on its own is marked, not mistaken for policy choices: the extra forced call
after `max_iter` (`info["forced_final_answer"]`) and task re-executions after an error or a
guardrail (`info["task_attempt"]` > 1). Tool results reach the step that asked for them from
the `tool` messages CrewAI sends back on its next call.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

# Offline by default: CrewAI reads these when it starts, so they are set before it is imported,
# and only where the user has not chosen otherwise.
for _key, _value in (("CREWAI_DISABLE_TELEMETRY", "true"), ("OTEL_SDK_DISABLED", "true"),
                     ("CREWAI_TRACING_ENABLED", "false"), ("CREWAI_DISABLE_VERSION_CHECK", "true")):
    os.environ.setdefault(_key, _value)

from crewai.llms.base_llm import BaseLLM  # noqa: E402
from pydantic import ConfigDict, Field, PrivateAttr  # noqa: E402

from forge_bridge.policy import DEFAULT_SLOT, Policy, PolicyError, PolicyOutput  # noqa: E402
from forge_bridge.session import Episode, current_episode  # noqa: E402


def _force_final_answer_text() -> str:
    from crewai.utilities.i18n import I18N_DEFAULT

    return I18N_DEFAULT.errors("force_final_answer")


class ForgeLLM(BaseLLM):
    """A CrewAI LLM backed by a forge-bridge policy (records inside an episode)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    policy: Any = Field(default=None, exclude=True)
    """The forge-bridge policy (LocalPolicy, VLLMPolicy) every call goes to."""
    role_adapter: dict[str, str] | None = None
    """Agent role -> policy slot whose current adapter serves that role (default slot otherwise)."""
    context_window: int = 2048
    """What CrewAI is told the context size is (it trims history to fit)."""

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _last_role: dict[str, str] = PrivateAttr(default_factory=dict)
    _attempts: dict[tuple[str, str], int] = PrivateAttr(default_factory=dict)

    def __init__(self, policy: Policy | None = None, role_adapter: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"ForgeLLM(policy): expected a forge_bridge Policy (LocalPolicy, "
                            f"VLLMPolicy), got {type(policy).__name__}")
        kwargs.setdefault("model", "forge")  # never contains "o1", which flips CrewAI to ReAct
        super().__init__(policy=policy, role_adapter=role_adapter, **kwargs)

    # CrewAI asks these to choose its protocol: native tool calls, no stop words.
    def supports_function_calling(self) -> bool:
        return True

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return self.context_window

    # ------------------------------------------------------------------ the call
    def _prepare(self, messages: Any, from_task: Any, from_agent: Any) -> tuple:
        msgs = ([{"role": "user", "content": messages}] if isinstance(messages, str)
                else [dict(m) for m in messages])
        forced = bool(msgs) and msgs[-1].get("role") == "user" and \
            msgs[-1].get("content") == _force_final_answer_text()
        parent = current_episode()
        key = parent.id if parent is not None else ""
        role = getattr(from_agent, "role", None)
        with self._lock:
            if role is None and forced:  # CrewAI's forced call names no agent: the last one did
                role = self._last_role.get(key)
            if role is not None:
                self._last_role[key] = role
        info: dict[str, Any] = {"framework": "crewai", "role": role, "forced_final_answer": forced}
        if from_task is not None:
            task_key = (key, str(getattr(from_task, "id", id(from_task))))
            fresh = not any(m.get("role") in ("assistant", "tool") for m in msgs)
            with self._lock:
                attempt = self._attempts.get(task_key, 0) + (1 if fresh or task_key not in self._attempts else 0)
                self._attempts[task_key] = attempt
            info.update(task=str(getattr(from_task, "description", ""))[:200], task_attempt=attempt)
        episode = parent.child(role) if parent is not None and role is not None else parent
        if episode is not None:
            episode.attach_tool_results(msgs)
        slot = (self.role_adapter or {}).get(role, DEFAULT_SLOT)
        sampling = {k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p),
                                      ("max_tokens", self.max_tokens), ("seed", self.seed))
                    if v is not None}
        return msgs, episode, slot, sampling, info

    def _finish(self, out: PolicyOutput, msgs: list[dict], tools: Any, episode: Episode | None,
                info: dict, available_functions: dict | None, response_model: Any) -> Any:
        step = None
        if episode is not None:
            step = episode.record(out.to_transition(msgs, tools or None, **info))
        if out.action.tool_calls and not available_functions:
            return [tc.to_openai() for tc in out.action.tool_calls]  # CrewAI runs them
        if out.action.tool_calls and available_functions:
            return self._run_tool(out, available_functions, episode, step)
        if response_model is not None:
            try:
                return response_model.model_validate_json(out.text)
            except Exception:  # CrewAI converts text itself when validation fails
                return out.text
        return out.text

    def _run_tool(self, out: PolicyOutput, functions: dict, episode: Episode | None,
                  step: int | None) -> Any:
        call = out.action.tool_calls[0]
        fn = functions.get(call.name)
        try:
            if fn is None:
                raise KeyError(f"no tool named {call.name!r}")
            result = fn(**json.loads(call.arguments or "{}"))
            record = {"name": call.name, "content": str(result), "status": "success", "error": None}
        except Exception as exc:
            result = f"Error: {type(exc).__name__}: {exc}"
            record = {"name": call.name, "content": None, "status": "error", "error": result[7:]}
        if episode is not None:
            episode.add_tool_result(call.id, record)
        return result

    def call(self, messages: Any, tools: list[dict] | None = None, callbacks: list[Any] | None = None,
             available_functions: dict[str, Any] | None = None, from_task: Any = None,
             from_agent: Any = None, response_model: Any = None) -> Any:
        msgs, episode, slot, sampling, info = self._prepare(messages, from_task, from_agent)
        try:
            out = self.policy.chat(msgs, tools or None, slot=slot, **sampling)
        except PolicyError as exc:
            if episode is not None:
                episode.note_error(f"{type(exc).__name__}: {exc}")
            raise
        return self._finish(out, msgs, tools, episode, info, available_functions, response_model)

    async def acall(self, messages: Any, tools: list[dict] | None = None,
                    callbacks: list[Any] | None = None,
                    available_functions: dict[str, Any] | None = None, from_task: Any = None,
                    from_agent: Any = None, response_model: Any = None) -> Any:
        msgs, episode, slot, sampling, info = self._prepare(messages, from_task, from_agent)
        try:
            out = await self.policy.achat(msgs, tools or None, slot=slot, **sampling)
        except PolicyError as exc:
            if episode is not None:
                episode.note_error(f"{type(exc).__name__}: {exc}")
            raise
        return self._finish(out, msgs, tools, episode, info, available_functions, response_model)


def wrap_crewai(obj: Any, policy: Policy) -> Any:
    """Put a `ForgeLLM` on an Agent, on every agent of a Crew, or in place of an LLM."""
    from crewai import Agent, Crew

    if isinstance(obj, BaseLLM):
        return ForgeLLM(policy, temperature=obj.temperature, max_tokens=obj.max_tokens)
    if isinstance(obj, Agent):
        obj.llm = ForgeLLM(policy)
        return obj
    if isinstance(obj, Crew):
        llm = ForgeLLM(policy)
        for agent in obj.agents:
            agent.llm = llm
        return obj
    raise TypeError(f"wrap() accepts a CrewAI Agent, Crew or LLM; got {type(obj).__name__}")


__all__ = ["ForgeLLM", "wrap_crewai"]

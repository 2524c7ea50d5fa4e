"""The CrewAI integration: record whole crew runs and train one LoRA adapter per role.

`ForgeLLM(policy)` is a CrewAI `BaseLLM`: give it to an `Agent` (`llm=ForgeLLM(policy)`) and
every model call of that agent goes to the policy with native function calling, recorded with
its exact tokens. Inside `with fb.episode(...)`, a `crew.kickoff()` becomes one trajectory per
agent role (children of the episode, tagged with the role), so the trainer can train a shared
adapter or one per role; `role_slot={"writer": "writer"}` serves each role from its own
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
import time
from typing import Any, cast

# Offline by default: CrewAI reads these when it starts, so they are set before it is imported,
# and only where the user has not chosen otherwise.
for _key, _value in (("CREWAI_DISABLE_TELEMETRY", "true"), ("OTEL_SDK_DISABLED", "true"),
                     ("CREWAI_TRACING_ENABLED", "false"), ("CREWAI_DISABLE_VERSION_CHECK", "true")):
    os.environ.setdefault(_key, _value)

from forge_bridge.core.extras import require  # noqa: E402

require("crewai", "crewai")  # a clear error naming the extra, not a bare ModuleNotFoundError

from crewai.llms.base_llm import BaseLLM  # noqa: E402
from pydantic import ConfigDict, Field, PrivateAttr  # noqa: E402

from forge_bridge.core.episode import Episode, current_episode  # noqa: E402
from forge_bridge.core.actions import ToolCall  # noqa: E402
from forge_bridge.core.errors import PolicyResponseError, PolicyUnavailable, WrongType  # noqa: E402
from forge_bridge.core.recording import (  # noqa: E402
    DEFAULT_MAX_MODEL_CALLS,
    DEFAULT_MAX_TOOL_OUTPUT_CHARS,
    DEFAULT_TOOL_TIMEOUT_S,
    Limits,
    StepRewards,
    acall_policy,
    bound_output,
    call_policy,
    record_tool_result,
    run_tool,
)
from forge_bridge.policies.base import DEFAULT_SLOT, Policy, PolicyOutput  # noqa: E402
from forge_bridge.policies.messages import normalize_messages  # noqa: E402
from forge_bridge.policies.upstream import Upstream  # noqa: E402

STEP_LIMIT_ANSWER = "[forge-bridge: the step limit was reached]"
"""The final answer ForgeLLM gives CrewAI past `max_model_calls` (not a model output: not recorded)."""


def _force_final_answer_text() -> str:
    from crewai.utilities.i18n import I18N_DEFAULT

    return I18N_DEFAULT.errors("force_final_answer")


class ForgeLLM(BaseLLM):
    """A CrewAI LLM backed by a forge-bridge policy (records inside an episode)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    policy: Any = Field(default=None, exclude=True)
    """The forge-bridge policy (LocalPolicy, VLLMPolicy) every call goes to."""
    role_slot: dict[str, str] | None = None
    """Agent role -> policy slot whose current adapter serves that role (default slot otherwise)."""
    context_window: int = 2048
    """What CrewAI is told the context size is (it trims history to fit)."""
    max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS
    """Model calls per role and episode; past it the task gets a final answer, episode truncated."""
    tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S
    """Seconds a tool run by this LLM (CrewAI's `available_functions`) may take."""
    max_tool_output_chars: int | None = DEFAULT_MAX_TOOL_OUTPUT_CHARS
    """Longest tool output kept (the rest cut, and counted)."""
    step_rewards: StepRewards | None = None
    """Rewards for what single steps did (a failed tool, a malformed or repeated call); None: off."""

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _last_role: dict[str, str] = PrivateAttr(default_factory=dict)
    _attempts: dict[tuple[str, str], int] = PrivateAttr(default_factory=dict)

    def __init__(self, policy: Policy | None = None, role_slot: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        if not isinstance(policy, Policy):
            raise WrongType(f"ForgeLLM(policy): expected a forge_bridge Policy (LocalPolicy, "
                            f"VLLMPolicy), got {type(policy).__name__}")
        kwargs.setdefault("model", "forge")  # never contains "o1", which flips CrewAI to ReAct
        # pydantic's __init__ takes this model's own fields, which mypy types as BaseLLM's only
        super().__init__(policy=policy, role_slot=role_slot, **kwargs)  # type: ignore[call-arg]
        self.limits  # validate the limits now, not at the first call
        if role_slot:  # the trainer of this policy trains each role in the slot that serves it
            policy.declare_role_slots(role_slot)

    @property
    def limits(self) -> Limits:
        return Limits(self.max_model_calls, self.tool_timeout_s, self.max_tool_output_chars)

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
        info: dict[str, Any] = {"role": role, "forced_final_answer": forced}
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
            if forced:  # CrewAI's max_iter cut the task: this call is its forced last word
                episode.truncate("CrewAI's max_iter")
        slot = (self.role_slot or {}).get(role, DEFAULT_SLOT) if role is not None else DEFAULT_SLOT
        sampling = {k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p),
                                      ("max_tokens", self.max_tokens), ("seed", self.seed))
                    if v is not None}
        return msgs, episode, slot, sampling, info

    def _answer(self, out: PolicyOutput | None, tools: Any, episode: Episode | None,
                available_functions: dict | None, response_model: Any) -> Any:
        if out is None:  # the step limit: a final answer ends the task (CrewAI refuses empty ones)
            return STEP_LIMIT_ANSWER
        if out.action.tool_calls and not tools:  # no tools offered (CrewAI's forced last call):
            # the calls are the model's answer, as text; CrewAI would crash on a list here
            return out.text or "\n".join(f"{tc.name}({tc.arguments})" for tc in out.action.tool_calls)
        if out.action.tool_calls and not available_functions:
            return [tc.to_openai() for tc in out.action.tool_calls]  # CrewAI runs them
        if out.action.tool_calls and available_functions:
            return self._run_tools(out, available_functions, episode)
        if response_model is not None:
            try:
                return response_model.model_validate_json(out.text)
            except Exception:  # CrewAI converts text itself when validation fails
                return out.text
        return out.text

    def _run_tools(self, out: PolicyOutput, functions: dict, episode: Episode | None) -> Any:
        """Run every tool call of the reply, each under the timeout; one call gives its result
        (as CrewAI's own LLM does), several give one line per call."""
        def invoke(call: Any) -> Any:
            fn = functions.get(call.name)
            if fn is None:
                raise KeyError(f"no tool named {call.name!r}")
            return fn(**json.loads(call.arguments or "{}"))

        results = []
        for call in out.action.tool_calls:
            outcome = run_tool(invoke, self.limits.tool_timeout_s, call)
            text, full = bound_output(str(outcome.value) if outcome.ok else f"Error: {outcome.error}",
                                      self.limits)
            record_tool_result(episode, call.id, call.name, content=text if outcome.ok else None,
                               error=outcome.error, latency_s=outcome.latency_s,
                               step_rewards=self.step_rewards,
                               **({"content_chars": full} if full is not None else {}))
            results.append((call.name, outcome.value if outcome.ok and full is None else text))
        if len(results) == 1:
            return results[0][1]
        return "\n".join(f"{name}: {value}" for name, value in results)

    def call(self, messages: Any, tools: list[dict] | None = None, callbacks: list[Any] | None = None,
             available_functions: dict[str, Any] | None = None, from_task: Any = None,
             from_agent: Any = None, response_model: Any = None) -> Any:
        msgs, episode, slot, sampling, info = self._prepare(messages, from_task, from_agent)
        out = call_policy(self.policy, episode, msgs, tools or None, source="crewai",
                          limits=self.limits, slot=slot, sampling=sampling, info=info,
                          step_rewards=self.step_rewards)
        return self._answer(out, tools, episode, available_functions, response_model)

    async def acall(self, messages: Any, tools: list[dict] | None = None,
                    callbacks: list[Any] | None = None,
                    available_functions: dict[str, Any] | None = None, from_task: Any = None,
                    from_agent: Any = None, response_model: Any = None) -> Any:
        msgs, episode, slot, sampling, info = self._prepare(messages, from_task, from_agent)
        out = await acall_policy(self.policy, episode, msgs, tools or None, source="crewai",
                                 limits=self.limits, slot=slot, sampling=sampling, info=info,
                                 step_rewards=self.step_rewards)
        return self._answer(out, tools, episode, available_functions, response_model)


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
    raise WrongType(f"wrap() accepts a CrewAI Agent, Crew or LLM; got {type(obj).__name__}")


class CrewAIUpstream(Upstream):
    """A crew's own CrewAI LLM as an upstream: record-only mode for any provider CrewAI speaks
    (its native Anthropic, Gemini, Bedrock, Azure clients, OpenAI, or LiteLLM's). Give it to
    `ForgeLLM` inside an episode opened with `behaviour="upstream"`: the crew's own model answers
    each call, with its own settings (temperature, max tokens: `ForgeLLM`'s are not sent), and
    the reply is recorded in the student's tokens (`tokenizer`: the student's, e.g.
    `student.tokenizer`), like `UpstreamPolicy` for an OpenAI-compatible server."""

    def __init__(self, llm: BaseLLM, tokenizer: Any, *, tool_format: str = "auto") -> None:
        if not isinstance(llm, BaseLLM) or isinstance(llm, ForgeLLM):
            raise WrongType(f"CrewAIUpstream(llm): expected the crew's own CrewAI LLM (crewai.LLM(...)), "
                            f"got {type(llm).__name__}")
        super().__init__(tokenizer, tool_format)
        self.llm = llm

    def generate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        from crewai.utilities.agent_utils import extract_tool_call_info

        messages, t0 = normalize_messages(messages), time.perf_counter()
        try:  # no available_functions: the LLM hands its tool calls back instead of running them
            reply = self.llm.call(messages, tools=tools or None, available_functions=None)
        except Exception as exc:  # noqa: BLE001 - whatever the provider's client raises is an outage here
            raise PolicyUnavailable(f"the crew's own model ({self.llm.model}) failed: "
                                    f"{type(exc).__name__}: {exc}") from None
        calls = []
        if isinstance(reply, list):  # the provider's own tool-call objects
            for item in reply:
                info = extract_tool_call_info(item)
                if info is None:
                    raise PolicyResponseError(f"the crew's own model ({self.llm.model}) answered a tool call "
                                              f"of an unknown shape: {type(item).__name__}")
                call_id, name, args = info
                calls.append(ToolCall.from_openai({"id": str(call_id), "function": {"name": name, "arguments": args}}))
        elif not isinstance(reply, str):
            raise PolicyResponseError(f"the crew's own model ({self.llm.model}) answered a "
                                      f"{type(reply).__name__}, not text or tool calls")
        # reply is text here, or an empty list of calls (not text: recorded fails on it, as it always did)
        return self.recorded(messages, tools, "" if calls else cast(str, reply), calls,
                             "tool_calls" if calls else "stop",
                             adapter, {"upstream": self.llm.model, "upstream_latency_s": time.perf_counter() - t0})


__all__ = ["CrewAIUpstream", "ForgeLLM", "wrap_crewai"]

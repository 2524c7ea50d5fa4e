"""The recording protocol: the one place where a model call becomes a recorded step.

Every front end (the LangChain middleware, the CrewAI LLM, the framework-free harness, the
gateway) only translates its framework's objects and calls these, so the same reply is recorded
the same way whoever made the call:

- `call_policy` / `acall_policy`: the step limit first (past `max_model_calls` the episode is
  marked truncated and no call is made: the front end ends the agent's loop), then the call (a
  prompt past the model's context also truncates the episode and ends the loop; any other
  `PolicyError` marks it `outage` and is raised on), then `record_call`.
- `record_call`: the policy output as a `Transition` in the current episode; a reply whose only
  tool call is malformed marks the episode `policy_fault` (the model's own doing: trained on).
- `run_tool` / `arun_tool` + `record_tool_result`: a tool under the timeout, its exception kept
  as an error, its output bounded, filed under its tool_call id in the step that asked for it.
- `StepRewards` (off by default): rewards for what one step did -- a tool that failed, a
  malformed call, a repeated identical call -- given to that step as it happens.

How an episode ended is the typed `Trajectory.end_reason`; the last step carries Gymnasium's
`terminated` or `truncated` flag (set when the episode finishes, see `Episode.finish`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from forge_bridge.core.episode import Episode
from forge_bridge.core.errors import ContextLengthExceeded, InvalidArgument, PolicyError
from forge_bridge.core.timeouts import call_with_timeout
from forge_bridge.core.types import Observation, Transition

if TYPE_CHECKING:  # the core calls a policy; it does not import the policies layer
    from forge_bridge.policies.base import Policy, PolicyOutput

DEFAULT_MAX_MODEL_CALLS = 25
DEFAULT_TOOL_TIMEOUT_S = 60.0
DEFAULT_MAX_TOOL_OUTPUT_CHARS = 16000


@dataclass(frozen=True)
class Limits:
    """The limits every front end applies to an episode (each may be None: no limit)."""

    max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS
    """Model calls one episode may make; the next one ends the agent's loop, episode truncated."""
    tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S
    """Seconds a tool may run before the model is told it timed out (where the front end runs tools)."""
    max_tool_output_chars: int | None = DEFAULT_MAX_TOOL_OUTPUT_CHARS
    """Longest tool output the model sees and the record keeps; the rest is cut, and counted."""

    def __post_init__(self) -> None:
        for name in ("max_model_calls", "max_tool_output_chars"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidArgument(f"{name}: expected an int >= 1 or None, got {value!r}")
        t = self.tool_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
            raise InvalidArgument(f"tool_timeout_s: expected a number > 0 or None, got {t!r}")


@dataclass(frozen=True)
class StepRewards:
    """Rewards a front end gives single steps as they happen, for what the step itself did (all 0:
    off, the default). Each lands in that step's `Transition.reward` (the trainer's per-step
    credit reads it there) and is explained in its `info['step_rewards']`."""

    tool_error: float = 0.0
    """Given to a step for each of its tool calls that raised or timed out (where the front end
    runs tools: the LangChain middleware, CrewAI)."""
    malformed_call: float = 0.0
    """Given to a step whose tool call could not be parsed."""
    repeated_call: float = 0.0
    """Given to a step that repeats a tool call (same name and arguments) the episode made before."""

    def __post_init__(self) -> None:
        for name in ("tool_error", "malformed_call", "repeated_call"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                    or value in (float("inf"), float("-inf")):
                raise InvalidArgument(f"StepRewards.{name}: expected a finite number, got {value!r}")


def give_step_reward(episode: Episode, step: int, why: str, value: float) -> None:
    """Add `value` to step `step`'s reward and note why in its info (nothing when 0)."""
    if value == 0:
        return

    def change(t: Any) -> None:
        t.reward += float(value)
        given = t.info.setdefault("step_rewards", {})
        given[why] = given.get(why, 0.0) + float(value)

    episode.update(step, change)


def _call_key(call: Any) -> tuple[str, str]:
    try:  # the same arguments written with other spacing or key order are the same call
        args = json.dumps(json.loads(call.arguments), sort_keys=True)
    except (TypeError, ValueError):
        args = call.arguments
    return call.name, args


def _reward_call(episode: Episode, step: int, rewards: StepRewards) -> None:
    transitions = episode.trajectory.transitions
    action = transitions[step].action
    if action.malformed:
        give_step_reward(episode, step, "malformed_call", rewards.malformed_call)
    earlier = {_call_key(c) for t in transitions[:step] for c in t.action.tool_calls}
    if any(_call_key(c) in earlier for c in action.tool_calls):
        give_step_reward(episode, step, "repeated_call", rewards.repeated_call)


# --------------------------------------------------------------------------- model calls
def over_step_limit(episode: Episode | None, limits: Limits) -> bool:
    """Before a model call: has this episode used up its model calls? Then it is marked
    truncated and the front end must end the agent's loop instead of calling."""
    if episode is None or limits.max_model_calls is None:
        return False
    if len(episode.trajectory) < limits.max_model_calls:
        return False
    episode.truncate(f"more than {limits.max_model_calls} model calls")
    return True


def transition_of(out: PolicyOutput, messages: list[dict], tools: list[dict] | None = None,
                  **info: Any) -> Transition:
    """A policy's reply to `messages` (and tool schemas) as a step: the exact tokens, the adapter
    version and slot that served it, the sampling temperature, and `info` (latency, the front
    end's metadata)."""
    return Transition(observation=Observation(messages=messages, tools=tools), action=out.action,
                      prompt_token_ids=out.prompt_token_ids, completion_token_ids=out.completion_token_ids,
                      completion_logprobs=out.completion_logprobs, version=out.version, slot=out.slot,
                      temperature=out.temperature, info={"latency_s": round(out.latency_s, 4), **out.info, **info})


def record_call(episode: Episode | None, out: PolicyOutput, messages: list[dict],
                tools: list[dict] | None, *, source: str, step_rewards: StepRewards | None = None,
                **info: Any) -> int | None:
    """Record one model call as the next step of `episode`; returns its index (None: no episode)."""
    if episode is None:
        return None
    step = episode.record(transition_of(out, messages, tools, source=source, **info))
    if step_rewards is not None:
        _reward_call(episode, step, step_rewards)
    if out.action.malformed:
        # No usable call: the agent stops here, by the model's own doing.
        episode.mark_end("policy_fault", "malformed tool call: " + out.action.parse_errors[0]["error"])
    return step


def record_outage(episode: Episode | None, exc: BaseException) -> None:
    """The policy could not answer: the episode ends as an outage (never trained on)."""
    if episode is not None:
        episode.mark_end("outage", f"{type(exc).__name__}: {exc}")


def _policy_failed(episode: Episode | None, exc: PolicyError) -> None:
    """A prompt past the context truncates the episode (a limit, not an outage: the caller ends
    the loop); any other policy error marks it an outage and is raised on."""
    if isinstance(exc, ContextLengthExceeded) and episode is not None:
        episode.truncate(f"the context is full: {exc}")
        return
    record_outage(episode, exc)
    raise exc


def _seeded(episode: Episode | None, sampling: dict | None) -> dict:
    """The call's sampling settings, with the episode's call seed when the caller named none."""
    sampling = dict(sampling or {})
    if sampling.get("seed") is None and episode is not None:
        seed = episode.call_seed()
        if seed is not None:
            sampling["seed"] = seed
    return sampling


def _slot(slot: str | None) -> dict:
    return {} if slot is None else {"slot": slot}


def check_behaviour(policy: Policy, episode: Episode | None) -> None:
    """An upstream model's replies (`UpstreamPolicy`) go only into episodes opened as the
    upstream's, and the student's own samples never into those: a step must never pass for
    someone else's behaviour (the trainer imitates the one and reinforces the other)."""
    check_steps_of(policy.behaviour, f"a {type(policy).__name__}", episode)


def check_steps_of(theirs: str | None, who: str, episode: Episode | None) -> None:
    """`check_behaviour` for a front end that records `theirs` steps itself (`who` records them)."""
    if theirs is None:  # a script: its replies stand for whoever the episode says (a demonstration's, say)
        return
    if episode is not None and (theirs == "upstream") != (episode.trajectory.behaviour == "upstream"):
        raise InvalidArgument(f"{who} records {theirs!r} steps, but episode {episode.id} was opened "
                              f"as {episode.trajectory.behaviour!r}: open it with fb.episode(..., behaviour="
                              f"{theirs!r})")


def call_policy(policy: Policy, episode: Episode | None, messages: list[dict],
                tools: list[dict] | None, *, source: str, limits: Limits, slot: str | None = None,
                sampling: dict | None = None, info: dict | None = None,
                step_rewards: StepRewards | None = None) -> PolicyOutput | None:
    """One model call of a front end, recorded; None when a limit (steps, context) ends the loop."""
    check_behaviour(policy, episode)
    if over_step_limit(episode, limits):
        return None
    try:
        out = policy.chat(messages, tools, **_slot(slot), **_seeded(episode, sampling))
    except PolicyError as exc:
        _policy_failed(episode, exc)
        return None
    record_call(episode, out, messages, tools, source=source, step_rewards=step_rewards, **(info or {}))
    return out


async def acall_policy(policy: Policy, episode: Episode | None, messages: list[dict],
                       tools: list[dict] | None, *, source: str, limits: Limits,
                       slot: str | None = None, sampling: dict | None = None,
                       info: dict | None = None, step_rewards: StepRewards | None = None
                       ) -> PolicyOutput | None:
    """`call_policy` for async front ends."""
    check_behaviour(policy, episode)
    if over_step_limit(episode, limits):
        return None
    try:
        out = await policy.achat(messages, tools, **_slot(slot), **_seeded(episode, sampling))
    except PolicyError as exc:
        _policy_failed(episode, exc)
        return None
    record_call(episode, out, messages, tools, source=source, step_rewards=step_rewards, **(info or {}))
    return out


# --------------------------------------------------------------------------- tool calls
@dataclass
class ToolOutcome:
    """What one tool call gave: its value, or the error it raised (a timeout included)."""

    value: Any = None
    error: str | None = None
    latency_s: float = 0.0
    exception: BaseException | None = None
    """The exception behind `error`, for a front end that must raise it again."""

    @property
    def ok(self) -> bool:
        return self.error is None


def run_tool(fn: Callable[..., Any], timeout_s: float | None, *args: Any, **kwargs: Any) -> ToolOutcome:
    """`fn(*args, **kwargs)` under the timeout; an exception becomes the outcome's error."""
    t0 = time.perf_counter()
    try:
        value = call_with_timeout(fn, timeout_s, *args, **kwargs)
    except Exception as exc:
        return _failed(exc, t0)
    return ToolOutcome(value=value, latency_s=time.perf_counter() - t0)


def _failed(exc: Exception, t0: float) -> ToolOutcome:
    return ToolOutcome(error=f"{type(exc).__name__}: {exc}", latency_s=time.perf_counter() - t0,
                       exception=exc)


async def arun_tool(fn: Callable[..., Any], timeout_s: float | None, *args: Any, **kwargs: Any) -> ToolOutcome:
    """`await fn(*args, **kwargs)` under the timeout; an exception becomes the outcome's error."""
    t0 = time.perf_counter()
    try:
        value = await asyncio.wait_for(fn(*args, **kwargs), timeout_s)
    except asyncio.TimeoutError:
        return _failed(TimeoutError(f"no answer within {timeout_s} s"), t0)
    except Exception as exc:
        return _failed(exc, t0)
    return ToolOutcome(value=value, latency_s=time.perf_counter() - t0)


def bound_output(text: str, limits: Limits) -> tuple[str, int | None]:
    """Tool output as the model sees it: cut to `max_tool_output_chars` with a note saying how
    much was cut; returns (text, the original length when cut, else None)."""
    limit = limits.max_tool_output_chars
    if limit is None or len(text) <= limit:
        return text, None
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]", len(text)


def record_tool_result(episode: Episode | None, call_id: str, name: str, *, content: str | None,
                       error: str | None, latency_s: float | None = None,
                       step_rewards: StepRewards | None = None, **extra: Any) -> None:
    """File a tool's outcome under its call id in the step that asked for it (and that step's
    `tool_error` reward, when the tool failed)."""
    if episode is None or episode.finished:
        return
    record = {"name": name, **extra, "content": content, "status": "success" if error is None else "error",
              "error": error}
    if latency_s is not None:
        record["latency_s"] = round(latency_s, 4)
    step = episode.add_tool_result(call_id, record)
    if error is not None and step is not None and step_rewards is not None:
        give_step_reward(episode, step, "tool_error", step_rewards.tool_error)


__all__ = ["DEFAULT_MAX_MODEL_CALLS", "DEFAULT_MAX_TOOL_OUTPUT_CHARS", "DEFAULT_TOOL_TIMEOUT_S",
           "Limits", "StepRewards", "ToolOutcome", "give_step_reward", "acall_policy", "arun_tool", "bound_output", "call_policy",
           "check_behaviour", "check_steps_of",
           "over_step_limit", "record_call", "record_outage", "record_tool_result", "run_tool", "transition_of"]

"""The LangChain integration: train an existing LangChain agent in place.

`ForgeMiddleware(policy)` is the one line added to `create_agent(..., middleware=[...])`: each
model call of the agent is routed to the policy (for that call only) and recorded with its exact
tokens; each tool call's arguments, result, status and latency land in the step that asked for
it. `ForgeChatModel(policy)` is the same thing as a chat model, for LCEL chains and custom
graphs. Recording happens inside `with fb.episode(...)`; outside one, calls are only routed.

The policy is read on every call, so an adapter published between two `invoke` calls of the
same compiled agent serves the second one; the agent is never rebuilt.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable, Iterator, Sequence, cast

from forge_bridge.core.extras import require

require("langchain", "langchain")  # a clear error naming the extra, not a bare ModuleNotFoundError
require("langchain_core", "langchain")

from langchain.agents.middleware import AgentMiddleware  # noqa: E402
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ToolMessage,
    UsageMetadata,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from forge_bridge.core.episode import current_episode, register_truncation
from forge_bridge.core.errors import InvalidArgument, WrongType
from forge_bridge.core.recording import (
    DEFAULT_MAX_MODEL_CALLS,
    DEFAULT_MAX_TOOL_OUTPUT_CHARS,
    DEFAULT_TOOL_TIMEOUT_S,
    Limits,
    StepRewards,
    ToolOutcome,
    acall_policy,
    check_steps_of,
    arun_tool,
    bound_output,
    call_policy,
    record_call,
    record_tool_result,
    run_tool,
)
from forge_bridge.core.actions import Action, ToolCall
from forge_bridge.policies.base import Policy, PolicyOutput
from forge_bridge.policies.messages import normalize_messages
from forge_bridge.policies.scripted import rendered

try:  # LangGraph's own step limit ends an episode as truncated, not crashed
    from langgraph.errors import GraphRecursionError

    register_truncation(GraphRecursionError, "LangGraph's recursion limit")
except ImportError:  # LCEL without LangGraph
    pass


# --------------------------------------------------------------------------- conversions
def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict]:
    """LangChain messages as the OpenAI-format dicts the policy (and the record) sees."""
    converted = convert_to_openai_messages(list(messages))
    for m in converted:
        if m.get("role") == "assistant" and m.get("content") is None:
            m["content"] = ""
    return converted


def to_ai_message(out: PolicyOutput, chunk: bool = False) -> AIMessage | AIMessageChunk:
    tool_calls: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    for tc in out.action.tool_calls:
        try:
            args = json.loads(tc.arguments) if tc.arguments.strip() else {}
            if not isinstance(args, dict):
                raise InvalidArgument("arguments are not a JSON object")
            tool_calls.append({"name": tc.name, "args": args, "id": tc.id, "type": "tool_call"})
        except ValueError as exc:
            invalid.append({"name": tc.name, "args": tc.arguments, "id": tc.id,
                            "error": str(exc), "type": "invalid_tool_call"})
    for err in out.action.parse_errors:
        invalid.append({"name": None, "args": err.get("text"), "id": None,
                        "error": err.get("error"), "type": "invalid_tool_call"})
    metadata = {"finish_reason": out.finish_reason, "model_name": out.version or "base",
                "version": out.version, "prompt_token_ids": out.prompt_token_ids,
                "token_ids": out.completion_token_ids, "logprobs": out.completion_logprobs}
    usage: UsageMetadata = {"input_tokens": len(out.prompt_token_ids),
                            "output_tokens": len(out.completion_token_ids),
                            "total_tokens": len(out.prompt_token_ids) + len(out.completion_token_ids)}
    if chunk:
        return AIMessageChunk(
            content=out.text, response_metadata=metadata, usage_metadata=usage,
            tool_call_chunks=[{"name": tc["name"], "args": json.dumps(tc["args"]), "id": tc["id"],
                               "index": i, "type": "tool_call_chunk"}
                              for i, tc in enumerate(tool_calls)],
            chunk_position="last")
    return AIMessage(content=out.text, tool_calls=tool_calls, invalid_tool_calls=invalid,
                     response_metadata=metadata, usage_metadata=usage)


def rendered_reply(student: Any, messages: list[dict], tools: list[dict] | None, reply: AIMessage) -> PolicyOutput:
    """Another model's reply as `student` (a policy with a tokenizer) would have written it: its
    exact tokens in the student's template and tool-call format (`scripted.rendered`)."""
    calls = [ToolCall(id=tc.get("id") or "", name=tc["name"], arguments=json.dumps(tc["args"])) for tc in reply.tool_calls]
    finish = reply.response_metadata.get("finish_reason")
    out = rendered(student.tokenizer, getattr(student, "tool_format", "hermes"), normalize_messages(messages), tools,
                   reply.text, [(tc["name"], tc["args"]) for tc in reply.tool_calls], 1 << 30, None,
                   {"upstream": reply.response_metadata.get("model_name")}, cut=finish == "length")
    out.action = Action(content=reply.text, tool_calls=calls, finish_reason=finish)
    return out


def to_reply(out: PolicyOutput | None, chunk: bool = False) -> AIMessage | AIMessageChunk:
    """The model's answer for the agent; no output (the step limit) is an empty final answer,
    which ends the agent's tool loop."""
    if out is not None:
        return to_ai_message(out, chunk)
    cls = AIMessageChunk if chunk else AIMessage
    return cls(content="", response_metadata={"forge_bridge": "step limit"})


# --------------------------------------------------------------------------- the chat model
class ForgeChatModel(BaseChatModel):
    """A LangChain chat model backed by a forge-bridge policy (records inside an episode)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    policy: Policy = Field(exclude=True)
    temperature: float | None = None
    """Sampling temperature (None: the policy's default, 1.0)."""
    max_tokens: int | None = None
    """Completion length limit (None: the policy's default)."""
    seed: int | None = None
    """Sampling seed, for reproducible outputs."""
    limits: Limits = Field(default_factory=Limits, exclude=True)
    """Step limit per episode (and the tool limits the middleware applies)."""
    step_rewards: StepRewards | None = Field(default=None, exclude=True)
    """Rewards for what single steps did (a failed tool, a malformed or repeated call); None: off."""

    def __init__(self, policy: Policy | None = None, **kwargs: Any) -> None:
        if policy is not None:
            kwargs["policy"] = policy
        super().__init__(**kwargs)

    @property
    def _llm_type(self) -> str:
        return "forge-bridge"

    @property
    def _identifying_params(self) -> dict:
        return {"policy": type(self.policy).__name__, "version": self.policy.current()}

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        formatted = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=formatted, **kwargs)

    def _sampling(self, stop: list[str] | None, kwargs: dict) -> dict:
        if stop:
            raise InvalidArgument("ForgeChatModel does not support stop sequences: the policy stops at "
                             "the end of the assistant turn")
        params = {"temperature": kwargs.get("temperature", self.temperature),
                  "max_tokens": kwargs.get("max_tokens", self.max_tokens),
                  "seed": kwargs.get("seed", self.seed)}
        return {k: v for k, v in params.items() if v is not None}

    def _call(self, messages: list[BaseMessage], stop, kwargs) -> PolicyOutput | None:
        return call_policy(self.policy, current_episode(), to_openai_messages(messages),
                           kwargs.get("tools") or None, source="langchain", limits=self.limits,
                           sampling=self._sampling(stop, kwargs), step_rewards=self.step_rewards)

    async def _acall(self, messages: list[BaseMessage], stop, kwargs) -> PolicyOutput | None:
        return await acall_policy(self.policy, current_episode(), to_openai_messages(messages),
                                  kwargs.get("tools") or None, source="langchain",
                                  limits=self.limits, sampling=self._sampling(stop, kwargs),
                                  step_rewards=self.step_rewards)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        out = self._call(messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=to_reply(out))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        out = await self._acall(messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=to_reply(out))])

    # The policy returns whole turns; streaming yields that turn as one chunk that keeps the
    # token ids in its response_metadata (what stream_mode="messages" consumers read).
    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        out = self._call(messages, stop, kwargs)
        chunk = ChatGenerationChunk(message=cast(AIMessageChunk, to_reply(out, chunk=True)))
        if run_manager:
            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        out = await self._acall(messages, stop, kwargs)
        chunk = ChatGenerationChunk(message=cast(AIMessageChunk, to_reply(out, chunk=True)))
        if run_manager:
            await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk


# --------------------------------------------------------------------------- the middleware
class ForgeMiddleware(AgentMiddleware):
    """`create_agent(model, tools, middleware=[ForgeMiddleware(policy)])`: route and record."""

    def __init__(self, policy: Policy, *, temperature: float | None = None,
                 max_tokens: int | None = None, handle_tool_errors: bool = True,
                 max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS,
                 tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S,
                 max_tool_output_chars: int | None = DEFAULT_MAX_TOOL_OUTPUT_CHARS,
                 step_rewards: StepRewards | None = None, passthrough: bool = False) -> None:
        """`max_model_calls` (default 25) ends an episode's tool loop after that many calls,
        recorded as truncated; `tool_timeout_s` (default 60) turns a hanging tool into an error
        the model sees; `max_tool_output_chars` (default 16,000) cuts huge tool results before
        they reach the model. None turns a limit off. `step_rewards` (default off) rewards single
        steps for what they did, e.g. `StepRewards(tool_error=-0.2, repeated_call=-0.1)`.
        `passthrough`: record only; the agent's own model answers, and each of its replies is
        recorded as `policy` (the student, which needs a tokenizer) would have written it, in an
        episode opened with `behaviour="upstream"` (docs/production.md)."""
        super().__init__()
        if not isinstance(policy, Policy):
            raise WrongType(f"ForgeMiddleware(policy): expected a forge_bridge Policy "
                            f"(LocalPolicy, VLLMPolicy), got {type(policy).__name__}")
        if passthrough and getattr(policy, "tokenizer", None) is None:
            raise InvalidArgument("ForgeMiddleware(passthrough=True) records the agent's own model in the student's "
                                  f"tokens: give it a policy with a tokenizer (LocalPolicy), not {type(policy).__name__}")
        self.passthrough = passthrough
        try:
            self.limits = Limits(max_model_calls, tool_timeout_s, max_tool_output_chars)
        except ValueError as exc:
            raise InvalidArgument(f"ForgeMiddleware({exc}") from None
        self.policy = policy
        self.handle_tool_errors = handle_tool_errors
        self.step_rewards = step_rewards
        self.model = ForgeChatModel(policy, temperature=temperature, max_tokens=max_tokens,
                                    limits=self.limits, step_rewards=step_rewards)

    @property
    def name(self) -> str:
        return "ForgeMiddleware"

    # model calls: the request's model is replaced for this call only (past the step limit it
    # answers with an empty final message, which ends the loop before LangGraph's recursion error)
    def wrap_model_call(self, request: Any, handler: Callable) -> Any:
        if self.passthrough:
            return self._record_own(request, handler(request))
        return handler(request.override(model=self.model))

    async def awrap_model_call(self, request: Any, handler: Callable) -> Any:
        if self.passthrough:
            return self._record_own(request, await handler(request))
        return await handler(request.override(model=self.model))

    def _record_own(self, request: Any, response: Any) -> Any:
        """Passthrough: the agent's own model's reply, recorded in the student's tokens; returned as it was."""
        episode = current_episode()
        reply = response if isinstance(response, AIMessage) else next(
            (m for m in getattr(response, "result", []) if isinstance(m, AIMessage)), None)
        if episode is None or reply is None:
            return response
        check_steps_of("upstream", "ForgeMiddleware(passthrough=True), the agent's own model,", episode)
        system = [request.system_message] if request.system_message is not None else []
        messages = to_openai_messages(system + list(request.messages))
        tools = [t if isinstance(t, dict) else convert_to_openai_tool(t) for t in request.tools or []] or None
        record_call(episode, rendered_reply(self.policy, messages, tools, reply), messages, tools, source="langchain")
        return response

    # tool calls: timed, errors turned into error ToolMessages, recorded into their step
    def wrap_tool_call(self, request: Any, handler: Callable) -> Any:
        return self._tool_message(request, run_tool(handler, self.limits.tool_timeout_s, request))

    async def awrap_tool_call(self, request: Any, handler: Callable) -> Any:
        return self._tool_message(request, await arun_tool(handler, self.limits.tool_timeout_s, request))

    def _tool_message(self, request: Any, outcome: ToolOutcome) -> Any:
        """Record the outcome; returns what the agent gets (huge text cut in both alike)."""
        call, episode = request.tool_call, current_episode()
        result, extra = outcome.value, {}
        if not outcome.ok:
            record_tool_result(episode, call["id"], call["name"], content=None, error=outcome.error,
                               latency_s=outcome.latency_s, step_rewards=self.step_rewards,
                               args=call.get("args"))
            if not self.handle_tool_errors:
                assert outcome.exception is not None  # a failed outcome keeps what it raised
                raise outcome.exception
            return ToolMessage(content=f"Error: {outcome.error}", tool_call_id=call["id"],
                               name=call["name"], status="error")
        if isinstance(result, ToolMessage):
            if isinstance(result.content, str):  # LangChain already made text of bytes
                content, full = bound_output(result.content, self.limits)
                if full is not None:
                    extra["content_chars"] = full
                    result = result.model_copy(update={"content": content})
            text = result.text if hasattr(result, "text") else str(result.content)
            error = text if result.status == "error" else None
        else:  # a Command or another object: keep its shape for the trainer to inspect
            text, error = repr(result)[:2000], None
        record_tool_result(episode, call["id"], call["name"], content=text, error=error,
                           latency_s=outcome.latency_s, step_rewards=self.step_rewards,
                           args=call.get("args"), **extra)
        return result


__all__ = ["ForgeChatModel", "ForgeMiddleware", "to_ai_message", "to_openai_messages"]

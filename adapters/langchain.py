"""LangChain adapter: train an existing LangChain agent in place.

`ForgeMiddleware(policy)` is the one line added to `create_agent(..., middleware=[...])`: each
model call of the agent is routed to the policy (for that call only) and recorded with its exact
tokens; each tool call's arguments, result, status and latency land in the step that asked for
it. `ForgeChatModel(policy)` is the same thing as a chat model, for LCEL chains and custom
graphs. Recording happens inside `with fb.episode(...)`; outside one, calls are only routed.

The policy is read on every call, so an adapter published between two `invoke` calls of the
same compiled agent serves the second one; the agent is never rebuilt.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

from langchain.agents.middleware import AgentMiddleware
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (AIMessage, AIMessageChunk, BaseMessage, ToolMessage,
                                     convert_to_openai_messages)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from forge_bridge.policy import Policy, PolicyError, PolicyOutput
from forge_bridge.session import Episode, current_episode


# --------------------------------------------------------------------------- conversions
def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict]:
    """LangChain messages as the OpenAI-format dicts the policy (and the record) sees."""
    converted = convert_to_openai_messages(list(messages))
    for m in converted:
        if m.get("role") == "assistant" and m.get("content") is None:
            m["content"] = ""
    return converted


def to_ai_message(out: PolicyOutput, chunk: bool = False) -> AIMessage | AIMessageChunk:
    tool_calls, invalid = [], []
    for tc in out.action.tool_calls:
        try:
            args = json.loads(tc.arguments) if tc.arguments.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments are not a JSON object")
            tool_calls.append({"name": tc.name, "args": args, "id": tc.id, "type": "tool_call"})
        except ValueError as exc:
            invalid.append({"name": tc.name, "args": tc.arguments, "id": tc.id,
                            "error": str(exc), "type": "invalid_tool_call"})
    for err in out.action.parse_errors:
        invalid.append({"name": None, "args": err.get("text"), "id": None,
                        "error": err.get("error"), "type": "invalid_tool_call"})
    metadata = {"finish_reason": out.finish_reason, "model_name": out.adapter or "base",
                "adapter": out.adapter, "prompt_token_ids": out.prompt_token_ids,
                "token_ids": out.completion_token_ids, "logprobs": out.completion_logprobs}
    usage = {"input_tokens": len(out.prompt_token_ids),
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


def _record(episode: Episode | None, out: PolicyOutput, messages: list[dict],
            tools: list[dict] | None) -> None:
    if episode is None:
        return
    episode.record(out.to_transition(messages, tools, source="langchain"))
    if out.action.parse_errors and not out.action.tool_calls:
        # The agent stops here (no usable call): the episode ends as failed, with the reason.
        # policy_fault: the model's own doing, so a trainer learns from it (reward it 0).
        episode.fail("malformed tool call: " + out.action.parse_errors[0]["error"], policy_fault=True)


@contextlib.contextmanager
def _fail_episode_on_policy_error(episode: Episode | None) -> Iterator[None]:
    """A model call that fails ends the episode as failed, with the reason, and still raises."""
    try:
        yield
    except PolicyError as exc:
        if episode is not None:
            episode.fail(f"{type(exc).__name__}: {exc}")
        raise


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

    def __init__(self, policy: Policy | None = None, **kwargs: Any) -> None:
        if policy is not None:
            kwargs["policy"] = policy
        super().__init__(**kwargs)

    @property
    def _llm_type(self) -> str:
        return "forge-bridge"

    @property
    def _identifying_params(self) -> dict:
        return {"policy": type(self.policy).__name__, "adapter": self.policy.current_adapter}

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        formatted = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=formatted, **kwargs)

    def _sampling(self, stop: list[str] | None, kwargs: dict) -> dict:
        if stop:
            raise ValueError("ForgeChatModel does not support stop sequences: the policy stops at "
                             "the end of the assistant turn")
        params = {"temperature": kwargs.get("temperature", self.temperature),
                  "max_tokens": kwargs.get("max_tokens", self.max_tokens),
                  "seed": kwargs.get("seed", self.seed)}
        return {k: v for k, v in params.items() if v is not None}

    def _prepare(self, messages: list[BaseMessage], kwargs: dict) -> tuple[list[dict], Any, Episode | None]:
        return to_openai_messages(messages), kwargs.get("tools") or None, current_episode()

    def _call(self, messages: list[BaseMessage], stop, kwargs) -> PolicyOutput:
        oa_messages, tools, episode = self._prepare(messages, kwargs)
        with _fail_episode_on_policy_error(episode):
            out = self.policy.chat(oa_messages, tools, **self._sampling(stop, kwargs))
        _record(episode, out, oa_messages, tools)
        return out

    async def _acall(self, messages: list[BaseMessage], stop, kwargs) -> PolicyOutput:
        oa_messages, tools, episode = self._prepare(messages, kwargs)
        with _fail_episode_on_policy_error(episode):
            out = await self.policy.achat(oa_messages, tools, **self._sampling(stop, kwargs))
        _record(episode, out, oa_messages, tools)
        return out

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        out = self._call(messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=to_ai_message(out))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        out = await self._acall(messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=to_ai_message(out))])

    # The policy returns whole turns; streaming yields that turn as one chunk that keeps the
    # token ids in its response_metadata (what stream_mode="messages" consumers read).
    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        out = self._call(messages, stop, kwargs)
        chunk = ChatGenerationChunk(message=to_ai_message(out, chunk=True))
        if run_manager:
            run_manager.on_llm_new_token(out.text, chunk=chunk)
        yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        out = await self._acall(messages, stop, kwargs)
        chunk = ChatGenerationChunk(message=to_ai_message(out, chunk=True))
        if run_manager:
            await run_manager.on_llm_new_token(out.text, chunk=chunk)
        yield chunk


# --------------------------------------------------------------------------- the middleware
class ForgeMiddleware(AgentMiddleware):
    """`create_agent(model, tools, middleware=[ForgeMiddleware(policy)])`: route and record."""

    def __init__(self, policy: Policy, *, temperature: float | None = None,
                 max_tokens: int | None = None, handle_tool_errors: bool = True,
                 max_model_calls: int | None = None, tool_timeout_s: float | None = None,
                 max_tool_output_chars: int | None = 16000) -> None:
        """`max_model_calls` ends an episode's tool loop after that many calls (recorded as
        truncated); `tool_timeout_s` turns a hanging tool into an error the model sees;
        `max_tool_output_chars` cuts huge tool results before they reach the model."""
        super().__init__()
        if not isinstance(policy, Policy):
            raise TypeError(f"ForgeMiddleware(policy): expected a forge_bridge Policy "
                            f"(LocalPolicy, VLLMPolicy), got {type(policy).__name__}")
        for name, value in (("max_model_calls", max_model_calls), ("max_tool_output_chars", max_tool_output_chars)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"ForgeMiddleware({name}): expected an int >= 1 or None, got {value!r}")
        if tool_timeout_s is not None and (isinstance(tool_timeout_s, bool) or not isinstance(
                tool_timeout_s, (int, float)) or tool_timeout_s <= 0):
            raise ValueError(f"ForgeMiddleware(tool_timeout_s): expected a number > 0 or None, got {tool_timeout_s!r}")
        self.policy = policy
        self.handle_tool_errors = handle_tool_errors
        self.max_model_calls, self.tool_timeout_s = max_model_calls, tool_timeout_s
        self.max_tool_output_chars = max_tool_output_chars
        self.model = ForgeChatModel(policy, temperature=temperature, max_tokens=max_tokens)

    @property
    def name(self) -> str:
        return "ForgeMiddleware"

    # model calls: the request's model is replaced for this call only
    def wrap_model_call(self, request: Any, handler: Callable) -> Any:
        return self._step_limit() or handler(request.override(model=self.model))

    async def awrap_model_call(self, request: Any, handler: Callable) -> Any:
        return self._step_limit() or await handler(request.override(model=self.model))

    def _step_limit(self) -> AIMessage | None:
        """Past `max_model_calls` in this episode: end the agent's loop (an answer with no tool
        call) and mark the episode truncated, instead of LangGraph's recursion error."""
        episode = current_episode()
        if self.max_model_calls is None or episode is None or len(episode.trajectory) < self.max_model_calls:
            return None
        episode.truncate(f"more than {self.max_model_calls} model calls")
        return AIMessage(content="", response_metadata={"forge_bridge": "step limit"})

    # tool calls: timed, errors turned into error ToolMessages, recorded into their step
    def wrap_tool_call(self, request: Any, handler: Callable) -> Any:
        from forge_bridge.timeouts import call_with_timeout

        episode, t0 = current_episode(), time.perf_counter()
        try:
            result = call_with_timeout(handler, self.tool_timeout_s, request)
        except Exception as exc:
            return self._tool_failed(episode, request, exc, t0)
        return self._tool_done(episode, request, result, t0)

    async def awrap_tool_call(self, request: Any, handler: Callable) -> Any:
        import asyncio

        episode, t0 = current_episode(), time.perf_counter()
        try:
            result = await asyncio.wait_for(handler(request), self.tool_timeout_s)
        except asyncio.TimeoutError:
            exc = TimeoutError(f"no answer within {self.tool_timeout_s} s")
            return self._tool_failed(episode, request, exc, t0)
        except Exception as exc:
            return self._tool_failed(episode, request, exc, t0)
        return self._tool_done(episode, request, result, t0)

    def _tool_done(self, episode: Episode | None, request: Any, result: Any, t0: float) -> Any:
        """Record the result; huge text is cut in what the model sees and in the record alike.
        Returns what the agent gets."""
        call = request.tool_call
        record: dict = {}
        if isinstance(result, ToolMessage):
            content = result.content  # LangChain already made text of bytes (an escaped literal)
            if isinstance(content, str) and self.max_tool_output_chars and len(content) > self.max_tool_output_chars:
                record["content_chars"] = len(content)
                content = (content[:self.max_tool_output_chars] +
                           f"\n[... {len(content) - self.max_tool_output_chars} more characters cut]")
            if content is not result.content:
                result = result.model_copy(update={"content": content})
            text = result.text if hasattr(result, "text") else str(result.content)
            record.update(content=text, status=result.status, error=text if result.status == "error" else None)
        else:  # a Command or another object: keep its shape for the trainer to inspect
            record.update(content=repr(result)[:2000], status="success", error=None)
        if episode is not None and not episode.finished:
            episode.add_tool_result(call["id"], {"name": call["name"], "args": call.get("args"), **record,
                                                 "latency_s": round(time.perf_counter() - t0, 4)})
        return result

    def _tool_failed(self, episode: Episode | None, request: Any, exc: Exception, t0: float) -> Any:
        call = request.tool_call
        error = f"{type(exc).__name__}: {exc}"
        if episode is not None and not episode.finished:
            episode.add_tool_result(call["id"], {"name": call["name"], "args": call.get("args"),
                                                 "content": None, "status": "error", "error": error,
                                                 "latency_s": round(time.perf_counter() - t0, 4)})
        if not self.handle_tool_errors:
            raise exc
        return ToolMessage(content=f"Error: {error}", tool_call_id=call["id"], name=call["name"],
                           status="error")


__all__ = ["ForgeChatModel", "ForgeMiddleware", "to_ai_message", "to_openai_messages"]

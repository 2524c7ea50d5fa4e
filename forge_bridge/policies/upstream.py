"""The agent's own model, recorded in the student's tokens: learning from production.

`UpstreamPolicy(url, tokenizer)` forwards each call to an OpenAI-compatible server (the hosted or
self-hosted model the agent runs on today) and answers with what it said, unchanged. What is
recorded is that reply as the student would have written it: the messages in the student's chat
template, the content and tool calls in its tool-call format, then its end-of-turn token
(`scripted.rendered`), so the step trains the student directly (imitation of what worked). Its
trajectories are marked `behaviour="upstream"`: never on-policy samples of the student.

Put it behind the gateway (`forge-bridge gateway --upstream URL`) and point the agent's
`base_url` at the gateway: the agent sees the upstream's answers; the store gets each step.
`Upstream` is what any such policy shares; `forge_bridge.adapters.crewai.CrewAIUpstream` is one
over a CrewAI LLM of any provider (Anthropic, Gemini, Bedrock, ...).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from pathlib import Path
from typing import Any

from forge_bridge.core.actions import Action, ToolCall
from forge_bridge.core.errors import PolicyResponseError, PolicyUnavailable, SchemaError, Unsupported
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling
from forge_bridge.policies.messages import normalize_messages
from forge_bridge.policies.scripted import rendered
from forge_bridge.policies.toolcalls import formats


def arguments(text: str) -> Any:
    """A tool call's JSON arguments as the object they encode (text that is not JSON: as is)."""
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text


class Upstream(Policy):
    """What every upstream shares: the agent's own model answers; its reply is recorded in the
    student's tokens (`tokenizer`, `tool_format`), marked `behaviour="upstream"`, never trained here.
    A subclass asks its model (`generate`/`agenerate`) and hands the reply to `recorded`."""

    behaviour = "upstream"
    """What the episodes recorded through it are (`Trajectory.behaviour`)."""

    def __init__(self, tokenizer: Any, tool_format: str = "auto") -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.tool_format = formats(tool_format, getattr(tokenizer, "chat_template", None))[0]

    def recorded(self, messages: list[dict], tools: list[dict] | None, content: str, calls: list[ToolCall],
                 finish: str | None, adapter: str | None, info: dict, reasoning: str = "") -> PolicyOutput:
        """The reply as the agent sees it (content, calls, finish reason unchanged), with the
        student's tokens for the record; normalized `messages` in."""
        out = rendered(self.tokenizer, self.tool_format, messages, tools, content,
                       [(c.name, arguments(c.arguments)) for c in calls], 1 << 30, adapter, info,
                       cut=finish == "length")
        out.action = Action(content=content, tool_calls=calls, finish_reason=finish, reasoning=reasoning)
        return out

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def load_version(self, path: Path, version: str) -> None:
        raise Unsupported("the upstream model is not trained here: train the student on what it recorded, and "
                          "serve the student's adapters from a LocalPolicy or a vLLM server")

    def unload_version(self, version: str) -> None:
        pass


class UpstreamPolicy(Upstream):
    """Calls an OpenAI-compatible server; records its replies in `tokenizer`'s tokens."""

    def __init__(self, base_url: str, tokenizer: Any, *, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 120.0, tool_format: str = "auto") -> None:
        """`base_url`: the server's OpenAI base URL (…/v1). `model`: the name to ask it for (None:
        the name the agent asked for, else 'default'). `api_key`: sent as a bearer token.
        `tool_format`: the student's tool-call format ('auto': from its chat template)."""
        import httpx

        super().__init__(tokenizer, tool_format)
        self.base_url, self.model = base_url.rstrip("/"), model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_args: dict[str, Any] = {"timeout": httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
                                             "headers": headers}
        self._client = httpx.Client(**self._client_args)
        self._aclients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # one per event loop

    def _body(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling) -> dict:
        body: dict[str, Any] = {"model": self.model or "default", "messages": messages,
                                "temperature": sampling.temperature, "top_p": sampling.top_p,
                                "max_tokens": sampling.max_tokens}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if tools:
            body["tools"] = tools
        return body

    def _answer(self, resp: Any, messages: list[dict], tools: list[dict] | None, sampling: Sampling,
                adapter: str | None, t0: float) -> PolicyOutput:
        """The upstream's reply as the agent sees it, with the student's tokens for the record."""
        if resp.status_code != 200:
            raise PolicyResponseError(f"the upstream at {self.base_url} answered HTTP {resp.status_code}: "
                                      f"{resp.text[:300]}")
        try:
            data = resp.json()
            choice = data["choices"][0]
            message = choice["message"]
            calls = [ToolCall.from_openai(tc) for tc in message.get("tool_calls") or []]
        except (ValueError, KeyError, IndexError, TypeError, SchemaError) as exc:
            raise PolicyResponseError(f"the upstream at {self.base_url} answered without a chat completion's "
                                      f"shape ({type(exc).__name__}: {exc})") from None
        return self.recorded(messages, tools, message.get("content") or "", calls, choice.get("finish_reason"), adapter,
                             {"upstream": data.get("model") or self.model, "upstream_latency_s": time.perf_counter() - t0,
                              "upstream_usage": data.get("usage")},
                             reasoning=message.get("reasoning_content") or message.get("reasoning") or "")

    def generate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        import httpx

        messages, t0 = normalize_messages(messages), time.perf_counter()
        try:
            resp = self._client.post(self.base_url + "/chat/completions", json=self._body(messages, tools, sampling))
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        return self._answer(resp, messages, tools, sampling, adapter, t0)

    async def agenerate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        import httpx

        messages, t0 = normalize_messages(messages), time.perf_counter()
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            client = self._aclients[loop] = httpx.AsyncClient(**self._client_args)
        try:
            resp = await client.post(self.base_url + "/chat/completions", json=self._body(messages, tools, sampling))
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        return self._answer(resp, messages, tools, sampling, adapter, t0)

    def _unreachable(self, exc: Exception) -> PolicyUnavailable:
        return PolicyUnavailable(f"the upstream at {self.base_url} is unreachable ({type(exc).__name__}: {exc})")

    def close(self) -> None:
        self._client.close()


__all__ = ["Upstream", "UpstreamPolicy", "arguments"]

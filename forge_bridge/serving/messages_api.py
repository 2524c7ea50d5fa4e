"""Anthropic's Messages API (`POST /v1/messages`, what Claude Code and Anthropic's SDK speak) in
the chat form the gateway serves every call in (`ChatCall`), and the reply back in its shapes.

A request becomes chat messages: `system` a system message; an assistant turn's `text` blocks
its content and its `tool_use` blocks its tool calls (the input as JSON arguments); a user
turn's `tool_result` blocks `tool` messages (in their order, first), its `text` blocks one user
message after them. Tools (`name`, `input_schema`) become chat function tools. The reply is a
`message` (a `text` block, then a `tool_use` block per call; `stop_reason` `tool_use`,
`max_tokens` or `end_turn`) or, streamed, its events from `message_start` to `message_stop`.
`POST /v1/messages/count_tokens` (Claude Code asks it) parses the same request and answers the
prompt's token count in the policy's tokenizer; it calls no model and records nothing.
With the policy's own tokens it carries them as extra fields (`prompt_token_ids`, `token_ids`,
`logprobs`), as the chat route does.

Parsed strictly, by hand (the core has no `anthropic` dependency; the SDK's request types are
TypedDicts, which check nothing): a field of the wrong type, a block that is not text (an image,
a document), a server tool, a `tool_result` for a `tool_use` never made or a field the API does
not have is a 400 that names it. The tests check every reply and event against the SDK's models.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable, Iterator

from forge_bridge.core.errors import Unsupported
from forge_bridge.policies.base import PolicyOutput
from forge_bridge.serving.http_api import ChatCall, RequestRefused, check_fields, expect

IGNORED = {"context_management", "metadata", "output_config", "service_tier", "stop_sequences", "thinking",
           "tool_choice", "top_k"}
"""Fields a client may send that change nothing here (checked for their type)."""
USED = {"model", "max_tokens", "messages", "system", "tools", "temperature", "top_p", "stream"}
COUNTED = {"model", "messages", "system", "tools", "tool_choice", "thinking", "context_management", "output_config"}
"""The fields of a `count_tokens` request."""
NOT_TEXT = {"image": "images", "document": "documents", "search_result": "search results"}
STOP = {"tool_calls": "tool_use", "length": "max_tokens"}
"""Chat finish reasons as Messages stop reasons (any other: end_turn)."""


def parse(body: Any, *, counting: bool = False) -> tuple[ChatCall, bool]:
    """A Messages request as the call it asks for and whether it streams, or a 400 naming what
    is wrong with it. `counting`: a `count_tokens` request (no `max_tokens`, sampling or stream)."""
    if not isinstance(body, dict):
        raise RequestRefused(400, "the body must be a JSON object")
    check_fields(body, COUNTED if counting else USED | IGNORED)
    required: list[tuple[str, type, str]] = [("model", str, "a string"), ("messages", list, "a non-empty list of messages")]
    if not counting:
        required.append(("max_tokens", int, "an integer"))
    for name, kinds, what in required:
        if name not in body:
            raise RequestRefused(400, f"{name}: required")
        expect(body[name], kinds, name, what)
    if not counting and body["max_tokens"] < 1:
        raise RequestRefused(400, f"max_tokens: expected an integer >= 1, got {body['max_tokens']}")
    sampling = {"max_tokens": body.get("max_tokens", 1)}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            sampling[name] = expect(body[name], (int, float), name, "a number")
    _check_ignored(body)
    listed = [_tool(t, f"tools[{i}]") for i, t in enumerate(expect(body.get("tools") or [], list, "tools", "a list"))]
    tools = [t for t in listed if t is not None]
    messages = [*_system(body.get("system")), *_messages(body["messages"])]
    stream = body.get("stream")
    return (ChatCall(messages, tools or None, sampling, body["model"], "messages"),
            False if stream is None else expect(stream, bool, "stream", "true or false"))


def _check_ignored(body: dict) -> None:
    for name, kinds, what in (("metadata", dict, "an object"), ("thinking", dict, "an object"),
                              ("context_management", dict, "an object"), ("output_config", dict, "an object"),
                              ("tool_choice", dict, "an object"), ("top_k", int, "an integer"),
                              ("stop_sequences", list, "a list of strings"), ("service_tier", str, "a string")):
        if body.get(name) is not None:
            expect(body[name], kinds, name, what)
    choice = body.get("tool_choice") or {"type": "auto"}
    if choice.get("type") not in ("auto", "any", "tool", "none"):
        raise RequestRefused(400, f"tool_choice.type: expected auto, any, tool or none, got {choice.get('type')!r}")


def _system(system: Any) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    blocks = expect(system, list, "system", "a string or a list of text blocks")
    text = "".join(_text(b, f"system[{i}]") for i, b in enumerate(blocks))
    return [{"role": "system", "content": text}] if text else []


def _tool(tool: Any, where: str) -> dict | None:
    """A custom tool as a chat function tool; None for one with `defer_loading` (the API keeps it
    out of the model's context until a tool search loads it)."""
    expect(tool, dict, where, "a tool object")
    if tool.get("type") not in (None, "custom"):
        raise RequestRefused(400, f"{where}.type: only custom tools (name, input_schema) are served here, "
                                  f"got {tool.get('type')!r}")
    check_fields(tool, {"type", "name", "description", "input_schema", "cache_control", "strict", "defer_loading",
                        "eager_input_streaming", "input_examples", "allowed_callers"}, where)
    for name, kinds, what in (("defer_loading", bool, "true or false"), ("eager_input_streaming", bool, "true or false"),
                              ("strict", bool, "true or false"), ("input_examples", list, "a list"),
                              ("allowed_callers", list, "a list")):
        if tool.get(name) is not None:
            expect(tool[name], kinds, f"{where}.{name}", what)
    function = {"name": expect(tool.get("name"), str, f"{where}.name", "a string")}
    if tool.get("description") is not None:
        function["description"] = expect(tool["description"], str, f"{where}.description", "a string")
    function["parameters"] = expect(tool.get("input_schema"), dict, f"{where}.input_schema", "a JSON schema object")
    return None if tool.get("defer_loading") else {"type": "function", "function": function}


def _messages(messages: list) -> list[dict]:
    """The turns as chat messages; a `tool_result` must answer a `tool_use` made before it."""
    if not messages:
        raise RequestRefused(400, "messages: expected a non-empty list of messages")
    out: list[dict] = []
    made: set[str] = set()
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = expect(m, dict, where, "a message object").get("role")
        if role not in ("user", "assistant", "system"):
            raise RequestRefused(400, f"{where}.role: expected user, assistant or system, got {role!r}")
        check_fields(m, {"role", "content"}, where)
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        blocks = expect(content, list, f"{where}.content", "a string or a list of content blocks")
        if not blocks:
            raise RequestRefused(400, f"{where}.content: expected a string or a non-empty list of content blocks")
        if role == "system":  # a system turn mid-conversation (Claude Code's): text only, where it stands
            out.append({"role": "system", "content": "".join(_text(b, f"{where}.content[{j}]")
                                                             for j, b in enumerate(blocks))})
        else:
            out += _assistant(blocks, where, made) if role == "assistant" else _user(blocks, where, made)
    return out


def _assistant(blocks: list, where: str, made: set[str]) -> list[dict]:
    text, calls = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = expect(block, dict, at, "a content block object").get("type")
        if kind == "tool_use":
            call_id = expect(block.get("id"), str, f"{at}.id", "a string")
            arguments = json.dumps(expect(block.get("input"), dict, f"{at}.input", "an object"))
            calls.append({"id": call_id, "type": "function", "function": {
                "name": expect(block.get("name"), str, f"{at}.name", "a string"), "arguments": arguments}})
            made.add(call_id)
        elif kind not in ("thinking", "redacted_thinking"):  # a thought carries nothing a chat template reads
            text.append(_text(block, at))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _user(blocks: list, where: str, made: set[str]) -> list[dict]:
    results, text = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if expect(block, dict, at, "a content block object").get("type") != "tool_result":
            text.append(_text(block, at))
            continue
        call_id = expect(block.get("tool_use_id"), str, f"{at}.tool_use_id", "a string")
        if call_id not in made:
            raise RequestRefused(400, f"{at}.tool_use_id: no tool_use with id {call_id!r} was made before it")
        content = block.get("content", "")
        if not isinstance(content, str):
            parts = expect(content, list, f"{at}.content", "a string or a list of text blocks")
            content = "".join(_text(p, f"{at}.content[{k}]") for k, p in enumerate(parts))
        if block.get("is_error") is not None:
            expect(block["is_error"], bool, f"{at}.is_error", "true or false")
        results.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return results + ([{"role": "user", "content": "".join(text)}] if text else [])


def _text(block: Any, where: str) -> str:
    kind = expect(block, dict, where, "a content block object").get("type")
    if kind in NOT_TEXT:
        raise RequestRefused(400, f"{where}.type: {NOT_TEXT[kind]} are not served: this gateway's model reads "
                                  f"text only ({kind!r})")
    if kind != "text":
        raise RequestRefused(400, f"{where}.type: unknown content block type {kind!r} here (served: text, tool_use, "
                                  "tool_result, thinking)")
    return expect(block.get("text"), str, f"{where}.text", "a string")


def count_tokens(call: ChatCall, tokenize: Callable[[str], list[int]]) -> int:
    """The prompt's tokens as `POST /v1/messages/count_tokens` reports them (`input_tokens`):
    the policy's tokenizer over the messages' text and the tools' JSON, without a chat
    template's markup (Anthropic's own count is an estimate too); a quarter of the characters
    where the policy does not tokenize."""
    text = "\n".join([*(str(m.get("content") or "") for m in call.messages),
                      *(json.dumps(tc.get("function", {})) for m in call.messages for tc in m.get("tool_calls") or []),
                      *(json.dumps(t["function"]) for t in call.tools or [])])
    try:
        return len(tokenize(text))
    except Unsupported:
        return (len(text) + 3) // 4


# ----------------------------------------------------------------------------- the reply
def message(out: PolicyOutput, model: str, *, tokens: bool) -> dict:
    """The policy's reply as a Messages `message`; `tokens`: with its exact token ids and logprobs."""
    content: list[dict] = [{"type": "text", "text": out.action.content}] if out.action.content else []
    content += [{"type": "tool_use", "id": tc.id, "name": tc.name, "input": _input(tc.arguments)}
                for tc in out.action.tool_calls]
    stop = "tool_use" if out.action.tool_calls else STOP.get(out.finish_reason or "", "end_turn")
    reply: dict[str, Any] = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model,
             "content": content, "stop_reason": stop, "stop_sequence": None, "usage": _usage(out, tokens)}
    if tokens:
        reply |= {"prompt_token_ids": out.prompt_token_ids, "token_ids": out.completion_token_ids,
                  "logprobs": out.completion_logprobs, "version": out.version}
    return reply


def _input(arguments: str) -> dict:
    """A call's JSON arguments as the object `tool_use.input` must be."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        value = arguments
    return value if isinstance(value, dict) else {"arguments": value}


def _usage(out: PolicyOutput, tokens: bool) -> dict:
    if tokens:
        return {"input_tokens": len(out.prompt_token_ids), "output_tokens": len(out.completion_token_ids)}
    usage = out.info.get("upstream_usage") or {}  # an upstream's reply: its own count
    return {"input_tokens": usage.get("prompt_tokens") or 0, "output_tokens": usage.get("completion_tokens") or 0}


def events(reply: dict) -> Iterator[str]:
    """The message as the Messages API streams it: message_start, each content block (start,
    its text or its input's JSON, stop), message_delta with the stop reason, message_stop."""
    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    usage = reply["usage"]
    yield event("message_start", message={**reply, "content": [], "stop_reason": None,
                                          "usage": {**usage, "output_tokens": 0}})
    for i, block in enumerate(reply["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=i, content_block={"type": "text", "text": ""})
            yield event("content_block_delta", index=i, delta={"type": "text_delta", "text": block["text"]})
        else:
            yield event("content_block_start", index=i, content_block={**block, "input": {}})
            yield event("content_block_delta", index=i, delta={"type": "input_json_delta",
                                                               "partial_json": json.dumps(block["input"])})
        yield event("content_block_stop", index=i)
    yield event("message_delta", delta={"stop_reason": reply["stop_reason"], "stop_sequence": None},
                usage={"output_tokens": usage["output_tokens"]})
    yield event("message_stop")


__all__ = ["count_tokens", "events", "message", "parse"]

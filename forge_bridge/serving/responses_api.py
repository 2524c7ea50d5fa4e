"""OpenAI's Responses API (`POST /v1/responses`, what Codex and the OpenAI Agents SDK speak) in
the chat form the gateway serves every call in (`ChatCall`), and the reply back in its shapes.

A request becomes chat messages: `instructions` a system message, each `message` item one
message (a `developer` one a system message), `function_call` items the assistant's tool calls
(joined to the assistant message before them, as one chat turn), `function_call_output` items
`tool` messages; with `previous_response_id` the conversation that response ended comes first
(the gateway keeps them per episode). Function tools become chat tools. The reply is a
`Response` (a message item, then a `function_call` item per call) or, streamed, its events from
`response.created` to `response.completed`. With the policy's own tokens it carries them as
extra fields, as the chat route does (`prompt_token_ids`, `token_ids`, per-token `logprobs`).

Parsed strictly, by hand (the core has no `openai` dependency; the SDK's request types are
TypedDicts, which check nothing): a field of the wrong type, an item or content kind that is
not text, a tool that is not a function, an output for a call never made or a field the API does
not have is a 400 that names it. The tests check every reply and event against the SDK's models.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from itertools import count
from typing import Any, Iterator

from forge_bridge.policies.base import PolicyOutput
from forge_bridge.serving.http_api import ChatCall, RequestRefused, check_fields, expect

IGNORED = {"client_metadata", "include", "metadata", "parallel_tool_calls", "prompt_cache_key", "prompt_cache_retention",
           "prompt_cache_options", "reasoning", "safety_identifier", "service_tier", "stream_options",
           "top_logprobs", "truncation", "user", "max_tool_calls", "tool_choice", "text"}
"""Fields a client may send that change nothing here (checked for their type where it matters)."""
USED = {"model", "input", "instructions", "tools", "temperature", "top_p", "max_output_tokens", "stream", "store",
        "previous_response_id"}
UNSERVED = {"background", "conversation", "prompt", "context_management", "moderation"}
"""Fields of features this gateway does not serve: refused unless null (or false)."""
NOT_TEXT = {"input_image": "images", "input_file": "files", "input_audio": "audio"}


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses request, checked: its new items already in chat form."""

    items: list[dict]
    """The request's input as chat messages (what follows the previous response's conversation)."""
    known_calls: frozenset[str]
    """The call ids of the `function_call` items among them."""
    outputs: tuple[tuple[int, str], ...]
    """(input index, call id) of each `function_call_output`, checked against the calls made."""
    instructions: str | None
    tools: list[dict]
    """The tools as the request gave them (the Response repeats them)."""
    sampling: dict
    model: str | None
    stream: bool
    store: bool
    previous_response_id: str | None
    tool_choice: Any


def parse(body: Any) -> ResponsesRequest:
    """A Responses request, or a 400 naming what is wrong with it."""
    if not isinstance(body, dict):
        raise RequestRefused(400, "the body must be a JSON object")
    check_fields(body, USED | IGNORED | UNSERVED)
    for name in sorted(UNSERVED):
        if body.get(name) not in (None, False):
            raise RequestRefused(400, f"{name}: not served by this gateway (send the whole conversation in input)")
    if "input" not in body:
        raise RequestRefused(400, "input: required (a string or a list of items)")
    raw = body["input"]
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else expect(raw, list, "input", "a string or a list")
    messages, known, outputs = _messages(items)
    tools = expect(body.get("tools") or [], list, "tools", "a list of tools")
    sampling = {"temperature": _number(body, "temperature"), "top_p": _number(body, "top_p"),
                "max_tokens": _count(body, "max_output_tokens")}
    _check_text(body.get("text"))
    _check_tool_choice(body.get("tool_choice"))
    for name in ("model", "instructions", "previous_response_id"):
        if body.get(name) is not None:
            expect(body[name], str, name, "a string")
    return ResponsesRequest(
        items=messages, known_calls=frozenset(known), outputs=tuple(outputs), instructions=body.get("instructions"),
        tools=[_check_tool(t, f"tools[{i}]") for i, t in enumerate(tools)],
        sampling={k: v for k, v in sampling.items() if v is not None}, model=body.get("model"),
        stream=_flag(body, "stream", False), store=_flag(body, "store", True),
        previous_response_id=body.get("previous_response_id"), tool_choice=body.get("tool_choice") or "auto")


def chat_call(request: ResponsesRequest, earlier: list[dict]) -> tuple[ChatCall, list[dict]]:
    """The call in chat form, and the conversation it carries (without the instructions, which
    each request gives anew) for a later `previous_response_id`. A `function_call_output` for a
    call that neither this request nor the conversation before it made is a 400."""
    made = request.known_calls | {tc.get("id") for m in earlier for tc in m.get("tool_calls") or []}
    for i, call_id in request.outputs:
        if call_id not in made:
            raise RequestRefused(400, f"input[{i}].call_id: no function_call with call_id {call_id!r} was made")
    conversation = [*earlier, *request.items]
    if not conversation:
        raise RequestRefused(400, "input: expected at least one item")
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
             for t in request.tools]
    return ChatCall([*system, *conversation], tools or None, request.sampling, request.model, "responses"), conversation


# ----------------------------------------------------------------------------- the request's parts
def _number(body: dict, name: str) -> float | None:
    value = body.get(name)
    return None if value is None else expect(value, (int, float), name, "a number")


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    return default if value is None else expect(value, bool, name, "true or false")


def _count(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if expect(value, int, name, "an integer") < 1:
        raise RequestRefused(400, f"{name}: expected an integer >= 1, got {value}")
    return value


def _check_text(text: Any) -> None:
    if text is None:
        return
    kind = expect(expect(text, dict, "text", "an object").get("format", {"type": "text"}), dict, "text.format",
                  "an object").get("type")
    if kind != "text":
        raise RequestRefused(400, f"text.format.type: only 'text' is served here, got {kind!r}")


def _check_tool_choice(choice: Any) -> None:
    if choice is None or choice in ("auto", "none", "required"):
        return
    if not (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str)):
        raise RequestRefused(400, "tool_choice: expected 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")


def _check_tool(tool: Any, where: str) -> dict:
    expect(tool, dict, where, "a tool object")
    if tool.get("type") != "function":
        raise RequestRefused(400, f"{where}.type: only function tools are served here, got {tool.get('type')!r}")
    check_fields(tool, {"type", "name", "description", "parameters", "strict", "defer_loading"}, where)
    expect(tool.get("name"), str, f"{where}.name", "a string")
    if tool.get("description") is not None:
        expect(tool["description"], str, f"{where}.description", "a string")
    if tool.get("parameters") is None:
        return {**tool, "parameters": {"type": "object", "properties": {}}}
    expect(tool["parameters"], dict, f"{where}.parameters", "a JSON schema object")
    return tool


def _messages(items: list) -> tuple[list[dict], set[str], list[tuple[int, str]]]:
    """Input items as chat messages, the call ids they make, and the call ids their outputs answer."""
    out: list[dict] = []
    known: set[str] = set()
    outputs: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        expect(item, dict, where, "an item object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            known.add(call["id"])
            if out and out[-1]["role"] == "assistant":  # the same turn: its text, then its calls
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = expect(item.get("call_id"), str, f"{where}.call_id", "a string")
            outputs.append((i, call_id))
            out.append({"role": "tool", "tool_call_id": call_id, "content": _output(item.get("output"), where)})
        elif kind != "reasoning":  # a reasoning item carries nothing a chat template reads
            raise RequestRefused(400, f"{where}.type: unknown item type {kind!r} (served: message, function_call, "
                                      "function_call_output, reasoning)")
    return out, known, outputs


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise RequestRefused(400, f"{where}.role: expected user, system, developer or assistant, got {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        text = content
    else:
        parts = expect(content, list, f"{where}.content", "a string or a list of content parts")
        text = "".join(_text_part(p, f"{where}.content[{j}]") for j, p in enumerate(parts))
    return {"role": "system" if role == "developer" else role, "content": text}


def _text_part(part: Any, where: str) -> str:
    kind = expect(part, dict, where, "a content part object").get("type")
    if kind in NOT_TEXT:
        raise RequestRefused(400, f"{where}.type: {NOT_TEXT[kind]} are not served: this gateway's model reads "
                                  f"text only ({kind!r})")
    if kind in ("input_text", "output_text"):
        return expect(part.get("text"), str, f"{where}.text", "a string")
    if kind == "refusal":
        return expect(part.get("refusal"), str, f"{where}.refusal", "a string")
    raise RequestRefused(400, f"{where}.type: unknown content type {kind!r} (served: input_text, output_text, "
                              "refusal)")


def _function_call(item: dict, where: str) -> dict:
    call_id = expect(item.get("call_id"), str, f"{where}.call_id", "a string")
    name = expect(item.get("name"), str, f"{where}.name", "a string")
    arguments = expect(item.get("arguments"), str, f"{where}.arguments", "a JSON string")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    parts = expect(output, list, f"{where}.output", "a string or a list of content parts")
    return "".join(_text_part(p, f"{where}.output[{j}]") for j, p in enumerate(parts))


# ----------------------------------------------------------------------------- the reply
def response(request: ResponsesRequest, out: PolicyOutput, model: str, *, tokens: bool) -> dict:
    """The policy's reply as a `Response`; `tokens`: with its exact token ids and logprobs."""
    logprobs = [{"token": str(t), "bytes": [], "logprob": lp, "top_logprobs": []}
                for t, lp in zip(out.completion_token_ids, out.completion_logprobs)] if tokens else []
    output: list[dict] = []
    if out.action.content or not out.action.tool_calls:
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": out.action.content, "annotations": [],
                                    "logprobs": logprobs}]})
    output += [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": tc.id, "name": tc.name,
                "arguments": tc.arguments, "status": "completed"} for tc in out.action.tool_calls]
    cut = out.finish_reason == "length"
    reply = {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
             "status": "incomplete" if cut else "completed", "error": None,
             "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
             "instructions": request.instructions, "model": model, "output": output, "parallel_tool_calls": True,
             "previous_response_id": request.previous_response_id, "store": request.store,
             "temperature": request.sampling.get("temperature"), "top_p": request.sampling.get("top_p"),
             "max_output_tokens": request.sampling.get("max_tokens"), "tool_choice": request.tool_choice,
             "tools": request.tools, "text": {"format": {"type": "text"}}, "metadata": {},
             "usage": _usage(out, tokens)}
    if tokens:
        reply |= {"prompt_token_ids": out.prompt_token_ids, "token_ids": out.completion_token_ids,
                  "logprobs": out.completion_logprobs, "version": out.version}
    return reply


def _usage(out: PolicyOutput, tokens: bool) -> dict | None:
    if tokens:
        prompt, completion = len(out.prompt_token_ids), len(out.completion_token_ids)
    elif out.info.get("upstream_usage"):  # an upstream's reply: its own count
        usage = out.info["upstream_usage"]
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    else:
        return None
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def events(reply: dict) -> Iterator[str]:
    """The Response as the Responses API streams it: created, in_progress, each output item
    (added, its text or arguments, done), then completed (or incomplete)."""
    seq = count()

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **fields})}\n\n"

    started = {**reply, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for i, item in enumerate(reply["output"]):
        at = {"item_id": item["id"], "output_index": i}
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_item.added", output_index=i, item={**item, "status": "in_progress",
                                                                             "content": []})
            yield event("response.content_part.added", **at, content_index=0, part={**part, "text": "", "logprobs": []})
            logprobs = [{"token": lp["token"], "logprob": lp["logprob"]} for lp in part["logprobs"]]
            yield event("response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=logprobs)
            yield event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=logprobs)
            yield event("response.content_part.done", **at, content_index=0, part=part)
        else:
            yield event("response.output_item.added", output_index=i, item={**item, "status": "in_progress",
                                                                             "arguments": ""})
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=i, item=item)
    yield event("response.completed" if reply["status"] == "completed" else "response.incomplete", response=reply)


__all__ = ["ResponsesRequest", "chat_call", "events", "parse", "response"]

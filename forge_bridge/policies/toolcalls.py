"""Read a model's reply as its content and tool calls, in whichever format the model wrote them.

Real instruct models do not all write the format their chat template teaches: Qwen2.5-Coder's
template asks for `<tool_call>` tags and the model writes a fenced JSON object. So by default
(`tool_format="any"`) a reply is read in every format (`FORMATS`) present in it:

- marked: Mistral's `[TOOL_CALLS]`, Llama 3's `<|python_tag|>`, Hermes `<tool_call>` blocks
  (`tagged`);
- unmarked: fenced JSON, Python calls in a `tool_code` fence, a reply that is JSON and nothing
  else (`untagged`).

A marked call is a call whatever tool it names, as vLLM's parsers read it: the agent's framework
answers a tool it does not have with an error result and the episode goes on. Unmarked JSON or
Python becomes a call only where it names a tool the request declares; otherwise it is text (an
answer, a code sample). The format the calls were read from is recorded on the step
(`Action.call_format`). A named `tool_format` reads that format only (strict). A reasoning block
(`<think>...</think>`, Qwen3 / DeepSeek-R1 style) is split off first: it is kept in
`Action.reasoning` and never parsed for calls.
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Callable
from functools import partial

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Action
from forge_bridge.policies.tagged import (ARGS, PYTHON_TAG, TOOL_CALLS, action, parse_hermes, parse_llama3_json,
                                          parse_mistral)
from forge_bridge.policies.untagged import Declared, parse_fenced, parse_json

ANY = "any"
"""The reading that accepts every format (the default)."""
READERS: dict[str, Callable[..., Action]] = {
    "hermes": parse_hermes,
    "fenced_json": partial(parse_fenced, kinds=("fenced_json",)),
    "json": parse_json,
    "tool_code": partial(parse_fenced, kinds=("tool_code",)),
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
}
"""Each format's reader: `(text, finish_reason, names) -> Action`."""
FORMATS = tuple(READERS)
"""The tool-call formats a reply is read in, and the values of `Action.call_format`."""
MARKED = ("hermes", "llama3_json", "mistral")
"""The formats whose calls carry markers of their own: read whatever tool they name; the ones a chat
template teaches (`detect_format`), in which a policy writes demonstrations."""
TOOL_CALL_OPEN = "<tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def check_format(tool_format: str, also: tuple[str, ...] = ("auto",)) -> str:
    """`tool_format` if it names a format (or is one of `also`), else a clear error."""
    known = [*also, *FORMATS]
    if tool_format not in known:
        raise InvalidArgument(f"tool_format: expected one of {known}, got {tool_format!r}")
    return tool_format


def formats(tool_format: str, chat_template: str | None) -> tuple[str, str]:
    """A policy's (written, read) formats for its `tool_format` setting: 'auto' writes the format
    the chat template teaches and reads every format; a named format is both (strict)."""
    check_format(tool_format)
    if tool_format == "auto":
        return detect_format(chat_template), ANY
    return tool_format, tool_format


def declared(tools: list[dict] | None) -> Declared | None:
    """The request's tools by name, each with its parameter names in order (None: no check)."""
    if tools is None:
        return None
    names: dict[str, list[str]] = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            names[function["name"]] = list(properties) if isinstance(properties, dict) else []
    return names


def parse(text: str, finish_reason: str | None, tool_format: str = ANY, tools: list[dict] | None = None) -> Action:
    """The reasoning block split off, then the tool calls read in `tool_format` ('any': every
    format), calling only the `tools` declared (None: any name)."""
    check_format(tool_format, also=(ANY,))
    reasoning, rest = split_reasoning(text)
    names = declared(tools)
    try:
        read = (read_any(rest, finish_reason, names) if tool_format == ANY
                else READERS[tool_format](rest, finish_reason, None if tool_format in MARKED else names))
    except (RecursionError, MemoryError) as exc:  # a reply nested past what the readers can hold
        read = action(rest, [], [{"text": rest[:2000], "error": f"reply not readable ({type(exc).__name__})"}],
                      finish_reason)
    read.reasoning = reasoning
    return read


def read_any(text: str, finish_reason: str | None, names: Declared | None) -> Action:
    """Every format present, each reading what the ones before it left: the marked formats by their
    markers (Llama 3's tag only where the reply begins with it, as Llama writes it, so prose that
    names it hides nothing; any tool name), then fences, then the JSON calls the rest begins with
    (declared tools only)."""
    readers: list[Callable[..., Action]] = []
    if TOOL_CALLS in text:
        readers.append(parse_mistral)
    if text.lstrip().startswith(PYTHON_TAG):
        readers.append(parse_llama3_json)
    if TOOL_CALL_OPEN in text:
        readers.append(parse_hermes)
    calls, errors, read, rest = [], [], [], text
    for reader in readers + [parse_fenced, parse_json]:
        step = reader(rest, finish_reason, None if reader in readers else names)
        calls += step.tool_calls
        errors += step.parse_errors
        read += [step.call_format] if step.call_format else []
        rest = step.content
    return action(rest, calls, errors, finish_reason, read[0] if read else "")


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, the rest): a leading `<think>...</think>` block (or an unclosed one, cut by
    max_tokens: all of it is reasoning). Templates that open the block in the prompt leave only
    `...</think>` in the reply; that is split the same way."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        inner = stripped[len(THINK_OPEN):]
        thought, sep, rest = inner.partition(THINK_CLOSE)
        return (thought.strip(), rest) if sep else (inner.strip(), "")
    if THINK_CLOSE in text and THINK_OPEN not in text:
        thought, _, rest = text.partition(THINK_CLOSE)
        return thought.strip(), rest
    return "", text


OPENINGS = {"hermes": '<tool_call>\n{"name": "'}
"""How a tool call begins in each format, up to the tool's name (what `Sampling.explore` forces)."""


def render_calls(content: str, calls: list[tuple[str, dict]], tool_format: str = "hermes") -> str:
    """A reply as a model of that format writes it: `content`, then the (name, arguments) calls;
    `parse` reads it back to the same content and calls."""
    if not calls:
        return content
    lead = content + "\n" if content else ""
    objects = [{"name": n, "arguments": a} for n, a in calls]
    if tool_format == "hermes":
        return lead + "\n".join(f"{TOOL_CALL_OPEN}\n{json.dumps(o)}\n</tool_call>" for o in objects)
    if tool_format == "fenced_json":
        return lead + "```json\n" + json.dumps(objects[0] if len(objects) == 1 else objects) + "\n```"
    if tool_format == "json":  # no room for content beside the calls
        return json.dumps(objects[0] if len(objects) == 1 else objects)
    if tool_format == "tool_code":
        if any(not k.isidentifier() or keyword.iskeyword(k) for _, a in calls for k in a):
            raise InvalidArgument("tool_format 'tool_code': an argument name that Python call syntax cannot "
                                  f"write ({[k for _, a in calls for k in a]}); use 'fenced_json'")
        lines = [f"{n}({', '.join(f'{k}={_python(v)}' for k, v in a.items())})" for n, a in calls]
        return lead + "```tool_code\n" + "\n".join(lines) + "\n```"
    if tool_format == "llama3_json":  # the format has no room for content beside its calls
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    if tool_format == "mistral":
        return content + TOOL_CALLS + json.dumps(objects)
    raise InvalidArgument(f"tool_format: expected one of {list(FORMATS)}, got {tool_format!r}")


def _python(value: object) -> str:
    """A JSON value as a Python literal (`true` -> `True`)."""
    return repr(json.loads(json.dumps(value)))


def detect_format(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches its model (one of `MARKED`): Mistral's
    `[TOOL_CALLS]`, Llama 3's header tokens, else Hermes `<tool_call>` (also the embedded model's)."""
    template = chat_template or ""
    if TOOL_CALLS in template:
        return "mistral"
    if TOOL_CALL_OPEN in template:
        return "hermes"
    if "<|start_header_id|>" in template or PYTHON_TAG in template:
        return "llama3_json"
    return "hermes"


FORMAT_MARKERS = (TOOL_CALLS, ARGS, PYTHON_TAG, THINK_OPEN, THINK_CLOSE)
"""Tokens a reply is parsed by, kept when a decoder drops the other special tokens."""

"""Where each argument of a Hermes tool call lies in a completion's tokens, for rewards on one
argument rather than the whole call (`Episode.span_reward`).

    <tool_call>{"name": "f", "arguments": {"a": 1, "b": "x"}}</tool_call>
                                           ^^^^^^                 "a": from after `{` to the end of 1
                                                 ^^^^^^^^^^       "b": from after 1 (its `,` included) to the end of "x"
                                                           ^      close: from after "x" through the `}`

An argument's span starts where the previous one ended, so it holds the decision to write it (the
`,` or the first key); `close` holds the decision to stop writing arguments. The call is the one
the Hermes parser reads: the first `<tool_call>` block after any reasoning block that parses. In
tokens, a span holds every token that writes one of its characters, so a token that ends one
value and starts the next argument (`",`) is in both spans and gets both rewards.

`CallSpans.members` splits each argument further, into the decisions that wrote it: the
separator (go on), the key (which argument) and the value (what it is); `reward_decisions`
rewards each of them in the state it was made in.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.policies.tagged import TOOL_CALL_BLOCK, parse_call
from forge_bridge.policies.toolcalls import split_reasoning

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class CallSpans:
    """Spans [start, end) of the first tool call's parts, in characters or in tokens."""

    arguments: dict[str, tuple[int, int]]
    """Argument name -> its span (the separator before it included)."""
    close: tuple[int, int]
    """From the end of the last argument through the `}` that closes the arguments."""
    members: tuple[tuple[str, tuple[int, int] | None, tuple[int, int], tuple[int, int]], ...] = ()
    """Each argument in the order written, split into its decisions: (name, separator, key, value).
    The separator runs from the end of the previous value to the key (the `,`: go on writing
    arguments; None before the first), the key from its `"` through the `:` (which argument), the
    value from its first character to its end (what it is)."""


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _members(text: str, i: int) -> tuple[list[tuple[str, int, int, int, int, int]], int]:
    """The members of the JSON object whose `{` is at i: (key, span start, key start, colon, value
    start, value end) each, and the index of its closing `}`. Raises ValueError or IndexError when
    malformed."""
    if text[i] != "{":
        raise ValueError("not an object")
    members: list[tuple[str, int, int, int, int, int]] = []
    start = i + 1
    j = _skip_space(text, start)
    if text[j] == "}":
        return members, j
    while True:
        key_start = j
        key, j = _DECODER.raw_decode(text, j)
        if not isinstance(key, str):
            raise ValueError("a key that is not a string")
        j = _skip_space(text, j)
        if text[j] != ":":
            raise ValueError("no ':' after a key")
        colon = j
        value_start = _skip_space(text, j + 1)
        _, value_end = _DECODER.raw_decode(text, value_start)
        members.append((key, start, key_start, colon, value_start, value_end))
        j = _skip_space(text, value_end)
        if text[j] == "}":
            return members, j
        if text[j] != ",":
            raise ValueError("no ',' or '}' after a value")
        start = value_end
        j = _skip_space(text, j + 1)


def argument_char_spans(text: str) -> CallSpans | None:
    """The character spans of the arguments of the call `parse_hermes` reads first in `text` (after
    a reasoning block); None when no block parses or its arguments are not a JSON object."""
    _, rest = split_reasoning(text)
    offset = len(text) - len(rest)
    for block in TOOL_CALL_BLOCK.finditer(rest):
        try:
            parse_call(block.group(1).strip())
        except ValueError:
            continue  # the parser skips it too
        try:
            outer, _ = _members(text, _skip_space(text, offset + block.start(1)))
            # json keeps the last of a repeated key; the parser prefers 'arguments' to 'parameters'
            found = [m for m in outer if m[0] == "arguments"] or [m for m in outer if m[0] == "parameters"]
            if not found:
                return None
            members, close = _members(text, found[-1][4])
        except (ValueError, IndexError):
            return None  # e.g. arguments given as a JSON string
        spans = {key: (start, end) for key, start, _, _, _, end in members}
        last = members[-1][5] if members else found[-1][4] + 1
        parts = tuple((key, (start, key_start) if k else None, (key_start, colon + 1), (value_start, end))
                      for k, (key, start, key_start, colon, value_start, end) in enumerate(members))
        return CallSpans(spans, (last, close + 1), parts)
    return None


def token_ends(tokenizer: Any, token_ids: Sequence[int]) -> tuple[str, list[int]]:
    """The decoded completion (special tokens kept) and, per token, the end of its text in it.
    Exact for any tokenizer (every prefix is decoded), so quadratic: about 0.03 s for 500 tokens and
    0.5 s for 2,000 with the embedded model's tokenizer."""
    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    text = decode(token_ids)
    ends, previous = [], 0
    for k in range(len(token_ids)):
        previous = max(previous, min(len(decode(token_ids[:k + 1])), len(text)))
        ends.append(previous)
    return text, ends


def argument_token_spans(tokenizer: Any, token_ids: Sequence[int]) -> CallSpans | None:
    """`argument_char_spans` of the decoded completion, as token spans: each holds every token that
    writes one of its characters. None where there is no well-formed call."""
    text, ends = token_ends(tokenizer, token_ids)
    spans = argument_char_spans(text)
    if spans is None:
        return None

    def tokens(span: tuple[int, int]) -> tuple[int, int]:  # tokens k with ends[k] > start and ends[k-1] < end
        return bisect.bisect_right(ends, span[0]), min(bisect.bisect_left(ends, span[1]) + 1, len(ends))

    parts = tuple((name, sep and tokens(sep), tokens(key), tokens(value)) for name, sep, key, value in spans.members)
    return CallSpans({k: tokens(s) for k, s in spans.arguments.items()}, tokens(spans.close), parts)


def reward_arguments(episode: Any, tokenizer: Any, verdicts: dict[str, bool], missing: bool, step: int = -1) -> int:
    """Per-argument credit on a step's first tool call: +1 on the span of each argument `verdicts`
    calls right, -1 on each it calls wrong (a wrong value, or an argument that should not be
    there), and on `close` -1 when an argument is `missing` (it stopped too early), else +1; keyed
    'argument:<name>' and 'close' for GRPO's `span_baseline='group'`.
    Returns how many spans were rewarded: 0 where the completion holds no well-formed call, or
    its arguments are not those `verdicts` names."""
    spans = _judged_spans("reward_arguments", episode, tokenizer, verdicts, step)
    if spans is None:
        return 0
    rewarded = [(1.0 if ok else -1.0, spans.arguments[name], "argument:" + name) for name, ok in verdicts.items()]
    rewarded.append((-1.0 if missing else 1.0, spans.close, "close"))
    return _give(episode, rewarded, step)


def reward_decisions(episode: Any, tokenizer: Any, asked: Collection[str], right: Mapping[str, bool],
                     step: int = -1) -> int:
    """Per-decision credit on a step's first tool call, each decision judged in the state it was
    made in: a separator (`,`) +1 when an argument `asked` for was still unwritten, else -1; a key
    +1 when it is asked for and not yet written, else -1; an asked argument's value +1 when
    `right[name]`, else -1 (an argument not asked for gets no value reward: its key had it; nor does
    one written twice, whose verdict is of the last copy, the one JSON keeps);
    `close` +1 when every asked argument was written, else -1. Keyed 'separator', 'key', 'value'
    and 'close'. `right` names every argument written (what `argument_verdicts` gives).
    Returns how many spans were rewarded: 0 where the completion holds no well-formed call, or
    its arguments are not those `right` names."""
    spans = _judged_spans("reward_decisions", episode, tokenizer, right, step)
    if spans is None:
        return 0
    written: set[str]
    rewarded, written = [], set()
    copies = [m[0] for m in spans.members]
    for name, separator, key, value in spans.members:
        if separator is not None:
            rewarded.append((1.0 if set(asked) - written else -1.0, separator, "separator"))
        fresh = name in asked and name not in written
        rewarded.append((1.0 if fresh else -1.0, key, "key"))
        if fresh and copies.count(name) == 1:
            rewarded.append((1.0 if right[name] else -1.0, value, "value"))
        written.add(name)
    rewarded.append((-1.0 if set(asked) - written else 1.0, spans.close, "close"))
    return _give(episode, rewarded, step)


def _judged_spans(what: str, episode: Any, tokenizer: Any, judged: Collection[str], step: int) -> CallSpans | None:
    """The token spans of a step's first call, or None where it holds no well-formed call or its
    arguments are not the `judged` ones (then no span is rewarded rather than a wrong one)."""
    steps = episode.trajectory.transitions
    if not -len(steps) <= step < len(steps):
        raise InvalidArgument(f"{what}: no step {step} in an episode of {len(steps)} steps")
    spans = argument_token_spans(tokenizer, steps[step].completion_token_ids)
    return spans if spans is not None and set(spans.arguments) == set(judged) else None


def _give(episode: Any, rewarded: list[tuple[float, tuple[int, int], str]], step: int) -> int:
    """Record (value, token span, key) rewards on a step; how many."""
    for value, (start, end), key in rewarded:
        episode.span_reward(value, start, end, step=step, key=key)
    return len(rewarded)


__all__ = ["CallSpans", "argument_char_spans", "argument_token_spans", "reward_arguments", "reward_decisions",
           "token_ends"]

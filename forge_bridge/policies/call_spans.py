"""Where each argument of a Hermes tool call lies in a completion's tokens, for rewards on one
argument rather than the whole call (`Episode.span_reward`).

    <tool_call>{"name": "f", "arguments": {"a": 1, "b": "x"}}</tool_call>
                                          ^^^^^^^^               "a": from after `{` to the end of 1
                                                  ^^^^^^^^^      "b": from after 1 (the `,` included) to the end of "x"
                                                           ^     close: from after "x" through the `}`

An argument's span starts where the previous one ended, so it holds the decision to write it (the
`,` or the first key); `close` holds the decision to stop writing arguments. In tokens, a token
belongs to the argument span that holds its last character (`",`, ending a value and starting
another, is the next argument's), and `close` runs through the token that writes the `}`.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any, Sequence

_DECODER = json.JSONDecoder()
_OPEN = "<tool_call>"


@dataclass(frozen=True)
class CallSpans:
    """Spans [start, end) of the first tool call's parts, in characters or in tokens."""

    arguments: dict[str, tuple[int, int]]
    """Argument name -> its span (the separator before it included)."""
    close: tuple[int, int]
    """From the end of the last argument through the `}` that closes the arguments."""


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _members(text: str, i: int) -> tuple[list[tuple[str, int, int, int]], int]:
    """The members of the JSON object whose `{` is at i: (key, span start, value start, value end)
    each, and the index of its closing `}`. Raises ValueError or IndexError when malformed."""
    if text[i] != "{":
        raise ValueError("not an object")
    members: list[tuple[str, int, int, int]] = []
    start = i + 1
    j = _skip_space(text, start)
    if text[j] == "}":
        return members, j
    while True:
        key, j = _DECODER.raw_decode(text, j)
        if not isinstance(key, str):
            raise ValueError("a key that is not a string")
        j = _skip_space(text, j)
        if text[j] != ":":
            raise ValueError("no ':' after a key")
        value_start = _skip_space(text, j + 1)
        _, value_end = _DECODER.raw_decode(text, value_start)
        members.append((key, start, value_start, value_end))
        j = _skip_space(text, value_end)
        if text[j] == "}":
            return members, j
        if text[j] != ",":
            raise ValueError("no ',' or '}' after a value")
        start = value_end
        j = _skip_space(text, j + 1)


def argument_char_spans(text: str) -> CallSpans | None:
    """The character spans of the first `<tool_call>`'s arguments in `text`; None when it has no
    such call, or its JSON (up to the arguments' closing `}`) is malformed, or its arguments are not
    an object."""
    at = text.find(_OPEN)
    if at < 0:
        return None
    try:
        outer, _ = _members(text, _skip_space(text, at + len(_OPEN)))
        found = [m for m in outer if m[0] in ("arguments", "parameters")]
        if not found:
            return None
        members, close = _members(text, found[0][2])
    except (ValueError, IndexError):
        return None
    spans = {key: (start, end) for key, start, _, end in members}
    last = members[-1][3] if members else found[0][2] + 1
    return CallSpans(spans, (last, close + 1))


def token_ends(tokenizer: Any, token_ids: Sequence[int]) -> tuple[str, list[int]]:
    """The decoded completion and, per token, the end of its text in it (special tokens kept, as
    the embedded policy decodes tool calls)."""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    ends, previous = [], 0
    for k in range(len(token_ids)):
        previous = max(previous, min(len(tokenizer.decode(list(token_ids[:k + 1]), skip_special_tokens=False)),
                                     len(text)))
        ends.append(previous)
    return text, ends


def argument_token_spans(tokenizer: Any, token_ids: Sequence[int]) -> CallSpans | None:
    """`argument_char_spans` of the decoded completion, as token spans (a token in the span that
    holds its last character); None where there is no well-formed call. Spans that hold no whole
    token's end are left out."""
    text, ends = token_ends(tokenizer, token_ids)
    spans = argument_char_spans(text)
    if spans is None:
        return None

    def tokens(span: tuple[int, int]) -> tuple[int, int]:  # tokens k with start < ends[k] <= end
        return bisect.bisect_right(ends, span[0]), bisect.bisect_right(ends, span[1])

    arguments = {k: tokens(s) for k, s in spans.arguments.items()}
    brace = spans.close[1] - 1  # the token that writes the arguments' `}` (`}}` closes the call too)
    close = (bisect.bisect_right(ends, spans.close[0]), min(bisect.bisect_right(ends, brace) + 1, len(ends)))
    return CallSpans({k: s for k, s in arguments.items() if s[0] < s[1]}, close)


def reward_arguments(episode: Any, tokenizer: Any, verdicts: dict[str, bool], missing: bool, step: int = -1) -> int:
    """Per-argument credit on a step's first tool call: +1 on the span of each argument `verdicts`
    calls right, -1 on each it calls wrong (a wrong value, or an argument that should not be
    there), and on `close` -1 when an argument is `missing` (it stopped too early), else +1.
    Arguments the completion's text does not show are skipped; returns how many spans were
    rewarded (0 where the completion holds no well-formed call)."""
    transition = episode.trajectory.transitions[step]
    spans = argument_token_spans(tokenizer, transition.completion_token_ids)
    if spans is None:
        return 0
    rewarded = [(1.0 if ok else -1.0, spans.arguments[name]) for name, ok in verdicts.items() if name in spans.arguments]
    if spans.close[0] < spans.close[1]:
        rewarded.append((-1.0 if missing else 1.0, spans.close))
    for value, (start, end) in rewarded:
        episode.span_reward(value, start, end, step=step)
    return len(rewarded)


__all__ = ["CallSpans", "argument_char_spans", "argument_token_spans", "reward_arguments", "token_ends"]

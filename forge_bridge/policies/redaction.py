"""Redaction: what a step would record, scrubbed before it is written, tokens included.

`Redaction(redact, tokenizer)` is given to the recorder (`Recorder(store, redaction=...)`): each
step, as it is appended and each time it is written again (its tool results arriving), has
`redact(text) -> text` applied to every string it holds (the messages the model was shown, its
reply, its tool calls' arguments, the tool results, what `info` keeps). A step the function
leaves unchanged is written as it is, with the exact tokens the policy sampled. A step it
changes is written with its token ids rendered again from the scrubbed text, in the tokenizer's
chat template and tool-call format (`scripted.rendered`), its log-probabilities zeroed and
`info["redacted"]` set: what was removed is never written, in text or in tokens. The step is then
no longer the policy's own sample (a demonstration of the scrubbed behaviour, at most).

What the agent sees is untouched: only what is written is scrubbed.
"""

from __future__ import annotations

from typing import Any, Callable

from forge_bridge.core.errors import WrongType
from forge_bridge.core.types import Transition
from forge_bridge.policies.scripted import rendered
from forge_bridge.policies.toolcalls import formats
from forge_bridge.policies.upstream import arguments

KEEP = frozenset({"version", "slot", "finish_reason", "role", "id", "type", "tool_call_id"})
"""Keys whose string values are identifiers, never scrubbed (a tool call's id must still match)."""


def scrub(value: Any, redact: Callable[[str], str], key: str | None = None) -> Any:
    """`value` with `redact` applied to every string in it (dict keys and `KEEP` fields aside)."""
    if isinstance(value, str):
        if key in KEEP:
            return value
        out = redact(value)
        if not isinstance(out, str):
            raise WrongType(f"redact: expected a function str -> str, it returned {type(out).__name__}")
        return out
    if isinstance(value, dict):
        return {k: scrub(v, redact, k) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, redact, key) for v in value]
    return value


class Redaction:
    """`redact` applied to each step before it is written; its tokens rendered by `tokenizer`."""

    def __init__(self, redact: Callable[[str], str], tokenizer: Any, tool_format: str = "auto") -> None:
        if not callable(redact):
            raise WrongType(f"redact: expected a function str -> str, got {type(redact).__name__}")
        self.redact, self.tokenizer = redact, tokenizer
        self.tool_format = formats(tool_format, getattr(tokenizer, "chat_template", None))[0]

    def __call__(self, transition: Transition) -> Transition:
        before = transition.to_dict()
        after = scrub(before, self.redact)
        if after == before:
            return transition  # nothing to remove: the exact sampled tokens are kept
        t = Transition.from_dict(after)
        out = rendered(self.tokenizer, self.tool_format, t.observation.messages, t.observation.tools,
                       t.action.content, [(c.name, arguments(c.arguments)) for c in t.action.tool_calls],
                       1 << 30, t.version, {}, cut=t.action.finish_reason == "length")
        t.prompt_token_ids, t.completion_token_ids = out.prompt_token_ids, out.completion_token_ids
        t.completion_logprobs = out.completion_logprobs
        t.info["redacted"] = True
        t.__post_init__()
        return t


__all__ = ["KEEP", "Redaction", "scrub"]

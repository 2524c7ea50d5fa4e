"""A policy that answers from a script instead of a model, with real token ids.

Demonstrations for a warm start are recorded by running the ordinary agent with this policy:
the script decides the reply text (an expert that knows the answer), and the target model's
tokenizer turns prompt and reply into the token ids the trainer learns from, exactly as the
model itself would have to produce them. Logprobs are recorded as 0 (the script is certain).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.errors import InvalidArgument, Unsupported
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling
from forge_bridge.policies.messages import normalize_messages
from forge_bridge.policies.toolcalls import PARSERS, detect_format, parse

Script = Callable[[list[dict], "list[dict] | None"], str]
"""(messages, tools) -> the assistant's reply text, tool calls written in the policy's format."""


class ScriptedPolicy(Policy):
    def __init__(self, script: Script, tokenizer: Any, tool_format: str = "auto") -> None:
        """`tool_format`: the format the script writes tool calls in, and replies are parsed in
        ('hermes', 'llama3_json', 'mistral'; 'auto': the target model's, from its chat
        template, as `LocalPolicy` parses that model's own replies)."""
        super().__init__()
        if tool_format != "auto" and tool_format not in PARSERS:
            raise InvalidArgument(f"tool_format: expected 'auto' or one of {sorted(PARSERS)}, got {tool_format!r}")
        self.script = script
        self.tokenizer = tokenizer
        self.tool_format = (detect_format(getattr(tokenizer, "chat_template", None))
                            if tool_format == "auto" else tool_format)

    def _chat(self, messages, tools, sampling: Sampling, adapter) -> PolicyOutput:
        messages = normalize_messages(messages)
        prompt = self.tokenizer.apply_chat_template(messages, tools=tools or None,
                                                    add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        text = self.script(messages, tools)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ended = len(ids) < sampling.max_tokens  # room for the end-of-turn token too
        ids = ids if ended else ids[:sampling.max_tokens]  # cut as a model hitting max_tokens is
        completion = ids + [self.tokenizer.eos_token_id] if ended else ids
        reply = text if ended else self.tokenizer.decode(ids, skip_special_tokens=False)  # specials such as [TOOL_CALLS] kept
        return PolicyOutput(action=parse(reply, "stop" if ended else "length", self.tool_format),
                            prompt_token_ids=prompt, completion_token_ids=completion,
                            completion_logprobs=[0.0] * len(completion), adapter=adapter,
                            info={"scripted": True})

    def _load(self, path: Path, version: str) -> None:
        raise Unsupported("a scripted policy has no weights to adapt")

    def _unload(self, version: str) -> None:
        pass

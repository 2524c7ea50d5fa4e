"""A policy that answers from a script instead of a model, with real token ids.

Demonstrations for a warm start are recorded by running the ordinary agent with this policy:
the script decides the reply text (an expert that knows the answer), and the target model's
tokenizer turns prompt and reply into the token ids the trainer learns from, exactly as the
model itself would have to produce them. Logprobs are recorded as 0 (the script is certain).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.errors import Unsupported
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling
from forge_bridge.policies.messages import normalize_messages
from forge_bridge.policies.toolcalls import parse_hermes

Script = Callable[[list[dict], "list[dict] | None"], str]
"""(messages, tools) -> the assistant's reply text, Hermes tool calls included."""


class ScriptedPolicy(Policy):
    def __init__(self, script: Script, tokenizer: Any) -> None:
        super().__init__()
        self.script = script
        self.tokenizer = tokenizer

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
        reply = self.tokenizer.decode(ids, skip_special_tokens=True)
        return PolicyOutput(action=parse_hermes(reply, "stop" if ended else "length"),
                            prompt_token_ids=prompt, completion_token_ids=completion,
                            completion_logprobs=[0.0] * len(completion), adapter=adapter,
                            info={"scripted": True})

    def _load(self, path: Path, version: str) -> None:
        raise Unsupported("a scripted policy has no weights to adapt")

    def _unload(self, version: str) -> None:
        pass

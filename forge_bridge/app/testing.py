"""Tiny models taught fixed replies, for tests and benchmarks that need predictable outputs.

A random tiny model's greedy output is near-uniform noise that flips with bf16 rounding; a few
dozen optimiser steps make it answer chosen prompts with chosen replies (a tool call, then an
answer), and a LoRA trained the same way gives each adapter version a reply of its own, so a
test can tell which version served a call from the text alone.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

from forge_bridge.policies import models
from forge_bridge.policies.messages import prompt_ids

Example = tuple[list[dict], list[dict] | None, str]
"""(messages, tools, reply text the model should produce, without the end-of-turn token)."""

# Exactly the schema LangChain derives from `@tool def add(a: int, b: int) -> int: "Add two integers."`
# (key order included), so a taught model sees the same prompt from raw clients and from agents.
ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "type": "object"}}}
ASK = [{"role": "user", "content": "What is 2 plus 3?"}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
AFTER_TOOL: list[dict] = ASK + [
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
TOOL_ERROR = "Error: RuntimeError: calculator is on fire"
AFTER_ERROR: list[dict] = AFTER_TOOL[:-1] + [{"role": "tool", "tool_call_id": "call_1", "content": TOOL_ERROR}]
BASE_EXAMPLES: list[Example] = [(ASK, [ADD_TOOL], CALL), (AFTER_TOOL, [ADD_TOOL], "The answer is 5."),
                                (AFTER_ERROR, [ADD_TOOL], "Sorry, the tool failed.")]


def _batch(tokenizer: Any, examples: Sequence[Example]) -> tuple[Any, Any]:
    import torch

    rows, masks = [], []
    for messages, tools, reply in examples:
        prompt = prompt_ids(tokenizer, messages, tools)  # as LocalPolicy renders them
        target = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append(list(prompt) + target)
        masks.append([0] * len(prompt) + [1] * len(target))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, mask) in enumerate(zip(rows, masks)):
        ids[i, :len(row)] = torch.tensor(row)
        attn[i, :len(row)] = 1
        labels[i, :len(row)] = torch.where(torch.tensor(mask) == 1, torch.tensor(row), -100)
    return (ids, attn), labels


def teach(model: Any, tokenizer: Any, examples: Sequence[Example], *, steps: int = 150,
          lr: float = 1e-2, seed: int = 0) -> Any:
    """Fit `model` (all weights, in place) until it reproduces each reply; returns it."""
    import torch

    torch.manual_seed(seed)
    (ids, attn), labels = _batch(tokenizer, examples)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    model.eval()
    return model


def teach_adapter(model: Any, tokenizer: Any, examples: Sequence[Example], path: str | Path, *,
                  rank: int = 16, steps: int = 300, lr: float = 1e-2, seed: int = 0) -> Path:
    """Train a LoRA (every linear layer) on a copy of `model` to give these replies and save it to `path`."""
    from peft import LoraConfig, get_peft_model

    with models.peft_wrapping():
        peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules="all-linear",
            lora_dropout=0.0))
    teach(peft_model, tokenizer, examples, steps=steps, lr=lr, seed=seed)
    peft_model.save_pretrained(str(path))
    return Path(path)


def taught_tiny_model(path: str | Path, *, arch: str = "llama", seed: int = 0) -> Path:
    """A tiny model saved at `path` that answers `ASK` with a call to `add` and, once the tool
    result is in, with 'The answer is 5.' (or, after `TOOL_ERROR`, 'Sorry, the tool failed.')"""
    model, tokenizer = models.tiny(arch, seed=seed)
    teach(model, tokenizer, BASE_EXAMPLES, seed=seed)
    return models.save(model, tokenizer, path)

"""A policy's per-token judgement of tokens another policy sampled (`Policy.score`), for the
embedded model: one forward pass over the part of prompt + completion that no earlier scored
sequence covers.

A teacher scores a training iteration's steps one after another: the rollouts of a group share
their first prompt (system prompt, tools, question), and an episode's next step extends the
last one. The KV of each scored sequence is kept (`PrefixCache`, keyed by adapter), so a
sequence that starts as an earlier one did is fed from where they part. Only the completion's
positions go through the output layer. Models with sliding-window layers are scored whole.
"""

from __future__ import annotations

from typing import Any

from forge_bridge.policies.decoding import PrefixCache, reusable


def completion_logprobs(model: Any, prompt: list[int], completion: list[int], *, device: str, adapter: str | None,
                        prefixes: PrefixCache | None, extra: dict | None = None) -> tuple[list[float], bool]:
    """([C] log P(completion[k] | prompt, completion[:k]) under `model`, whether `prefixes` may
    keep being used). `extra`: keyword arguments of the forward pass (peft's adapter names)."""
    import torch
    from transformers import DynamicCache

    ids = prompt + completion
    hit = prefixes.match(adapter, prompt) if prefixes is not None else None  # leaves prompt[-1] to feed
    reused, past = hit if hit is not None else (0, None)
    cache = DynamicCache([(k[:, :, :reused], v[:, :, :reused]) for k, v in past]) if past else None
    feed = torch.tensor([ids[reused:]], device=device)
    positions = torch.arange(reused, len(ids), device=device)[None]
    out = model(input_ids=feed, position_ids=positions, cache=cache, use_cache=prefixes is not None,
                logits_to_keep=len(completion) + 1, **(extra or {}))
    logits = out.logits[0, -len(completion) - 1:-1].float()  # [C, V]: at prompt[-1] .. completion[-2]
    taken = torch.tensor(completion, device=logits.device)[:, None]
    scores = torch.log_softmax(logits, -1).gather(-1, taken)[:, 0].cpu().tolist()
    if prefixes is None:
        return scores, False
    layers = out.cache.layers
    if not reusable(layers):  # sliding windows
        return scores, False
    prefixes.put(adapter, ids, [(layer.keys, layer.values) for layer in layers])
    return scores, True


__all__ = ["completion_logprobs"]

"""Continuous batching for the embedded policy: one running batch that requests join and leave
between decode steps.

A request arriving while others decode does not wait for them to finish: its prompt is
prefilled (together with any others that arrived meanwhile), its KV cache is left-padded to the
running batch's length and stacked onto it, and from the next step on it decodes with the rest.
A row leaves as soon as it ends. Each row keeps its own position ids, sampling settings, seeded
generator and adapter (peft's mixed-adapter batches), so a row decodes the same tokens whether
it ran alone or joined a batch mid-flight (up to the float rounding of padded attention).

A GRPO group's rollouts start together with the same prompt: it is prefilled once, and each
row gets a copy of its KV.

The next call of an episode usually extends the last one (the same conversation plus a reply
and a tool result): `PrefixCache` keeps the KV of finished calls, and a call whose prompt starts
with the same tokens (under the same adapter) prefills only the rest.

State between steps, for the n running rows: the KV cache and the attention mask over the L
tokens fed so far ([n, L], left padding masked out), and per row the token sampled last, not yet
fed, and its position.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from forge_bridge.policies.machine import synchronize
from forge_bridge.policies.next_token import ForcedOpening, sample_next

BASE = "__base__"  # peft's name for "no adapter" in a mixed batch


@dataclass
class Row:
    """One request being decoded."""

    request: Any
    """The caller's request: `.prompt` (token ids), `.sampling`, `.adapter`, `.future`."""
    limit: int
    """Most tokens it may generate (its max_tokens, cut to the model's context)."""
    generator: Any
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    position: int = 0
    """Position id of the next token fed (the last sampled one)."""
    done: bool = False
    opening: ForcedOpening | None = None
    """Exploration by a forced opening (`request.opening`), else None."""


class PrefixCache:
    """KV caches of finished calls, keyed by their fed token ids and adapter, least recently used
    first out once they hold more than `max_tokens` tokens in all."""

    def __init__(self, max_tokens: int, min_reuse: int = 16) -> None:
        self.max_tokens, self.min_reuse = max_tokens, min_reuse
        self._entries: OrderedDict[int, tuple[str | None, list[int], list]] = OrderedDict()
        self._tokens = 0
        self._next = 0

    def put(self, adapter: str | None, ids: list[int], kv: list) -> None:
        """Keep `kv` (per layer (keys, values) [1, heads, len(ids), dim]) for these ids."""
        if not self.max_tokens or len(ids) > self.max_tokens or len(ids) < self.min_reuse:
            return
        self._entries[self._next] = (adapter, ids, kv)
        self._next += 1
        self._tokens += len(ids)
        while self._tokens > self.max_tokens:
            _, (_, old, _) = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def match(self, adapter: str | None, prompt: list[int]) -> tuple[int, list] | None:
        """(n, kv) of the entry sharing the longest prefix with `prompt` (at least `min_reuse`
        tokens, at most all but its last token, so something is left to feed), or None."""
        best, best_key = 0, None
        for key, (owner, ids, _) in self._entries.items():
            if owner != adapter:
                continue
            n = len(os.path.commonprefix([ids, prompt]))
            if n > best:
                best, best_key = n, key
        best = min(best, len(prompt) - 1)
        if best_key is None or best < self.min_reuse:
            return None
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key][2]

    def forget(self, adapter: str | None) -> None:
        """Drop the entries of an adapter that is no longer served."""
        for key in [k for k, (owner, _, _) in self._entries.items() if owner == adapter]:
            self._tokens -= len(self._entries.pop(key)[1])

    def __len__(self) -> int:
        return len(self._entries)


def reusable(layers: list) -> bool:
    """Whether every layer of a transformers cache grows plainly, one column a token (no sliding
    window), so its KV can be cut by column, padded and reused later."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in layers)


class Decoder:
    """The running batch of one model (`model_for()` gives the model to call: plain or peft)."""

    def __init__(self, model_for: Callable[[], Any], *, device: str, pad_id: int, eos_id: int,
                 max_context: int, uses_adapters: Callable[[], bool], prefixes: PrefixCache | None = None,
                 adapter_name: Callable[[str | None], str | None] = lambda version: version,
                 share_prefill: bool = True) -> None:
        self.model_for, self.uses_adapters, self.adapter_name = model_for, uses_adapters, adapter_name
        self.share_prefill = share_prefill
        """Whether requests admitted together with the same prompt and adapter are fed once."""
        self.device, self.pad_id, self.eos_id, self.max_context = device, pad_id, eos_id, max_context
        self.prefixes = prefixes
        self.reused_tokens = 0
        """Prompt tokens not prefilled because a finished call's KV covered them."""
        self.prefilled_tokens = 0
        """Prompt tokens fed through the model in prefill passes."""
        self.shared_tokens = 0
        """Prompt tokens not prefilled because a request prefilled beside them had the same prompt."""
        self.prefill_s = 0.0
        """Seconds spent in prefill passes."""
        self.decoded_tokens = 0
        """Tokens fed in decode steps (one per running row per step)."""
        self.decode_s = 0.0
        """Seconds spent in decode steps."""
        self.joinable = True
        """Whether rows can join mid-flight: plain growing caches only (no sliding windows)."""
        self.rows: list[Row] = []
        self.cache: Any = None
        self.mask: Any = None  # [n, L]
        self.prefills = 0
        """Prefill passes run (each admits every request that arrived together)."""
        self.steps = 0
        """Decode steps run (each one forward pass over every running row)."""

    # ------------------------------------------------------------------ joining
    def admit(self, requests: list) -> list[Row]:
        """Prefill `requests`, sample each one's first token, and stack them onto the running
        batch; returns the rows that already ended (their first token ended them). Requests
        whose prompt extends a finished call's tokens prefill only the rest, together; the
        others prefill together."""
        rows = [self._row(r) for r in requests]
        ended: list[Row] = []
        fresh, hits = [], []
        for row in rows:
            hit = self.prefixes.match(row.request.adapter, row.request.prompt) if self.prefixes else None
            if hit is None:
                fresh.append(row)
            else:
                hits.append((row, hit))
        if hits:
            ended += self._prefill([row for row, _ in hits], [hit for _, hit in hits])
        if fresh:
            ended += self._prefill(fresh)
        return ended

    def _prefill(self, rows: list[Row], pasts: list[tuple[int, list]] | None = None) -> list[Row]:
        """One forward pass over the rows' prompts (with `pasts`, each row's first `reused`
        tokens come from that cached KV and only the rest is fed). Rows with the same prompt
        under the same adapter (a GRPO group's rollouts, starting together) are fed once: their
        KV and next-token logits are copied to each, and each samples with its own generator."""
        import torch

        slots: dict[Any, int] = {}  # (adapter, prompt) -> its place among the rows fed
        index = [slots.setdefault((row.request.adapter, tuple(row.request.prompt)) if self.share_prefill else k,
                                  len(slots)) for k, row in enumerate(rows)]
        firsts: dict[int, int] = {}
        for i, slot in enumerate(index):
            firsts.setdefault(slot, i)
        fed = [rows[i] for i in firsts.values()]  # in slot order
        fed_pasts = None if pasts is None else [pasts[i] for i in firsts.values()]
        n = len(fed)
        if fed_pasts is None:
            width = max(len(r.request.prompt) for r in fed)
            ids = torch.full((n, width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((n, width), dtype=torch.long)
            for i, row in enumerate(fed):  # left padding: every row's last prompt token at the end
                prompt = row.request.prompt
                ids[i, width - len(prompt):] = torch.tensor(prompt)
                mask[i, width - len(prompt):] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            positions, cache = (mask.cumsum(-1) - 1).clamp(min=0), None
        else:
            ids, mask, positions, cache = self._resume(fed, fed_pasts)
        for row in rows:
            row.position = len(row.request.prompt)
        start = time.perf_counter()
        logits, cache = self._forward(ids, mask, positions, cache, fed)
        synchronize(self.device)
        self.prefill_s += time.perf_counter() - start
        reused = [r for r, _ in pasts] if pasts else [0] * len(rows)
        new = [len(row.request.prompt) - r for row, r in zip(rows, reused)]
        self.prefilled_tokens += sum(new[i] for i in firsts.values())
        self.shared_tokens += sum(new) - sum(new[i] for i in firsts.values())
        self.reused_tokens += sum(reused)
        self.prefills += 1
        if n < len(rows):  # one copy of the shared prompt's KV and logits per row
            copies = torch.tensor(index, device=self.device)
            logits, mask = logits[copies], mask[copies]
            cache.batch_select_indices(copies)
        self._sample(rows, logits)
        self._keep_prefixes(rows, cache, mask)
        live = [i for i, row in enumerate(rows) if not row.done]
        if live:
            self._stack([rows[i] for i in live], cache, mask, live)
        return [row for row in rows if row.done]

    def _resume(self, rows: list[Row], pasts: list[tuple[int, list]]) -> tuple[Any, Any, Any, Any]:
        """(ids, mask, positions, cache) continuing each row from its cached prefix. Row i's
        columns: [pad][its r_i cached tokens] in the cache, then [pad][its s_i new tokens] fed;
        the pads in between are masked out, as left padding is."""
        import torch
        from transformers import DynamicCache

        R = max(reused for reused, _ in pasts)
        S = max(len(row.request.prompt) - reused for row, (reused, _) in zip(rows, pasts))
        ids = torch.full((len(rows), S), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), R + S), dtype=torch.long)
        positions = torch.zeros((len(rows), S), dtype=torch.long)
        for i, (row, (reused, _)) in enumerate(zip(rows, pasts)):
            rest = row.request.prompt[reused:]
            ids[i, S - len(rest):] = torch.tensor(rest)
            positions[i, S - len(rest):] = torch.arange(reused, reused + len(rest))
            mask[i, R - reused:R] = 1
            mask[i, R + S - len(rest):] = 1
        layers = []
        for k in range(len(pasts[0][1])):  # per layer: [n, heads, R, dim], each row right-aligned
            keys, values = [], []
            for reused, kv in pasts:
                pad = (0, 0, R - reused, 0)
                keys.append(torch.nn.functional.pad(kv[k][0][:, :, :reused], pad))
                values.append(torch.nn.functional.pad(kv[k][1][:, :, :reused], pad))
            layers.append((torch.cat(keys), torch.cat(values)))
        return ids.to(self.device), mask.to(self.device), positions.to(self.device), DynamicCache(layers)

    def _keep_prefixes(self, rows: list[Row], cache: Any, mask: Any) -> None:
        """Keep the KV of the rows that just ended (their fed tokens are the unmasked columns
        of their cache row) for a later call that extends them."""
        if self.joinable and not reusable(cache.layers):
            self.joinable = False  # sliding windows: no padding tricks, no reuse
            self.prefixes = None
        if self.prefixes is None:
            return
        for i, row in enumerate(rows):
            if row.done:
                fed = row.request.prompt + row.tokens[:-1]
                cols = mask[i].nonzero().squeeze(-1)  # len(fed) of them
                kv = [(layer.keys[i:i + 1, :, cols], layer.values[i:i + 1, :, cols]) for layer in cache.layers]
                self.prefixes.put(row.request.adapter, fed, kv)

    def _row(self, request) -> Row:
        import torch

        limit = min(request.sampling.max_tokens, self.max_context - len(request.prompt))
        g = torch.Generator()
        g.manual_seed(request.sampling.seed if request.sampling.seed is not None else
                      int(torch.randint(0, 2**62, (1,)).item()))
        opening = getattr(request, "opening", None)
        if not opening:
            return Row(request, limit, g)
        epsilon = request.sampling.explore
        forced = bool(torch.rand(1, generator=g).item() < epsilon)
        return Row(request, limit, g, opening=ForcedOpening(list(opening), epsilon, forced))

    def _stack(self, rows: list[Row], cache: Any, mask: Any, keep: list[int]) -> None:
        """Add prefilled rows (their cache and mask, rows `keep` of them) to the running batch."""
        import torch
        import torch.nn.functional as F

        if len(keep) < mask.shape[0]:
            index = torch.tensor(keep, device=self.device)
            cache.batch_select_indices(index)
            mask = mask[index]
        if not self.rows:
            self.rows, self.cache, self.mask = rows, cache, mask
            return
        old, new = self.mask.shape[1], mask.shape[1]
        width = max(old, new)
        for mine, theirs in zip(self.cache.layers, cache.layers):  # [n, heads, L, dim]: pad L on the left
            mine.keys = torch.cat([F.pad(mine.keys, (0, 0, width - old, 0)),
                                   F.pad(theirs.keys, (0, 0, width - new, 0))])
            mine.values = torch.cat([F.pad(mine.values, (0, 0, width - old, 0)),
                                     F.pad(theirs.values, (0, 0, width - new, 0))])
        self.mask = torch.cat([F.pad(self.mask, (width - old, 0)), F.pad(mask, (width - new, 0))])
        self.rows = self.rows + rows
        self._trim()

    # ------------------------------------------------------------------ decoding
    def step(self) -> list[Row]:
        """Feed every running row its last token, sample the next; returns the rows that ended
        (they have left the batch)."""
        import torch

        ids = torch.tensor([[row.tokens[-1]] for row in self.rows], device=self.device)
        positions = torch.tensor([[row.position] for row in self.rows], device=self.device)
        mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=torch.long, device=self.device)], 1)
        start = time.perf_counter()
        logits, self.cache = self._forward(ids, mask, positions, self.cache, self.rows)
        synchronize(self.device)
        self.decode_s += time.perf_counter() - start
        self.decoded_tokens += len(self.rows)
        self.mask = mask
        self.steps += 1
        for row in self.rows:
            row.position += 1
        self._sample(self.rows, logits)
        self._keep_prefixes(self.rows, self.cache, self.mask)
        ended = [row for row in self.rows if row.done]
        if ended:
            keep = [i for i, row in enumerate(self.rows) if not row.done]
            self.rows = [self.rows[i] for i in keep]
            if keep:
                index = torch.tensor(keep, device=self.device)
                self.cache.batch_select_indices(index)
                self.mask = self.mask[index]
                self._trim()
            else:
                self.cache = self.mask = None
        return ended

    def _trim(self) -> None:
        """Drop the leading columns no remaining row attends to (the padding of rows that left),
        so a batch that never empties does not grow without bound."""
        start = int(self.mask.any(0).int().argmax())  # the first column some row uses
        if start:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
            self.mask = self.mask[:, start:]

    def _forward(self, ids, mask, positions, cache, rows: list[Row]) -> tuple[Any, Any]:
        """One forward pass: (the next-token logits of each row [n, V], the grown cache)."""
        import torch

        model, names = self.model_for(), None
        if self.uses_adapters():
            names = [self.adapter_name(row.request.adapter) or BASE for row in rows]
            if len(set(names)) == 1 and names[0] != BASE:
                # One adapter for the whole batch (a training iteration's rollouts): the plain
                # LoRA forward, without peft's per-row gathers and scatters of a mixed batch.
                if model.active_adapter != names[0]:
                    model.set_adapter(names[0], inference_mode=True)
                names = None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        with torch.inference_mode():
            if names is not None or not hasattr(base, "lm_head"):  # a mixed batch: peft routes each row
                extra = {} if names is None else {"adapter_names": names}
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                            use_cache=True, logits_to_keep=1, **extra)
                return out.logits[:, -1, :], out.cache
            # The body, then lm_head on the last positions as one [n, H] matrix: through the
            # model's own forward, a [n, 1, H] input made torch copy the whole [H, V] head
            # weight on every call (half the time of a one-row pass).
            out = base.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
            return base.lm_head(out.last_hidden_state[:, -1, :].contiguous()), out.cache

    def _sample(self, rows: list[Row], logits) -> None:
        logits = logits.float().cpu()  # sampled with CPU generators, wherever the model runs
        for k, row in enumerate(rows):
            sampling = row.request.sampling
            choose = row.opening.next if row.opening is not None else sample_next
            token, logp = choose(logits[k], sampling.temperature, sampling.top_p, row.generator)
            row.tokens.append(token)
            row.logprobs.append(logp)
            row.done = token == self.eos_id or len(row.tokens) >= row.limit

    def drop_all(self) -> list[Row]:
        """Empty the batch (after a failed forward pass); returns the rows it held."""
        rows, self.rows, self.cache, self.mask = self.rows, [], None, None
        return rows

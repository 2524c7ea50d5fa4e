"""The embedded policy: transformers + peft in this process, on the GPU when there is one.

Decoding a small model on a CPU is memory-bound, so calls from concurrent agents are gathered
into one batch (left-padded, one KV cache) by a single worker thread that owns the model: eight
callers cost little more than one. Each row of a batch carries its own adapter (peft's mixed
adapter batches), so a swap never changes the version of a call already queued.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge_bridge.core.errors import (
    AdapterError,
    ContextLengthExceeded,
    InvalidArgument,
    PolicyError,
    WrongType,
)
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling
from forge_bridge.policies.device import bf16_supported, resolve_device
from forge_bridge.policies.messages import normalize_messages
from forge_bridge.policies.toolcalls import FORMAT_MARKERS, PARSERS, detect_format, parse

BASE = "__base__"  # peft's name for "no adapter" in a mixed batch
__all__ = ["LocalPolicy", "bf16_supported"]


@dataclass
class _Request:
    prompt: list[int]
    sampling: Sampling
    adapter: str | None
    future: Future


class LocalPolicy(Policy):
    """In-process policy over a transformers causal LM (the embedded SmolLM2 by default)."""

    def __init__(self, model: Any = "smollm2-135m-instruct", tokenizer: Any = None, *,
                 dtype: str = "auto", device: str = "auto", tool_format: str = "auto",
                 max_batch: int = 8, batch_wait_s: float = 0.01,
                 keep_versions: int = 3, adapter_roots: Any = None) -> None:
        """`device`: 'auto' (CUDA, then MPS, then CPU), or one by name. `dtype` 'auto': bf16
        where the device computes it fast, else fp32. `tool_format`: how replies are parsed for
        tool calls ('hermes', 'llama3_json', 'mistral'; 'auto': from the chat template)."""
        super().__init__(keep_versions=keep_versions, adapter_roots=adapter_roots)
        import torch

        from forge_bridge.policies import models

        self.model_path = str(model) if isinstance(model, (str, Path)) else None
        """Where the base model came from (a trainer loads its own copy from there)."""
        if isinstance(model, (str, Path)):
            model, loaded_tok = models.load(str(model))
            tokenizer = tokenizer or loaded_tok
        elif tokenizer is None:
            raise WrongType("LocalPolicy(model, tokenizer): a model object needs its tokenizer")
        if dtype not in ("auto", "bfloat16", "float32"):
            raise InvalidArgument(f"dtype: expected 'auto', 'bfloat16' or 'float32', got {dtype!r}")
        if tool_format != "auto" and tool_format not in PARSERS:
            raise InvalidArgument(f"tool_format: expected 'auto' or one of {sorted(PARSERS)}, got {tool_format!r}")
        self.device = resolve_device(device)
        """Where the model runs ('cuda', 'mps' or 'cpu')."""
        if dtype == "auto":
            dtype = "bfloat16" if bf16_supported(self.device) else "float32"
        if max_batch < 1:
            raise InvalidArgument(f"max_batch: expected >= 1, got {max_batch}")
        self.dtype = getattr(torch, dtype)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.tokenizer = tokenizer
        self.tool_format = detect_format(tokenizer.chat_template) if tool_format == "auto" else tool_format
        """The tool-call format replies are parsed in."""
        markers = {tokenizer.convert_tokens_to_ids(m) for m in FORMAT_MARKERS
                   if m in getattr(tokenizer, "all_special_tokens", [])}
        self._drop_ids = set(tokenizer.all_special_ids) - markers if markers else None
        """Special tokens left out of a reply's text when some (`[TOOL_CALLS]`) must stay in it."""
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.max_context = getattr(model.config, "max_position_embeddings", None) or 2048
        self._peft = None
        self._model_lock = threading.Lock()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="forge-local-policy", daemon=True)
        self._closed = False
        self._worker.start()
        self.batches_run = 0
        """How many batched forward passes have run (tests and benchmarks read it)."""

    # ------------------------------------------------------------------ calls
    def encode(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt token ids this policy feeds the model for these messages."""
        enc = self.tokenizer.apply_chat_template(normalize_messages(messages), tools=tools or None,
                                                 add_generation_prompt=True)
        return list(enc["input_ids"] if hasattr(enc, "keys") else enc)

    def _submit(self, messages, tools, sampling: Sampling, adapter: str | None) -> Future:
        if self._closed:
            raise PolicyError("LocalPolicy is closed")
        prompt = self.encode(messages, tools)
        if len(prompt) >= self.max_context:
            raise ContextLengthExceeded(f"prompt of {len(prompt)} tokens does not fit the model's "
                                        f"context of {self.max_context} tokens")
        fut: Future = Future()
        self._queue.put(_Request(prompt, sampling, adapter, fut))
        return fut

    def _chat(self, messages, tools, sampling, adapter) -> PolicyOutput:
        return self._submit(messages, tools, sampling, adapter).result()

    async def _achat(self, messages, tools, sampling, adapter) -> PolicyOutput:
        return await asyncio.wrap_future(self._submit(messages, tools, sampling, adapter))

    # ------------------------------------------------------------------ the batching worker
    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            try:
                while len(batch) < self.max_batch:
                    nxt = self._queue.get(timeout=self.batch_wait_s)
                    if nxt is None:
                        self._queue.put(None)
                        break
                    batch.append(nxt)
            except queue.Empty:
                pass
            try:
                with self._model_lock:
                    outputs = self._generate(batch)
                self.batches_run += 1
                for req, out in zip(batch, outputs):
                    req.future.set_result(out)
            except Exception as exc:  # reported to every caller of this batch, never swallowed
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(
                            PolicyError(f"local generation failed: {type(exc).__name__}: {exc}"))

    def _generate(self, batch: list[_Request]) -> list[PolicyOutput]:
        import torch

        from forge_bridge.policies.next_token import sample_next

        n, width = len(batch), max(len(r.prompt) for r in batch)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding: every row's next token is at the end
            ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        limits = [min(r.sampling.max_tokens, self.max_context - len(r.prompt)) for r in batch]
        generators = []
        for r in batch:
            g = torch.Generator()
            g.manual_seed(r.sampling.seed if r.sampling.seed is not None else
                          int(torch.randint(0, 2**62, (1,)).item()))
            generators.append(g)
        names = [r.adapter or BASE for r in batch]
        model = self._peft if self._peft is not None else self.model
        tokens: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        done = [False] * n
        active = list(range(n))  # row k of the running batch is request active[k]
        cache = None
        with torch.inference_mode():
            step_ids, step_pos = ids, positions
            for _ in range(max(limits)):
                extra = {"adapter_names": [names[i] for i in active]} if self._peft is not None else {}
                out = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                            cache=cache, use_cache=True, logits_to_keep=1, **extra)
                cache = out.cache
                logits = out.logits[:, -1, :].float().cpu()  # sampled with CPU generators
                nxt = torch.full((len(active),), self.pad_id, dtype=torch.long)
                for k, i in enumerate(active):
                    r = batch[i]
                    tok, logp = sample_next(logits[k], r.sampling.temperature, r.sampling.top_p, generators[i])
                    nxt[k] = tok
                    tokens[i].append(tok)
                    logprobs[i].append(logp)
                    done[i] = tok == self.eos_id or len(tokens[i]) >= limits[i]
                keep = [k for k, i in enumerate(active) if not done[i]]
                if not keep:
                    break
                step_ids = nxt[:, None].to(self.device)
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((len(active), 1), dtype=torch.long, device=self.device)], dim=1)
                if len(keep) < len(active):  # finished rows leave: a long straggler decodes alone
                    rows = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(rows)
                    step_ids, step_pos, mask = step_ids[rows], step_pos[rows], mask[rows]
                    active = [active[k] for k in keep]
        return [self._output(r, toks, lps) for r, toks, lps in zip(batch, tokens, logprobs)]

    def _output(self, req: _Request, tokens: list[int], logprobs: list[float]) -> PolicyOutput:
        ended = bool(tokens) and tokens[-1] == self.eos_id
        reply = tokens[:-1] if ended else tokens
        if self._drop_ids is None:
            text = self.tokenizer.decode(reply, skip_special_tokens=True)
        else:
            text = self.tokenizer.decode([t for t in reply if t not in self._drop_ids], skip_special_tokens=False)
        action = parse(text, "stop" if ended else "length", self.tool_format)
        return PolicyOutput(action=action, prompt_token_ids=req.prompt, completion_token_ids=tokens,
                            completion_logprobs=logprobs, adapter=req.adapter)

    # ------------------------------------------------------------------ adapters
    def _check_compatible(self, path: Path) -> None:
        from safetensors import safe_open

        modules = dict(self.model.named_modules())
        with safe_open(str(path / "adapter_model.safetensors"), framework="pt") as f:
            for key in f.keys():
                if ".lora_A." not in key and ".lora_B." not in key:
                    continue
                owner = key.split(".lora_")[0].removeprefix("base_model.model.")
                module = modules.get(owner)
                base = getattr(module, "base_layer", module)
                if base is None or not hasattr(base, "in_features"):
                    raise AdapterError(f"adapter {path}: targets {owner!r}, which this model "
                                       "does not have as a linear layer")
                shape = f.get_slice(key).get_shape()
                expected = base.in_features if ".lora_A." in key else base.out_features
                actual = shape[1] if ".lora_A." in key else shape[0]
                if actual != expected:
                    raise AdapterError(f"adapter {path}: {key} has shape {shape}, which does not "
                                       f"fit this model ({owner} has {expected} features there)")

    def _load(self, path: Path, version: str) -> None:
        from peft import PeftModel

        self._check_compatible(path)
        with self._model_lock:
            try:
                if self._peft is None:
                    self._peft = PeftModel.from_pretrained(self.model, str(path), adapter_name=version,
                                                           is_trainable=False)
                else:
                    self._peft.load_adapter(str(path), adapter_name=version, is_trainable=False)
                self._peft.eval()
            except Exception as exc:
                if self._peft is not None and version in self._peft.peft_config:
                    self._peft.delete_adapter(version)
                raise AdapterError(f"adapter {path} could not be loaded: {exc}") from None

    def _unload(self, version: str) -> None:
        with self._model_lock:
            if self._peft is not None and version in self._peft.peft_config:
                remaining = [a for a in self._peft.peft_config if a != version]
                if remaining:  # peft refuses to delete the active adapter while others exist
                    self._peft.set_adapter(remaining[-1])
                    self._peft.delete_adapter(version)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._worker.join(timeout=30)

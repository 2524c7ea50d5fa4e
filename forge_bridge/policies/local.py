"""The embedded policy: transformers + peft in this process, on the GPU when there is one.

Decoding a small model on a CPU is memory-bound, so calls from concurrent agents share one
running batch (one KV cache) decoded by a single worker thread that owns the model: eight
callers cost little more than one. A call joins the running batch at the next decode step and
leaves it when it ends (continuous batching, `decoding.py`). Each row carries its own adapter
(peft's mixed adapter batches), so a swap never changes the version of a call already queued.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from forge_bridge.core.errors import (
    AdapterError,
    ContextLengthExceeded,
    InvalidArgument,
    PolicyError,
    WrongType,
)
from forge_bridge.policies.adapter_pool import AdapterPool
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling
from forge_bridge.policies.decoding import BASE, Decoder, PrefixCache
from forge_bridge.policies.device import bf16_supported, resolve_device
from forge_bridge.policies.messages import normalize_messages, prompt_ids
from forge_bridge.policies.scoring import completion_logprobs
from forge_bridge.policies.toolcalls import FORMAT_MARKERS, OPENINGS, check_format, formats, parse

if TYPE_CHECKING:
    from peft import PeftModel

__all__ = ["LocalPolicy", "bf16_supported"]


def _generation_failed(exc: Exception) -> PolicyError:
    return PolicyError(f"local generation failed: {type(exc).__name__}: {exc}")


@dataclass
class _Request:
    prompt: list[int]
    sampling: Sampling
    adapter: str | None
    future: Future
    opening: list[int] | None = None
    """A tool call's opening this call may be made to begin with (`Sampling.explore`)."""
    tools: list[dict] | None = None
    """The tools the call declares: unmarked JSON or Python becomes a call only for these."""


def check_settings(dtype: str, tool_format: str, max_batch: int, threads: int | None,
                   prefix_cache_tokens: int) -> None:
    """Raise `InvalidArgument` naming the first of LocalPolicy's settings that is out of range."""
    if dtype not in ("auto", "bfloat16", "float32"):
        raise InvalidArgument(f"dtype: expected 'auto', 'bfloat16' or 'float32', got {dtype!r}")
    check_format(tool_format)
    if max_batch < 1:
        raise InvalidArgument(f"max_batch: expected >= 1, got {max_batch}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise InvalidArgument(f"threads: expected an int >= 1 or None, got {threads!r}")
    if isinstance(prefix_cache_tokens, bool) or not isinstance(prefix_cache_tokens, int) or prefix_cache_tokens < 0:
        raise InvalidArgument(f"prefix_cache_tokens: expected an int >= 0, got {prefix_cache_tokens!r}")


def reply_drop_ids(tokenizer: Any) -> set[int] | None:
    """The special token ids to leave out of a reply's text when the tool format's markers
    (`[TOOL_CALLS]`) are special tokens that must stay in it (None: decode skipping specials)."""
    special = set(getattr(tokenizer, "all_special_tokens", [])) | {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
    markers = {tokenizer.convert_tokens_to_ids(m) for m in FORMAT_MARKERS if m in special}
    if not markers:
        return None
    return (set(tokenizer.all_special_ids) | {i for i, t in getattr(
        tokenizer, "added_tokens_decoder", {}).items() if t.special}) - markers


class LocalPolicy(Policy):
    """In-process policy over a transformers causal LM (the embedded SmolLM2 by default)."""

    def __init__(self, model: Any = "smollm2-135m-instruct", tokenizer: Any = None, *,
                 dtype: str = "auto", device: str = "auto", tool_format: str = "auto",
                 max_batch: int = 8, batch_wait_s: float = 0.01, prefix_cache_tokens: int = 16384,
                 continuous_batching: bool = True, share_prefill: bool = True, threads: int | None = None,
                 keep_versions: int = 3, adapter_roots: Any = None) -> None:
        """`device`: 'auto' (CUDA, then MPS, then CPU), or one by name. `dtype` 'auto': bf16
        where the device computes it fast, else fp32. `tool_format`: 'auto' reads tool calls in
        every format a model writes them (`toolcalls.FORMATS`); a named one reads only that one.
        `max_batch`: most calls decoding at once. `prefix_cache_tokens`: KV of finished calls
        kept for the next call that extends one (the next step of an episode), and as many of
        scored sequences for the next `score` that starts alike; 0: none.
        `continuous_batching=False`: a call waits for the running batch to end; `share_prefill=False`:
        calls with one prompt (a group's rollouts) are each prefilled, not fed once (for comparison).
        `threads`: CPU threads of the decoding worker's ops (None: all but one of torch's, so
        the agents' own Python -- tools, templates, the framework -- keeps a core: on 2 cores
        with 20 LangChain agents, 1 thread made rollouts 30% faster than 2, whose parallel
        ops stalled whenever an agent thread took a core). Only this worker's; the trainer
        keeps all of them.
        A model object (rather than a name or directory) is used in place: adapters are injected
        into its modules, so it must not be shared with another policy."""
        super().__init__(keep_versions=keep_versions, adapter_roots=adapter_roots)
        import torch

        from forge_bridge.policies import models

        self.model_path = str(model) if isinstance(model, (str, Path)) else None
        """Where the base model came from (a trainer loads its own copy from there)."""
        if not isinstance(model, (str, Path)) and tokenizer is None:
            raise WrongType("LocalPolicy(model, tokenizer): a model object needs its tokenizer")
        check_settings(dtype, tool_format, max_batch, threads, prefix_cache_tokens)
        self.device = resolve_device(device)
        """Where the model runs ('cuda', 'mps' or 'cpu')."""
        if dtype == "auto":
            dtype = "bfloat16" if bf16_supported(self.device) else "float32"
        if isinstance(model, (str, Path)):  # read in the dtype it runs in: no float32 copy on the way
            model, loaded_tok = models.load(str(model), dtype=getattr(torch, dtype))
            tokenizer = tokenizer or loaded_tok
        self.threads = threads or max(1, torch.get_num_threads() - 1)
        """Intra-op threads of the decoding worker."""
        self._prefixes = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None
        self._scored = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None
        """KV of scored sequences, for the next `score` that starts alike (`scoring`)."""
        self._pool = AdapterPool(spare=keep_versions + 1)
        """LoRA buffers reused across versions of one shape: a swap copies weights (`adapter_pool`)."""
        self.continuous_batching, self.share_prefill = bool(continuous_batching), bool(share_prefill)
        self.dtype = getattr(torch, dtype)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.tokenizer = tokenizer
        self.tool_format, self.reading = formats(tool_format, tokenizer.chat_template)
        """The format this policy writes calls in (a forced opening, a teacher's demonstration: the
        chat template's unless named), and the one replies are read in ('any' unless named)."""
        self._drop_ids = reply_drop_ids(tokenizer)
        """Special tokens left out of a reply's text when some (`[TOOL_CALLS]`) must stay in it."""
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.max_context = getattr(model.config, "max_position_embeddings", None) or 2048
        self._peft: PeftModel | None = None
        self._start_worker()

    def _start_worker(self) -> None:
        """The decoding worker thread and what it shares with the callers."""
        self._model_lock = threading.Lock()
        self._flight_lock = threading.Lock()
        self._in_flight: dict[str | None, int] = {}
        """version -> calls submitted and not yet answered (a cancelled caller's row still decodes)."""
        self._unload_later: set[str] = set()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="forge-local-policy", daemon=True)
        self._closed = False
        self._running = self._decoder()  # replaced by the worker's own when it starts
        self._worker.start()

    # ------------------------------------------------------------------ calls
    def encode(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt token ids this policy feeds the model for these messages."""
        return prompt_ids(self.tokenizer, messages, tools)

    def _submit(self, messages, tools, sampling: Sampling, adapter: str | None) -> Future:
        if self._closed:
            raise PolicyError("LocalPolicy is closed")
        prompt = self.encode(messages, tools)
        if len(prompt) >= self.max_context:
            raise ContextLengthExceeded(f"prompt of {len(prompt)} tokens does not fit the model's "
                                        f"context of {self.max_context} tokens")
        opening = None
        if sampling.explore and sampling.temperature > 0:
            if self.tool_format not in OPENINGS:
                raise InvalidArgument(f"Sampling.explore: no tool-call opening is known for the {self.tool_format!r} "
                                      f"format (known: {sorted(OPENINGS)})")
            if normalize_messages(messages)[-1]["role"] == "tool":
                opening = self.tokenizer.encode(OPENINGS[self.tool_format], add_special_tokens=False)
        fut: Future = Future()
        with self._flight_lock:  # the version stays loaded until this call is answered
            self._in_flight[adapter] = self._in_flight.get(adapter, 0) + 1
        fut.add_done_callback(lambda _: self._landed(adapter))
        self._queue.put(_Request(prompt, sampling, adapter, fut, opening, tools or []))
        return fut

    def generate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        return self._submit(messages, tools, sampling, adapter).result()

    async def agenerate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        return await asyncio.wrap_future(self._submit(messages, tools, sampling, adapter))

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _logprobs(self, prompt: list[int], completion: list[int], adapter: str | None) -> list[float]:
        """One forward pass over what no earlier scored sequence covers (`scoring`), with
        `adapter` (peft's per-row adapter names: the batching worker's own choice is left alone)."""
        import torch

        if len(prompt) + len(completion) > self.max_context:
            raise ContextLengthExceeded(f"score: {len(prompt) + len(completion)} tokens do not fit the model's "
                                        f"context of {self.max_context} tokens")
        with self._model_lock, torch.inference_mode():
            model = self._peft if self._peft is not None else self.model
            extra: dict[str, Any] = ({} if self._peft is None
                                     else {"adapter_names": [self._pool.name_of(adapter) or BASE]})
            scores, reusable = completion_logprobs(model, prompt, completion, device=self.device, adapter=adapter,
                                                   prefixes=self._scored, extra=extra)
            if not reusable:
                self._scored = None
        return scores

    # ------------------------------------------------------------------ the batching worker
    def _decoder(self, prefixes: PrefixCache | None = None) -> Decoder:
        return Decoder(lambda: self._peft if self._peft is not None else self.model, device=self.device,
                       pad_id=self.pad_id, eos_id=self.eos_id, max_context=self.max_context,
                       uses_adapters=lambda: self._peft is not None, prefixes=prefixes,
                       adapter_name=self._pool.name_of, share_prefill=self.share_prefill)

    def _take(self, running: bool, room: int) -> tuple[list[_Request], bool]:
        """Requests to admit now, and whether close() was called. Idle, it waits for one and
        gathers those arriving within `batch_wait_s`; while rows decode, it takes only what is
        already queued (they join at the next step)."""
        taken: list[_Request] = []
        closing = False
        try:
            if not running:
                first = self._queue.get()
                if first is None:
                    return [], True
                taken.append(first)
            while len(taken) < room:
                nxt = self._queue.get(timeout=self.batch_wait_s) if not running else self._queue.get_nowait()
                if nxt is None:
                    closing = True
                    break
                taken.append(nxt)
        except queue.Empty:
            pass
        # A caller that gave up before its turn is not decoded (its future can no longer be cancelled after this).
        return [r for r in taken if r.future.set_running_or_notify_cancel()], closing

    def _serve(self) -> None:
        import torch

        torch.set_num_threads(self.threads)  # this thread's own setting (OpenMP's is per thread)
        decoder = self._decoder(self._prefixes)
        self._running = decoder
        closing = False
        while True:
            new: list[_Request] = []
            if not closing and (not decoder.rows or (decoder.joinable and self.continuous_batching)):
                new, closing = self._take(bool(decoder.rows), self.max_batch - len(decoder.rows))
            if not new and not decoder.rows:
                if closing:
                    return
                continue
            ended = []
            try:
                with self._model_lock:
                    if new:
                        ended += decoder.admit(new)
                    if decoder.rows:
                        ended += decoder.step()
            except Exception as exc:  # reported to every caller in the batch, never swallowed
                error = _generation_failed(exc)
                for req in new + [row.request for row in decoder.drop_all()]:
                    if not req.future.done():
                        req.future.set_exception(error)
                continue
            for row in ended:
                self._answer(row)

    def _answer(self, row) -> None:
        """Give a finished row's output to its caller (who may have stopped waiting)."""
        future = row.request.future
        if future.done():
            return
        try:
            future.set_result(self._output(row.request, row.tokens, row.logprobs, row.opening))
        except InvalidStateError:  # cancelled meanwhile
            pass
        except Exception as exc:
            if not future.done():
                future.set_exception(_generation_failed(exc))

    def _landed(self, version: str | None) -> None:
        """A call of `version` was answered: unload the version now if it was retired meanwhile."""
        with self._flight_lock:
            self._in_flight[version] -= 1
            due = version in self._unload_later and not self._in_flight[version]
            if due:
                self._unload_later.discard(cast(str, version))  # retired: a version, not the base (None)
        if due:
            self._unload_now(cast(str, version))

    @property
    def batches_run(self) -> int:
        """Prefill passes run so far: one admits every request that arrived together (and has
        no reusable prefix; each one that has is prefilled on its own)."""
        return self._running.prefills

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens the running batch did not prefill: a finished call's KV covered them."""
        return self._running.reused_tokens

    def decoding_counts(self) -> dict[str, float] | None:
        """What the running batch has done so far: prompt tokens fed through the model
        (`prefill_tokens`), copied from a request beside them with the same prompt (a GRPO
        group's rollouts: `prefill_shared_tokens`) or covered by a finished call's KV
        (`prefill_reused_tokens`), seconds in prefill passes (`prefill_s`), tokens fed in decode
        steps (`decode_tokens`) and their seconds (`decode_s`)."""
        d = self._running
        return {"prefill_tokens": d.prefilled_tokens, "prefill_shared_tokens": d.shared_tokens,
                "prefill_reused_tokens": d.reused_tokens, "prefill_s": d.prefill_s,
                "decode_tokens": d.decoded_tokens, "decode_s": d.decode_s}

    def matmul_flops_per_token(self, *, decode: bool) -> float:
        """Matmul FLOPs of one token through the model's weights (attention over the context
        aside): twice the body's weights, and the output head's too in decoding (a prefill
        computes logits at a prompt's last position only)."""
        body = sum(p.numel() for n, p in self.model.named_parameters()
                   if not any(part in n for part in ("embed", "lm_head", "lora_")))  # a LoRA's matmuls are thin
        head = self.model.get_output_embeddings().weight.numel() if decode else 0
        return 2.0 * (body + head)

    def _generate(self, batch: list[_Request]) -> list[PolicyOutput]:
        """Decode `batch` to the end in a batch of its own (callers go through the worker)."""
        decoder = self._decoder()
        with self._model_lock:
            finished = decoder.admit(batch)
            while decoder.rows:
                finished += decoder.step()
        rows = {id(row.request): row for row in finished}
        return [self._output(r, rows[id(r)].tokens, rows[id(r)].logprobs, rows[id(r)].opening) for r in batch]

    def _output(self, req: _Request, tokens: list[int], logprobs: list[float], opening=None) -> PolicyOutput:
        ended = bool(tokens) and tokens[-1] == self.eos_id
        reply = tokens[:-1] if ended else tokens
        if self._drop_ids is None:
            text = self.tokenizer.decode(reply, skip_special_tokens=True)
        else:
            text = self.tokenizer.decode([t for t in reply if t not in self._drop_ids], skip_special_tokens=False)
        action = parse(text, "stop" if ended else "length", self.reading, req.tools)
        return PolicyOutput(action=action, prompt_token_ids=req.prompt, completion_token_ids=tokens,
                            completion_logprobs=logprobs, version=req.adapter,
                            info={} if opening is None else {"forced_opening": opening.forced})

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

    def load_version(self, path: Path, version: str) -> None:
        from forge_bridge.policies.adapter_pool import shape_of

        self._check_compatible(path)
        shape = shape_of(path)
        with self._model_lock:
            try:
                if self._peft is None:
                    self._peft = self._pool.first(self.model, path, version)
                elif self._pool.fits(shape):
                    self._pool.load(self._peft, path, version)
                else:  # another shape: its own LoRA modules, under its own name
                    self._peft.load_adapter(str(path), adapter_name=version, is_trainable=False)
                self._peft.eval()
            except Exception as exc:
                if self._peft is not None and version in self._peft.peft_config:
                    self._peft.delete_adapter(version)
                raise AdapterError(f"adapter {path} could not be loaded: {exc}") from None

    def unload_version(self, version: str) -> None:
        with self._flight_lock:  # a caller that gave up left its row decoding with this version
            if self._in_flight.get(version):
                self._unload_later.add(version)
                return
        self._unload_now(version)

    def _unload_now(self, version: str) -> None:
        with self._model_lock:
            if not self._pool.release(version) and self._peft is not None and version in self._peft.peft_config:
                remaining = [a for a in self._peft.peft_config if a != version]
                if remaining:  # peft refuses to delete the active adapter while others exist
                    self._peft.set_adapter(remaining[-1])
                    self._peft.delete_adapter(version)
            for cache in (self._prefixes, self._scored):
                if cache is not None:
                    cache.forget(version)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._worker.join(timeout=30)

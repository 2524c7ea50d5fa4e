"""A policy served by OpenVINO GenAI's continuous-batching pipeline in this process.

The model runs as an OpenVINO IR (exported once from the local safetensors folder,
`openvino_ir.py`) in native loops: paged KV cache, continuous batching, the sampler in C++. The
prompt is this repository's own (the transformers tokenizer and chat template, as
`LocalPolicy.encode`), fed as token ids, so both policies see the same prompt tokens.

LoRA: OpenVINO adds LoRA inputs (state variables A, B, alpha) to the modules of the adapters
declared when the pipeline is built; here a zero placeholder adapter declares the `lora_targets`
of every layer, so any peft adapter on those modules (any rank) can be applied later without
rebuilding. `load_version` reads and checks the adapter the trainer just saved (in the caller's
thread, before the base class makes it current); the worker applies an adapter only while no
request decodes (OpenVINO's pipeline has one adapter for all running requests), so a call is
never served by a half-loaded adapter, and requests for another version wait for the running ones
to end. peft's scale (lora_alpha / r) is the adapter's alpha in OpenVINO.

Log-probabilities: greedy calls record the model's own log softmax of the chosen token (as
`LocalPolicy`); sampled calls record the log-probability under the distribution the token was
drawn from (tempered, top-p renormalised: OpenVINO's sampler value when `logprobs` is not asked
for), which is what the trainer's importance weight compares with. Scoring given tokens
(`Policy.logprobs`) is not offered by the pipeline.

openvino-genai is imported when a policy is built: `import forge_bridge` stays light.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import queue
import re
import secrets
import shutil
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_bridge.core.errors import (
    AdapterError,
    ContextLengthExceeded,
    InvalidArgument,
    PolicyError,
)
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling
from forge_bridge.policies.local import reply_drop_ids
from forge_bridge.policies.messages import prompt_ids
from forge_bridge.policies.openvino_ir import WEIGHT_FORMATS
from forge_bridge.policies.toolcalls import formats, parse

logger = logging.getLogger(__name__)

__all__ = ["OpenVINOConfig", "OpenVINOPolicy"]

PRECISIONS = ("f32", "bf16", "f16")
KV_PRECISIONS = ("f32", "f16", "bf16", "u8")
_PEFT_PREFIX = "base_model.model."
_UNSET = object()


@dataclass(frozen=True)
class OpenVINOConfig:
    """How the OpenVINO policy runs its model."""

    weight_format: str = "fp32"
    """IR weights: 'fp32' (the trainer's weights), 'fp16', 'int8' or 'int4' (weight-only compression)."""
    precision: str = "f32"
    """Inference precision of the CPU plugin (OpenVINO's own default is bf16 where the CPU has it)."""
    kv_cache_precision: str = "f32"
    """Element type of the paged KV cache ('f32', 'f16', 'bf16', 'u8')."""
    max_batch: int = 8
    """Most sequences decoding at once (the scheduler's max_num_seqs)."""
    cache_gib: float = 1.0
    """Size of the paged KV cache in GiB."""
    threads: int | None = None
    """CPU threads of inference (None: all but one core, so the agents' own Python keeps one, as LocalPolicy)."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Modules an adapter may target: declared when the pipeline is built (the trainer's defaults)."""
    batch_wait_s: float = 0.01
    """How long an idle worker gathers arriving calls before admitting them together."""

    def __post_init__(self) -> None:
        if self.weight_format not in WEIGHT_FORMATS:
            raise InvalidArgument(f"weight_format: expected one of {WEIGHT_FORMATS}, got {self.weight_format!r}")
        if self.precision not in PRECISIONS:
            raise InvalidArgument(f"precision: expected one of {PRECISIONS}, got {self.precision!r}")
        if self.kv_cache_precision not in KV_PRECISIONS:
            raise InvalidArgument(f"kv_cache_precision: expected one of {KV_PRECISIONS}, "
                                  f"got {self.kv_cache_precision!r}")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise InvalidArgument(f"max_batch: expected an int >= 1, got {self.max_batch!r}")
        if isinstance(self.cache_gib, bool) or not isinstance(self.cache_gib, (int, float)) or self.cache_gib <= 0:
            raise InvalidArgument(f"cache_gib: expected a number > 0, got {self.cache_gib!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise InvalidArgument(f"threads: expected an int >= 1 or None, got {self.threads!r}")
        if (not isinstance(self.lora_targets, tuple) or not self.lora_targets
                or not all(isinstance(t, str) and t for t in self.lora_targets)):
            raise InvalidArgument(f"lora_targets: expected a non-empty tuple of module names, got {self.lora_targets!r}")
        if not isinstance(self.batch_wait_s, (int, float)) or self.batch_wait_s < 0:
            raise InvalidArgument(f"batch_wait_s: expected a number >= 0, got {self.batch_wait_s!r}")


@dataclass
class _Request:
    prompt: list[int]
    sampling: Sampling
    adapter: str | None
    future: Future
    tools: list[dict] = field(default_factory=list)


@dataclass
class _Row:
    request: _Request
    handle: Any
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def target_shapes(model_dir: Path, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Module name -> (out_features, in_features) of every linear layer named in `targets`, read
    from the safetensors headers of `model_dir` (no weights are loaded)."""
    from safetensors import safe_open

    pattern = re.compile(r"^(.*\.(?:" + "|".join(map(re.escape, targets)) + r"))\.weight$")
    shapes: dict[str, tuple[int, int]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():
                found = pattern.match(key)
                if found:
                    shape = f.get_slice(key).get_shape()
                    if len(shape) == 2:
                        shapes[found.group(1)] = (int(shape[0]), int(shape[1]))
    if not shapes:
        raise InvalidArgument(f"lora_targets {targets}: no linear layer of the model in {model_dir} has one of "
                              "these names")
    return shapes


def write_placeholder(shapes: dict[str, tuple[int, int]], path: Path) -> Path:
    """A rank-1 peft adapter of zeros on every module of `shapes`: declares where LoRA inputs go."""
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {}
    for module, (out_f, in_f) in shapes.items():
        tensors[f"{_PEFT_PREFIX}{module}.lora_A.weight"] = np.zeros((1, in_f), dtype=np.float32)
        tensors[f"{_PEFT_PREFIX}{module}.lora_B.weight"] = np.zeros((out_f, 1), dtype=np.float32)
    save_file(tensors, str(path))
    return path


def adapter_scale(path: Path, shapes: dict[str, tuple[int, int]]) -> float:
    """peft's scale of the adapter at `path` (lora_alpha / r, or / sqrt(r) with rsLoRA), after
    checking that OpenVINO can serve it exactly: plain LoRA on declared modules of fitting shapes."""
    from safetensors import safe_open

    config = json.loads((path / "adapter_config.json").read_text())
    refused = [name for name, bad in (
        ("use_dora", bool(config.get("use_dora"))),
        ("bias", config.get("bias", "none") != "none"),
        ("modules_to_save", bool(config.get("modules_to_save"))),
        ("rank_pattern", bool(config.get("rank_pattern"))),
        ("alpha_pattern", bool(config.get("alpha_pattern")))) if bad]
    if refused:
        raise AdapterError(f"adapter {path}: {', '.join(refused)} set in adapter_config.json; the OpenVINO policy "
                           "serves plain LoRA (one rank and alpha, no bias, DoRA or saved modules)")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)):
        raise AdapterError(f"adapter {path}: adapter_config.json needs an int r >= 1 and a number lora_alpha, "
                           f"got r={r!r}, lora_alpha={alpha!r}")
    with safe_open(str(path / "adapter_model.safetensors"), framework="numpy") as f:
        for key in f.keys():
            part = ".lora_A." if ".lora_A." in key else ".lora_B." if ".lora_B." in key else None
            if part is None:
                raise AdapterError(f"adapter {path}: {key} is not a LoRA A or B matrix; refused")
            module = key.split(part)[0].removeprefix(_PEFT_PREFIX)
            if module not in shapes:
                raise AdapterError(f"adapter {path}: targets {module!r}, which is not among the modules this policy "
                                   "declared (OpenVINOConfig.lora_targets); build the policy with them")
            out_f, in_f = shapes[module]
            shape = tuple(f.get_slice(key).get_shape())
            expected = (r, in_f) if part == ".lora_A." else (out_f, r)
            if shape != expected:
                raise AdapterError(f"adapter {path}: {key} has shape {list(shape)}, expected {list(expected)}")
    return float(alpha) / (math.sqrt(r) if config.get("use_rslora") else r)


class OpenVINOPolicy(Policy):
    """In-process policy over OpenVINO GenAI's ContinuousBatchingPipeline on the CPU."""

    def __init__(self, model: str | os.PathLike = "smollm2-135m-instruct", config: OpenVINOConfig | None = None, *,
                 tool_format: str = "auto", keep_versions: int = 3, adapter_roots: Any = None) -> None:
        """`model`: a named model or a transformers folder (its IR is exported once and cached,
        `openvino_ir.export`). `tool_format`: as LocalPolicy's."""
        super().__init__(keep_versions=keep_versions, adapter_roots=adapter_roots)
        import numpy as np

        from forge_bridge.core.extras import require
        from forge_bridge.policies import models, openvino_ir

        ov_genai = require("openvino_genai", "openvino")
        ov = require("openvino", "openvino")

        self.config = config or OpenVINOConfig()
        """How the model runs (frozen)."""
        self._np, self._ov, self._g = np, ov, ov_genai
        self.model_path = str(models.model_path(str(model)))
        """The transformers folder the IR was exported from (a trainer loads its own copy from there)."""
        self.ir_path = openvino_ir.export(self.model_path, self.config.weight_format)
        """The cached OpenVINO IR the pipeline runs."""
        self.tokenizer = models.load_tokenizer(self.model_path)
        self.tool_format, self.reading = formats(tool_format, self.tokenizer.chat_template)
        self._drop_ids = reply_drop_ids(self.tokenizer)
        self.eos_id = int(self.tokenizer.eos_token_id)
        model_config = json.loads((Path(self.model_path) / "config.json").read_text())
        self.max_context = int(model_config.get("max_position_embeddings") or 2048)
        self._shapes = target_shapes(Path(self.model_path), self.config.lora_targets)
        self._tmp = Path(tempfile.mkdtemp(prefix="forge-openvino-policy-"))
        placeholder = ov_genai.Adapter(str(write_placeholder(self._shapes, self._tmp / "placeholder.safetensors")))
        self._adapters: dict[str, tuple[Any, float]] = {}
        """version -> (OpenVINO Adapter, its scale); read by the worker under `_adapters_lock`."""
        self._adapters_lock = threading.Lock()

        scheduler = ov_genai.SchedulerConfig()
        scheduler.cache_size = max(1, math.ceil(self.config.cache_gib))
        scheduler.max_num_seqs = self.config.max_batch
        scheduler.enable_prefix_caching = False  # its blocks are keyed by tokens, not by adapter
        threads = self.config.threads or max(1, (os.cpu_count() or 2) - 1)
        properties = {"adapters": ov_genai.AdapterConfig(placeholder, 0.0),
                      "INFERENCE_PRECISION_HINT": self.config.precision,
                      "KV_CACHE_PRECISION": self.config.kv_cache_precision,
                      "INFERENCE_NUM_THREADS": threads}
        try:
            self._pipe = ov_genai.ContinuousBatchingPipeline(str(self.ir_path), scheduler, "CPU", properties)
        except Exception as exc:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise PolicyError(f"OpenVINO could not build the pipeline for {self.ir_path}: {exc}") from None
        self.threads = threads
        """CPU threads of inference."""
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="forge-openvino-policy", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ calls
    def encode(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt token ids this policy feeds the model (the same as LocalPolicy's)."""
        return prompt_ids(self.tokenizer, messages, tools)

    def _submit(self, messages, tools, sampling: Sampling, adapter: str | None) -> Future:
        if self._closed:
            raise PolicyError("OpenVINOPolicy is closed")
        if sampling.explore and sampling.temperature > 0:
            raise InvalidArgument("Sampling.explore: forcing a tool call's opening is the embedded LocalPolicy's; "
                                  "OpenVINO samples every token itself")
        prompt = self.encode(messages, tools)
        if len(prompt) >= self.max_context:
            raise ContextLengthExceeded(f"prompt of {len(prompt)} tokens does not fit the model's "
                                        f"context of {self.max_context} tokens")
        fut: Future = Future()
        self._queue.put(_Request(prompt, sampling, adapter, fut, tools or []))
        return fut

    def generate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        return self._submit(messages, tools, sampling, adapter).result()

    async def agenerate(self, messages, tools, sampling, adapter) -> PolicyOutput:
        return await asyncio.wrap_future(self._submit(messages, tools, sampling, adapter))

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ------------------------------------------------------------------ the worker
    def _generation_config(self, request: _Request) -> Any:
        s = request.sampling
        c = self._g.GenerationConfig()
        c.max_new_tokens = min(s.max_tokens, self.max_context - len(request.prompt))
        c.eos_token_id = self.eos_id
        c.stop_token_ids = {self.eos_id}  # as LocalPolicy: the tokenizer's end token only
        if s.temperature == 0:
            c.do_sample = False
            c.logprobs = 1  # the model's own log softmax of the chosen token
        else:
            c.do_sample = True
            c.temperature = float(s.temperature)
            c.top_p = float(s.top_p)
            c.rng_seed = s.seed if s.seed is not None else secrets.randbits(31)
            c.logprobs = 0  # the sampler then reports the drawn-from distribution's log-probability
        return c

    def _take(self, waiting: deque[_Request], idle: bool) -> bool:
        """Move queued calls to `waiting`; idle, wait for one and those arriving within
        `batch_wait_s`. Returns whether close() was called."""
        try:
            if idle:
                first = self._queue.get()
                if first is None:
                    return True
                waiting.append(first)
                while True:
                    nxt = self._queue.get(timeout=self.config.batch_wait_s)
                    if nxt is None:
                        return True
                    waiting.append(nxt)
            while True:
                nxt = self._queue.get_nowait()
                if nxt is None:
                    return True
                waiting.append(nxt)
        except queue.Empty:
            return False

    def _apply(self, version: str | None) -> None:
        """Make `version` the adapter of the next requests (none may be running): a one-token
        generate call carries the adapter config, the only way the pipeline applies one."""
        g = self._g
        if version is None:
            adapters = g.AdapterConfig()
        else:
            with self._adapters_lock:
                found = self._adapters.get(version)
            if found is None:
                raise PolicyError(f"adapter version {version!r} is not loaded (unloaded while the call waited)")
            adapters = g.AdapterConfig(found[0], found[1])
        c = g.GenerationConfig()
        c.max_new_tokens, c.eos_token_id, c.adapters = 1, self.eos_id, adapters
        self._pipe.generate([self._ov.Tensor(self._np.array([[self.eos_id]], dtype=self._np.int64))], [c])

    def _serve(self) -> None:
        waiting: deque[_Request] = deque()
        running: dict[int, _Row] = {}
        active: Any = _UNSET
        closing, next_id = False, 0
        while True:
            if not closing:
                closing = self._take(waiting, idle=not running and not waiting)
            if closing and not running:
                for req in waiting:
                    self._fail(req, PolicyError("OpenVINOPolicy was closed before this call was served"))
                return
            try:
                if waiting and not running and waiting[0].adapter != active:
                    active = _UNSET
                    self._apply(waiting[0].adapter)
                    active = waiting[0].adapter
                while waiting and waiting[0].adapter == active:
                    req = waiting.popleft()
                    if not req.future.set_running_or_notify_cancel():
                        continue  # the caller gave up before its turn
                    try:
                        ids = self._ov.Tensor(self._np.array([req.prompt], dtype=self._np.int64))
                        handle = self._pipe.add_request(next_id, ids, self._generation_config(req))
                    except Exception as exc:  # this call's own settings: it alone fails
                        self._fail(req, PolicyError(f"OpenVINO refused the call: {type(exc).__name__}: {exc}"))
                        continue
                    running[next_id] = _Row(req, handle)
                    next_id += 1
                if running:
                    self._pipe.step()
                    self._collect(running)
            except Exception as exc:  # reported to every caller concerned, never swallowed
                error = PolicyError(f"OpenVINO generation failed: {type(exc).__name__}: {exc}")
                for row in running.values():
                    row.handle.cancel()
                    self._fail(row.request, error)
                running.clear()
                if waiting and active is _UNSET:  # the adapter could not be applied: its call fails
                    self._fail(waiting.popleft(), error)
                if self._pipe.has_non_finished_requests():
                    logger.warning("OpenVINO pipeline still holds requests after a failure")

    def _collect(self, running: dict[int, _Row]) -> None:
        """Read what each running request generated; answer those that ended."""
        status = self._g.GenerationStatus
        for rid in list(running):
            row = running[rid]
            while row.handle.can_read():
                for out in row.handle.read().values():
                    row.tokens.extend(int(t) for t in out.generated_ids)
                    row.logprobs.extend(min(0.0, float(x)) for x in out.generated_log_probs)
            state = row.handle.get_status()
            if state == status.RUNNING:
                continue
            del running[rid]
            if state == status.IGNORED:
                self._fail(row.request, PolicyError(
                    f"OpenVINO's scheduler ignored a prompt of {len(row.request.prompt)} tokens: it does not fit the KV "
                    f"cache (OpenVINOConfig.cache_gib={self.config.cache_gib})"))
            elif len(row.logprobs) != len(row.tokens):
                self._fail(row.request, PolicyError(f"OpenVINO returned {len(row.logprobs)} log-probabilities for "
                                                    f"{len(row.tokens)} tokens"))
            else:
                self._answer(row)

    def _fail(self, request: _Request, error: Exception) -> None:
        try:
            if not request.future.done():
                request.future.set_exception(error)
        except InvalidStateError:
            pass

    def _answer(self, row: _Row) -> None:
        try:
            row.request.future.set_result(self._output(row))
        except InvalidStateError:  # cancelled meanwhile
            pass
        except Exception as exc:
            self._fail(row.request, PolicyError(f"OpenVINO output could not be read: {type(exc).__name__}: {exc}"))

    def _output(self, row: _Row) -> PolicyOutput:
        tokens, req = row.tokens, row.request
        ended = bool(tokens) and tokens[-1] == self.eos_id
        reply = tokens[:-1] if ended else tokens
        if self._drop_ids is None:
            text = self.tokenizer.decode(reply, skip_special_tokens=True)
        else:
            text = self.tokenizer.decode([t for t in reply if t not in self._drop_ids], skip_special_tokens=False)
        action = parse(text, "stop" if ended else "length", self.reading, req.tools)
        return PolicyOutput(action=action, prompt_token_ids=req.prompt, completion_token_ids=list(tokens),
                            completion_logprobs=list(row.logprobs), version=req.adapter)

    # ------------------------------------------------------------------ adapters
    def load_version(self, path: Path, version: str) -> None:
        """Read and check the adapter now (this thread); it is servable once this returns."""
        try:
            scale = adapter_scale(path, self._shapes)
            adapter = self._g.Adapter(str(path / "adapter_model.safetensors"))
        except AdapterError:
            raise
        except Exception as exc:
            raise AdapterError(f"adapter {path} could not be loaded by OpenVINO: {exc}") from None
        with self._adapters_lock:
            self._adapters[version] = (adapter, scale)

    def unload_version(self, version: str) -> None:
        """Forget the version (a request already running with it keeps its applied tensors)."""
        with self._adapters_lock:
            self._adapters.pop(version, None)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._worker.join(timeout=60)
            shutil.rmtree(self._tmp, ignore_errors=True)

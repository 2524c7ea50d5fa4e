"""The policy interface every front end calls, and the hot-swap contract both backends share.

Hot-swap contract: `load_adapter(path, version)` validates and loads the new adapter into the
backend *first*, and only then flips the handle that calls read; a call reads the handle once,
when it starts, so calls already in flight finish on the version they started with, and their
output names it. The last `keep_versions` versions stay loaded, so `rollback()` is a flip. A
version still in use by an in-flight call is unloaded only after that call ends. A corrupt
adapter raises `AdapterError` and the live version keeps serving.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import json
import re
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, cast

from forge_bridge.core.errors import (
    AdapterError,
    InvalidArgument,
    Unsupported,
    WrongType,
)
from forge_bridge.core.deprecated import renamed
from forge_bridge.core.types import Action

DEFAULT_SLOT = "default"
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


_SAMPLING_OVERRIDE: contextvars.ContextVar[dict] = contextvars.ContextVar("forge_bridge_sampling",
                                                                           default={})


@contextlib.contextmanager
def sampling(**overrides: Any) -> Iterator[None]:
    """Override sampling settings for every model call made in this context, whatever the
    adapter asks for: `with fb.sampling(temperature=0): agent.invoke(...)` evaluates the same
    agent object greedily that trains at temperature 1."""
    Sampling.from_kwargs(overrides)  # validate now, not at the first call
    token = _SAMPLING_OVERRIDE.set({**_SAMPLING_OVERRIDE.get(), **overrides})
    try:
        yield
    finally:
        _SAMPLING_OVERRIDE.reset(token)


@renamed("adapter", "version")  # its name until schema version 6, kept for one release
@dataclass
class PolicyOutput:
    """One model call's result with the exact tokens the backend sampled."""

    action: Action
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    version: str | None
    """The adapter version that produced this output (None: the base model)."""
    latency_s: float = 0.0
    info: dict = field(default_factory=dict)
    temperature: float | None = None
    """The temperature the completion was sampled at (set by `Policy.chat`)."""
    slot: str | None = None
    """The policy slot that served the call (set by `Policy.chat`)."""

    @property
    def text(self) -> str:
        return self.action.content

    @property
    def tool_calls(self) -> list[dict]:
        return [tc.to_openai() for tc in self.action.tool_calls]

    @property
    def finish_reason(self) -> str | None:
        return self.action.finish_reason

    @property
    def message(self) -> dict:
        """The OpenAI-format assistant message."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.action.content}
        if self.action.reasoning:  # vLLM's and DeepSeek's name; templates of thinking models read it
            msg["reasoning_content"] = self.action.reasoning
        if self.action.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@dataclass(frozen=True)
class Sampling:
    """Per-call sampling settings, named as in the OpenAI API."""

    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_tokens: int = 256
    """Completion length limit; hitting it sets finish_reason 'length' (the step is not
    `truncated`: that flag means a limit cut the whole episode)."""
    seed: int | None = None
    """Seed for this call's sampling (reproducible outputs)."""
    explore: float = 0.0
    """Exploration (embedded policy only): a sampled call made right after a tool's result
    begins with a tool call's opening, up to the tool's name, with this probability; the recorded
    log-probabilities are those of that mixture, so the trainer's importance weight re-weights
    the opening's tokens (`ForcedOpening`). 0: off; greedy calls never explore; vLLM refuses it."""

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise InvalidArgument(f"temperature: expected a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise InvalidArgument(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidArgument(f"max_tokens: expected an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidArgument(f"seed: expected an int or None, got {self.seed!r}")
        if isinstance(self.explore, bool) or not isinstance(self.explore, (int, float)) or not 0 <= self.explore < 1:
            raise InvalidArgument(f"explore: expected a number in [0, 1), got {self.explore!r}")

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "Sampling":
        known = {"temperature", "top_p", "max_tokens", "seed", "explore"}
        unknown = set(kwargs) - known - {"max_completion_tokens"}
        if unknown:
            raise WrongType(f"unknown sampling argument(s) {sorted(unknown)}; accepted: {sorted(known)}")
        args = {k: v for k, v in kwargs.items() if k in known and v is not None}
        if kwargs.get("max_completion_tokens") is not None:
            args.setdefault("max_tokens", kwargs["max_completion_tokens"])
        return cls(**args)


def check_adapter_dir(path: str | Path) -> Path:
    """A peft LoRA directory with a readable config and safetensors weights (never pickle)."""
    path = Path(path)
    if not path.is_dir():
        raise AdapterError(f"adapter {path}: not a directory")
    cfg = path / "adapter_config.json"
    weights = path / "adapter_model.safetensors"
    if not cfg.is_file():
        raise AdapterError(f"adapter {path}: adapter_config.json is missing")
    if not weights.is_file():
        pickled = path / "adapter_model.bin"
        hint = " (adapter_model.bin is pickle, which is refused)" if pickled.exists() else ""
        raise AdapterError(f"adapter {path}: adapter_model.safetensors is missing{hint}")
    try:
        json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterError(f"adapter {path}: adapter_config.json is unreadable ({exc})") from None
    try:
        from safetensors import safe_open

        with safe_open(str(weights), framework="numpy") as f:
            keys = list(f.keys())
            for k in keys:  # reading each tensor catches truncated files
                f.get_slice(k)[:]
    except Exception as exc:  # safetensors raises several types for corrupt files
        raise AdapterError(f"adapter {path}: adapter_model.safetensors is corrupt ({exc})") from None
    if not keys:
        raise AdapterError(f"adapter {path}: adapter_model.safetensors holds no tensors")
    return path


@dataclass(frozen=True)
class ClientSpec:
    """How another process (a Ray worker) builds a client of the same backend: picklable, so
    `make(*args, **kwargs)` must be a module-level callable and the arguments plain data."""

    make: Callable[..., "Policy"]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def connect(self) -> "Policy":
        return self.make(*self.args, **self.kwargs)


class Policy(abc.ABC):
    """Where every model call of a wrapped agent goes."""

    behaviour: str | None = "policy"
    """Whose steps its replies are (`BEHAVIOURS`; None: whoever the episode says, as a script's)."""

    def __init__(self, keep_versions: int = 3, adapter_roots: Sequence[str | Path] | None = None) -> None:
        """`adapter_roots`: folders adapters may be loaded from (None: anywhere); a path outside
        them, symlinks resolved, is refused before any file is read."""
        if keep_versions < 1:
            raise InvalidArgument(f"keep_versions: expected >= 1, got {keep_versions}")
        self.keep_versions = keep_versions
        self.adapter_roots = None if adapter_roots is None else [Path(r).resolve() for r in adapter_roots]
        # slot -> published versions still kept, oldest first; None = the base model
        self._slots: dict[str, list[str | None]] = {DEFAULT_SLOT: [None]}
        self._published: set[str] = set()  # every version name ever used (names are immutable)
        self._in_use: dict[str | None, int] = {}
        self._retired: set[str] = set()
        self._swap_lock = threading.RLock()
        self.role_slots: dict[str, str] = {}
        """Role -> slot, as the front ends that serve roles from slots declared it
        (`declare_role_slots`): the one mapping a trainer of this policy trains by."""

    def declare_role_slots(self, mapping: dict[str, str]) -> None:
        """Record that these roles are served from these slots (a `ForgeLLM(role_slot=...)` does
        it); a role declared again on another slot is refused, naming both."""
        with self._swap_lock:
            for role, slot in mapping.items():
                if self.role_slots.get(role, slot) != slot:
                    raise InvalidArgument(f"role {role!r} is served from slot {self.role_slots[role]!r} already; "
                                          f"refusing to serve it from {slot!r} too (one slot per role)")
            self.role_slots.update(mapping)

    # ------------------------------------------------------------------ the calls
    def chat(self, messages: list[dict], tools: list[dict] | None = None, *, slot: str = DEFAULT_SLOT,
             **sampling: Any) -> PolicyOutput:
        """One model call: messages (and tool schemas) in OpenAI format in, exact tokens out.
        `slot` picks whose current adapter serves it (one slot per CrewAI role, say)."""
        params = Sampling.from_kwargs({**sampling, **_SAMPLING_OVERRIDE.get()})
        with self._use_current(slot) as adapter:
            t0 = time.perf_counter()
            out = self.generate(messages, tools, params, adapter)
            out.latency_s, out.temperature, out.slot = time.perf_counter() - t0, float(params.temperature), slot
            return out

    async def achat(self, messages: list[dict], tools: list[dict] | None = None, *,
                    slot: str = DEFAULT_SLOT, **sampling: Any) -> PolicyOutput:
        params = Sampling.from_kwargs({**sampling, **_SAMPLING_OVERRIDE.get()})
        with self._use_current(slot) as adapter:
            t0 = time.perf_counter()
            out = await self.agenerate(messages, tools, params, adapter)
            out.latency_s, out.temperature, out.slot = time.perf_counter() - t0, float(params.temperature), slot
            return out

    # The backend protocol: what a backend implements (`generate`, `load_version`,
    # `unload_version`; `agenerate` where it has a native async path) and what a policy made of
    # others (`PolicyPool`, a Ray-hosted policy) calls on its members. `chat`, `load_adapter` and
    # the slots wrap them with the hot-swap bookkeeping.
    @abc.abstractmethod
    def generate(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling,
                 adapter: str | None) -> PolicyOutput:
        """One model call served by `adapter` (a loaded version; None: the base model)."""

    async def agenerate(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling,
                        adapter: str | None) -> PolicyOutput:
        """`generate` without blocking the event loop (a thread, unless the backend has better)."""
        return await asyncio.to_thread(self.generate, messages, tools, sampling, adapter)

    def logprobs(self, prompt_token_ids: Sequence[int], completion_token_ids: Sequence[int], *,
                 slot: str = DEFAULT_SLOT) -> list[float]:
        """log P(completion token k | the prompt and the completion tokens before k), one per
        completion token, under the version `slot` serves now, at temperature 1: a teacher's
        per-token judgement of tokens another policy sampled. A backend that gives no token
        log-probabilities raises `Unsupported` (it can still teach by acting)."""
        prompt, completion = list(prompt_token_ids), list(completion_token_ids)
        if not prompt or not completion or not all(isinstance(t, int) and t >= 0 for t in prompt + completion):
            raise InvalidArgument("logprobs: expected non-empty lists of token ids (ints >= 0) for the prompt and "
                                  "the completion")
        with self._use_current(slot) as adapter:
            return self._logprobs(prompt, completion, adapter)

    def score(self, prompt_token_ids: Sequence[int], completion_token_ids: Sequence[int], *,
              slot: str = DEFAULT_SLOT) -> list[float]:
        """Deprecated: `logprobs` (a score is a judge's number for an episode)."""
        warnings.warn("Policy.score is now Policy.logprobs", DeprecationWarning, stacklevel=2)
        return self.logprobs(prompt_token_ids, completion_token_ids, slot=slot)

    def _logprobs(self, prompt: list[int], completion: list[int], adapter: str | None) -> list[float]:
        raise Unsupported(f"{type(self).__name__} gives no token log-probabilities: as a teacher it can act "
                          "(guide rollouts, relabelling) but not score the student's tokens (distillation)")

    def tokenize(self, text: str) -> list[int]:
        """The token ids of `text`, no special tokens added, in this policy's vocabulary (to check
        that a teacher and a student share one)."""
        raise Unsupported(f"{type(self).__name__} does not say how it tokenizes text")

    # ------------------------------------------------------------------ hot-swap
    def current(self, slot: str = DEFAULT_SLOT) -> str | None:
        """The version new calls of `slot` use (None: the base model)."""
        with self._swap_lock:
            return self._slots.get(slot, [None])[-1]

    @property
    def slots(self) -> list[str]:
        """Slot names that have (or had) adapters; each serves its own current version."""
        with self._swap_lock:
            return list(self._slots)

    def versions(self, slot: str = DEFAULT_SLOT) -> list[str | None]:
        """Versions `rollback(slot)` can return to, oldest first (None: the base model)."""
        with self._swap_lock:
            return list(self._slots.get(slot, [None]))

    def _use_current(self, slot: str):
        policy = self

        class _Use:
            def __enter__(self) -> str | None:
                with policy._swap_lock:
                    self.adapter = policy._slots.get(slot, [None])[-1]
                    policy._in_use[self.adapter] = policy._in_use.get(self.adapter, 0) + 1
                return self.adapter

            def __exit__(self, *exc: object) -> None:
                with policy._swap_lock:
                    policy._in_use[self.adapter] -= 1
                    policy._evict_unused()

        return _Use()

    def _allowed(self, path: str | Path) -> Path:
        resolved = Path(path).resolve()
        if self.adapter_roots is not None and not any(
                resolved == root or root in resolved.parents for root in self.adapter_roots):
            raise AdapterError(f"adapter {path}: outside the allowed folders "
                               f"({', '.join(map(str, self.adapter_roots))}); refused")
        return resolved

    def load_adapter(self, path: str | Path, version: str, *, slot: str = DEFAULT_SLOT) -> str:
        """Load a LoRA adapter as `version` and make it current in `slot` (see the module
        docstring)."""
        if not isinstance(version, str) or not _VERSION.match(version):
            raise AdapterError(f"version: expected a name like 'run-v3' (letters, digits, . _ -), "
                               f"got {version!r}")
        path = check_adapter_dir(self._allowed(path))
        with self._swap_lock:
            if version in self._published:
                raise AdapterError(f"version {version!r} was already published; use a new version "
                                   "name (versions are immutable so outputs stay attributable)")
        self.load_version(path, version)  # may raise: nothing has changed yet
        with self._swap_lock:
            self._published.add(version)
            history = self._slots.setdefault(slot, [None])
            history.append(version)
            while len(history) > self.keep_versions + 1:  # +1: the base stays reachable
                self._retired.add(cast(str, history.pop(1)))  # past the base model (None): a version
            self._evict_unused()
        return version

    def promote(self, version: str, from_slot: str, to_slot: str = DEFAULT_SLOT) -> str:
        """Make `version`, current in `from_slot` (a candidate tried there), current in `to_slot` with no
        reload; `from_slot` serves what it did before, and `rollback(to_slot)` returns to the replaced one."""
        with self._swap_lock:
            source = self._slots.get(from_slot, [None])
            if source[-1] != version or version is None:
                raise AdapterError(f"promote: {version!r} is not what slot {from_slot!r} serves ({source[-1]!r})")
            source.pop()
            self._slots.setdefault(to_slot, [None]).append(version)
            history = self._slots[to_slot]
            while len(history) > self.keep_versions + 1:
                self._retired.add(cast(str, history.pop(1)))  # past the base model (None): a version
            self._evict_unused()
        return version

    def rollback(self, slot: str = DEFAULT_SLOT) -> str | None:
        """Serve the previous version of `slot` again (instant: it is still loaded); returns it."""
        with self._swap_lock:
            history = self._slots.get(slot, [None])
            if len(history) < 2:
                raise AdapterError(f"nothing to roll back to: slot {slot!r} already serves the base model")
            self._retired.add(cast(str, history.pop()))  # not the base model (None): a version
            self._evict_unused()
            return history[-1]

    def _evict_unused(self) -> None:
        for version in list(self._retired):
            if self._in_use.get(version, 0) == 0:
                self._retired.discard(version)
                try:
                    self.unload_version(version)
                except Exception:  # eviction is best effort; the version is no longer served
                    pass

    @abc.abstractmethod
    def load_version(self, path: Path, version: str) -> None:
        """Make the adapter folder at `path` servable as `version` (no slot serves it yet)."""

    @abc.abstractmethod
    def unload_version(self, version: str) -> None:
        """Free a version no slot serves and no call uses any more."""

    # ------------------------------------------------------------------ clients in other processes
    def client_spec(self) -> ClientSpec:
        """What a worker process needs to reach this policy's backend (`spec.connect()` there).
        A policy whose model lives in this process has none: host it in a Ray actor
        (`forge_bridge.scale.RayPolicy`) or serve it with vLLM."""
        raise Unsupported(f"{type(self).__name__} serves from this process only; other processes "
                          "cannot call it. Host it with forge_bridge.scale.RayPolicy.start(...), or "
                          "serve the model with vLLM (VLLMPolicy)")

    def serving_state(self) -> dict:
        """What a worker's client mirrors before each episode: each slot's current version."""
        with self._swap_lock:
            return {"slots": {slot: history[-1] for slot, history in self._slots.items()}}

    def mirror(self, state: dict) -> None:
        """Serve what `serving_state()` of the publishing policy says, on a client of the same
        backend: the versions are already loaded there, so nothing is loaded or unloaded here,
        and each step records exactly the version that served it."""
        with self._swap_lock:
            for slot, version in state["slots"].items():
                self._slots[slot] = [None] if version is None else [None, version]
                if version is not None:
                    self._published.add(version)

    def decoding_counts(self) -> dict[str, float] | None:
        """Running totals of the policy's own decoding (tokens and seconds, prefill and decode),
        for the rates an iteration logs (`machine.decoding_rates`); None where the model is
        served elsewhere (vLLM, a Ray host): its server counts them."""
        return None

    def close(self) -> None:
        """Release the model or connections."""

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


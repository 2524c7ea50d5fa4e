"""A policy hosted in a Ray actor, so every worker of the cluster can call it.

    policy = RayPolicy.start(lambda: LocalPolicy(model_dir))              # the embedded model
    server = RayPolicy.start(serve_vllm(model_dir), num_gpus=1)          # a vLLM server on a GPU
    pool = PolicyPool([RayPolicy.start(serve_vllm(m), num_gpus=1) for _ in range(4)])

The actor builds the policy with the factory and answers `chat` calls (many at once: the
embedded model batches them). The `RayPolicy` in this process is a client like any policy: the
trainer publishes to it, and `load_adapter` sends the adapter's files as bytes through Ray's
object store to the actor, which writes them atomically into a folder on its own node before
loading them, so no file system is shared. Its `client_spec()` is the actor handle: workers
call the same actor.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.atomic import write_dir
from forge_bridge.core.errors import ForgeBridgeError, PolicyResponseError, PolicyUnavailable, WrongType
from forge_bridge.policies.base import ClientSpec, Policy, PolicyOutput, Sampling
from forge_bridge.scale.cluster import ensure_ray, require_ray

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class PolicyHost:
    """The Ray actor: one policy, its adapters in a folder of its own node."""

    def __init__(self, factory: Callable[[], Policy]) -> None:
        self.policy = factory()
        if not isinstance(self.policy, Policy):
            raise WrongType(f"the policy factory returned {type(self.policy).__name__}, not a Policy")
        self.adapters = Path(tempfile.mkdtemp(prefix="forge-bridge-host-adapters-"))

    def describe(self) -> str:
        return type(self.policy).__name__

    def chat(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling,
             adapter: str | None) -> PolicyOutput:
        return self.policy.generate(messages, tools, sampling, adapter)

    def load(self, files: dict[str, bytes], version: str) -> str:
        def write(folder: Path) -> None:
            for name, data in files.items():
                (folder / name).write_bytes(data)

        path = write_dir(self.adapters / version, write)
        self.policy.load_version(path, version)
        return str(path)

    def unload(self, version: str) -> None:
        self.policy.unload_version(version)
        shutil.rmtree(self.adapters / version, ignore_errors=True)

    def close(self) -> None:
        self.policy.close()
        shutil.rmtree(self.adapters, ignore_errors=True)


def _connect(handle: Any) -> "RayPolicy":
    return RayPolicy(handle)


class RayPolicy(Policy):
    """A client of a `PolicyHost` actor (see the module docstring)."""

    def __init__(self, handle: Any, *, timeout_s: float = 600.0, keep_versions: int = 3,
                 adapter_roots: Any = None) -> None:
        """`timeout_s`: the longest a call (or an adapter load) may take before the host counts
        as unavailable."""
        super().__init__(keep_versions=keep_versions, adapter_roots=adapter_roots)
        self.handle = handle
        self.timeout_s = float(timeout_s)
        self.owner = False
        """This client started the actor: `close()` stops it."""

    @classmethod
    def start(cls, factory: Callable[[], Policy], *, num_cpus: float = 1, num_gpus: float = 0,
              max_concurrency: int = 64, ray_init: dict | None = None, **options: Any) -> "RayPolicy":
        """Start a host actor building its policy with `factory()` (picklable: a lambda over
        plain values is), wait until it answers, and return its client. `options`: more of
        Ray's actor options (`resources`, `runtime_env`, `scheduling_strategy`, ...)."""
        ray = ensure_ray(ray_init)
        actor = ray.remote(PolicyHost).options(num_cpus=num_cpus, num_gpus=num_gpus,
                                              max_concurrency=max_concurrency, **options)
        handle = actor.remote(factory)
        try:
            ray.get(handle.describe.remote())
        except ray.exceptions.RayError as exc:
            ray.kill(handle)
            raise PolicyUnavailable(f"the policy host could not start: {exc}") from None
        policy = cls(handle)
        policy.owner = True
        return policy

    def _call(self, ref: Any, what: str) -> Any:
        ray = require_ray()
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as exc:
            raise self._error(exc, what) from None
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            raise PolicyUnavailable(f"{what}: the policy host actor is gone or not answering "
                                    f"({type(exc).__name__})") from None

    @staticmethod
    def _error(exc: Any, what: str) -> Exception:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ForgeBridgeError):  # the hosted policy's own typed error, as it raised it
            return cause
        return PolicyResponseError(f"{what}: the hosted policy raised {type(cause).__name__}: {cause}")

    def generate(self, messages, tools, sampling: Sampling, adapter: str | None) -> PolicyOutput:
        return self._call(self.handle.chat.remote(messages, tools, sampling, adapter), "chat")

    async def agenerate(self, messages, tools, sampling: Sampling, adapter: str | None) -> PolicyOutput:
        ray = require_ray()
        try:
            return await asyncio.wait_for(self.handle.chat.remote(messages, tools, sampling, adapter), self.timeout_s)
        except ray.exceptions.RayTaskError as exc:
            raise self._error(exc, "chat") from None
        except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
            raise PolicyUnavailable(f"chat: the policy host actor is gone or not answering "
                                    f"({type(exc).__name__})") from None

    def load_version(self, path: Path, version: str) -> None:
        files = {name: (path / name).read_bytes() for name in ADAPTER_FILES}
        self._call(self.handle.load.remote(files, version), f"loading adapter {version}")

    def unload_version(self, version: str) -> None:
        self._call(self.handle.unload.remote(version), f"unloading adapter {version}")

    def client_spec(self) -> ClientSpec:
        return ClientSpec(_connect, (self.handle,))

    def close(self) -> None:
        """Stop the host actor if this client started it (workers' clients leave it running)."""
        if not self.owner:
            return
        ray = require_ray()
        self.owner = False
        try:
            ray.get(self.handle.close.remote(), timeout=30)
        except Exception:  # already gone
            pass
        ray.kill(self.handle)


class _VLLMFactory:
    """Starts a vLLM server on the host actor's node and returns a policy that stops it on close."""

    def __init__(self, model: str, server_options: dict) -> None:
        self.model, self.server_options = model, server_options

    def __call__(self) -> Policy:
        from forge_bridge.policies.vllm import VLLMPolicy
        from forge_bridge.policies.vllm_server import VLLMServer

        server = VLLMServer(self.model, **self.server_options)
        server.start()
        policy = VLLMPolicy(server.base_url)
        close = policy.close

        def close_both() -> None:
            close()
            server.stop()

        policy.close = close_both  # type: ignore[method-assign]
        return policy


def serve_vllm(model: str | Path, **server_options: Any) -> Callable[[], Policy]:
    """A factory for `RayPolicy.start`: a `VLLMServer` of `model` (a path on the actor's node,
    or a hub id when it is online) started inside the host actor, LoRA enabled."""
    return _VLLMFactory(str(model), server_options)


__all__ = ["PolicyHost", "RayPolicy", "serve_vllm"]

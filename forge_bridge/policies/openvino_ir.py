"""A model's OpenVINO IR, exported once from its local safetensors folder and cached.

The exporter (optimum-intel) pins a transformers of its own, so it lives in its own virtual
environment (`.venv-openvino`, `make openvino`, pinned by `constraints-openvino.txt`) and runs as
a subprocess, offline: it reads the local folder and downloads nothing. The IR lands under the
models cache (`cache_dir()/models/openvino/<folder>-<weights>-<stamp>`), the stamp naming the
source folder and its files' sizes and times, so a changed model is exported anew. The runtime
(`openvino-genai`, `policies/openvino.py`) lives in the main environment and needs no exporter
once the IR is cached.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from forge_bridge.core.errors import ForgeBridgeError, InvalidArgument

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
WEIGHT_FORMATS = ("fp32", "fp16", "int8", "int4")
_MODEL_FILE = "openvino_model.xml"


class ExportError(ForgeBridgeError, RuntimeError):
    """The IR could not be exported (no exporter found, or it failed)."""


def find_exporter_python() -> str:
    """`FORGE_BRIDGE_OPENVINO_EXPORT_PYTHON`, else `.venv-openvino` (here or beside the package),
    else this interpreter if it can import optimum.intel."""
    explicit = os.environ.get("FORGE_BRIDGE_OPENVINO_EXPORT_PYTHON")
    if explicit:
        return explicit
    for root in (Path.cwd(), REPO_ROOT):
        candidate = root / ".venv-openvino" / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    if importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("optimum.intel") is not None:
        return sys.executable
    raise ExportError("no OpenVINO exporter found: build .venv-openvino (make openvino) or set "
                      "FORGE_BRIDGE_OPENVINO_EXPORT_PYTHON to a Python with optimum-intel[openvino]")


def stamp(model_dir: Path, weight_format: str) -> str:
    """Names the source folder and its files' sizes and times: a changed model gets a new
    conversion (the IR here, bench/rollouts.py's ONNX Runtime GenAI model)."""
    digest = hashlib.sha256(str(model_dir.resolve()).encode())
    for f in sorted(p for p in model_dir.iterdir() if p.is_file()):
        st = f.stat()
        digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    digest.update(weight_format.encode())
    return digest.hexdigest()[:12]


def ir_dir(model_dir: str | os.PathLike, weight_format: str = "fp32") -> Path:
    """Where the IR of `model_dir` in `weight_format` is cached (it may not exist yet)."""
    from forge_bridge.policies.models import cache_dir

    source = Path(model_dir)
    return cache_dir() / "models" / "openvino" / f"{source.name}-{weight_format}-{stamp(source, weight_format)}"


def export(model_dir: str | os.PathLike, weight_format: str = "fp32", *, python: str | None = None,
           timeout_s: float = 1800.0) -> Path:
    """The cached IR of the transformers folder `model_dir`, exported first if missing (tens of
    seconds for 135M, minutes for 0.5B). `weight_format`: 'fp32' (exact weights), 'fp16',
    'int8' or 'int4' (weight-only compression by optimum-intel's defaults)."""
    if weight_format not in WEIGHT_FORMATS:
        raise InvalidArgument(f"weight_format: expected one of {WEIGHT_FORMATS}, got {weight_format!r}")
    source = Path(model_dir)
    if not (source / "config.json").is_file():
        raise InvalidArgument(f"model_dir {source}: not a transformers folder (config.json is missing)")
    target = ir_dir(source, weight_format)
    if (target / _MODEL_FILE).is_file():
        return target
    python = python or find_exporter_python()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    command = [python, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(source),
               "--task", "text-generation-with-past", "--weight-format", weight_format, str(tmp)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # a local conversion
    logger.info("exporting %s to OpenVINO IR (%s) ...", source, weight_format)
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
        if done.returncode != 0 or not (tmp / _MODEL_FILE).is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise ExportError(f"exporting {source} to OpenVINO IR failed (exit {done.returncode}):\n{tail}")
        try:
            tmp.rename(target)
        except OSError:  # another process exported it meanwhile
            if not (target / _MODEL_FILE).is_file():
                raise
    except subprocess.TimeoutExpired:
        raise ExportError(f"exporting {source} to OpenVINO IR took longer than {timeout_s:.0f} s") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

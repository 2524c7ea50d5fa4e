"""Which device a model runs on, and in which precision: CUDA, then MPS, then the CPU.

torch is imported inside the functions: `import forge_bridge` stays light.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from typing import Any

from forge_bridge.core.errors import InvalidArgument, Unsupported

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def check_device(device: str) -> str:
    """`device` if it names a device kind forge-bridge runs on (availability is checked later)."""
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise InvalidArgument(f"device: expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    return device


def resolve_device(device: str = "auto") -> str:
    """'auto' -> 'cuda' when a CUDA GPU is visible, else 'mps' (Apple silicon), else 'cpu'. A
    device asked for by name that this machine lacks is an error, never a silent CPU run."""
    import torch

    check_device(device)
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if device == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if device.startswith("cuda"):
        if not cuda:
            raise Unsupported(f"device={device!r}: torch sees no CUDA GPU here (torch "
                              f"{torch.__version__}, built for CUDA {torch.version.cuda}); use 'auto' or 'cpu'")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise Unsupported(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device == "mps" and not mps:
        raise Unsupported("device='mps': this torch has no MPS backend here; use 'auto' or 'cpu'")
    return device


def bf16_supported(device: str = "cpu") -> bool:
    """Whether bf16 math is fast here: a GPU that has it, a CPU with AVX512-BF16 or AMX."""
    import torch

    kind, _, index = device.partition(":")
    if kind == "cuda":
        with torch.cuda.device(int(index or 0)):
            return bool(torch.cuda.is_bf16_supported())
    if kind == "mps":
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def autocast(device: str, bf16: bool) -> Any:
    """bf16 autocast on the device's kind when `bf16`, else a no-op context."""
    import torch

    return torch.autocast(device.partition(":")[0], dtype=torch.bfloat16) if bf16 else nullcontext()

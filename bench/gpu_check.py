"""The trainer on a GPU: update throughput on a model of a real size, and a short learning run.

Sized for a bare CUDA machine (torch, transformers, peft, accelerate; no vLLM, no LangChain, no
network): forge-bridge is imported from this checkout without installing it. Run it with
`bash bench/gpu_check.sh` (or `python bench/gpu_check.py --device cpu --quick` to try the
script itself on a CPU). Two parts:

1. **Update tokens/s**: one GRPO update (log-probabilities, clipped loss, backward, AdamW step on
   the LoRA) over the same synthetic samples, on a randomly initialised model built from a real
   configuration (Qwen2-0.5B by default: no weights needed), on the GPU and on the CPU, side by
   side, printed as a ratio. Tokens/s counts the trained (completion) tokens.
2. **Learning on the device**: a tiny model taught to pick `add` or `multiply` at random for the
   same question; GRPO with the embedded policy and the trainer both on the device, asserting
   that the model, the LoRA, the optimizer state and the batches live there, and that the
   success rate rises.

What it does not cover: vLLM (not on the bare machine), multi-GPU, models loaded from real
weights, rollout speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def import_from_checkout() -> None:
    """`forge_bridge` from this checkout when it is not installed: its `trainer` and `adapters`
    packages live at the repository root (pyproject maps them), so a folder of links lays the
    package out as an install would."""
    import importlib.util

    if importlib.util.find_spec("forge_bridge") is not None:
        return
    package = Path(tempfile.mkdtemp(prefix="forge-bridge-src-")) / "forge_bridge"
    package.mkdir()
    for item in (ROOT / "forge_bridge").iterdir():
        (package / item.name).symlink_to(item)
    for name in ("adapters", "trainer"):
        (package / name).symlink_to(ROOT / name)
    sys.path.insert(0, str(package.parent))


CONFIGS = {  # the published configurations' shapes (vocabulary included: the head costs)
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    "qwen2-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, vocab_size=1024),
}


def random_model_dir(name: str, out: Path) -> Path:
    """A randomly initialised Qwen2 model of configuration `name`, saved (safetensors) with a
    small tokenizer: the trainer loads it like any model directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from forge_bridge.policies import models

    _, tokenizer = models.tiny()
    config = Qwen2Config(**CONFIGS[name], max_position_embeddings=4096, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config)
    return models.save(model, tokenizer, out)


def synthetic_samples(n: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0):
    """n GRPO samples: random prompt and completion ids, advantages +-1, sampler logprobs -1."""
    import torch

    from forge_bridge.trainer.batch import Sample

    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        ids = torch.randint(10, vocab, (prompt_len + completion_len,), generator=g).tolist()
        mask = [0] * prompt_len + [1] * completion_len
        adv = 1.0 if i % 2 == 0 else -1.0
        samples.append(Sample(input_ids=ids, loss_mask=mask, sampler_logprobs=[-1.0 if m else 0.0 for m in mask],
                              advantages=[adv * m for m in mask], temperature=1.0))
    return samples


def update_throughput(model_dir: Path, device: str, samples, steps: int, microbatch: int, out: Path) -> dict:
    """Trained tokens/s of `steps` GRPO updates (after one warm-up) on `device`."""
    import torch

    from forge_bridge.policies import models
    from forge_bridge.policies.scripted import ScriptedPolicy
    from forge_bridge.trainer.config import GRPOConfig
    from forge_bridge.trainer.grpo import GRPOTrainer

    _, tokenizer = models.load(str(model_dir))
    policy = ScriptedPolicy(lambda m, t: "", tokenizer)  # the update needs no rollouts
    config = GRPOConfig(out_dir=str(out), device=device, minibatch_size=len(samples),
                        microbatch_size=microbatch, max_seq_len=4096, progress=False, lr=1e-4, warmup_steps=0,
                        kl_beta=0.0)
    trainer = GRPOTrainer(policy, config, model=str(model_dir))
    where = {p.device.type for p in trainer.model.parameters()}
    assert where == {torch.device(device).type}, f"parameters on {where}, expected {device}"
    tokens = sum(sum(s.loss_mask) for s in samples)
    trainer.update(samples)  # warm-up: kernels, allocator, optimizer state
    state_devices = {t.device.type for st in trainer.learner.optimizer.state.values() for t in st.values()
                     if isinstance(t, torch.Tensor) and t.dim() > 0}
    assert state_devices == {torch.device(device).type}, f"optimizer state on {state_devices}"
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.update(samples)
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    trainer.close()
    return {"device": device, "bf16": trainer.bf16, "tokens_per_update": tokens,
            "s_per_update": statistics.median(times), "tokens_per_s": tokens / statistics.median(times),
            "peak_gib": peak}


def learning_run(device: str, iterations: int, out: Path) -> dict:
    """GRPO on the add-or-multiply choice with the policy and the trainer on `device`."""
    import torch

    from forge_bridge.app import testing
    from forge_bridge.core.episode import current_episode
    from forge_bridge.core.recording import Limits, call_policy
    from forge_bridge.policies import models
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.trainer.config import GRPOConfig
    from forge_bridge.trainer.grpo import GRPOTrainer

    multiply = json.loads(json.dumps(testing.ADD_TOOL).replace('"add"', '"multiply"').replace(
        "Add two", "Multiply two"))
    tools = [testing.ADD_TOOL, multiply]
    call = '<tool_call>\n{{"name": "{}", "arguments": {{"a": 2, "b": 3}}}}\n</tool_call>'
    model, tokenizer = models.tiny(seed=1)
    testing.teach(model, tokenizer, [(testing.ASK, tools, call.format("add")),
                                     (testing.ASK, tools, call.format("multiply"))], steps=150)
    path = models.save(model, tokenizer, out / "model")
    policy = LocalPolicy(str(path), device=device, dtype="float32")

    def rollout(task) -> float:
        reply = call_policy(policy, current_episode(), testing.ASK, tools, source="gpu_check",
                            limits=Limits(), sampling={"temperature": 1.0, "max_tokens": 40})
        calls = reply.action.tool_calls if reply is not None else []
        return 1.0 if calls and calls[0].name == "add" else 0.0

    config = GRPOConfig(out_dir=str(out / "run"), device=device, group_size=16, lr=3e-3,
                        minibatch_size=16, progress=False, lora_rank=8, lora_alpha=16, microbatch_size=None,
                        warmup_steps=0, kl_beta=0.0)
    trainer = GRPOTrainer(policy, config, model=str(path))
    history = trainer.train(rollout, [{"id": "add"}], iterations=iterations)
    kind = torch.device(device).type
    checks = {
        "policy_model": next(policy.model.parameters()).device.type == kind,
        "trainer_lora": all(p.device.type == kind for p in trainer.model.parameters() if p.requires_grad),
        "trainer_base": next(trainer.model.parameters()).device.type == kind,
        "optimizer_state": all(t.device.type == kind for st in trainer.learner.optimizer.state.values()
                               for t in st.values() if isinstance(t, torch.Tensor) and t.dim() > 0),
        "batch": trainer.learner.collate(synthetic_samples(1, 4, 4, 100))["input_ids"].device.type == kind,
    }
    trainer.close()
    policy.close()
    success = [m["success_rate"] for m in history]
    return {"device": device, "success_by_iteration": success, "checks": checks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="the device to check (against the CPU)")
    ap.add_argument("--config", default="qwen2-0.5b", choices=sorted(CONFIGS))
    ap.add_argument("--samples", type=int, default=8, help="sequences per update")
    ap.add_argument("--prompt-len", type=int, default=384)
    ap.add_argument("--completion-len", type=int, default=128)
    ap.add_argument("--microbatch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="timed updates on the device")
    ap.add_argument("--cpu-steps", type=int, default=1, help="timed updates on the CPU (0: skip)")
    ap.add_argument("--iterations", type=int, default=10, help="learning-run iterations")
    ap.add_argument("--quick", action="store_true", help="tiny everything: try the script on a CPU")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.quick:
        args.config, args.samples, args.prompt_len, args.completion_len = "tiny", 4, 32, 16
        args.steps, args.iterations = 1, 3
    import_from_checkout()
    import torch

    from forge_bridge.policies.device import resolve_device

    device = resolve_device(args.device)
    print(f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.startswith("cuda") else ""))
    results: dict = {"device": device, "config": args.config}
    with tempfile.TemporaryDirectory(prefix="forge-gpu-check-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        model_dir = random_model_dir(args.config, tmp / "model")
        print(f"built a random {args.config} in {time.perf_counter() - t0:.1f} s")
        samples = synthetic_samples(args.samples, args.prompt_len, args.completion_len,
                                    CONFIGS[args.config]["vocab_size"])
        rows = [update_throughput(model_dir, device, samples, args.steps, args.microbatch, tmp / "dev")]
        if args.cpu_steps and device != "cpu":
            rows.append(update_throughput(model_dir, "cpu", samples, args.cpu_steps, args.microbatch, tmp / "cpu"))
        results["update"] = rows
        print(f"\nGRPO update, {args.config} (random weights), {args.samples} x "
              f"({args.prompt_len} prompt + {args.completion_len} completion) tokens, LoRA r=16 on q,k,v,o")
        print(f"{'device':8} {'bf16':>5} {'s/update':>9} {'tokens/s':>10} {'peak GiB':>9} {'ratio':>7}")
        for row in rows:
            peak = f"{row['peak_gib']:.2f}" if row["peak_gib"] is not None else "-"
            print(f"{row['device']:8} {str(row['bf16']):>5} {row['s_per_update']:9.2f} "
                  f"{row['tokens_per_s']:10.0f} {peak:>9} {row['tokens_per_s'] / rows[-1]['tokens_per_s']:6.1f}x")
        learn = learning_run(device, args.iterations, tmp / "learn")
        results["learning"] = learn
        s = learn["success_by_iteration"]
        print(f"\nlearning on {device}: success {s[0]:.2f} -> {s[-1]:.2f} over {len(s)} iterations "
              f"({' '.join(f'{x:.2f}' for x in s)})")
        print("tensors on the device: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in learn["checks"].items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    failed = [k for k, v in learn["checks"].items() if not v]
    if failed:
        sys.exit(f"FAILED: not on {device}: {', '.join(failed)}")
    if max(s[len(s) // 2:]) <= s[0] + 0.1:
        sys.exit(f"FAILED: the success rate did not rise ({s})")
    print("OK")


if __name__ == "__main__":
    main()

"""The same adapters from the same seeds: a fixed, deterministic mini-pipeline on a tiny taught model
(GRPO with a KL reference and anchor credit, the SFT warm start within a memory budget, GRPO on
from the warm start, PPO, and one iteration learned from the store), saved as tensors, and compared
with another checkout's. A restructuring of the trainer must change no result: run it before
(`--out A`), after (`--out B`), then `--compare A B` (largest difference of any weight, 1e-6 passes).

    .venv/bin/python bench/same_result.py --out /tmp/before
    .venv/bin/python bench/same_result.py --compare /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))


def lora(trainer) -> dict:
    return {n: p.detach().float().clone().contiguous() for n, p in trainer.model.named_parameters()
            if "lora_" in n}


def run(out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    import forge_bridge as fb
    from forge_bridge.trainer.config import OfflineConfig
    from forge_bridge.trainer.sft import SFTConfig, sft

    import training_task

    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="same-result-"))
    model = training_task.choice_model(work / "model")
    numbers: dict = {}
    tensors: dict = {}
    for algo in ("grpo", "ppo"):
        torch.manual_seed(0)
        policy = fb.LocalPolicy(model)
        rollout = training_task.make_rollout(training_task.agent_for(policy))
        common = dict(group_size=4, lr=1e-3, epochs=2, minibatch_size=4, lora_rank=8, lora_alpha=16,
                      out_dir=str(work / algo), run_name=algo, progress=False, seed=0, concurrency=1,
                      kl_beta=0.1, max_memory_gb=8.0, microbatch_size=None, warmup_steps=0)
        trainer = (fb.GRPOTrainer(policy, fb.GRPOConfig(**common)) if algo == "grpo"
                   else fb.PPOTrainer(policy, fb.PPOConfig(**common)))
        history = trainer.train(rollout, training_task.TASKS, iterations=2)
        numbers[algo] = [{k: v for k, v in h.items() if isinstance(v, float) and not k.startswith("time")
                          and k != "tokens_per_s"} for h in history]
        tensors.update({f"{algo}/{n}": v for n, v in lora(trainer).items()})
        if algo == "grpo":
            store = trainer.recorder.store
            good = [t for t in store.iter(run_id=trainer.run_id) if t.reward and t.reward > 0]
            numbers["sft"] = sft(trainer, good, SFTConfig(epochs=2, lr=1e-3, batch_size=4))
            tensors.update({f"sft/{n}": v for n, v in lora(trainer).items()})
            trainer.freeze_reference()
            history = trainer.train(rollout, training_task.TASKS, iterations=3)
            numbers["grpo-after-sft"] = history[-1]["loss"]
            tensors.update({f"grpo-after-sft/{n}": v for n, v in lora(trainer).items()})
            for t in store.iter(run_id=trainer.run_id):
                store.add_feedback(fb.Feedback(episode_id=t.id, key="thumbs", value=float(t.reward or 0)))
            offline = trainer.train_offline(store, OfflineConfig(run_id=trainer.run_id, imitate=False))
            numbers["offline"] = {k: v for k, v in offline.items() if isinstance(v, float)}
            tensors.update({f"offline/{n}": v for n, v in lora(trainer).items()})
        trainer.close()
        policy.close()
    save_file(tensors, str(out / "adapters.safetensors"))
    (out / "numbers.json").write_text(json.dumps(numbers, indent=1, default=str))
    print(f"wrote {len(tensors)} tensors and the metrics to {out}")


def compare(a: Path, b: Path) -> int:
    from safetensors.torch import load_file

    x, y = load_file(str(a / "adapters.safetensors")), load_file(str(b / "adapters.safetensors"))
    if set(x) != set(y):
        print(f"different tensors: {sorted(set(x) ^ set(y))[:5]}")
        return 1
    worst = max((float((x[k] - y[k]).abs().max()), k) for k in x)
    print(f"{len(x)} tensors; largest difference {worst[0]:.3g} ({worst[1]})")
    return 0 if worst[0] <= 1e-6 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, nargs=2)
    args = parser.parse_args()
    sys.exit(compare(*args.compare) if args.compare else run(args.out))

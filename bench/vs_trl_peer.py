"""TRL's side of `bench/vs_trl.py`: GRPO with TRL's own `GRPOTrainer`, run in TRL's venv
(`.venv-trl`, pinned by `bench/vs_trl.py`), never in forge-bridge's.

    .venv-trl/bin/python bench/vs_trl_peer.py JOB.json

JOB.json (written by `bench/vs_trl.py`): the model folder, the warm start's LoRA folder, the prompts
in the order forge-bridge's run drew them (the token ids its agent's first model call was given)
with their task ids, the suite, the settings, and `out` (a folder). TRL continues the same LoRA
(trainable) with the same rollouts per prompt, optimiser steps, optimiser and learning-rate schedule, clip,
temperature and token budget; its reward is forge-bridge's own score of the first tool call
(`score_call`, read with the same parser as `LocalPolicy`). Writes `out/adapter` (peft's
safetensors) and `out/result.json` (the training's wall time, the reward per step).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(job_path: str) -> int:
    import torch
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from forge_bridge.app.tasks.functions import generate_suite, score_call
    from forge_bridge.policies.toolcalls import parse

    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    torch.manual_seed(job["seed"])
    torch.set_num_threads(job["threads"])
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    prompts = [tokenizer.decode(row["prompt_ids"], skip_special_tokens=False) for row in job["rows"]]
    # the text TRL is given must tokenize back to the ids forge-bridge's agent was given
    mismatched = sum(tokenizer(p, add_special_tokens=False)["input_ids"] != row["prompt_ids"]
                     for p, row in zip(prompts, job["rows"]))
    if mismatched:
        sys.exit(f"{mismatched} of {len(prompts)} prompts do not tokenize back to their ids")
    tasks = {t.id: t for t in generate_suite(job["functions"], seed=job["suite_seed"])}
    eos = tokenizer.eos_token_id

    def first_call_score(prompts, completions, completion_ids, task_id, **_) -> list[float]:
        scores = []
        for ids, tid in zip(completion_ids, task_id):
            ended = bool(ids) and ids[-1] == eos
            text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
            action = parse(text, "stop" if ended else "length", "hermes")
            scores.append(score_call(tasks[tid], action.tool_calls))
        return scores

    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    model = PeftModel.from_pretrained(model, job["adapter"], is_trainable=True)
    s = job["settings"]
    config = GRPOConfig(
        output_dir=str(out / "trainer"), use_cpu=True, bf16=False, seed=job["seed"],
        num_generations=s["group_size"], per_device_train_batch_size=s["group_size"],
        gradient_accumulation_steps=s["tasks_per_iteration"],  # one optimiser step per iteration's samples
        max_steps=s["iterations"], num_iterations=1, shuffle_dataset=False,
        learning_rate=s["lr"], max_grad_norm=s["grad_clip"], epsilon=s["clip"],
        beta=s["kl_beta"], temperature=s["temperature"], top_p=1.0, top_k=0,
        max_completion_length=s["max_tokens"], loss_type="dapo", scale_rewards="group",
        gradient_checkpointing=False,  # TRL's default is on; forge-bridge's run has it off
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=False)
    dataset = Dataset.from_list([{"prompt": p, "task_id": row["task_id"]} for p, row in zip(prompts, job["rows"])])
    # forge-bridge's optimiser and schedule: torch's AdamW at its defaults, the rate ramped over
    # the first `warmup_steps` steps ((step + 1) / warmup_steps), then constant
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=s["lr"])
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / s["warmup_steps"]) if s["warmup_steps"] else 1.0)
    trainer = GRPOTrainer(model=model, reward_funcs=first_call_score, args=config, train_dataset=dataset,
                          processing_class=tokenizer, optimizers=(optimizer, schedule))
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    model.save_pretrained(out / "adapter", safe_serialization=True)
    rewards = [round(e["reward"], 4) for e in trainer.state.log_history if "reward" in e]
    (out / "result.json").write_text(json.dumps({"rl_s": wall, "training_reward": rewards}, indent=2))
    print(f"TRL GRPO: {wall:.0f} s, reward per step {rewards}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

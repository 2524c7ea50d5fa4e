"""Tokens/s of one GRPO update: forge-bridge's trainer against TRL's GRPOTrainer, side by side in
one run, on the same model, the same samples (prompt + completion ids, advantages, behaviour
logprobs) and the same LoRA settings (r=16 on q,k,v,o), both under bf16 autocast where the CPU
has it. Only the update is timed (log-probabilities, loss, backward, optimiser step); rollouts
are not part of it.

TRL is installed for this bench only, in a separate environment:

    python3 -m venv /tmp/venv-bench
    /tmp/venv-bench/bin/pip install -c constraints.txt -e . trl==1.16.0 "datasets>=4.7"
    /tmp/venv-bench/bin/python bench/update_throughput.py [--tiny] [--samples 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch


def make_samples(tokenizer, n: int, seed: int):
    """n (prompt ids, completion ids) pairs from the demo's tasks and expert replies."""
    from forge_bridge.app.tasks import expert_reply, make_splits, tool_schemas

    train, _ = make_splits(seed=seed)
    pairs = []
    for task in train[:n]:
        messages = [{"role": "user", "content": task.question}]
        prompt = list(tokenizer.apply_chat_template(messages, tools=tool_schemas(),
                                                    add_generation_prompt=True)["input_ids"])
        completion = tokenizer.encode(expert_reply(messages, tool_schemas()), add_special_tokens=False)
        pairs.append((prompt, completion + [tokenizer.eos_token_id]))
    g = torch.Generator().manual_seed(seed)
    advantages = (torch.randn(n, generator=g)).tolist()
    return pairs, advantages


def behaviour_logprobs(model, pairs):
    """The base model's logprobs of each completion (what a sampler would have recorded)."""
    from forge_bridge.trainer.batch import Sample, collate
    from forge_bridge.trainer.logprobs import token_logprobs

    samples = [Sample(input_ids=p + c, loss_mask=[0] * len(p) + [1] * len(c),
                      sampler_logprobs=[0.0] * (len(p) + len(c)), advantages=[0.0] * (len(p) + len(c)))
               for p, c in pairs]
    batch = collate(samples, 0)
    with torch.no_grad():
        logp, _, _ = token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
    return [logp[i, len(p):len(p) + len(c)].tolist() for i, (p, c) in enumerate(pairs)]


def ours(model_name: str, pairs, advantages, old, minibatch: int, autocast) -> float:
    import forge_bridge as fb
    from forge_bridge.policies import models
    from forge_bridge.policies.scripted import ScriptedPolicy
    from forge_bridge.trainer.batch import Sample

    tokenizer = models.load(model_name)[1]
    policy = ScriptedPolicy(lambda m, t: "", tokenizer)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(lr=1e-4, minibatch_size=minibatch, epochs=1, microbatch_size=None,
                                                   warmup_steps=0, kl_beta=0.0,
                                                   out_dir=tempfile.mkdtemp(), progress=False,
                                                   bf16=autocast), model=model_name)
    samples = [Sample(input_ids=p + c, loss_mask=[0] * len(p) + [1] * len(c),
                      sampler_logprobs=[0.0] * len(p) + lp, advantages=[0.0] * len(p) + [a] * len(c))
               for (p, c), a, lp in zip(pairs, advantages, old)]
    t0 = time.perf_counter()
    trainer.update(samples)
    return time.perf_counter() - t0


def trl_update(model_name: str, pairs, advantages, old, minibatch: int, autocast) -> float:
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from forge_bridge.policies import models

    base, tokenizer = models.load(model_name)
    args = TRLConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=minibatch,
                     num_generations=minibatch, learning_rate=1e-4, beta=0.0, use_cpu=True,
                     report_to=[], bf16=False, max_completion_length=64, loss_type="grpo")
    trainer = TRLTrainer(model=base, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                         args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * minibatch),
                         processing_class=tokenizer,
                         peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop, which is not run here
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    pad = tokenizer.pad_token_id
    t0 = time.perf_counter()
    for start in range(0, len(pairs), minibatch):
        chunk = list(range(start, min(start + minibatch, len(pairs))))
        P = max(len(pairs[i][0]) for i in chunk)
        C = max(len(pairs[i][1]) for i in chunk)
        prompt_ids = torch.full((len(chunk), P), pad)
        prompt_mask = torch.zeros((len(chunk), P), dtype=torch.long)
        completion_ids = torch.full((len(chunk), C), pad)
        completion_mask = torch.zeros((len(chunk), C), dtype=torch.long)
        old_logps = torch.zeros((len(chunk), C))
        for row, i in enumerate(chunk):  # TRL's layout: prompts left-padded, completions right-padded
            p, c = pairs[i]
            prompt_ids[row, P - len(p):] = torch.tensor(p)
            prompt_mask[row, P - len(p):] = 1
            completion_ids[row, :len(c)] = torch.tensor(c)
            completion_mask[row, :len(c)] = 1
            old_logps[row, :len(c)] = torch.tensor(old[i])
        inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                  "completion_mask": completion_mask, "old_per_token_logps": old_logps,
                  "advantages": torch.tensor([advantages[i] for i in chunk]),
                  "num_items_in_batch": completion_mask.sum()}
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext():
            loss = trainer.compute_loss(model, inputs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description="one GRPO update: ours vs TRL, tokens/s")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model instead of SmolLM2-135M")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--minibatch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="a named model (forge-bridge fetch --list) or a model directory")
    args = parser.parse_args()

    from forge_bridge.policies import models
    from forge_bridge.policies.local import bf16_supported

    torch.manual_seed(0)
    name = args.model
    if args.tiny:
        name = str(models.save(*models.tiny(), tempfile.mkdtemp() + "/tiny"))
    model, tokenizer = models.load(name)
    pairs, advantages = make_samples(tokenizer, args.samples, seed=0)
    old = behaviour_logprobs(model, pairs)
    del model
    autocast = bf16_supported()
    tokens = sum(len(p) + len(c) for p, c in pairs)
    times = {"forge-bridge": [], "TRL GRPOTrainer": []}
    for _ in range(args.repeats):  # alternate, so machine noise hits both alike
        times["forge-bridge"].append(ours(name, pairs, advantages, old, args.minibatch, autocast))
        times["TRL GRPOTrainer"].append(trl_update(name, pairs, advantages, old, args.minibatch, autocast))
    print(f"\nmodel {name}; {args.samples} sequences, {tokens} tokens, minibatch {args.minibatch}, "
          f"LoRA r=16 q,k,v,o, bf16 autocast={autocast}; median of {args.repeats}")
    medians = {k: statistics.median(v) for k, v in times.items()}
    for k, t in medians.items():
        print(f"  {k:<18}{t:>8.2f} s {tokens / t:>9.0f} tokens/s")
    print(f"  forge-bridge / TRL throughput: {medians['TRL GRPOTrainer'] / medians['forge-bridge']:.2f}x")


if __name__ == "__main__":
    main()

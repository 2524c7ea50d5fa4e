"""Peak memory of one update on the default model, microbatch × sequence length, before and after
issue 43's changes, each configuration in a process of its own (its peak resident set).

- before: the log-softmax of every trained position's full vocabulary in float32, kept for the
  backward pass, and eager attention at every length (the code before 2026-12-04);
- after: the sampled tokens' log-probabilities a chunk at a time (trainer/logprobs.py), and eager
  attention only up to 512 tokens, sdpa's fused kernel past it (`Trainer.attention`);
- checkpointed: after, with `gradient_checkpointing=True` (each layer's activations recomputed in
  the backward pass; the lever for long sequences).

Each update is one optimizer step on `microbatch` random sequences of `seq` tokens, a quarter of
each trained (an agent's prompt is longer than its reply), LoRA r=16 on q,k,v,o, bf16 autocast,
as the trainer runs. Configurations whose estimate exceeds `--limit-gb` are not run (said so).
The fitted coefficients are what `trainer/memory.py` uses to pick microbatches from
`max_memory_gb`.

    .venv/bin/python bench/memory.py                        # the table in docs/memory.md
    .venv/bin/python bench/memory.py --microbatch 8 --seq 768

What it does not cover: the rest of a training process (the policy's own model and its KV cache,
a KL reference), which `/usr/bin/time -v forge-bridge demo` measures whole; a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

MODEL = "smollm2-135m-instruct"


def full_log_softmax(head, h, taken, inverse_temperature, with_entropy=False, chunk=None):
    """The formula before: [N, V] float32 log-softmax over every trained position, kept by autograd."""
    import torch

    logits = head(h).float()
    if inverse_temperature is not None:
        logits = logits * inverse_temperature[:, None]
    logp = torch.log_softmax(logits, -1)
    entropy = -(logp.exp() * logp).sum(-1).detach() if with_entropy else None
    return logp.gather(-1, taken[:, None]).squeeze(-1), entropy


def one(microbatch: int, seq: int, variant: str, model: str = MODEL) -> dict:
    """One update in this process; its resident set before and its peak."""
    import resource

    import torch

    import forge_bridge as fb
    from forge_bridge.policies import models
    from forge_bridge.trainer import learner, logprobs, memory
    from forge_bridge.trainer.batch import Sample

    if variant == "before":
        logprobs.sampled_logprobs = full_log_softmax
        learner.EAGER_MAX_LEN = 1 << 30
    policy = fb.ScriptedPolicy(lambda messages, tools: "", models.load_tokenizer(model))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(minibatch_size=microbatch, microbatch_size=microbatch,
                                                   max_seq_len=seq, out_dir=tempfile.mkdtemp(), progress=False,
                                                   lr=1e-4, warmup_steps=0, kl_beta=0.0,
                                                   gradient_checkpointing=variant == "checkpointed"), model=model)
    g = torch.Generator().manual_seed(0)
    trained = seq // 4
    samples = [Sample(input_ids=torch.randint(0, trainer.tokenizer.vocab_size, (seq,), generator=g).tolist(),
                      loss_mask=[0] * (seq - trained) + [1] * trained, sampler_logprobs=[-3.0] * seq,
                      advantages=[0.5] * seq) for _ in range(microbatch)]
    trainer.update([Sample(input_ids=samples[0].input_ids[:16], loss_mask=samples[0].loss_mask[-16:],
                            sampler_logprobs=[-3.0] * 16, advantages=[0.5] * 16)])  # weights paged in
    resident = memory.resident_gb()
    reset = peak_reset()  # the peak of the update alone, not of loading the model
    start = time.perf_counter()
    trainer.update(samples)
    seconds = time.perf_counter() - start
    peak = (peak_kb() if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 2 ** 20
    config = trainer.model.get_base_model().config
    return {"microbatch": microbatch, "seq": seq, "variant": variant, "resident_gb": resident, "peak_gb": peak,
            "seconds": seconds, "layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "heads": config.num_attention_heads}


def peak_reset() -> bool:
    """Reset this process's peak resident set (Linux: /proc/self/clear_refs, 5); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_kb() -> int:
    """This process's peak resident set since the last reset, in kB (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def estimate_gb(microbatch: int, seq: int, variant: str) -> float:
    """A rough prior, to skip configurations that cannot fit (eager attention's length² term)."""
    eager = variant == "before" or seq <= 512
    layers = 1 if variant == "checkpointed" else 30
    linear = 30 * 576 * 8 + 576 * 54 if variant == "checkpointed" else 30 * 576 * 54
    return 1.5 + microbatch * seq * (linear + (layers * 9 * 10 * seq if eager else 0)) / 2 ** 30


def fit(rows: list[dict]) -> dict:
    """LINEAR_BYTES (per token, layer, hidden unit) from the sdpa rows, ATTENTION_BYTES (per row,
    position², layer, head) from the eager ones, CHECKPOINT_BYTES (per token, layer, hidden unit
    kept under activation checkpointing, beyond one layer's recompute) from the checkpointed ones."""
    after = [r for r in rows if r["variant"] == "after" and "peak_gb" in r]
    sdpa = [(r["peak_gb"] - r["resident_gb"]) * 2 ** 30 / (r["microbatch"] * r["seq"] * r["layers"] * r["hidden"])
            for r in after if r["seq"] > 512 and r["microbatch"] >= 4]
    linear = statistics.median(sdpa) if sdpa else float("nan")
    eager = [((r["peak_gb"] - r["resident_gb"]) * 2 ** 30 / (r["microbatch"] * r["seq"]) - linear * r["layers"]
              * r["hidden"]) / (r["seq"] * r["layers"] * r["heads"]) for r in after if r["seq"] <= 512
             and r["microbatch"] >= 4]
    checkpointed = [((r["peak_gb"] - r["resident_gb"]) * 2 ** 30 / (r["microbatch"] * r["seq"] * r["hidden"]) - linear)
                    / r["layers"] for r in rows if r["variant"] == "checkpointed" and "peak_gb" in r
                    and r["seq"] > 512 and r["microbatch"] >= 4]
    return {"LINEAR_BYTES": linear, "ATTENTION_BYTES": statistics.median(eager) if eager else float("nan"),
            "CHECKPOINT_BYTES": statistics.median(checkpointed) if checkpointed else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--microbatch", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--variants", nargs="+", default=["before", "after", "checkpointed"],
                   choices=["before", "after", "checkpointed"])
    p.add_argument("--limit-gb", type=float, default=20.0, help="skip configurations estimated above this")
    p.add_argument("--out", default="runs/memory.json")
    p.add_argument("--model", default=MODEL, help="a named model (forge-bridge fetch --list) or a model directory")
    p.add_argument("--one", nargs=3, metavar=("MICROBATCH", "SEQ", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), int(args.one[1]), args.one[2], args.model)))
        return
    rows = []
    for seq in args.seq:
        for mb in args.microbatch:
            for variant in args.variants:
                if estimate_gb(mb, seq, variant) > args.limit_gb:
                    rows.append({"microbatch": mb, "seq": seq, "variant": variant,
                                 "skipped": f"estimated {estimate_gb(mb, seq, variant):.0f} GiB"})
                else:
                    proc = subprocess.run([sys.executable, __file__, "--one", str(mb), str(seq), variant,
                                           "--model", args.model],
                                          capture_output=True, text=True)
                    rows.append(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else
                                {"microbatch": mb, "seq": seq, "variant": variant,
                                 "failed": proc.stderr.strip().splitlines()[-1][:200]})
                print(json.dumps(rows[-1]), flush=True)
    coefficients = fit(rows)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "fit": coefficients}, f, indent=2)
    cell = {(r["microbatch"], r["seq"], r["variant"]): r for r in rows}
    print(f"\npeak resident set of one update, GiB ({' -> '.join(args.variants)})")
    print("| microbatch | " + " | ".join(f"{s} tokens" for s in args.seq) + " |")
    print("| --- |" + " --- |" * len(args.seq))
    for mb in args.microbatch:
        show = []
        for seq in args.seq:
            parts = []
            for v in args.variants:
                r = cell[(mb, seq, v)]
                parts.append(f"{r['peak_gb']:.1f}" if "peak_gb" in r else ("not run" if "skipped" in r else "failed"))
            show.append(" → ".join(parts))
        print(f"| {mb} | " + " | ".join(show) + " |")
    print(f"fitted: {coefficients}")


if __name__ == "__main__":
    main()

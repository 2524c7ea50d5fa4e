"""The update on 1 process against N (DDP and FSDP2), side by side in one run: seconds per GRPO
update on the same synthetic samples, the ratio, and whether the LoRAs came out the same.

Each world size runs in its own process group, launched by torch's elastic launcher (what
torchrun runs); rank 0 times `trainer.update` (the update the trainer's loop runs)
after one untimed warm-up update, and writes its LoRA's tensors so the driver can compare them.

    .venv/bin/python bench/distributed.py                                # this CPU: 1 vs 2, gloo
    python bench/distributed.py --device cuda --nproc 8 --config qwen2-1.5b   # a GPU machine (nccl)

What it does not cover: rollouts (they stay where they are); on a 2-core CPU, two processes
share the two cores one process uses with two threads, so the ratio shows what the spreading
costs (gloo's all-reduce, the padding microbatches, a process each) and not a speed-up; on
GPUs, one device per process is what buys the speed-up this script measures there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_check  # noqa: E402  (its random models of real shapes and its synthetic samples)


def worker(args: argparse.Namespace) -> None:
    """One rank: build the trainer, time `steps` updates (rank 0), write the result and the LoRA."""
    import torch
    from safetensors.torch import save_file

    import forge_bridge as fb
    from forge_bridge.policies import models
    from forge_bridge.policies.base import DEFAULT_SLOT
    from forge_bridge.trainer import distributed

    samples = gpu_check.synthetic_samples(args.samples, args.prompt_len, args.completion_len, args.vocab)
    policy = fb.ScriptedPolicy(lambda m, t: "", models.load_tokenizer(args.model)) if distributed.leader() else None
    spread = fb.Distributed(strategy=args.strategy) if args.strategy else None
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
        out_dir=args.out, device=args.device, minibatch_size=len(samples), microbatch_size=args.microbatch,
        lr=1e-4, warmup_steps=0, kl_beta=0.0,  # the settings its figures were measured with
        max_seq_len=4096, progress=False, bf16=False if args.device == "cpu" else None,
        distributed=spread), model=args.model)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times = []

    def lead() -> list:
        with trainer.learner.training(DEFAULT_SLOT):
            for step in range(args.steps + 1):
                t0 = time.perf_counter()
                trainer.update(samples)
                sync()
                times.append(time.perf_counter() - t0)
        return []

    trainer.ranks.run(lead, trainer.follow_update)  # the other ranks take their share of each update
    if trainer.follower:
        return
    full = trainer.ranks.full_state()
    weights = full["weights"] if full else {
        n: p.detach().cpu() for n, p in trainer.model.named_parameters() if p.requires_grad}
    save_file({n: t.contiguous() for n, t in weights.items()}, str(Path(args.out) / "lora.safetensors"))
    tokens = sum(sum(s.loss_mask) for s in samples)
    (Path(args.out) / "result.json").write_text(json.dumps({
        "s_per_update": statistics.median(times[1:]), "tokens_per_s": tokens / statistics.median(times[1:]),
        "warmup_s": times[0], "world_size": trainer.ranks.size}))
    trainer.close()


def launch(args: argparse.Namespace, nproc: int, strategy: str | None, out: Path) -> dict:
    """The worker on `nproc` processes (1: this interpreter, alone); rank 0's result."""
    import subprocess

    flags = ["--worker", "--model", args.model, "--device", args.device, "--samples", str(args.samples),
             "--prompt-len", str(args.prompt_len), "--completion-len", str(args.completion_len),
             "--microbatch", str(args.microbatch), "--steps", str(args.steps), "--vocab", str(args.vocab),
             "--out", str(out)] + (["--strategy", strategy] if strategy else [])
    launcher = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    f"--nproc-per-node={nproc}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
    subprocess.run([*launcher, __file__, *flags], check=True, env=env)
    return json.loads((out / "result.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2, help="the world size compared with 1")
    ap.add_argument("--device", default="cpu", help="'cpu' (gloo) or 'cuda' (nccl, one GPU per process)")
    ap.add_argument("--config", default="smollm2-135m", help="'smollm2-135m' (the embedded model's weights) "
                    f"or a random model of a real shape: {', '.join(sorted(gpu_check.CONFIGS))}")
    ap.add_argument("--samples", type=int, default=16, help="sequences per update")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--microbatch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="timed updates per world size (after a warm-up)")
    ap.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    ap.add_argument("--json", type=Path, help="also write the results here")
    # the worker's own flags
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="with --config smollm2-135m: the weights of this named model (forge-bridge fetch "
                    "--list) or model directory (default: smollm2-135m-instruct)")
    ap.add_argument("--strategy", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    gpu_check.import_from_checkout()
    if args.worker:
        return worker(args)
    import torch
    from safetensors.torch import load_file

    from forge_bridge.policies import models

    with tempfile.TemporaryDirectory(prefix="forge-bench-dist-") as tmp:
        tmp = Path(tmp)
        if args.config == "smollm2-135m":
            args.model = str(models.model_path(args.model))
            args.vocab = models.load_tokenizer(args.model).vocab_size
        else:
            args.model = str(gpu_check.random_model_dir(args.config, tmp / "model"))
            args.vocab = gpu_check.CONFIGS[args.config]["vocab_size"]
        runs = [("1 process", 1, None)] + [(f"{args.nproc} x {s}", args.nproc, s) for s in args.strategies]
        rows = []
        for name, nproc, strategy in runs:
            out = tmp / name.replace(" ", "")
            out.mkdir()
            rows.append({"run": name, **launch(args, nproc, strategy, out),
                         "lora": load_file(str(out / "lora.safetensors"))})
        base = rows[0]
        print(f"\nGRPO update on {args.device}, {args.config}, {args.samples} x ({args.prompt_len} prompt + "
              f"{args.completion_len} completion) tokens, microbatch {args.microbatch}, LoRA r=16 on q,k,v,o; "
              f"median of {args.steps} updates after a warm-up")
        moved = max(float(t.abs().max()) for n, t in base["lora"].items() if "lora_B" in n)
        print(f"{'run':14} {'s/update':>9} {'tokens/s':>9} {'vs 1':>6} {'max |dLoRA| vs 1':>17}   (max |B| {moved:.1e})")
        for row in rows:
            diff = max(float((row["lora"][n] - base["lora"][n]).abs().max()) for n in base["lora"])
            row["max_lora_diff"] = diff
            print(f"{row['run']:14} {row['s_per_update']:9.2f} {row['tokens_per_s']:9.0f} "
                  f"{row['tokens_per_s'] / base['tokens_per_s']:5.2f}x {diff:17.1e}")
        print(f"(torch {torch.__version__}, {os.cpu_count()} CPUs; {args.nproc} processes get "
              f"{max(1, (os.cpu_count() or 1) // args.nproc)} thread(s) each, one process {os.cpu_count()})")
        if args.json:
            args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "lora"} for r in rows], indent=1))


if __name__ == "__main__":
    main()

"""forge-bridge beside a peer: the same GRPO run by TRL's `GRPOTrainer` and by forge-bridge through
a LangChain agent, on the generated function-calling suite, with held-out accuracy and wall time
in one run.

    .venv/bin/python bench/vs_trl.py [--seeds 0 1 2] [--out runs/bench-vs-trl] [--with-reply]

Per seed, `bench/function_calling.py` at its defaults (the measured setting: SmolLM2-135M, 48
demonstrations, an SFT warm start, then 6 GRPO iterations of 6 training requests x 8 rollouts,
partial-credit reward, one optimiser step per iteration) does the warm start and forge-bridge's
run: an ordinary LangChain `create_agent` agent on `LocalPolicy` through `ForgeMiddleware`, the
trainer hot-swapping each adapter into it. The agent's tool is `return_direct` (its answer ends the
episode), so an episode is one model call, the call TRL samples for the same prompt; with
`--with-reply` the agent also writes its closing reply after the tool returns, and forge-bridge
samples and trains on that second call too (how the bench ran until 2026-12-05). Then TRL
(`bench/vs_trl_peer.py`, in its own venv `.venv-trl`, pinned below and installed here on first use)
continues the *same* warm-start LoRA on the *same* prompts in the same order (the token ids the
agent's first model call was given, as text that tokenizes back to them), with the same rollouts
per prompt, optimiser steps, AdamW and warm-up, clip, temperature, token budget and reward
(forge-bridge's score of the first tool call). Both final adapters are scored by the same greedy
evaluation, through the agent, on the held-out functions (exact first call). Wall time is each
trainer's RL phase alone: sampling, rewards, updates (and for forge-bridge the agent's loop,
recording, publishing and swapping every adapter); model loading, the warm start and the
evaluations are outside it. Both run on this machine's CPU, one after the other, float32.

What it does not cover: TRL with vLLM or on a GPU (both are CPU-only here); agents of more than one
model call (TRL's `GRPOTrainer` samples one completion per prompt); TRL's defaults where they
differ in kind (its loss is `dapo`, token-level, like forge-bridge's; it has no truncated
importance sampling, which a local sampler does not need); other tasks, models and budgets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = ROOT / ".venv-trl"
PINS = ["torch==2.13.0", "trl==1.16.0", "transformers==5.24.0", "peft==0.21.2", "accelerate==1.15.0",
        "datasets==5.2.0"]
"""TRL's venv: TRL pinned, with the torch, transformers and peft forge-bridge's own venv runs."""


def trl_python() -> Path:
    """TRL's venv, made and pinned on first use; this checkout's core (`forge_bridge`, no
    dependencies) is reinstalled into it on every run, for the parser and the reward."""
    python, stamp = VENV / "bin" / "python", VENV / ".installed"
    if not (stamp.is_file() and stamp.read_text() == " ".join(PINS)):
        print(f"== installing TRL's venv ({VENV}): {' '.join(PINS)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *PINS], check=True)
        stamp.write_text(" ".join(PINS))
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)], check=True)
    return python


def prompts_of(store, run_id: str) -> list[dict]:
    """The prompts forge-bridge's run trained on, iteration by iteration, each task once in the
    order it was drawn: the token ids of its first model call (the same for every rollout)."""
    rows, seen = [], set()
    by_iteration: dict[int, list] = {}
    for traj in store.iter(run_id=run_id):
        if traj.transitions and traj.behaviour != "guide":
            by_iteration.setdefault(traj.metadata["iteration"], []).append(traj)
    for it in sorted(by_iteration):
        for traj in by_iteration[it]:
            if (it, traj.task_id) not in seen:
                seen.add((it, traj.task_id))
                rows.append({"task_id": traj.task_id, "prompt_ids": traj.transitions[0].prompt_token_ids})
    return rows


def run_seed(seed: int, args, python: Path) -> dict:
    import torch

    import forge_bridge as fb
    import function_calling as fc
    from forge_bridge.core.runs import read_run_id
    from forge_bridge.core.store import TrajectoryStore
    from forge_bridge.policies.models import model_path

    fc_args = fc.parser().parse_args(["--out", str(args.out), "--eval-tasks", str(args.eval_tasks),
                                      "--iterations", str(args.iterations),
                                      *([] if args.with_reply else ["--return-direct"]),
                                      *(["--quiet"] if args.quiet else [])])
    ours = fc.run_seed(seed, fc_args)
    folder = Path(args.out) / f"seed{seed}"
    with TrajectoryStore(folder / "trajectories.db") as store:
        rows = prompts_of(store, read_run_id(folder / "run", "fc"))
    a = fc_args
    job = {"model": str(model_path(a.model)), "adapter": str(folder / "run" / "adapters" / "fc-v1"),
           "out": str(folder / "trl"), "seed": seed, "threads": torch.get_num_threads(), "rows": rows,
           "functions": a.functions, "suite_seed": a.suite_seed,
           "settings": {"group_size": a.group_size, "tasks_per_iteration": a.tasks_per_iteration,
                        "iterations": a.iterations, "lr": a.lr, "warmup_steps": 2, "grad_clip": 1.0,
                        "clip": 0.2, "kl_beta": a.kl_beta, "temperature": a.temperature, "max_tokens": a.max_tokens}}
    (folder / "trl").mkdir(exist_ok=True)
    (folder / "trl" / "job.json").write_text(json.dumps(job))
    subprocess.run([python, HERE / "vs_trl_peer.py", folder / "trl" / "job.json"], check=True,
                   env={**os.environ, "PYTHONPATH": ""})
    theirs = json.loads((folder / "trl" / "result.json").read_text())
    _, _, held_out = fc.splits(a.functions, a.suite_seed)
    policy = fb.LocalPolicy(a.model, max_batch=a.concurrency)
    try:
        policy.load_adapter(folder / "trl" / "adapter", "trl")
        with TrajectoryStore(folder / "trl" / "eval.db") as store:
            trl_score = fc.evaluate(policy, held_out[:args.eval_tasks], store, "eval-trl", a.max_tokens,
                                    a.concurrency, a.return_direct)
    finally:
        policy.close()
    result = {"seed": seed, "SFT": ours["SFT"], "forge-bridge": ours["SFT+RL"], "TRL": trl_score,
              "forge-bridge_s": ours["rl_s"], "TRL_s": theirs["rl_s"], "prompts": len(rows),
              "training_reward": {"forge-bridge": ours["training_reward"], "TRL": theirs["training_reward"]}}
    print(f"seed {seed}: SFT {ours['SFT']:.2f}; forge-bridge {ours['SFT+RL']:.2f} in {ours['rl_s']:.0f} s; "
          f"TRL {trl_score:.2f} in {theirs['rl_s']:.0f} s", flush=True)
    return result


def table(results: list[dict]) -> str:
    from function_calling import sd

    lines = ["| seed | SFT | SFT + TRL GRPO | SFT + forge-bridge GRPO | TRL RL wall time | forge-bridge RL wall time | time ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['seed']} | {100 * r['SFT']:.0f} % | {100 * r['TRL']:.0f} % | {100 * r['forge-bridge']:.0f} % "
                     f"| {r['TRL_s']:.0f} s | {r['forge-bridge_s']:.0f} s | {r['forge-bridge_s'] / r['TRL_s']:.2f}x |")
    col = {k: [100 * r[k] for r in results] for k in ("SFT", "TRL", "forge-bridge")}
    ratio = [r["forge-bridge_s"] / r["TRL_s"] for r in results]
    lines.append(f"| mean ± sd | {statistics.mean(col['SFT']):.0f} ± {sd(col['SFT']):.0f} % "
                 f"| {statistics.mean(col['TRL']):.0f} ± {sd(col['TRL']):.0f} % "
                 f"| {statistics.mean(col['forge-bridge']):.0f} ± {sd(col['forge-bridge']):.0f} % | | "
                 f"| {statistics.mean(ratio):.2f} ± {sd(ratio):.2f}x |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-tasks", type=int, default=60, help="held-out requests scored")
    p.add_argument("--iterations", type=int, default=6, help="GRPO iterations (optimiser steps) of each trainer")
    p.add_argument("--out", default="runs/bench-vs-trl")
    p.add_argument("--with-reply", action="store_true", help="the agent also writes its closing reply after the "
                   "tool returns (two model calls per episode, both sampled and trained by forge-bridge)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        p.error(f"--out {args.out} holds an earlier run: move it away or name another folder")
    python = trl_python()
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, args, python))
        (Path(args.out) / "vs_trl.json").write_text(json.dumps({"args": vars(args), "pins": PINS, "results": results}, indent=2))
    print("\n" + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

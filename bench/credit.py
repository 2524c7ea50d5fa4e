"""Per-step credit, ablated: trajectory-level GRPO vs anchor-state per-step GRPO vs PPO-GAE, on
the same multi-step tasks with the same number of rollouts, over several seeds.

    .venv/bin/python bench/credit.py [--seeds 0 1 2] [--iterations 4] [--out runs/bench-credit]
    .venv/bin/python bench/credit.py --arms ppo --warm-start runs/bench-credit --out runs/bench-ppo

`--warm-start` reuses an earlier run's warm starts (its SFT adapters and their held-out scores),
so an arm can be re-run alone from the same starting point.

The agent is the demo's ordinary LangChain agent (`create_agent` + `ForgeMiddleware`) with three
tools (multiply, lookup, add) on the embedded SmolLM2-135M. The multi-step kinds:

- `lookup_multiply`: lookup, then multiply (two tool calls, three model calls);
- `lookup_add`: two lookups, then add (three tool calls, four model calls).

Per seed, one SFT warm start is shared by the three arms: demonstrations (the scripted expert
through the same agent), 8 of each single-tool kind and 10 of each multi-step kind, two epochs, so that the
warm start solves some multi-step tasks and RL has something to sharpen. Each arm then starts from
that adapter and trains `--iterations` iterations on the multi-step kinds only (the same tasks
in the same order for every arm: `--tasks-per-kind` of each kind x `--group-size` rollouts at
T = 0.7), and is evaluated greedily on the held-out multi-step tasks (cities never seen in
training). Reported: held-out success per kind per arm and seed, the mean and the spread over
seeds, and the first iteration whose training rollouts of a kind reached 80 % success.

    trajectory   GRPOConfig(credit="trajectory", gamma=1): the outcome on every step
    anchor       GRPOConfig(credit="anchor", gamma=0.95): + step-level advantages in anchor states
    ppo          PPOConfig(gamma=0.95, lam=0.95): GAE with a value head

What it does not cover: settings were not tuned per arm (one learning rate for all three, the
demo's); it does not measure speed (the arms' rollouts take the same time; PPO's update runs one
extra forward pass for the values); the tasks are the demo's suite, not the generated
function-calling suite.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ARMS = ("trajectory", "anchor", "ppo")
MULTI = ("lookup_multiply", "lookup_add")


def arm_config(arm: str, args, out: Path, seed: int):
    import forge_bridge as fb

    common = dict(group_size=args.group_size, lr=args.lr, warmup_steps=2, minibatch_size=64, kl_beta=0.0,
                  microbatch_size=8, concurrency=args.concurrency, max_seq_len=1024, merge_steps=True,
                  run_name=arm, out_dir=str(out / arm), seed=seed, progress=not args.quiet)
    if arm == "trajectory":
        return fb.GRPOConfig(credit="trajectory", gamma=1.0, **common)
    if arm == "anchor":
        return fb.GRPOConfig(credit="anchor", gamma=0.95, **common)
    return fb.PPOConfig(gamma=0.95, lam=0.95, **common)


def kind_of(task_id: str) -> str:
    return task_id.rsplit("-", 1)[0]


def run_seed(seed: int, args) -> dict:
    import torch

    import forge_bridge as fb
    from forge_bridge.app.demo import attempt, build_agent, run_tasks
    from forge_bridge.app.report import rates
    from forge_bridge.app.tasks import ALL_KINDS, expert_reply, make_splits
    from forge_bridge.core.store import TrajectoryStore
    from forge_bridge.policies.scripted import ScriptedPolicy
    from forge_bridge.trainer.lora import load_adapter_weights, save_adapter
    from forge_bridge.trainer.run import WARM_START
    from forge_bridge.trainer.sft import SFTConfig, sft as warm_start

    torch.manual_seed(seed)
    out = Path(args.out) / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    store = TrajectoryStore(out / "trajectories.db")
    train, held_out = make_splits(args.train_per_kind, args.eval_per_kind, seed, kinds=ALL_KINDS)
    held_multi = [t for t in held_out if t.kind in MULTI]
    policy = fb.LocalPolicy(args.model, max_batch=args.concurrency)
    agent = build_agent(policy, args.temperature, args.max_tokens, with_add=True)
    result: dict = {"seed": seed, "arms": {}}

    def evaluate(run_id: str) -> dict:
        passed = run_tasks(agent, held_multi, fb.Recorder(store, run_id), greedy=True,
                           concurrency=args.concurrency, desc=f"eval {run_id}", progress=not args.quiet,
                           max_model_calls=args.max_model_calls)
        return rates(held_multi, passed)

    earlier = Path(args.warm_start) / f"seed{seed}" if args.warm_start else None
    if earlier is not None:  # an earlier run's warm start, as it was
        sft_path = earlier / "sft-adapter"
        before = json.loads((Path(args.warm_start) / "credit.json").read_text())["results"]
        result["sft"] = next(r["sft"] for r in before if r["seed"] == seed)
    else:  # the shared warm start
        rng = random.Random(seed)
        demos_tasks = []
        for kind in ALL_KINDS:
            n = args.demos_per_multi if kind in MULTI else args.demos_per_single
            demos_tasks += rng.sample([t for t in train if t.kind == kind], n)
        expert = build_agent(ScriptedPolicy(expert_reply, policy.tokenizer), 0.0, args.max_tokens, with_add=True)
        run_tasks(expert, demos_tasks, fb.Recorder(store, "demonstrations"), greedy=True,
                  concurrency=args.concurrency, desc="demonstrations", progress=not args.quiet,
                  max_model_calls=args.max_model_calls)
        demos = sorted(store.trajectories(run_id="demonstrations", status="complete"), key=lambda t: t.task_id)
        warm = fb.GRPOTrainer(policy, fb.GRPOConfig(run_name="sft", out_dir=str(out / "sft"), seed=seed,
                                                     progress=not args.quiet), recorder=fb.Recorder(store))
        sft = warm_start(warm, demos, SFTConfig(epochs=args.sft_epochs, lr=args.sft_lr, batch_size=8))
        sft_path = save_adapter(warm.model, out / "sft-adapter")
        warm.close()
        del warm
        result["sft"] = {"loss": [sft["sft_loss_first"], sft["sft_loss_last"]], "held_out": evaluate("eval-sft")}
    print(f"seed {seed}: SFT held-out {result['sft']['held_out']}", flush=True)

    by_kind = {kind: [t for t in train if t.kind == kind] for kind in MULTI}

    def schedule(it: int):  # the same tasks for every arm
        r = random.Random(seed * 100_003 + it)
        return [t for kind in MULTI for t in r.sample(by_kind[kind], args.tasks_per_kind)]

    def rollout(task) -> float:
        return 1.0 if attempt(agent, task, args.max_model_calls) else 0.0

    for arm in args.arms:
        t0 = time.perf_counter()
        config = arm_config(arm, args, out, seed)
        trainer = (fb.PPOTrainer if arm == "ppo" else fb.GRPOTrainer)(policy, config, recorder=fb.Recorder(store))
        load_adapter_weights(trainer.model, sft_path)
        trainer.publish(WARM_START)  # '<arm>-sft': the warm start, served to the live agent
        history = trainer.train(rollout, schedule, iterations=args.iterations)
        per_iteration = {kind: [] for kind in MULTI}
        for it in range(1, 1 + args.iterations):
            rolled = [t for t in store.trajectories(run_id=trainer.run_id) if t.metadata.get("iteration") == it]
            for kind in MULTI:
                mine = [t.reward or 0.0 for t in rolled if kind_of(t.task_id) == kind]
                per_iteration[kind].append(sum(mine) / max(len(mine), 1))
        held = evaluate(f"eval-{arm}")
        result["arms"][arm] = {
            "held_out": held, "training_success": per_iteration,
            "iterations_to_80": {k: next((i + 1 for i, v in enumerate(vals) if v >= 0.8), None)
                                 for k, vals in per_iteration.items()},
            "wall_s": time.perf_counter() - t0,
            "history": [{k: h.get(k) for k in ("iteration", "reward_mean", "kl", "entropy", "sampler_logp_gap",
                                                "tis_weight_mean", "batch_samples", "time_rollout_s",
                                                "time_update_s")} for h in history]}
        print(f"seed {seed} {arm}: held-out {held}; training success per iteration {per_iteration} "
              f"({result['arms'][arm]['wall_s']:.0f} s)", flush=True)
        trainer.close()
        del trainer
    policy.close()
    store.close()
    return result


def table(results: list[dict]) -> str:
    seeds = [r["seed"] for r in results]
    lines = [f"| arm | {' | '.join(f'{k} held-out (seeds {seeds})' for k in MULTI)} | both, mean ± sd | "
             f"iterations to 80 % training success ({', '.join(MULTI)}) |",
             "| --- | " + " | ".join("---" for _ in MULTI) + " | --- | --- |"]
    rows = [("SFT warm start", [r["sft"]["held_out"] for r in results], None)]
    rows += [(arm, [r["arms"][arm]["held_out"] for r in results], [r["arms"][arm]["iterations_to_80"] for r in results])
             for arm in ARMS if all(arm in r["arms"] for r in results)]
    for name, held, to80 in rows:
        cells = []
        for kind in MULTI:
            values = [h.get(kind, 0.0) * 100 for h in held]
            cells.append(" / ".join(f"{v:.0f}" for v in values) + f" (mean {statistics.mean(values):.0f})")
        both = [statistics.mean(h.get(k, 0.0) for k in MULTI) * 100 for h in held]
        spread = statistics.stdev(both) if len(both) > 1 else 0.0
        its = "–" if to80 is None else "; ".join(
            ", ".join("never" if s[k] is None else str(s[k]) for k in MULTI) for s in to80)
        lines.append(f"| {name} | {' | '.join(cells)} | {statistics.mean(both):.0f} ± {spread:.0f} | {its} |")
    return "\n".join(lines)


WARM_START_SETTINGS = ("model", "train_per_kind", "eval_per_kind", "demos_per_single", "demos_per_multi",
                       "sft_epochs", "sft_lr", "max_tokens", "max_model_calls")
"""What an earlier run's warm starts were made with; a run that reuses them must match."""


def check_warm_start(p: argparse.ArgumentParser, args) -> None:
    record = Path(args.warm_start) / "credit.json"
    if not record.is_file():
        p.error(f"--warm-start {args.warm_start}: no credit.json there (an earlier run's --out)")
    earlier = json.loads(record.read_text())
    differ = [k for k in WARM_START_SETTINGS if earlier["args"].get(k) != getattr(args, k)]
    if differ:
        p.error(f"--warm-start {args.warm_start} was made with other settings: "
                + ", ".join(f"{k}={earlier['args'].get(k)!r} (here {getattr(args, k)!r})" for k in differ))
    missing = [s for s in args.seeds if s not in {r["seed"] for r in earlier["results"]}
               or not (Path(args.warm_start) / f"seed{s}" / "sft-adapter").is_dir()]
    if missing:
        p.error(f"--warm-start {args.warm_start} has no warm start for seeds {missing}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--warm-start", help="an earlier run's --out: reuse its warm starts instead of training them")
    p.add_argument("--iterations", type=int, default=4, help="RL iterations per arm")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--tasks-per-kind", type=int, default=2, help="tasks of each multi-step kind per iteration")
    p.add_argument("--train-per-kind", type=int, default=16)
    p.add_argument("--eval-per-kind", type=int, default=10)
    p.add_argument("--demos-per-single", type=int, default=8, help="demonstrations of each single-tool kind")
    p.add_argument("--demos-per-multi", type=int, default=10, help="demonstrations of each multi-step kind")
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--lr", type=float, default=3e-4, help="RL learning rate (every arm)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--max-model-calls", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", default="runs/bench-credit")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        p.error(f"--out {args.out} holds an earlier run: move it away or name another folder")
    if args.warm_start:
        check_warm_start(p, args)
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, args))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "credit.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print("\n" + table(results))
    print(f"\nfull results: {Path(args.out) / 'credit.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

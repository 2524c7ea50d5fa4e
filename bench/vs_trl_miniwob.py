"""forge-bridge beside TRL on multi-turn web tasks: the same GRPO run on MiniWoB++ by forge-bridge's
trainer through `HarnessAgent`, and by TRL 1.16's `GRPOTrainer` through its own multi-turn
tool-calling path (`environment_factory`), from the same base model, both final adapters scored by
one evaluation.

    .venv/bin/python bench/vs_trl_miniwob.py --seeds 0 1 2 --out runs/bench-vs-trl-miniwob

The tasks, the system prompt and the settings' defaults come from `bench/miniwob_rl.py` (its
`splits()`, `SYSTEM` and `parser()`): the model is Qwen2.5-Coder-0.5B-Instruct (`--model`), in the
folder forge-bridge resolves locally (`model_path`), which TRL loads too. Per seed:

1. forge-bridge: `GRPOTrainer` as bench/miniwob_rl.py's `grpo` arm runs it (anchor credit, token-level
   loss, truncated importance sampling, `--kl-beta` to the base: 0 there, which also skips groups
   with no reward spread) trains a fresh LoRA from the base: `--iterations` iterations of `--tasks`
   training problems (drawn as bench/miniwob_rl.py draws them) x `--group-size` rollouts, each an
   episode of `HarnessAgent` on a fresh `MiniWoBEnvironment` page (at most `--max-calls` model calls
   of `--max-tokens` new tokens, `--temperature`), one optimiser step per iteration
   (`minibatch_size` holds all of an iteration's calls).
2. TRL (`bench/vs_trl_miniwob_peer.py`, in its own venv `.venv-trl`: bench/vs_trl.py's pins, plus
   Playwright and `miniwob` at constraints.txt's versions, added on first use) trains a fresh LoRA of
   the same shape from the same base on the *same* problems in the same order, with the same
   rollouts per problem, optimiser steps, AdamW and warm-up, clip, KL weight, temperature, tokens per
   reply and tool-running replies per episode. Its environment class wraps the same
   `MiniWoBEnvironment` (pages, seeds, page text, and each tool call run by the environment's own
   code, so argument checks and error texts are forge-bridge's); its reward is the page's
   (`get_reward`). Both agents see the same tool schemas, the ones TRL renders from its
   environment's methods (TRL lists them by name and wants every argument described), so the first
   prompts are the same tokens: the peer checks each problem's and records mismatches. Both read the
   model's replies with forge-bridge's reader: Qwen2.5-Coder-0.5B writes its calls as bare or fenced
   JSON, which TRL's own reader (the Qwen response template: `<tool_call>` tags) reads as no call --
   on 281 replies of this model on these pages forge-bridge's reader found calls in 230, TRL's in
   none -- so with `--trl-parser native` TRL's episodes end at the first reply with reward 0.
3. One evaluation scores both final adapters (and, once, the base): forge-bridge's greedy
   `HarnessAgent` with the same tools on the held-out split (`--eval-tasks` of it, evenly spaced; 0:
   all), success = reward >= 1, per family too. TRL's adapter is loaded into `LocalPolicy` as any
   peft LoRA is.

Wall time is each trainer's RL phase alone (sampling, browsers, tool calls, rewards, updates, and for
forge-bridge its recording and publishing); loading, the base and the evaluations are outside it.
TRL's result.json also splits its time: its generate calls, its environment. Both run on this
machine's CPU, one after the other, float32: time them on an otherwise idle machine. A seed whose
result.json exists is skipped; within a seed, a finished forge-bridge run, TRL run or evaluation is
not run again; `--out` refuses a folder holding a run with other settings.

What it does not cover: TRL with vLLM, on a GPU, or its async GRPO; validation-based selection (both
sides end on their last version, unlike bench/miniwob_rl.py's `grpo` arm, which ends on its best
validated one); credit per step on TRL's side (one advantage per episode: forge-bridge's `--credit
trajectory` is the like-for-like setting, its default `anchor` is not); TRL's group std is Bessel-
corrected (forge-bridge's is the population's: TRL's advantages are 0.87x forge-bridge's at 4
rollouts), and TRL does not skip groups without spread (their tokens still count in its DAPO
normaliser); an episode ended by the environment on TRL's side (TRL's loop stops only at a reply
without a tool call, or after `max_tool_calling_iterations` tool rounds, so after the page ends the
task, or after the last tool round, TRL samples and trains one more reply that forge-bridge's agent
does not take); TRL's per-episode token budget (`--trl-max-completion`: its replies and the tool
results together; forge-bridge cuts training sequences at `--max-seq-len` instead and its agent has
no budget); MiniWoB's visual tasks; other models; more than this machine's 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ("model", "iterations", "tasks", "group_size", "temperature", "kl_beta", "max_tokens", "max_calls",
          "max_seq_len", "concurrency")
"""The settings whose defaults are bench/miniwob_rl.py's (its parser's)."""


def defaults(mw) -> dict:
    values = vars(mw.parser().parse_args([]))
    return {k: values[k] for k in SHARED}


def trl_python() -> Path:
    """TRL's venv (bench/vs_trl.py's, made and pinned there), with the browser stack added: Playwright
    and the `miniwob` pages (no dependencies: only its html/ folder is served) at constraints.txt's
    versions."""
    import vs_trl

    python = vs_trl.trl_python()
    pins = {line.split("==")[0].strip(): line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip().startswith(("playwright==", "miniwob=="))}
    want = [pins.get("playwright", "playwright"), pins.get("miniwob", "miniwob==1.1.0")]
    stamp = vs_trl.VENV / ".installed-miniwob"
    if not (stamp.is_file() and stamp.read_text() == " ".join(want)):
        print(f"== adding the browser stack to TRL's venv: {' '.join(want)}", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q", want[0]], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", want[1]], check=True)
        stamp.write_text(" ".join(want))
    return python


def shared_env(peer):
    """MiniWoBEnvironment with the tool schemas TRL renders (same tools, same code, same order)."""
    from forge_bridge.envs.miniwob import MiniWoBEnvironment

    schemas = peer.tool_schemas(peer.make_tools_class({}))

    class SameToolsMiniWoB(MiniWoBEnvironment):
        def tool_functions(self):
            own = super().tool_functions()
            assert set(own) == set(schemas), (sorted(own), sorted(schemas))
            return {name: (schemas[name], own[name][1]) for name in schemas}

    return SameToolsMiniWoB


def held_out(mw, args) -> list:
    tasks = mw.splits()["held_out"]
    if args.eval_tasks and args.eval_tasks < len(tasks):
        step = len(tasks) / args.eval_tasks
        tasks = [tasks[int(i * step)] for i in range(args.eval_tasks)]
    return tasks


def run_forge(seed: int, args, mw, env, folder: Path) -> dict:
    """forge-bridge's GRPO run and its evaluation (forge.json), unless done."""
    path = folder / "forge.json"
    if path.is_file():
        return json.loads(path.read_text())
    import torch

    import forge_bridge as fb
    from forge_bridge.core.store import TrajectoryStore

    if (folder / "run").exists():  # an interrupted run: start it again whole
        import shutil

        shutil.rmtree(folder / "run")
        for name in ("trajectories.db", "trajectories.db-wal", "trajectories.db-shm"):
            (folder / name).unlink(missing_ok=True)
    torch.manual_seed(seed)
    store = TrajectoryStore(folder / "trajectories.db")
    policy = fb.LocalPolicy(args.model, max_batch=args.concurrency)
    try:
        config = fb.GRPOConfig(
            group_size=args.group_size, tasks_per_iteration=args.tasks, concurrency=args.concurrency,
            credit=args.credit, max_seq_len=args.max_seq_len, lr=args.lr, kl_beta=args.kl_beta,
            skip_uniform_groups=args.kl_beta == 0,  # as bench/miniwob_rl.py runs it
            minibatch_size=args.tasks * args.group_size * args.max_calls,  # one optimiser step per iteration
            run_name="fb", out_dir=str(folder / "run"), seed=seed, progress=not args.quiet, report_to=())
        trainer = fb.GRPOTrainer(policy, config, recorder=fb.Recorder(store))
        pool = mw.splits()["train"]

        drawn: dict[int, list] = {}

        def schedule(it: int) -> list:
            drawn[it] = mw.draw(pool, seed, it, args.tasks)
            return drawn[it]

        t0 = time.perf_counter()
        history = trainer.train(mw.agent(policy, args, env, temperature=args.temperature), schedule,
                                iterations=args.iterations)
        rl_s = time.perf_counter() - t0
        trainer.close()
        score = mw.evaluate(policy, held_out(mw, args), store, "eval-forge-bridge", args, env)
    finally:
        policy.close()
        store.close()
    result = {"rl_s": rl_s, "held_out": score,
              "drawn": [[{"name": t.name, "seed": t.seed} for t in drawn[it]] for it in sorted(drawn)],
              "training": [{k: v for k, v in h.items() if k == "iteration" or k.startswith("reward")} for h in history],
              "config": {"lr": config.optimizer.lr, "warmup_steps": config.optimizer.warmup_steps,
                         "grad_clip": config.optimizer.grad_clip, "clip": config.loss.clip_low,
                         "kl_beta": config.loss.kl_beta, "lora": {"rank": config.lora.rank, "alpha": config.lora.alpha,
                                                                  "targets": list(config.lora.targets)}}}
    path.write_text(json.dumps(result, indent=1))
    return result


def run_trl(seed: int, args, python: Path, ours: dict, folder: Path) -> dict:
    """TRL's run in its venv on the problems forge-bridge drew (trl/result.json), unless done."""
    done = folder / "trl" / "result.json"
    if done.is_file() and (folder / "trl" / "adapter" / "adapter_config.json").is_file():
        return json.loads(done.read_text())
    import torch

    from forge_bridge.core.runs import read_run_id
    from forge_bridge.core.store import TrajectoryStore
    from forge_bridge.policies.models import model_path

    import vs_trl

    # the problems in the order forge-bridge's schedule drew them, each with the token ids its agent's
    # first model call was given (the peer checks that TRL renders the same)
    with TrajectoryStore(folder / "trajectories.db") as store:
        first = {r["task_id"]: r["prompt_ids"] for r in vs_trl.prompts_of(store, read_run_id(folder / "run", "fb"))}
    rows = [{**task, **({"prompt_ids": first[f"{task['name']}-{task['seed']}"]}
                        if f"{task['name']}-{task['seed']}" in first else {})}
            for tasks in ours["drawn"] for task in tasks]
    c = ours["config"]
    job = {"model": str(model_path(args.model)), "out": str(folder / "trl"), "seed": seed,
           "threads": torch.get_num_threads(), "system": args.system, "rows": rows, "parser": args.trl_parser,
           "env_config": {},
           "settings": {"group_size": args.group_size, "tasks_per_iteration": args.tasks,
                        "iterations": args.iterations, "lr": c["lr"], "warmup_steps": c["warmup_steps"],
                        "grad_clip": c["grad_clip"], "clip": c["clip"], "kl_beta": c["kl_beta"],
                        "temperature": args.temperature, "max_tokens": args.max_tokens, "max_calls": args.max_calls,
                        "max_seq_len": args.max_seq_len, "lora": c["lora"], "microbatch": args.trl_microbatch,
                        "max_completion": args.trl_max_completion}}
    if len(rows) != args.iterations * args.tasks:
        sys.exit(f"seed {seed}: forge-bridge's run drew {len(rows)} training problems, expected "
                 f"{args.iterations * args.tasks}")
    (folder / "trl").mkdir(exist_ok=True)
    (folder / "trl" / "job.json").write_text(json.dumps(job))
    subprocess.run([python, HERE / "vs_trl_miniwob_peer.py", folder / "trl" / "job.json"], check=True,
                   env={**os.environ, "PYTHONPATH": "", "TRL_EXPERIMENTAL_SILENCE": "1"})
    return json.loads(done.read_text())


def score_adapter(args, mw, env, adapter: Path | None, folder: Path, name: str) -> dict:
    """The one evaluation, on `adapter` (None: the base), kept in folder/<name>.json."""
    path = folder / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    import forge_bridge as fb
    from forge_bridge.core.store import TrajectoryStore

    policy = fb.LocalPolicy(args.model, max_batch=args.concurrency)
    try:
        if adapter is not None:
            policy.load_adapter(adapter, name)
        with TrajectoryStore(folder / f"{name}.db") as store:
            score = mw.evaluate(policy, held_out(mw, args), store, f"eval-{name}", args, env)
    finally:
        policy.close()
    path.write_text(json.dumps(score, indent=1))
    return score


def run_seed(seed: int, args, python: Path, mw, env) -> dict:
    folder = Path(args.out) / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"== seed {seed}: forge-bridge", flush=True)
    ours = run_forge(seed, args, mw, env, folder)
    print(f"== seed {seed}: TRL", flush=True)
    theirs = run_trl(seed, args, python, ours, folder)
    trl_score = score_adapter(args, mw, env, folder / "trl" / "adapter", folder, "trl")
    result = {"seed": seed, "forge-bridge": ours["held_out"]["success"], "TRL": trl_score["success"],
              "forge-bridge_s": ours["rl_s"], "TRL_s": theirs["rl_s"], "eval_tasks": trl_score["n"],
              "prompts_mismatched": theirs.get("prompts_mismatched"),
              "training_reward": {"forge-bridge": ours["training"], "TRL": theirs["training_reward"]},
              "families": {"forge-bridge": ours["held_out"]["families"], "TRL": trl_score["families"]}}
    (folder / "result.json").write_text(json.dumps(result, indent=1))
    print(f"seed {seed}: forge-bridge {ours['held_out']['success']:.2f} in {ours['rl_s']:.0f} s; "
          f"TRL {trl_score['success']:.2f} in {theirs['rl_s']:.0f} s", flush=True)
    return result


def table(results: list[dict], base: dict | None) -> str:
    def sd(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    b = f"{100 * base['success']:.0f} %" if base else "-"
    lines = ["| seed | base | TRL GRPO | forge-bridge GRPO | TRL RL wall time | forge-bridge RL wall time "
             "| time ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['seed']} | {b} | {100 * r['TRL']:.0f} % | {100 * r['forge-bridge']:.0f} % "
                     f"| {r['TRL_s']:.0f} s | {r['forge-bridge_s']:.0f} s | {r['forge-bridge_s'] / r['TRL_s']:.2f}x |")
    col = {k: [100 * r[k] for r in results] for k in ("TRL", "forge-bridge")}
    ratio = [r["forge-bridge_s"] / r["TRL_s"] for r in results]
    lines.append(f"| mean ± sd | {b} | {statistics.mean(col['TRL']):.0f} ± {sd(col['TRL']):.0f} % "
                 f"| {statistics.mean(col['forge-bridge']):.0f} ± {sd(col['forge-bridge']):.0f} % | | "
                 f"| {statistics.mean(ratio):.2f} ± {sd(ratio):.2f}x |")
    return "\n".join(lines)


def parser(shared: dict) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/bench-vs-trl-miniwob")
    p.add_argument("--model", default=shared["model"])
    p.add_argument("--iterations", type=int, default=shared["iterations"], help="GRPO iterations (optimiser steps)")
    p.add_argument("--tasks", type=int, default=shared["tasks"], help="training problems per iteration")
    p.add_argument("--group-size", type=int, default=shared["group_size"], help="rollouts per problem")
    p.add_argument("--temperature", type=float, default=shared["temperature"])
    p.add_argument("--kl-beta", type=float, default=shared["kl_beta"], help="KL to the base, both trainers")
    p.add_argument("--max-tokens", type=int, default=shared["max_tokens"], help="new tokens per model call")
    p.add_argument("--max-calls", type=int, default=shared["max_calls"], help="model calls per episode")
    p.add_argument("--max-seq-len", type=int, default=shared["max_seq_len"])
    p.add_argument("--concurrency", type=int, default=shared["concurrency"], help="forge-bridge's rollouts at once")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--credit", choices=("anchor", "trajectory"), default="anchor",
                   help="forge-bridge's credit ('trajectory' is TRL's kind: one advantage per episode)")
    p.add_argument("--trl-parser", choices=("forge-bridge", "native"), default="forge-bridge",
                   help="how TRL reads the model's tool calls (native: TRL's own, <tool_call> tags only)")
    p.add_argument("--trl-microbatch", type=int, default=1, help="episodes per TRL forward/backward pass "
                   "(memory only: the optimiser step is the same)")
    p.add_argument("--trl-max-completion", type=int, default=4096, help="TRL's token budget for a whole episode "
                   "(its replies and the tool results between them; forge-bridge's agent has none)")
    p.add_argument("--eval-tasks", type=int, default=0, help="held-out problems scored, evenly spaced (0: all)")
    p.add_argument("--no-base", action="store_true", help="do not score the base model")
    p.add_argument("--quiet", action="store_true")
    return p


def main() -> int:
    import miniwob_rl as mw
    import vs_trl_miniwob_peer as peer

    args = parser(defaults(mw)).parse_args()
    args.system = mw.SYSTEM
    if args.trl_microbatch < 1 or (args.group_size * args.tasks) % args.trl_microbatch:
        sys.exit(f"--trl-microbatch {args.trl_microbatch}: expected a divisor of --group-size x --tasks")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "args.json"
    same = {k: v for k, v in vars(args).items() if k not in ("seeds", "out", "quiet", "no_base")}
    if saved.is_file() and json.loads(saved.read_text()) != same:
        sys.exit(f"--out {out} holds a run with other settings ({saved}): name another folder")
    saved.write_text(json.dumps(same, indent=1))
    python = trl_python()
    env = shared_env(peer)
    print(f"== settings: {json.dumps(same)}", flush=True)
    base = None if args.no_base else score_adapter(args, mw, env, None, out, "base")
    results = []
    for seed in args.seeds:
        done = out / f"seed{seed}" / "result.json"
        results.append(json.loads(done.read_text()) if done.is_file() else run_seed(seed, args, python, mw, env))
        (out / "vs_trl_miniwob.json").write_text(json.dumps({"args": same, "base": base, "results": results}, indent=2))
    print("\n" + table(results, base))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Learning where nobody here wrote the tasks: GRPO on MiniWoB++ from the Qwen2.5-Coder-0.5B base,
with validation inside training, scored on web-task families the training never saw.

    .venv/bin/python bench/miniwob_rl.py --seeds 0 1 2 --out runs/bench-miniwob          # GRPO from the base
    .venv/bin/python bench/miniwob_rl.py --arms guided --seeds 0 1 2 --out runs/bench-miniwob  # + the 1.5B's guides
    .venv/bin/python bench/miniwob_rl.py --arms grpo-trajectory --seeds 0 1 2 ...       # credit on the episode only
    .venv/bin/python bench/miniwob_rl.py --report runs/bench-miniwob                     # the tables again

The agent: `HarnessAgent` on `MiniWoBEnvironment` (the package's pages in headless Chromium, the
page as text, four tools: click, type, press, select; MiniWoB's clock stopped), the model's own
reply format read as calls (Qwen2.5-Coder writes fenced JSON). The reward: MiniWoB's own.

The families (fixed before any run, by what a solution takes; variants of one family -- click-test
and click-test-2 -- form one group and go to one split): tasks done by clicking, typing, pressing
or choosing elements the page names as text, none needing coordinates, dragging, colours or
shapes. Per group size (one action, two, three or more), the groups are shuffled with
`Random(62)`; the first half (rounded up) train, a quarter (at least one) validate, the rest are
held out. Seeds: training draws problems 0-499 of the training families; validation runs
problems 500-501 of the validation families and 500 of the training ones; the held-out split is
problems 1000-1002 of the held-out families and 1000-1001 of the training families.

Arms, each a cell `<arm>/seed<N>` (a finished cell is not run again):
- `base`: the 0.5B as it ships, greedy (one cell; greedy does not depend on the seed);
- `grpo`: GRPO from the base (no demonstrations), anchor credit (the default), validated every
  `--eval-every` iterations with `--patience`, ending on its best version on validation;
- `grpo-trajectory`: the same with the episode's advantage on every step (`credit='trajectory'`);
- `guided`: `grpo` plus guided groups from Qwen2.5-Coder-1.5B-Instruct through the same agent
  (`Guidance(source='teacher')`), for groups at or below `--guide-below` success.

Per family it reports success before and after (greedy, held-out problems), steps per episode,
and each cell's wall time. What it does not cover: MiniWoB's visual tasks, the 1.5B as a student,
more than 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STUDENT = "qwen2.5-coder-0.5b-instruct"
TEACHER = "qwen2.5-coder-1.5b-instruct"

GROUPS: dict[int, list[tuple[str, ...]]] = {
    1: [("click-test", "click-test-2", "click-test-transfer"), ("click-button",), ("click-link",),
        ("click-dialog", "click-dialog-2"), ("focus-text", "focus-text-2"), ("click-widget",), ("unicode-test",)],
    2: [("choose-list",), ("enter-text", "enter-text-2", "enter-text-dynamic"), ("click-button-sequence",),
        ("click-collapsible-nodelay",), ("click-option",), ("click-tab",), ("simple-arithmetic",), ("find-word",)],
    3: [("login-user", "login-user-popup"), ("enter-password",),
        ("click-checkboxes", "click-checkboxes-large", "click-checkboxes-transfer"),
        ("multi-orderings", "multi-layouts"), ("navigate-tree",)],
}
"""Family groups by the actions a solution takes (1, 2, 3 or more)."""

SYSTEM = ("You operate a web page to do the task it states. The page lists its elements as [ref] tag \"text\". "
          "Use the tools: click(ref), type(ref, text), press(key), select(ref, option). When the page says the "
          "task is over, answer briefly.")

ARMS = ("base", "grpo", "grpo-trajectory", "guided")


def split_families() -> dict[str, list[str]]:
    """'train' / 'validation' / 'held_out' -> family names, by the rule in the module's docstring."""
    out: dict[str, list[str]] = {"train": [], "validation": [], "held_out": []}
    for size in sorted(GROUPS):
        groups = list(GROUPS[size])
        random.Random(62).shuffle(groups)
        n_train = math.ceil(len(groups) / 2)
        n_val = max(1, len(groups) // 4)
        for i, group in enumerate(groups):
            part = "train" if i < n_train else "validation" if i < n_train + n_val else "held_out"
            out[part].extend(group)
    return out


def steps_of(name: str) -> int:
    """The group size (1, 2 or 3 = three or more actions) of a family."""
    return next(size for size, groups in GROUPS.items() for group in groups if name in group)


def splits() -> dict[str, list]:
    """The tasks of each split (`MiniWoBTask`s); 'train' is the pool iterations draw from."""
    from forge_bridge.envs.miniwob import MiniWoBTask

    fam = split_families()
    return {
        "train": [MiniWoBTask(f, s) for f in fam["train"] for s in range(500)],
        "validation": [MiniWoBTask(f, s) for f in fam["validation"] for s in (500, 501)]
                      + [MiniWoBTask(f, 500) for f in fam["train"]],
        "held_out": [MiniWoBTask(f, s) for f in fam["held_out"] for s in (1000, 1001, 1002)]
                    + [MiniWoBTask(f, s) for f in fam["train"] for s in (1000, 1001)],
    }


def draw(pool: list, seed: int, iteration: int, n: int) -> list:
    """The `n` training problems iteration `iteration` of seed `seed` runs (every bench that
    trains on these splits draws them so)."""
    return random.Random(seed * 100_003 + iteration).sample(pool, n)


def agent(policy, args, env=None, **sampling):
    """The agent every arm runs (and the teacher through it): HarnessAgent on a fresh MiniWoB page
    (`env`: the environment class, MiniWoBEnvironment unless given)."""
    from forge_bridge.envs.harness import HarnessAgent
    from forge_bridge.envs.miniwob import MiniWoBEnvironment

    return HarnessAgent(policy, env or MiniWoBEnvironment, system=SYSTEM, max_model_calls=args.max_calls,
                        max_tokens=args.max_tokens, **sampling)


def evaluate(policy, tasks, store, run_id: str, args, env=None) -> dict:
    """Greedy episodes of `tasks`; per family: success, mean reward, steps per episode."""
    import forge_bridge as fb

    harness = agent(policy, args, env)

    def one(task) -> tuple[str, float, int]:
        with fb.sampling(temperature=0):
            traj = harness.run(task, recorder=fb.Recorder(store, run_id))
        return task.name, float(traj.reward or 0.0), len(traj)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        rows = list(pool.map(one, tasks))
    per: dict[str, dict] = {}
    for name, reward, steps in rows:
        d = per.setdefault(name, {"n": 0, "success": 0.0, "reward": 0.0, "steps": 0.0})
        d["n"] += 1
        d["success"] += reward >= 1.0
        d["reward"] += reward
        d["steps"] += steps
    for d in per.values():
        for key in ("success", "reward", "steps"):
            d[key] /= d["n"]
    return {"families": per, "success": sum(r >= 1.0 for _, r, _ in rows) / len(rows), "n": len(rows),
            "wall_s": time.perf_counter() - t0}


def run_cell(arm: str, seed: int, args) -> dict:
    import torch

    import forge_bridge as fb
    from forge_bridge.core.store import TrajectoryStore

    torch.manual_seed(seed)
    out = Path(args.out) / arm / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    store = TrajectoryStore(out / "trajectories.db")
    split = splits()
    if args.limit:  # a quick try of the whole path
        split = {k: v if k == "train" else v[::max(1, len(v) // args.limit)][:args.limit] for k, v in split.items()}
    policy = fb.LocalPolicy(args.model, max_batch=args.concurrency)
    result: dict = {"arm": arm, "seed": seed, "model": args.model}
    t0 = time.perf_counter()
    if arm == "base":
        result["held_out"] = evaluate(policy, split["held_out"], store, "eval-base", args)
        result["validation"] = evaluate(policy, split["validation"], store, "val-base", args)
    else:
        guided = arm == "guided"
        # the teacher first: the trainer measures what the process holds when it is built, and
        # cuts each update into microbatches that fit `--max-memory-gb` on top of that
        teacher = fb.LocalPolicy(TEACHER, max_batch=args.concurrency) if guided else None
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
            group_size=args.group_size, tasks_per_iteration=args.tasks, concurrency=args.concurrency,
            credit="trajectory" if arm == "grpo-trajectory" else "anchor", max_seq_len=args.max_seq_len,
            kl_beta=args.kl_beta, skip_uniform_groups=args.kl_beta == 0, max_memory_gb=args.max_memory_gb,
            run_name=arm, out_dir=str(out / "run"), seed=seed, progress=not args.quiet,
            guidance=fb.Guidance(below=args.guide_below, k=2, source="teacher") if guided else None),
            recorder=fb.Recorder(store))
        if teacher is not None:  # the bigger model through the same agent: guides for the groups that fail
            trainer.use_teacher(fb.Teacher(policy=teacher, make_rollout=lambda p: agent(
                p, args, temperature=args.temperature)))
        pool = split["train"]

        def schedule(it: int) -> list:
            return draw(pool, seed, it, args.tasks)

        t_rl = time.perf_counter()
        history = trainer.train(agent(policy, args, temperature=args.temperature), schedule,
                                iterations=args.iterations, resume=(out / "run").exists() and args.resume,
                                validation=split["validation"], eval_every=args.eval_every, patience=args.patience)
        result["rl_s"] = time.perf_counter() - t_rl
        result["training"] = [{k: v for k, v in h.items() if k == "iteration" or k.startswith(("reward", "time_", "guid"))}
                              for h in history]
        events = [json.loads(line) for line in (out / "run" / "events.jsonl").read_text().splitlines()]
        best = [e for e in events if e.get("event") == "best_on_validation"][-1]
        result["validation_scores"], result["best_iteration"] = best["scores"], best["iteration"]
        result["served"] = policy.versions()[-1] or "base"
        result["held_out"] = evaluate(policy, split["held_out"], store, "eval-after", args)
        trainer.close()
        if teacher is not None:
            teacher.close()
    result["wall_s"] = time.perf_counter() - t0
    policy.close()
    store.close()
    return result


def pm(xs: list[float]) -> str:
    """Mean ± population std, in points."""
    return f"{100 * statistics.mean(xs):.0f} ± {100 * statistics.pstdev(xs):.0f}" if xs else "-"


def report(cells: dict) -> str:
    fam = split_families()
    base = cells.get("base/seed0")
    arms = sorted({k.split("/")[0] for k in cells if not k.startswith("base/")})
    lines = ["| family | split | actions | base | " + " | ".join(f"{a} (after, mean ± std)" for a in arms)
             + " | steps/episode base → after |", "| --- " * (5 + len(arms)) + "|"]
    names = [(f, "held-out family") for f in fam["held_out"]] + [(f, "training family, new problems")
                                                                 for f in fam["train"]]
    for name, part in names:
        row = [name, part, str(steps_of(name)) if steps_of(name) < 3 else "3+"]
        b = base["held_out"]["families"].get(name) if base else None
        row.append(f"{100 * b['success']:.0f}" if b else "-")
        steps_after = []
        for arm in arms:
            runs = [c["held_out"]["families"][name] for k, c in cells.items()
                    if k.startswith(arm + "/") and name in c["held_out"]["families"]]
            row.append(pm([r["success"] for r in runs]))
            steps_after += [r["steps"] for r in runs]
        row.append(f"{b['steps']:.1f} → {statistics.mean(steps_after):.1f}" if b and steps_after else "-")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for arm in arms:
        runs = sorted((k, c) for k, c in cells.items() if k.startswith(arm + "/"))
        for k, c in runs:
            held = c["held_out"]["families"]
            unseen = [held[f]["success"] for f in fam["held_out"] if f in held for _ in range(held[f]["n"])] or [0.0]
            seen = [held[f]["success"] for f in fam["train"] if f in held for _ in range(held[f]["n"])] or [0.0]
            lines.append(f"- {k}: held-out all {100 * c['held_out']['success']:.0f} % (held-out families "
                         f"{100 * statistics.mean(unseen):.0f} %, training families' new problems "
                         f"{100 * statistics.mean(seen):.0f} %); validation {c['validation_scores']}; served "
                         f"{c['served']}; RL {c['rl_s'] / 60:.1f} min, cell {c['wall_s'] / 60:.1f} min")
    if base:
        lines.append(f"- base: held-out all {100 * base['held_out']['success']:.0f} %, validation "
                     f"{100 * base['validation']['success']:.0f} % ({base['wall_s'] / 60:.1f} min)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=["base", "grpo"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/bench-miniwob")
    p.add_argument("--report", metavar="OUT", help="print the tables of a finished bench folder and stop")
    p.add_argument("--model", default=STUDENT)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--tasks", type=int, default=6, help="training problems per iteration")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per problem")
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--kl-beta", type=float, default=0.0,
                   help="KL to the base; 0 (the default here) also skips groups with no reward spread, "
                        "which a KL would still train")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per model call")
    p.add_argument("--max-calls", type=int, default=5, help="model calls per episode (then truncated)")
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-memory-gb", type=float,
                   help="the update's peak (GRPOConfig.max_memory_gb); unset, 8 sequences a microbatch (the "
                        "0.5B's grpo cells peaked at 19-21 GiB so)")
    p.add_argument("--guide-below", type=float, default=0.0, help="guided arm: groups at or below this success")
    p.add_argument("--resume", action="store_true", help="continue a cell's interrupted training run")
    p.add_argument("--limit", type=int, help="evaluate only this many tasks of each split (a quick try)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.report or args.out)
    cells_path = out / "cells.json"
    cells = json.loads(cells_path.read_text()) if cells_path.is_file() else {}
    if args.report:
        print(report(cells))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "splits.json").write_text(json.dumps(split_families(), indent=1))
    for arm in args.arms:
        for seed in ([0] if arm == "base" else args.seeds):
            key = f"{arm}/seed{seed}"
            if key in cells:
                continue
            print(f"== {key}", flush=True)
            cells[key] = run_cell(arm, seed, args)
            cells_path.write_text(json.dumps(cells, indent=1))
            c = cells[key]
            print(f"{key}: held-out {100 * c['held_out']['success']:.0f} % ({c['wall_s'] / 60:.1f} min)", flush=True)
    print(report(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

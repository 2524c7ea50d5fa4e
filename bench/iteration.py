"""The demo's GRPO iteration, this checkout against an earlier commit, side by side in one run.

Both sides run `forge-bridge demo` with the same settings (the demo's own: 40 rollouts of a
LangChain agent on the embedded SmolLM2-135M per iteration, one update with a KL to the warm
start; the one-epoch warm start of the baseline, since a longer one makes longer rollouts),
each in its own process: the earlier commit from a `git worktree`, imported from there through
a folder of links (as an install would lay it out), this checkout as installed. The
runs alternate (baseline, head, baseline, head, ...) so a change in the machine's load hits
both. Per iteration it reads the trainer's own timings from `metrics.jsonl`: the rollouts
(`time_rollout_s`), the update (`time_update_s`), and the rollouts' decoded tokens, and prints
the medians and the ratios.

    .venv/bin/python bench/iteration.py                       # baseline 6191d6e, 3 iterations, 1 pair
    .venv/bin/python bench/iteration.py --pairs 2 --iterations 2

The baseline default, 6191d6e, is the commit the rollout-speed issue measured its 83 s per
iteration on.

With `--suite function-calling` both sides run their own `bench/function_calling.py` instead (an
ordinary LangChain agent per function of the generated suite, a light SFT warm start (`--sft-lr`), GRPO on
`--tasks` training requests x `--group-size` rollouts an iteration, the held-out functions
evaluated greedily before and after), on `--model` and each of `--seeds`, alternating by seed. It
prints the iteration's times as above and each side's held-out exact-call rate after training, so
a faster iteration is seen to learn as much:

    .venv/bin/python bench/iteration.py --suite function-calling --model qwen2.5-coder-0.5b-instruct \
        --baseline 238344d --seeds 0 1 2 --iterations 1

(238344d is the commit before the rollout issue's work: shared prefill, merged calls, rollouts
ahead.) What it does not cover: the evaluations, SFT and set-up around the GRPO phase
(timed by the demo itself), other models, more cores, a GPU. The two sides sample different
rollouts (the baseline has no per-rollout seeds), so the decoded tokens per iteration differ a
little; tokens per second of rollout is printed beside the times for that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def linked_package(checkout: Path) -> Path:
    """A folder whose `forge_bridge` is `checkout`'s, laid out as pyproject maps it."""
    root = Path(tempfile.mkdtemp(prefix="forge-bridge-baseline-"))
    package = root / "forge_bridge"
    package.mkdir()
    for item in (checkout / "forge_bridge").iterdir():
        (package / item.name).symlink_to(item)
    for name in ("adapters", "trainer"):
        (package / name).symlink_to(checkout / name)
    return root


def run_side(label: str, pythonpath: str | None, out: Path, iterations: int, seed: int) -> list[dict]:
    env = dict(os.environ)
    if pythonpath:  # ahead of the editable install (its finder comes after sys.path)
        env["PYTHONPATH"] = pythonpath
    # Both sides unguided, on every demonstration: the fields a later demo added, where it has them.
    code = ("import dataclasses; from forge_bridge.app.demo import DemoConfig, run; "
            "names = {f.name for f in dataclasses.fields(DemoConfig)}; "
            "later = {k: v for k, v in dict(guide='none', multi_step_demos=None).items() if k in names}; "
            f"run(DemoConfig(out_dir={str(out)!r}, rl_iterations={iterations}, seed={seed}, sft_epochs=1, **later), "
            "progress=False)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        sys.exit(f"{label}: the demo failed:\n{proc.stderr[-3000:]}")
    return [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "time_rollout_s" in m]


def run_function_calling(label: str, checkout: Path, pythonpath: str | None, out: Path, args, seed: int) -> dict:
    """One seed of `checkout`'s own bench/function_calling.py: its GRPO iterations' metrics and
    the held-out exact-call rate before (SFT) and after RL."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, str(checkout / "bench" / "function_calling.py"), "--model", args.model,
           "--seeds", str(seed), "--iterations", str(args.iterations), "--tasks-per-iteration", str(args.tasks),
           "--group-size", str(args.group_size), "--demos", str(args.demos), "--sft-epochs", "1",
           "--sft-lr", str(args.sft_lr),
           "--eval-tasks", str(args.eval_tasks), "--concurrency", str(args.concurrency), "--out", str(out),
           "--quiet"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        sys.exit(f"{label}: bench/function_calling.py failed:\n{proc.stderr[-3000:]}")
    result = json.loads((out / "fc.json").read_text())["results"][0]
    metrics = [m for m in map(json.loads, (out / f"seed{seed}" / "run" / "metrics.jsonl").read_text().splitlines())
               if "time_rollout_s" in m]
    return {"metrics": metrics, "held_out": {"SFT": result["SFT"], "SFT+RL": result["SFT+RL"]},
            "rl_s": result["rl_s"]}


def decoded_tokens(db: Path, iteration: int) -> int:
    """Completion tokens the policy decoded in that iteration's rollouts (evaluations, which carry
    no iteration, left out)."""
    from forge_bridge.core.store import TrajectoryStore

    store = TrajectoryStore(db)
    try:
        return sum(len(step.completion_token_ids) for t in store.iter()
                   if t.metadata.get("iteration") == iteration for step in t.transitions)
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="6191d6e", help="the earlier commit (default: %(default)s)")
    ap.add_argument("--iterations", type=int, default=3, help="GRPO iterations per run")
    ap.add_argument("--pairs", type=int, default=1, help="baseline/head run pairs, alternating")
    ap.add_argument("--seed", type=int, default=0, help="the demo's seed")
    ap.add_argument("--suite", choices=("demo", "function-calling"), default="demo",
                    help="what both sides run: the demo, or bench/function_calling.py")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="function-calling: the student")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="function-calling: one run pair each")
    ap.add_argument("--tasks", type=int, default=8, help="function-calling: training requests an iteration")
    ap.add_argument("--group-size", type=int, default=8, help="function-calling: rollouts a request")
    ap.add_argument("--demos", type=int, default=16, help="function-calling: demonstrations for the warm start")
    ap.add_argument("--sft-lr", type=float, default=1e-5,
                    help="function-calling: the warm start's learning rate (the bench's own 1e-3, chosen for "
                         "SmolLM2, makes the 0.5B echo its tool schemas: 0 of 30 exact calls)")
    ap.add_argument("--eval-tasks", type=int, default=30, help="function-calling: held-out requests evaluated")
    ap.add_argument("--concurrency", type=int, default=32, help="function-calling: agents at once")
    ap.add_argument("--out", default="runs/bench-iteration")
    args = ap.parse_args()

    out = Path(args.out).resolve()  # the runs start in a folder of their own
    out.mkdir(parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="forge-bridge-worktree-")) / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), args.baseline],
                   check=True, capture_output=True)
    results: dict[str, list[dict]] = {"baseline": [], "head": []}
    held_out: dict[str, list[dict]] = {"baseline": [], "head": []}
    try:
        farm = str(linked_package(tree))
        sides = (("baseline", tree, farm), ("head", ROOT, None))
        if args.suite == "demo":
            for pair in range(args.pairs):
                for label, _, path in sides:
                    run_dir = out / f"{label}-{pair}"
                    print(f"{label} run {pair + 1}/{args.pairs} ...", flush=True)
                    for m in run_side(label, path, run_dir, args.iterations, args.seed):
                        m["decoded_tokens"] = decoded_tokens(run_dir / "trajectories.db", m["iteration"])
                        results[label].append(m)
        else:
            for seed in args.seeds:
                for label, checkout, path in sides:
                    run_dir = out / f"{label}-seed{seed}"
                    print(f"{label} seed {seed} ...", flush=True)
                    side = run_function_calling(label, checkout, path, run_dir, args, seed)
                    for m in side["metrics"]:
                        m["decoded_tokens"] = decoded_tokens(run_dir / f"seed{seed}" / "trajectories.db", m["iteration"])
                        results[label].append(m)
                    held_out[label].append({"seed": seed, **side["held_out"], "rl_s": side["rl_s"]})
                    print(f"  held-out exact calls {side['held_out']['SFT']:.2f} -> {side['held_out']['SFT+RL']:.2f}; "
                          f"GRPO phase {side['rl_s']:.0f} s", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)

    if args.suite == "demo":
        print(f"\nthe demo's GRPO iteration (seed {args.seed}; {args.pairs} run pair(s) x {args.iterations} "
              f"iterations; medians), baseline {args.baseline} vs this checkout")
    else:
        print(f"\nthe function-calling suite's GRPO iteration ({args.model}, {args.tasks} x {args.group_size} "
              f"rollouts, {args.concurrency} at once; seeds {args.seeds} x {args.iterations} iterations; medians), "
              f"baseline {args.baseline} vs this checkout")
    print(f"{'':<10}{'rollouts s':>12}{'update s':>10}{'iteration s':>13}{'tokens':>8}{'tok/s':>8}")
    medians = {}
    for label, ms in results.items():
        roll = statistics.median(m["time_rollout_s"] for m in ms)
        upd = statistics.median(m["time_update_s"] for m in ms)
        it = statistics.median(m["time_rollout_s"] + m["time_update_s"] + m["time_publish_s"] for m in ms)
        tok = statistics.median(m["decoded_tokens"] for m in ms)
        rate = statistics.median(m["decoded_tokens"] / m["time_rollout_s"] for m in ms)
        medians[label] = (roll, upd, it)
        print(f"{label:<10}{roll:>12.1f}{upd:>10.1f}{it:>13.1f}{tok:>8.0f}{rate:>8.0f}")
    (b_roll, b_upd, b_it), (h_roll, h_upd, h_it) = medians["baseline"], medians["head"]
    print(f"{'speed-up':<10}{b_roll / h_roll:>11.2f}x{b_upd / h_upd:>9.2f}x{b_it / h_it:>12.2f}x")
    for label, runs in held_out.items():
        if runs:
            after = [r["SFT+RL"] for r in runs]
            print(f"{label}: held-out exact calls after RL {statistics.mean(after):.2f} ± "
                  f"{statistics.stdev(after) if len(after) > 1 else 0:.2f} (from "
                  f"{statistics.mean(r['SFT'] for r in runs):.2f} after SFT; by seed {[round(a, 2) for a in after]})")
    (out / "iteration.json").write_text(json.dumps(
        {"baseline": args.baseline, "args": vars(args), "results": results, "held_out": held_out}, indent=1))


if __name__ == "__main__":
    main()

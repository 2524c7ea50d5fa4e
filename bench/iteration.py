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
iteration on. What it does not cover: the evaluations, SFT and set-up around the GRPO phase
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


def decoded_tokens(out: Path, iteration: int) -> int:
    """Completion tokens the policy decoded in that iteration's rollouts."""
    from forge_bridge.core.store import TrajectoryStore

    store = TrajectoryStore(out / "trajectories.db")
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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench-iteration")
    args = ap.parse_args()

    out = Path(args.out).resolve()  # the runs start in a folder of their own
    out.mkdir(parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="forge-bridge-worktree-")) / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), args.baseline],
                   check=True, capture_output=True)
    results: dict[str, list[dict]] = {"baseline": [], "head": []}
    try:
        farm = str(linked_package(tree))
        for pair in range(args.pairs):
            for label, path in (("baseline", farm), ("head", None)):
                run_dir = out / f"{label}-{pair}"
                print(f"{label} run {pair + 1}/{args.pairs} ...", flush=True)
                for m in run_side(label, path, run_dir, args.iterations, args.seed):
                    m["decoded_tokens"] = decoded_tokens(run_dir, m["iteration"])
                    results[label].append(m)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)

    print(f"\nthe demo's GRPO iteration (seed {args.seed}; {args.pairs} run pair(s) x {args.iterations} "
          f"iterations; medians), baseline {args.baseline} vs this checkout")
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
    (out / "iteration.json").write_text(json.dumps({"baseline": args.baseline, "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""Asynchronous against synchronous iterations (`max_staleness`), side by side in one run, on an
agent whose tools take 300 ms each, as an API's would.

The task is the learning tests' tool choice (tests/trainer/training_task.py: a tiny model taught
both `add` and `multiply` for "What is 2 plus 3?", a coin flip at T=1; RL should make it pick
`add`), with each tool sleeping `--tool-ms` before it answers. The same GRPO settings as the
learning test (group 8, 12 iterations) run synchronously (`max_staleness=0`) and with the next
iteration's rollouts running during the update (`max_staleness=1`), seed by seed, alternating.
Per run: wall seconds and iterations per hour, the success rate measured greedily-free after
training (`--after` sampled runs of the task at T=1, as the test measures it), the steps served
by an older version and the trajectories dropped as too stale.

    .venv/bin/python bench/staleness.py [--seeds 0 1 2] [--iterations 12] [--tool-ms 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))


def slow_agent(policy, seconds: float):
    """training_task's agent, its tools each waiting `seconds` first."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.tools import tool

    from forge_bridge.adapters.langchain import ForgeMiddleware

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        time.sleep(seconds)
        return a + b

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        time.sleep(seconds)
        return a * b

    return create_agent(FakeListChatModel(responses=["unused"]), [add, multiply],
                        middleware=[ForgeMiddleware(policy, temperature=1.0, max_tokens=48)])


def one_run(model: str, out: Path, seed: int, staleness: int, iterations: int, tool_s: float, after: int) -> dict:
    import torch

    import forge_bridge as fb
    import training_task

    torch.manual_seed(seed)
    policy = fb.LocalPolicy(model)
    rollout = training_task.make_rollout(slow_agent(policy, tool_s))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
        group_size=8, lr=1e-3, epochs=2, lora_rank=8, lora_alpha=16, out_dir=str(out), run_name="bench",
        progress=False, seed=seed, concurrency=8, max_staleness=staleness))
    t0 = time.perf_counter()
    history = trainer.train(rollout, training_task.TASKS, iterations=iterations)
    wall = time.perf_counter() - t0
    successes = sum(rollout(training_task.TASKS[0]) for _ in range(after))
    trainer.close()
    policy.close()
    return {"seed": seed, "max_staleness": staleness, "wall_s": wall, "iterations_per_hour": iterations * 3600 / wall,
            "success_after": successes / after,
            "rollout_s": sum(h["time_rollout_s"] for h in history), "update_s": sum(h["time_update_s"] for h in history),
            "stale_step_share": statistics.mean(h.get("stale_step_share", 0.0) for h in history),
            "stale_dropped": sum(h.get("stale_dropped", 0) for h in history)}


def main() -> None:
    parser = argparse.ArgumentParser(description="asynchronous vs synchronous iterations, 300 ms tools")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--tool-ms", type=float, default=300.0)
    parser.add_argument("--after", type=int, default=64, help="sampled runs of the task after training")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    import training_task

    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = training_task.choice_model(Path(tmp) / "model")
        for seed in args.seeds:
            for staleness in (0, 1):
                row = one_run(model, Path(tmp) / f"s{seed}-k{staleness}", seed, staleness, args.iterations,
                              args.tool_ms / 1000, args.after)
                runs.append(row)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print(f"\n{'max_staleness':<15}{'it/hour':>12}{'wall s':>10}{'rollout s':>11}{'update s':>10}"
          f"{'success after':>16}{'stale steps':>13}{'dropped':>9}")
    for staleness in (0, 1):
        mine = [r for r in runs if r["max_staleness"] == staleness]
        rate = [r["iterations_per_hour"] for r in mine]
        success = [r["success_after"] for r in mine]
        spread = lambda xs: f"{statistics.mean(xs):.2f} ± {statistics.pstdev(xs):.2f}"  # noqa: E731
        print(f"{staleness:<15}{statistics.mean(rate):>12.0f}{statistics.mean(r['wall_s'] for r in mine):>10.1f}"
              f"{statistics.mean(r['rollout_s'] for r in mine):>11.1f}{statistics.mean(r['update_s'] for r in mine):>10.1f}"
              f"{spread(success):>16}{statistics.mean(r['stale_step_share'] for r in mine):>13.2f}"
              f"{sum(r['stale_dropped'] for r in mine):>9}")
    sync, ahead = ([r["iterations_per_hour"] for r in runs if r["max_staleness"] == k] for k in (0, 1))
    print(f"iterations per hour, asynchronous / synchronous: {statistics.mean(ahead) / statistics.mean(sync):.2f}x "
          f"(seed by seed: {', '.join(f'{a / s:.2f}' for a, s in zip(ahead, sync))})")
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()

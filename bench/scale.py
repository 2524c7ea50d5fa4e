"""Rollouts per second with Ray workers vs the threaded loop, side by side in one run.

Two workloads, each run the same number of episodes through the trainer's own collection path
(`rollouts.collect`) into a fresh store:

- **overhead**: a rollout that records three fabricated steps and calls no model. What is left
  is what each runner costs per episode: the threaded loop's thread hand-off and store writes,
  vs Ray's job dispatch, the worker's in-memory store, the long polls that bring the writes
  back and their replay on the trainer's store. Ray's added cost per episode is the difference
  of the per-episode times with one worker vs one thread (goal: < 5 ms).
- **agent**: a LangChain `create_agent` agent on a tiny taught model (a tool call, then the
  answer: two model calls per episode). Threaded: the embedded policy in this process. Ray:
  the same embedded policy hosted in a Ray actor (`RayPolicy`), the agents in 1 or 2 workers.

On this 2-core machine the policy, the workers and the trainer share two cores, so more
workers cannot add throughput: the point here is what Ray costs, and that nothing breaks. On a
cluster the workers' agents and tools run on their own cores and the policy on its own GPU
servers (docs/scale.md). Not covered: several nodes, GPUs, vLLM servers in actors.

    .venv/bin/python bench/scale.py [--episodes 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

from forge_bridge.core.episode import Recorder, current_episode
from forge_bridge.core.types import Action, Observation, Transition
from forge_bridge.policies.base import ClientSpec, Policy
from forge_bridge.trainer import rollouts as loop


class NoModel(Policy):
    """The overhead workload's policy: never called, reachable from any process."""

    def generate(self, messages, tools, sampling, adapter):
        raise AssertionError("the overhead workload calls no model")

    def load_version(self, path, version):
        pass

    def unload_version(self, version):
        pass

    def client_spec(self) -> ClientSpec:
        return ClientSpec(NoModel)


def fabricated_steps(policy):
    def rollout(task) -> float:
        for k in range(3):
            current_episode().record(Transition(
                observation=Observation(messages=[{"role": "user", "content": f"step {k}"}]),
                action=Action(content="ok"), prompt_token_ids=list(range(64)),
                completion_token_ids=list(range(16)), completion_logprobs=[-0.1] * 16))
        return 1.0
    return rollout


def agent_rollout(policy):
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.tools import tool

    from forge_bridge.adapters.langchain import ForgeMiddleware

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = create_agent(FakeListChatModel(responses=["unused"]), [add],
                         middleware=[ForgeMiddleware(policy, temperature=1.0, max_tokens=48)])

    def rollout(task) -> float:
        result = agent.invoke({"messages": [{"role": "user", "content": task["question"]}]})
        return 1.0 if "5" in str(result["messages"][-1].content) else 0.0
    return rollout


def timed(runner, policy, episodes: int, out: Path, name: str, concurrency: int = 1) -> float:
    """Seconds for `episodes` episodes of one task, collected as the trainer collects them."""
    recorder = Recorder(out / f"{name}.db", run_id=name)
    tasks = [("t", {"id": "t", "question": "What is 2 plus 3?"})]
    t0 = time.perf_counter()
    groups, stats = loop.collect(runner, tasks, 0, recorder=recorder, run_id=name, group_size=episodes,
                                 concurrency=concurrency, progress=False, policy=policy)
    seconds = time.perf_counter() - t0
    assert stats["episodes"] == episodes and stats["episodes_lost"] == 0 and len(groups[0]) == episodes, stats
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from forge_bridge.app import testing
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.scale import RayPolicy, RayRollouts

    out = Path(tempfile.mkdtemp(prefix="forge-bench-scale-"))
    model = str(testing.taught_tiny_model(out / "model"))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}})
    n = args.episodes
    rows: list[tuple[str, str, float]] = []

    # --- overhead: no model, three recorded steps per episode
    no_model = NoModel()
    timed(fabricated_steps(no_model), no_model, 8, out, "warm-threads")
    rows.append(("overhead", "threaded, 1 thread", timed(fabricated_steps(no_model), no_model, n, out, "o-t1")))
    rows.append(("overhead", "threaded, 2 threads", timed(fabricated_steps(no_model), no_model, n, out, "o-t2", 2)))
    for workers in (1, 2):
        with RayRollouts(fabricated_steps, num_workers=workers) as rr:
            timed(rr, no_model, 8, out, f"warm-ray{workers}")  # workers started and warm
            rows.append(("overhead", f"Ray, {workers} worker(s)", timed(rr, no_model, n, out, f"o-r{workers}")))

    # --- agent: a LangChain agent on a tiny model, two model calls per episode
    local = LocalPolicy(model)
    timed(agent_rollout(local), local, 8, out, "warm-local", 2)
    rows.append(("agent", "threaded, 2 threads", timed(agent_rollout(local), local, n, out, "a-t2", 2)))
    local.close()
    hosted = RayPolicy.start(lambda: LocalPolicy(model))
    for workers in (1, 2):
        with RayRollouts(agent_rollout, num_workers=workers, episodes_per_worker=2 // workers) as rr:
            timed(rr, hosted, 8, out, f"warm-a{workers}")
            rows.append(("agent", f"Ray, {workers} worker(s) x {2 // workers} episodes",
                         timed(rr, hosted, n, out, f"a-r{workers}")))
    hosted.close()
    ray.shutdown()

    print(f"\n{n} episodes per row; per-episode time = wall time / episodes\n")
    print(f"{'workload':<10} {'runner':<34} {'episodes/s':>11} {'ms/episode':>11} {'vs threaded':>12}")
    base = {"overhead": rows[0][2], "agent": next(r[2] for r in rows if r[0] == "agent")}
    for workload, runner, seconds in rows:
        print(f"{workload:<10} {runner:<34} {n / seconds:>11.1f} {1000 * seconds / n:>11.2f} "
              f"{base[workload] / seconds:>11.2f}x")
    one_thread = rows[0][2] / n
    one_worker = next(r[2] for r in rows if r[1] == "Ray, 1 worker(s)") / n
    print(f"\nRay adds {1000 * (one_worker - one_thread):.2f} ms per episode (1 worker vs 1 thread, "
          "3 recorded steps, no model)")


if __name__ == "__main__":
    main()

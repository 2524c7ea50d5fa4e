"""What recording costs: the same agent and policy with and without forge-bridge's capture,
side by side in one run, runs interleaved so machine noise hits both alike.

- without: `create_agent(ForgeChatModel(policy), tools)` invoked outside any episode (the policy
  is called, nothing is recorded);
- with: `create_agent(model, tools, middleware=[ForgeMiddleware(policy)])` inside `fb.episode`
  (every step and tool result written to SQLite as it happens).

Two policies: the taught tiny model (a real model, so the ratio is what an episode pays) and a
scripted policy (no model time, so the difference is the capture cost per step by itself).

    .venv/bin/python bench/capture_overhead.py [--episodes 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool

import forge_bridge as fb
from forge_bridge import models, testing
from forge_bridge.adapters.langchain import ForgeChatModel, ForgeMiddleware
from forge_bridge.scripted_policy import ScriptedPolicy

QUESTION = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def expert(messages: list[dict], tools: list[dict] | None) -> str:
    return "The answer is 5." if messages[-1]["role"] == "tool" else testing.CALL


def measure(policy, recorder: fb.Recorder, episodes: int) -> tuple[float, float, int]:
    plain = create_agent(ForgeChatModel(policy, temperature=0, max_tokens=48), [add])
    wrapped = create_agent(FakeListChatModel(responses=["unused"]), [add],
                           middleware=[ForgeMiddleware(policy, temperature=0, max_tokens=48)])
    plain.invoke(QUESTION)  # warm-up both paths
    with fb.episode("warm", recorder=recorder):
        wrapped.invoke(QUESTION)
    without, with_, steps = [], [], 0
    for i in range(episodes):
        t0 = time.perf_counter()
        plain.invoke(QUESTION)
        without.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with fb.episode(f"e{i}", recorder=recorder) as ep:
            wrapped.invoke(QUESTION)
        with_.append(time.perf_counter() - t0)
        steps = len(ep.trajectory)
    return statistics.median(without), statistics.median(with_), steps


def main() -> None:
    parser = argparse.ArgumentParser(description="capture overhead, with vs without recording")
    parser.add_argument("--episodes", type=int, default=40)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-capture-"))
    model_dir = testing.taught_tiny_model(tmp / "tiny")
    model, tokenizer = models.load(str(model_dir))
    recorder = fb.Recorder(tmp / "t.db", run_id="bench")
    print(f"LangChain create_agent, 2-step tool episode, median of {args.episodes} interleaved runs")
    print(f"{'policy':<28}{'without':>12}{'with':>12}{'overhead':>12}{'per step':>12}")
    for name, policy in (("LocalPolicy (tiny model)", fb.LocalPolicy(model, tokenizer)),
                         ("ScriptedPolicy (no model)", ScriptedPolicy(expert, tokenizer))):
        without, with_, steps = measure(policy, recorder, args.episodes)
        per_step_ms = (with_ - without) / steps * 1000
        print(f"{name:<28}{without * 1000:>10.1f}ms{with_ * 1000:>10.1f}ms"
              f"{(with_ / without - 1) * 100:>11.1f}%{per_step_ms:>10.2f}ms")
        policy.close()
    print("targets: under 2 % of an episode's wall time, under 1 ms per step")


if __name__ == "__main__":
    main()

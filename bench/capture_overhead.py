"""What recording costs: the same agent and policy with and without forge-bridge's capture,
side by side in one run, runs interleaved so machine noise hits both alike.

LangChain:
- without: `create_agent(ForgeChatModel(policy), tools)` invoked outside any episode (the policy
  is called, nothing is recorded);
- with: `create_agent(model, tools, middleware=[ForgeMiddleware(policy)])` inside `fb.episode`
  (every step and tool result written to SQLite as it happens).
CrewAI: the same crew on `ForgeLLM(policy)`, kicked off outside and inside `fb.episode` (one
trajectory per role).

Two policies: the taught tiny model (a real model, so the ratio is what an episode pays) and a
scripted policy (no model time, so the difference is the capture cost per step by itself).

    .venv/bin/python bench/capture_overhead.py [--episodes 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HOME", tempfile.mkdtemp())  # CrewAI writes under HOME
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool

import forge_bridge as fb  # noqa: E402
from forge_bridge.adapters.crewai import ForgeLLM  # noqa: E402
from forge_bridge.adapters.langchain import ForgeChatModel, ForgeMiddleware  # noqa: E402
from forge_bridge.app import testing  # noqa: E402
from forge_bridge.policies import models  # noqa: E402
from forge_bridge.policies.scripted import ScriptedPolicy

import crew_demos  # noqa: E402  (the test crews and their scripted expert)

QUESTION = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def expert(messages: list[dict], tools: list[dict] | None) -> str:
    return "The answer is 5." if messages[-1]["role"] == "tool" else testing.CALL


def expert_any(messages: list[dict], tools: list[dict] | None) -> str:
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    return crew_demos.expert(messages, tools) if "calculator" in system else expert(messages, tools)


def interleaved(run_plain, run_recorded, episodes: int) -> tuple[float, float, int]:
    run_plain()  # warm-up both paths
    run_recorded("warm")
    without, with_, steps = [], [], 0
    for i in range(episodes):
        t0 = time.perf_counter()
        run_plain()
        without.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        steps = run_recorded(f"e{i}")
        with_.append(time.perf_counter() - t0)
    return statistics.median(without), statistics.median(with_), steps


def measure_crewai(policy, recorder: fb.Recorder, episodes: int) -> tuple[float, float, int]:
    crew = crew_demos.calculator_crew(ForgeLLM(policy, temperature=0, max_tokens=64))

    def recorded(task: str) -> int:
        with fb.episode(task, recorder=recorder) as ep:
            crew.kickoff()
        return sum(len(c.trajectory) for c in ep.children.values())

    return interleaved(crew.kickoff, recorded, episodes)


def measure(policy, recorder: fb.Recorder, episodes: int) -> tuple[float, float, int]:
    plain = create_agent(ForgeChatModel(policy, temperature=0, max_tokens=48), [add])
    wrapped = create_agent(FakeListChatModel(responses=["unused"]), [add],
                           middleware=[ForgeMiddleware(policy, temperature=0, max_tokens=48)])

    def recorded(task: str) -> int:
        with fb.episode(task, recorder=recorder) as ep:
            wrapped.invoke(QUESTION)
        return len(ep.trajectory)

    return interleaved(lambda: plain.invoke(QUESTION), recorded, episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description="capture overhead, with vs without recording")
    parser.add_argument("--episodes", type=int, default=40)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-capture-"))
    model, tokenizer = models.tiny()
    examples = list(testing.BASE_EXAMPLES) + crew_demos.crew_examples(tokenizer, tmp / "demos.db")
    testing.teach(model, tokenizer, examples, steps=200)
    recorder = fb.Recorder(tmp / "t.db", run_id="bench")
    print(f"2-step tool episodes (tool call, then answer), median of {args.episodes} interleaved runs")
    print(f"{'framework / policy':<40}{'without':>11}{'with':>11}{'overhead':>10}{'per step':>11}")
    for framework, measure_fn in (("LangChain", measure), ("CrewAI", measure_crewai)):
        for name, policy in (("LocalPolicy (tiny model)", fb.LocalPolicy(model, tokenizer)),
                             ("ScriptedPolicy (no model)", ScriptedPolicy(expert_any, tokenizer))):
            without, with_, steps = measure_fn(policy, recorder, args.episodes)
            per_step_ms = (with_ - without) / steps * 1000
            print(f"{framework + ', ' + name:<40}{without * 1000:>9.1f}ms{with_ * 1000:>9.1f}ms"
                  f"{(with_ / without - 1) * 100:>9.1f}%{per_step_ms:>9.2f}ms")
            policy.close()
    print("targets: under 2 % of an episode's wall time, under 1 ms per step")


if __name__ == "__main__":
    main()

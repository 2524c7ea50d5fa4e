"""Wrap an ordinary LangChain agent with forge-bridge and record its trajectories.

The agent below is what a LangChain user already has: `create_agent` with two tools. The only
forge-bridge line is `middleware=[ForgeMiddleware(policy)]`; the episode block names the task
and gives the outcome reward. Runs offline on the embedded SmolLM2-135M (on CPU), which out of
the box answers in prose rather than calling tools: training (forge-bridge demo) fixes that.

    .venv/bin/python examples/langchain_agent.py
"""

import os

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import forge_bridge as fb
from forge_bridge.adapters.langchain import ForgeMiddleware


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly."""
    return a * b


@tool
def lookup_population(city: str) -> str:
    """Population of a city, from a small local table."""
    table = {"paris": 2_102_650, "berlin": 3_596_999, "madrid": 3_332_035}
    return str(table.get(city.strip().lower(), "unknown city"))


def main() -> None:
    policy = fb.LocalPolicy("smollm2-135m-instruct")
    # The user's own model: ForgeMiddleware replaces it on every call, so it is never contacted.
    model = ChatOpenAI(model="gpt-4o-mini", api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    agent = create_agent(model, [multiply, lookup_population],
                         middleware=[ForgeMiddleware(policy, temperature=0.7, max_tokens=96)])
    recorder = fb.Recorder("runs/examples/langchain.db", run_id="langchain-example")
    questions = {"mul": ("What is 1234 times 5678?", str(1234 * 5678)),
                 "pop": ("How many people live in Berlin?", "3596999")}
    for task_id, (question, answer) in questions.items():
        with fb.episode(task_id, recorder=recorder) as ep:
            result = agent.invoke({"messages": [{"role": "user", "content": question}]})
            final = result["messages"][-1].content
            ep.reward(1.0 if answer in final.replace(",", "") else 0.0)
        traj = ep.trajectory
        print(f"\n[{task_id}] {question}\n  reward={traj.reward} status={traj.status} steps={len(traj)}")
        for i, step in enumerate(traj):
            calls = [f"{c.name}({c.arguments})" for c in step.action.tool_calls]
            print(f"  step {i}: {len(step.prompt_token_ids)} prompt + {len(step.completion_token_ids)} "
                  f"completion tokens, version={step.version}, calls={calls or '-'}, "
                  f"text={step.action.content[:60]!r}")
    print("\nstored in runs/examples/langchain.db; export with: forge-bridge export "
          "runs/examples/langchain.db out.jsonl")
    policy.close()


if __name__ == "__main__":
    main()

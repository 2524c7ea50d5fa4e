"""Train agents on MiniWoB++: Farama's web tasks (click a button, fill a form, pick from a list)
in headless Chromium, each scored by its own page.

`MiniWoBEnvironment()` serves the `miniwob` package's pages on 127.0.0.1 and gives the model
four tools -- click(ref), type(ref, text), press(key), select(ref, option) -- over the page as
text, where every element is `[ref] tag "text"`. MiniWoB's 10-second clock is stopped.

Two ways in, both recorded with exact token ids:
- framework-free: `HarnessAgent(policy, MiniWoBEnvironment)` runs obs -> action -> obs;
- LangChain: a `create_agent` agent with one tool per action, wrapped in `AgentEnvironment`
  (`--langchain`).

    pip install 'forge-bridge[miniwob]'
    .venv/bin/python examples/miniwob_agent.py                 # record 4 episodes, print them
    .venv/bin/python examples/miniwob_agent.py --langchain     # the same with the LangChain agent
"""

from __future__ import annotations

import argparse
from typing import Any

import forge_bridge as fb
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.miniwob import MiniWoBEnvironment, MiniWoBTask
from forge_bridge.envs.tool import ToolError

SYSTEM = ("You operate a web page to do the task it states. The page lists its elements as [ref] tag \"text\". "
          "Use the tools: click(ref), type(ref, text), press(key), select(ref, option). When the page says the "
          "task is over, answer briefly.")


def langchain_miniwob_agent(env: MiniWoBEnvironment):
    """(build, run, check) for `AgentEnvironment`: a LangChain agent whose tools act on the page."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.tools import tool

    from forge_bridge.adapters.langchain import ForgeMiddleware

    def observed(fn, *args: Any) -> str:
        try:
            return fn(*args)
        except ToolError as exc:  # the model sees the refusal, as in the framework-free loop
            return f"error: {exc}"

    @tool
    def click(ref: int) -> str:
        """Click the element [ref]; returns the page after it."""
        return observed(env.click, ref)

    @tool("type")
    def type_text(ref: int, text: str) -> str:
        """Replace the text of the field [ref] with `text`."""
        return observed(env.type, ref, text)

    @tool
    def press(key: str) -> str:
        """Press a key (Enter, Tab, Backspace, ArrowDown, Control+a) on the focused element."""
        return observed(env.press, key)

    @tool
    def select(ref: int, option: str) -> str:
        """Choose the option with this text in the select element [ref]."""
        return observed(env.select, ref, option)

    def build(policy: fb.Policy):
        return create_agent(FakeListChatModel(responses=["unused"]), [click, type_text, press, select],
                            system_prompt=SYSTEM, middleware=[ForgeMiddleware(policy)])

    def run(agent: Any, task: MiniWoBTask) -> str:
        first = env.reset(task)  # a fresh page and problem; the page is in the prompt
        result = agent.invoke({"messages": first}, {"recursion_limit": 12})
        return result["messages"][-1].content

    def check(task: MiniWoBTask, answer: str) -> float:
        return env.reward

    return build, run, check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--langchain", action="store_true", help="run the LangChain agent instead")
    args = parser.parse_args()

    from forge_bridge.envs.agent import AgentEnvironment

    tasks = [MiniWoBTask(name) for name in ("click-test", "click-button", "enter-text", "login-user")]
    policy = fb.LocalPolicy("smollm2-135m-instruct")
    recorder = fb.Recorder("runs/examples/miniwob.db", run_id="miniwob-example")
    env = MiniWoBEnvironment()
    if args.langchain:
        harness = HarnessAgent(policy, AgentEnvironment(*langchain_miniwob_agent(env), timeout_s=300),
                               max_model_calls=6, temperature=0.7, max_tokens=64)
    else:
        harness = HarnessAgent(policy, env, system=SYSTEM, max_model_calls=6, temperature=0.7, max_tokens=64)
    for task in tasks:
        traj = harness.run(task, recorder=recorder)
        print(f"\n[{task.id}] reward={traj.reward} status={traj.status} steps={len(traj)}")
        for i, step in enumerate(traj):
            calls = [f"{c.name}({c.arguments})" for c in step.action.tool_calls]
            print(f"  step {i}: calls={calls or '-'}, text={step.action.content[:60]!r}")
    env.close()
    policy.close()


if __name__ == "__main__":
    main()

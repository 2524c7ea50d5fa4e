"""Train agents in a real browser: headless Chromium on a local web shop.

`BrowserEnvironment(ShopSite())` serves the shop on 127.0.0.1, opens a fresh browser context per
episode and gives the model five tools (goto, click, type, read, back); navigation off the
site, downloads and popups are refused. Tasks (add to cart, remove from cart, buy, find a
price) are checked from the shop's state; the held-out split names products training never saw.

Two ways in, both recorded with exact token ids:
- framework-free: `HarnessAgent(policy, make_env)` runs obs -> action -> obs over the browser;
- LangChain: a `create_agent` agent whose tools drive the same browser, wrapped in
  `AgentEnvironment`, so each of the agent's model calls is one step and the same trainer
  trains it (`--langchain`).

    .venv/bin/python examples/browser_agent.py                # record 4 episodes, print them
    .venv/bin/python examples/browser_agent.py --train 2      # then 2 GRPO iterations (HarnessAgent)
    .venv/bin/python examples/browser_agent.py --langchain --train 2   # the same with the LangChain agent

Runs offline on the embedded SmolLM2-135M on a CPU with the system's Chromium. Out of the box the
small model rarely finishes a shop task; its episodes are still recorded in full, which is what
the trainer learns from.
"""

from __future__ import annotations

import argparse
from typing import Any

import forge_bridge as fb
from forge_bridge.app.tasks.shop import ShopSite, make_shop_splits
from forge_bridge.envs.browser import BrowserEnvironment
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.tool import ToolError, ToolTask

SYSTEM = ("You control a web browser on a shop. Use the tools: click(target) with an element id "
          "like 4 or a link's text, type(target, text), goto(url), read(), back(). When the task "
          "is done, answer briefly.")


def langchain_browser_agent(browser: BrowserEnvironment):
    """(build, run, check) for `AgentEnvironment`: a LangChain agent whose tools are the browser's."""
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
    def click(target: str) -> str:
        """Click a link or button (an element id like 4, or its text); returns the page after it."""
        return observed(browser.click, target)

    @tool("type")
    def type_text(target: str, text: str) -> str:
        """Type text into a field (an element id or its label)."""
        return observed(browser.type, target, text)

    @tool
    def goto(url: str) -> str:
        """Open a URL or a path of the shop; returns the page."""
        return observed(browser.goto, url)

    @tool
    def read() -> str:
        """Read the current page."""
        return observed(browser.read)

    def build(policy: fb.Policy):
        return create_agent(FakeListChatModel(responses=["unused"]), [click, type_text, goto, read],
                            system_prompt=SYSTEM, middleware=[ForgeMiddleware(policy)])

    def run(agent: Any, task: ToolTask) -> str:
        first = browser.reset(task)  # fresh context and shop state; the page is in the prompt
        result = agent.invoke({"messages": first}, {"recursion_limit": 12})
        return result["messages"][-1].content

    def check(task: ToolTask, answer: str) -> float:
        return float(task.check(answer, browser))

    return build, run, check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=0, metavar="N", help="GRPO iterations after recording")
    parser.add_argument("--langchain", action="store_true", help="run the LangChain agent instead")
    args = parser.parse_args()

    from forge_bridge.envs.agent import AgentEnvironment

    train_tasks, held_out = make_shop_splits(seed=0)
    policy = fb.LocalPolicy("smollm2-135m-instruct")
    recorder = fb.Recorder("runs/examples/browser.db", run_id="browser-example")
    if args.langchain:
        browser = BrowserEnvironment(ShopSite())
        env = AgentEnvironment(*langchain_browser_agent(browser), timeout_s=300)
        harness = HarnessAgent(policy, env, max_model_calls=5, temperature=0.7, max_tokens=64)
    else:
        harness = HarnessAgent(policy, lambda: BrowserEnvironment(ShopSite()), system=SYSTEM, max_model_calls=5,
                               temperature=0.7, max_tokens=64)
    for task in train_tasks[:4]:
        traj = harness.run(task, recorder=recorder)
        print(f"\n[{task.id}] reward={traj.reward} status={traj.status} steps={len(traj)}")
        for i, step in enumerate(traj):
            calls = [f"{c.name}({c.arguments})" for c in step.action.tool_calls]
            results = [r["content"][:70].replace("\n", " ") for r in step.info.get("tool_results", {}).values()]
            print(f"  step {i}: {len(step.completion_token_ids)} tokens, calls={calls or '-'}, "
                  f"results={results or '-'}, text={step.action.content[:60]!r}")
    if args.train:  # one AgentEnvironment holds one agent: its rollouts run one at a time
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, lr=1e-4, concurrency=1 if args.langchain else 2,
                                                       out_dir="runs/examples/browser", run_name="browser"))
        for metrics in trainer.train(harness, train_tasks[:2], iterations=args.train):
            print(f"iteration {metrics['iteration']}: reward {metrics['reward_mean']:.2f}, "
                  f"published {metrics['version']}")
        trainer.close()
    if args.langchain:
        env.close()
        browser.close()
    policy.close()


if __name__ == "__main__":
    main()

"""A synthetic multi-step tool task for the learning tests: the agent must pick `add` (not
`multiply`) for 'What is 2 plus 3?', see the result, and answer. The tiny model starts out
choosing either tool about half the time, so RL has something to improve."""

from __future__ import annotations

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from forge_bridge.adapters.langchain import ForgeMiddleware
from forge_bridge.app import testing
from forge_bridge.policies import models

QUESTION = "What is 2 plus 3?"
TASKS = [{"id": "add-2-3", "question": QUESTION}]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [convert_to_openai_tool(add), convert_to_openai_tool(multiply)]


def _after(name: str, result: int) -> list[dict]:
    return testing.ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": name, "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": str(result), "name": name}]


def choice_model(path) -> str:
    """A tiny model taught both tool choices for the same question (a coin flip at T=1)."""
    model, tokenizer = models.tiny(seed=1)
    call = '<tool_call>\n{{"name": "{}", "arguments": {{"a": 2, "b": 3}}}}\n</tool_call>'
    testing.teach(model, tokenizer, [
        (testing.ASK, TOOLS, call.format("add")), (testing.ASK, TOOLS, call.format("multiply")),
        (_after("add", 5), TOOLS, "The answer is 5."), (_after("multiply", 6), TOOLS, "The answer is 6.")],
        steps=150)
    return str(models.save(model, tokenizer, path))


def agent_for(policy):
    """An ordinary create_agent agent on the policy, sampling at temperature 1."""
    return create_agent(FakeListChatModel(responses=["unused"]), [add, multiply],
                        middleware=[ForgeMiddleware(policy, temperature=1.0, max_tokens=48)])


def make_rollout(agent):
    def rollout(task) -> float:
        result = agent.invoke({"messages": [{"role": "user", "content": task["question"]}]})
        return 1.0 if "5" in str(result["messages"][-1].content) else 0.0
    return rollout


def rollout_for(policy):
    """`forge-bridge train --rollout training_task:rollout_for`: policy -> rollout(task) -> reward."""
    return make_rollout(agent_for(policy))

"""Your agent: an ordinary LangChain `create_agent` agent with your tools, your tasks and your
checker. This file is what you replace with your own; `train.py` beside it does not change.

The agent converts US dollars into other currencies. Two kinds of task:
- `rate`:    "How many JPY is one US dollar?"  -> lookup_rate("JPY") -> "149"
- `convert`: "How many JPY is 25 US dollars?"  -> lookup_rate("JPY") -> multiply(25, 149) -> "3725"

Every task has a `kind` (the probe and the metrics report success per kind) and may carry a
`demo`: the steps an expert takes (tool calls, then the answer). forge-bridge replays a demo
through this same agent to record a demonstration in the agent's own prompts and tokens.
"""

from __future__ import annotations

import random

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError

import forge_bridge as fb
from forge_bridge.adapters.langchain import ForgeMiddleware

RATES = {"JPY": 149, "INR": 83, "RUB": 92, "KES": 129, "ISK": 137, "HUF": 356, "CZK": 23, "MXN": 17,
         "ZAR": 18, "THB": 35, "PHP": 56, "TWD": 31, "UAH": 41, "EGP": 48, "NGN": 1500, "PKR": 278,
         "DZD": 134, "ARS": 350, "CLP": 880, "COP": 3900, "KRW": 1320, "IDR": 15600, "VND": 24300,
         "LKR": 320}
"""Units of each currency per US dollar (rounded: the tool's table)."""
MAX_MODEL_CALLS = 4
"""A rollout that has not answered after this many model calls fails (the agent loops)."""


@tool
def lookup_rate(currency: str) -> str:
    """How many units of a currency one US dollar buys, by its three-letter code."""
    rate = RATES.get(currency.strip().upper())
    return str(rate) if rate is not None else f"unknown currency: {currency}"


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly."""
    return a * b


def build_agent(policy, temperature: float = 0.7, max_tokens: int = 64):
    """The agent as you already have it, plus the one forge-bridge line (`middleware=`)."""
    model = ChatOpenAI(model="gpt-4o-mini", api_key="unused")  # never called: the middleware answers
    return create_agent(model, [lookup_rate, multiply],
                        middleware=[ForgeMiddleware(policy, temperature=temperature, max_tokens=max_tokens)])


def is_correct(task: dict, messages: list) -> bool:
    """Your checker: the final answer holds the expected number, and a tool produced it (an
    answer the model made up, even a right one, does not count)."""
    expected = str(task["answer"])
    final = str(messages[-1].content).replace(",", "")
    from_tools = [str(m.content) for m in messages if getattr(m, "type", "") == "tool"]
    return expected in final and expected in from_tools


def make_rollout(policy):
    """policy -> rollout(task) -> reward: what forge-bridge's trainer, probe and warm start call
    (each inside an episode they open, so every model call is recorded)."""
    agent = build_agent(policy)

    def rollout(task: dict) -> float:
        try:
            result = agent.invoke({"messages": [{"role": "user", "content": task["question"]}]},
                                  {"recursion_limit": 2 * MAX_MODEL_CALLS})
        except GraphRecursionError:  # the agent kept calling tools: cut, and recorded as truncated
            fb.current_episode().truncate(f"more than {MAX_MODEL_CALLS} model calls")
            return 0.0
        return 1.0 if is_correct(task, result["messages"]) else 0.0

    return rollout


def task(kind: str, currency: str, amount: int = 1) -> dict:
    """One task of a kind, with its answer and the expert's demo plan."""
    rate = RATES[currency]
    lookup = {"tool": "lookup_rate", "args": {"currency": currency}}
    if kind == "rate":
        return {"id": f"rate-{currency}", "kind": "rate", "answer": rate,
                "question": f"How many {currency} is one US dollar?",
                "demo": [lookup, f"One US dollar is {rate} {currency}."]}
    return {"id": f"convert-{currency}-{amount}", "kind": "convert", "answer": amount * rate,
            "question": f"How many {currency} is {amount} US dollars?",
            "demo": [lookup, {"tool": "multiply", "args": {"a": amount, "b": rate}},
                     f"{amount} US dollars is {amount * rate} {currency}."]}


def splits(seed: int = 0) -> tuple[list[dict], list[dict], list[dict]]:
    """(demonstrations, training tasks, held-out tasks): the currencies are split three ways, so
    the held-out tasks ask about currencies neither the demonstrations nor RL saw."""
    rng = random.Random(seed)
    codes = sorted(RATES)
    rng.shuffle(codes)
    demo, train, held = codes[:6], codes[6:16], codes[16:]
    amount = lambda: rng.randint(2, 40)  # noqa: E731
    demos = [task("rate", c) for c in demo] + [task("convert", c, amount()) for c in demo]
    training = [task("rate", c) for c in train] + [task("convert", c, amount()) for c in train]
    held_out = [task("rate", c) for c in held] + [task("convert", c, amount()) for c in held]
    return demos, training, held_out


DEMOS, TASKS, HELD_OUT = splits(0)
"""What `forge-bridge sft/probe/train --tasks own_agent.agent:TASKS` reads."""

"""The whole production loop on one machine: serve, record, hear back, train, gate, swap.

A LangChain agent (ChatOpenAI, pointed at the gateway: its code knows nothing of forge-bridge)
serves a stream of requests from a user simulator. The gateway serves it from the student policy
and records every step. The simulated users' thumbs arrive `--delay` requests later and are wrong
`--noise` of the time. Every `--train-every` requests, a training job learns from the store
(`train_offline`: the requests since the last job, with the feedback that has arrived) and saves a
candidate; the gate (`Promotion`) tries it on a held-out check in a slot of its own and hot-swaps it
into the serving agent only if it is no worse; live feedback that falls rolls it back. Nothing is
restarted; every request is answered.

The task: "What is 2 plus 3?" with two tools, `add` and `multiply`; the default model is a tiny
one taught to pick either (a coin flip), built in seconds, so the loop runs in about a minute on
a CPU. `--model DIR` runs it on another model directory.

    .venv/bin/python examples/production_loop.py [--requests 60] [--train-every 20] [--noise 0.15]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

import httpx
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import forge_bridge as fb
from forge_bridge.app import testing
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.policies import models
from forge_bridge.serving.gateway import Gateway
from forge_bridge.serving.promotion import Gate, Promotion

QUESTION = "What is 2 plus 3?"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def coin_flip_model(path: Path, questions: tuple[str, ...] = (QUESTION,)) -> str:
    """A tiny model taught both tool choices for each question (right half the time at T=1)."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    tools = [convert_to_openai_tool(add), convert_to_openai_tool(multiply)]
    call = '<tool_call>\n{{"name": "{}", "arguments": {{"a": 2, "b": 3}}}}\n</tool_call>'

    def after(ask: list[dict], name: str, result: int) -> list[dict]:
        return ask + [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": name, "arguments": '{"a": 2, "b": 3}'}}]},
            {"role": "tool", "tool_call_id": "c", "content": str(result), "name": name}]

    examples = []
    for question in questions:
        ask = [{"role": "user", "content": question}]
        examples += [(ask, tools, call.format("add")), (ask, tools, call.format("multiply")),
                     (after(ask, "add", 5), tools, "The answer is 5."), (after(ask, "multiply", 6), tools, "The answer is 6.")]
    model, tokenizer = models.tiny(seed=1)
    testing.teach(model, tokenizer, examples, steps=150)
    return str(models.save(model, tokenizer, path))


def held_out(policy: fb.Policy, slot: str, n: int = 24) -> float:
    """The gate's check: the share of `n` sampled first calls that pick `add` (a fixed seed each)."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    tools = [convert_to_openai_tool(add), convert_to_openai_tool(multiply)]
    right = 0
    for k in range(n):
        out = policy.chat(testing.ASK, tools, slot=slot, temperature=1.0, max_tokens=48, seed=1000 + k)
        right += bool(out.action.tool_calls) and out.action.tool_calls[0].name == "add"
    return right / n


def serve(gateway: Gateway, episode_id: str, question: str = QUESTION, *, model: str = "forge",
          seed: int | None = None) -> tuple[bool, float, int]:
    """One user's request through the agent: (right answer, seconds, HTTP status of its calls).
    `model` names the gateway's policy slot that answers (another name: the serving version)."""
    chat = ChatOpenAI(base_url=gateway.episode_url(episode_id), api_key="unused", model=model,
                      temperature=1.0, max_tokens=48, max_retries=0, seed=seed)
    agent = create_agent(chat, [add, multiply])
    t0 = time.perf_counter()
    try:
        answer = agent.invoke({"messages": [{"role": "user", "content": question}]})["messages"][-1].content
        status = 200
    except Exception:  # noqa: BLE001 - counted as a dropped request
        answer, status = "", 500
    httpx.post(f"{gateway.address}/episodes/{episode_id}/finish", json={})
    return "5" in answer, time.perf_counter() - t0, status


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a model directory (default: the tiny coin-flip model, built here)")
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--train-every", type=int, default=20)
    p.add_argument("--delay", type=int, default=5, help="a user's feedback arrives this many requests later")
    p.add_argument("--noise", type=float, default=0.15, help="the share of feedback that is wrong")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="the run folder (default: a new temporary one)")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    out = Path(args.out or tempfile.mkdtemp(prefix="forge-production-"))
    model = args.model or coin_flip_model(out / "model")
    policy = fb.LocalPolicy(model)
    store = fb.TrajectoryStore(out / "production.db")
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(out_dir=str(out / "train"), run_name="prod", lr=3e-3,
                                                   lora_rank=8, lora_alpha=16, progress=False, seed=args.seed))
    promotion = Promotion(policy, lambda slot: held_out(policy, slot), Gate(margin=0.0, window=10, drop=0.3),
                          store=store)
    pending: deque = deque()  # (arrives at request k, episode, thumb, version that served it)
    results, latencies, statuses, started, covered = [], [], [], [], 0  # covered: requests a job has had feedback for
    with Gateway(policy, fb.Recorder(store, run_id="production")) as gateway:
        for k in range(args.requests):
            version = policy.current()
            started.append(time.time())
            right, seconds, status = serve(gateway, f"req-{k}")
            results.append((k, version, right))
            latencies.append(seconds)
            statuses.append(status)
            thumb = float(right) if rng.random() >= args.noise else float(not right)
            pending.append((k + args.delay, f"req-{k}", thumb, version))
            while pending and pending[0][0] <= k:
                _, episode, value, served = pending.popleft()
                fb.feedback(episode, value, store=store)
                promotion.observe(value, served)
            if (k + 1) % args.train_every == 0:
                since, covered = started[covered] if covered < len(started) else time.time(), k + 1 - args.delay
                try:  # the requests since the last job's, with the feedback that has arrived
                    job = trainer.train_offline(store, fb.OfflineConfig(since=since, imitate=False, publish=False))
                except InvalidArgument as exc:  # nothing to learn from yet
                    print(f"request {k + 1}: {exc}", flush=True)
                    continue
                promoted = promotion.consider(job["adapter_path"], job["version"])
                print(f"request {k + 1}: trained {job['version']} on {job['offline_own']} requests with feedback "
                      f"({job['offline_missing_reward']} still waiting); gate: {'promoted' if promoted else 'refused'}; "
                      f"serving {policy.current()}", flush=True)
    trainer.close()
    policy.close()
    events = store.events()
    store.close()
    blocks = [statistics.mean(r for _, _, r in results[i:i + args.train_every])
              for i in range(0, len(results), args.train_every)]
    summary = {"success_by_block": blocks, "dropped": sum(s != 200 for s in statuses),
               "p99_latency_s": sorted(latencies)[int(0.99 * (len(latencies) - 1))],
               "events": [(e["kind"], e["version"]) for e in events], "out": str(out)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

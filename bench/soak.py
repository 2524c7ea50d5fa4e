"""Soak: many concurrent LangChain agents through the Gateway for minutes, with faults injected
at random, and an account of every step.

Each agent is an unchanged `create_agent` on `ChatOpenAI(base_url=<gateway episode URL>)`
(`max_retries=0`, so every fault reaches it). Behind the Gateway, a scripted expert with real
SmolLM2 token ids (no model time, so the run stresses forge-bridge rather than a 135M model)
fails at random: outages (the Gateway answers 502), slow answers, malformed tool calls. The
tools fail too: `lookup` raises, `multiply` is slow now and then. Every policy output the
Gateway receives is counted; at the end the store must hold exactly that many steps.

    .venv/bin/python bench/soak.py [--minutes 10] [--agents 256] [--fault-rate 0.03]

First, side by side in one run (interleaved, no faults): the latency of a call made to the
policy directly and of the same call through the gateway (an httpx client on one keep-alive
connection), p50 and p99, and the gateway's overhead per call. Then the soak. Prints episodes
completed / failed (by reason) / truncated, transitions generated vs stored, episodes per
minute, and resident memory over time (peak, and whether it grew after warm-up). Not part of CI
(it runs for minutes); results go into docs/reliability.md. Not covered: a real model's time
(the scripted expert answers at once, so the overhead is the gateway's alone).
"""

from __future__ import annotations

import argparse
import collections
import random
import resource
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import forge_bridge as fb
from forge_bridge.app.tasks import CITIES, check_answer, expert_reply, make_splits
from forge_bridge.core.errors import PolicyUnavailable
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy


class FaultyExpert(ScriptedPolicy):
    """The scripted expert, failing at random; counts the outputs it hands to the Gateway."""

    def __init__(self, tokenizer, rate: float, seed: int) -> None:
        super().__init__(expert_reply, tokenizer)
        self.rate, self.rng, self.lock = rate, random.Random(seed), threading.Lock()
        self.generated = 0
        self.injected: collections.Counter = collections.Counter()
        self.malformed = ScriptedPolicy(
            lambda m, t: '<tool_call>\n{"name": "lookup", "arguments": {oops}\n</tool_call>', tokenizer)

    def generate(self, messages, tools, sampling, adapter):
        with self.lock:
            roll = self.rng.random()
            fault = ("policy outage" if roll < self.rate else "slow answer (1.5 s)" if roll < 2 * self.rate
                     else "malformed tool call" if roll < 3 * self.rate else None)
            if fault:
                self.injected[fault] += 1
        if fault == "policy outage":
            raise PolicyUnavailable("injected outage")
        if fault == "slow answer (1.5 s)":
            time.sleep(1.5)
        source = self.malformed if fault == "malformed tool call" else super()
        out = source.generate(messages, tools, sampling, adapter)
        with self.lock:
            self.generated += 1
        return out


def make_tools(rng: random.Random, rate: float, injected: collections.Counter):
    lock = threading.Lock()

    def fault(kind: str) -> bool:
        with lock:
            hit = rng.random() < rate
            injected[kind] += hit
        return hit

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        if fault("slow tool (1 s)"):
            time.sleep(1.0)
        return a * b

    @tool
    def lookup(city: str) -> str:
        """Population of a city."""
        if fault("tool raised"):
            raise RuntimeError("lookup service unavailable")
        return str(CITIES.get(city.strip(), f"unknown city: {city}"))

    return [multiply, lookup]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def overhead(tokenizer, n: int) -> None:
    """Per-call latency, direct vs through the gateway, interleaved so both see the same machine."""
    policy = ScriptedPolicy(expert_reply, tokenizer)
    messages = [{"role": "user", "content": "What is 12 times 34?"}]
    direct, via = [], []
    recorder = fb.Recorder(Path(tempfile.mkdtemp(prefix="forge-overhead-")) / "o.db", run_id="overhead")
    with fb.Gateway(policy, recorder) as gateway, httpx.Client(timeout=30) as client:
        url = gateway.episode_url("overhead") + "/chat/completions"
        body = {"model": "forge", "messages": messages, "temperature": 0, "max_tokens": 64}
        for i in range(n + 20):  # the first 20 of each warm up and are not counted
            t0 = time.perf_counter()
            policy.chat(messages, temperature=0, max_tokens=64)
            t1 = time.perf_counter()
            assert client.post(url, json=body).status_code == 200
            t2 = time.perf_counter()
            if i >= 20:
                direct.append((t1 - t0) * 1000)
                via.append((t2 - t1) * 1000)
    p = {name: (percentile(v, 0.5), percentile(v, 0.99)) for name, v in (("direct", direct), ("gateway", via))}
    print(f"per call, {n} calls each, interleaved: direct p50 {p['direct'][0]:.2f} ms p99 {p['direct'][1]:.2f} ms; "
          f"through the gateway p50 {p['gateway'][0]:.2f} ms p99 {p['gateway'][1]:.2f} ms; "
          f"overhead p50 {p['gateway'][0] - p['direct'][0]:.2f} ms, p99 {p['gateway'][1] - p['direct'][1]:.2f} ms "
          "(HTTP, JSON, recording the step in SQLite)")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--overhead-calls", type=int, default=500, help="calls per side in the overhead phase")
    parser.add_argument("--fault-rate", type=float, default=0.03, help="probability of each fault kind per call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="whose tokenizer makes the token "
                        "ids: a named model (forge-bridge fetch --list) or a model directory")
    args = parser.parse_args()

    _, tokenizer = models.load(args.model)  # the real tokenizer: real token ids
    overhead(tokenizer, args.overhead_calls)
    policy = FaultyExpert(tokenizer, args.fault_rate, args.seed)
    store_dir = Path(tempfile.mkdtemp(prefix="forge-soak-"))
    recorder = fb.Recorder(store_dir / "soak.db", run_id="soak")
    tool_faults: collections.Counter = collections.Counter()
    tools = make_tools(random.Random(args.seed + 1), args.fault_rate, tool_faults)
    tasks, _ = make_splits(24, 1, args.seed)
    outcomes: collections.Counter = collections.Counter()
    stop_at = time.monotonic() + args.minutes * 60
    samples: list[tuple[float, float]] = []
    t_start = time.monotonic()

    with fb.Gateway(policy, recorder) as gateway:
        def agent_loop(worker: int) -> None:
            rng = random.Random(args.seed * 1000 + worker)
            while time.monotonic() < stop_at:
                task, eid = rng.choice(tasks), uuid.uuid4().hex
                url = gateway.episode_url(eid)
                llm = ChatOpenAI(model="forge", base_url=url, api_key="unused", max_retries=0,
                                 timeout=30, temperature=0)
                agent = create_agent(llm, tools)
                try:
                    result = agent.invoke({"messages": [{"role": "user", "content": task.question}]},
                                          {"recursion_limit": 12})
                    reward = 1.0 if check_answer(task, str(result["messages"][-1].content)) else 0.0
                    done = httpx.post(url.removesuffix("/v1") + "/finish", json={"reward": reward}, timeout=30)
                    outcomes["finish answered " + str(done.status_code)] += 1
                except Exception as exc:  # the agent saw a fault: end its episode with the reason
                    outcomes[f"agent raised {type(exc).__name__}"] += 1
                    httpx.post(url.removesuffix("/v1") + "/finish", timeout=30,
                               json={"error": f"the agent raised {type(exc).__name__}: {exc}"[:500]})

        def sample_memory() -> None:
            while time.monotonic() < stop_at:
                samples.append((time.monotonic() - t_start, rss_mib()))
                time.sleep(5)

        threads = [threading.Thread(target=agent_loop, args=(w,)) for w in range(args.agents)]
        threads.append(threading.Thread(target=sample_memory, daemon=True))
        for t in threads:
            t.start()
        for t in threads[:-1]:
            t.join()
    elapsed = time.monotonic() - t_start

    store = recorder.store
    trajs = store.trajectories(run_id="soak")
    statuses = collections.Counter(t.status for t in trajs)
    reasons = collections.Counter(f"{t.end_reason} ({str(t.end_detail or '?').split(':')[0]})" for t in trajs
                                  if t.status == "failed")
    stored_steps = sum(len(t) for t in trajs)
    print(f"\nsoak: {args.agents} agents x {elapsed / 60:.1f} min through the Gateway, fault rate "
          f"{args.fault_rate} per kind per call")
    print(f"episodes: {len(trajs)} ({len(trajs) / (elapsed / 60):.0f}/min): " +
          ", ".join(f"{k} {v}" for k, v in statuses.most_common()))
    print("failed by reason: " + (", ".join(f"{k} {v}" for k, v in reasons.most_common()) or "none"))
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in (policy.injected + tool_faults).most_common()))
    print("agents saw: " + ", ".join(f"{k} {v}" for k, v in outcomes.most_common()))
    print(f"transitions generated {policy.generated}, stored {stored_steps}: "
          f"{'EQUAL' if stored_steps == policy.generated else 'MISMATCH'}")
    steps_without_tokens = sum(not s.has_tokens for t in trajs for s in t)
    print(f"stored steps without token ids: {steps_without_tokens}")
    warm = [m for t, m in samples if t >= min(120, elapsed / 3)]
    if warm:
        print(f"resident memory: start {samples[0][1]:.0f} MiB, after warm-up {warm[0]:.0f} MiB, end "
              f"{warm[-1]:.0f} MiB, peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB "
              f"(growth after warm-up {warm[-1] - warm[0]:+.0f} MiB)")
    print(f"store: {store.path}")


if __name__ == "__main__":
    main()

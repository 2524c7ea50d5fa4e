"""How much of a long episode's history the update encodes again: per step against merged
(`GRPOConfig.merge_steps`), side by side in one run.

1. Where merging applies. Episodes of 10 model calls (9 tool calls, then the answer), written by
   a `ScriptedPolicy` in each real model's own tool-call format, through each front end: a
   LangChain agent (`create_agent` + `ForgeMiddleware`), a CrewAI agent (`ForgeLLM`), and the
   gateway under the openai SDK's chat-completions loop. For each front end and model: the share
   of later calls whose prompt continues the call before's prompt and completion token for token
   (`merge_share`, as each iteration logs it). Scripted replies are written as the chat template
   writes them back, the best case: a model that writes its calls its own way (Qwen's fenced
   JSON) is re-serialised differently, and those steps start sequences of their own.
2. What merging saves. The LangChain episodes of each model, one GRPO update on the same samples
   and advantages, per step and merged, interleaved `--repeats` times: model calls, sequences,
   tokens through the model (unpadded and padded to each microbatch), optimizer steps, seconds.

    .venv/bin/python bench/merge.py [--models smollm2-135m-instruct qwen2.5-coder-0.5b-instruct]
                                    [--episodes 4] [--repeats 3]
    .venv/bin/python bench/merge.py --sampled --models qwen2.5-coder-0.5b-instruct   # the model's own replies

With `--sampled` the model itself answers (`LocalPolicy`, temperature 1), in whatever format it
writes its calls, so (1) gives the share on its own episodes, however long they run; no update
is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HOME", tempfile.mkdtemp())  # CrewAI writes under HOME
for name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED", "CREWAI_DISABLE_VERSION_CHECK"):
    os.environ.setdefault(name, "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

CALLS = 10
"""Model calls per episode: 9 lookups, then the answer."""


def value(key: str) -> str:
    """The lookup tool's result: a few tokens, as a real tool's would be."""
    return f"{key}: {sum(map(ord, key)) * 7919 % 100000} units, last updated 2026-11-{len(key) + 10}"


def script(messages: list[dict], tools: list[dict] | None):
    """The k-th call of an episode (k assistant turns so far) looks up item k; the last answers."""
    k = sum(m["role"] == "assistant" for m in messages)
    return {"tool": "lookup", "args": {"key": f"item-{k}"}} if k < CALLS - 1 else "All nine items are looked up."


def langchain_episodes(policy, recorder, n: int) -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.tools import tool

    import forge_bridge as fb
    from forge_bridge.adapters.langchain import ForgeMiddleware

    @tool
    def lookup(key: str) -> str:
        """Look up an item by its key."""
        return value(key)

    agent = create_agent(FakeListChatModel(responses=["unused"]), [lookup],
                         middleware=[ForgeMiddleware(policy, max_tokens=64)])
    for i in range(n):
        with fb.episode(f"lc-{i}", recorder=recorder) as ep:
            agent.invoke({"messages": [{"role": "user", "content": "Look up item-0 to item-8, one at a time."}]},
                         {"recursion_limit": 4 * CALLS})
            ep.reward(1.0)


def crewai_episodes(policy, recorder, n: int) -> None:
    from crewai import Agent, Crew, Process, Task
    from crewai.tools import tool

    import forge_bridge as fb
    from forge_bridge.adapters.crewai import ForgeLLM

    @tool("lookup")
    def lookup(key: str) -> str:
        """Look up an item by its key."""
        return value(key)

    agent = Agent(role="clerk", goal="look items up", backstory="You look things up.", llm=ForgeLLM(policy, max_tokens=64),
                  tools=[lookup], max_iter=CALLS + 2, verbose=False)
    task = Task(description="Look up item-0 to item-8, one at a time.", expected_output="a confirmation", agent=agent)
    crew = Crew(agents=[agent], tasks=[task], process=Process.sequential, verbose=False)
    for i in range(n):
        with fb.episode(f"crew-{i}", recorder=recorder) as ep:
            crew.kickoff()
            ep.reward(1.0)


def gateway_episodes(policy, recorder, n: int) -> None:
    from openai import OpenAI

    from forge_bridge.serving.gateway import Gateway

    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look up an item by its key.",
                                               "parameters": {"type": "object", "required": ["key"],
                                                              "properties": {"key": {"type": "string"}}}}}]
    with Gateway(policy, recorder, token="bench") as gateway:
        for i in range(n):
            episode_id = f"gw-{i}"
            client = OpenAI(base_url=gateway.episode_url(episode_id), api_key="bench", max_retries=0)
            messages: list[dict] = [{"role": "user", "content": "Look up item-0 to item-8, one at a time."}]
            for _ in range(CALLS):
                message = client.chat.completions.create(model="forge", messages=messages, tools=tools,  # type: ignore[arg-type]
                                                         max_tokens=64).choices[0].message
                if not message.tool_calls:
                    break
                messages.append({"role": "assistant", "content": message.content or "", "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                  "arguments": c.function.arguments}}
                    for c in message.tool_calls]})
                for c in message.tool_calls:
                    messages.append({"role": "tool", "tool_call_id": c.id,
                                     "content": value(json.loads(c.function.arguments)["key"])})
            gateway.finish(episode_id, 1.0, None)


FRONT_ENDS = {"langchain": langchain_episodes, "crewai": crewai_episodes, "gateway": gateway_episodes}


def shares(trajectories) -> tuple[float, int, int]:
    """(share of later calls that continue the call before, calls, trajectories)."""
    import torch

    from forge_bridge.trainer.batch import build_samples

    _, stats = build_samples(trajectories, [torch.ones(len(t)) for t in trajectories], 1 << 20, merge=True)
    continuing = sum(c for c, _ in stats.continuing.values())
    later = sum(n for _, n in stats.continuing.values())
    return continuing / max(later, 1), sum(len(t) for t in trajectories), len(trajectories)


def update_cost(model_name: str, trajectories, repeats: int, microbatch: int) -> dict[str, dict]:
    """One GRPO update on these trajectories' samples, per step and merged, interleaved."""
    import torch

    import forge_bridge as fb
    from forge_bridge.policies import models
    from forge_bridge.trainer.batch import build_samples
    from forge_bridge.trainer.learner import microbatches

    g = torch.Generator().manual_seed(0)
    advantages = [torch.randn(len(t), generator=g) for t in trajectories]
    built = {merge: build_samples(trajectories, advantages, 8192, merge=merge)[0] for merge in (False, True)}
    policy = fb.LocalPolicy(str(models.model_path(model_name)))
    out: dict[str, dict] = {}
    seconds: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {merge: fb.GRPOTrainer(policy, fb.GRPOConfig(
            merge_steps=merge, minibatch_size=CALLS * len(trajectories), microbatch_size=microbatch, epochs=1,
            kl_beta=0.0, out_dir=f"{tmp}/{merge}", progress=False, seed=0)) for merge in (False, True)}
        for merge in (False, True):  # a first update of each pays the one-time costs (allocation, kernels)
            trainers[merge].update(built[merge])
        for _ in range(repeats):
            for merge in (False, True):
                t0 = time.perf_counter()
                stats = trainers[merge].update(built[merge])
                seconds[merge].append(time.perf_counter() - t0)
                out.setdefault("merged" if merge else "per step", {})["optimizer_steps"] = stats["optimizer_steps"]
    policy.close()
    for merge in (False, True):
        samples = built[merge]
        padded = sum(len(chunk) * max(len(s.input_ids) for s in chunk)
                     for chunk, _ in microbatches(samples, microbatch, "token"))
        out["merged" if merge else "per step"] |= {
            "calls": sum(s.calls for s in samples), "sequences": len(samples),
            "tokens": sum(len(s.input_ids) for s in samples), "padded_tokens": padded,
            "seconds": statistics.median(seconds[merge]), "all_seconds": seconds[merge]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="merged vs per-step update on 10-call episodes")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per front end and model")
    parser.add_argument("--update-episodes", type=int, nargs="+", default=[4, 1],
                        help="LangChain episodes in the timed update, per model (the last repeats)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--sampled", action="store_true", help="the model answers, sampled: the share only")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import forge_bridge as fb
    from forge_bridge.policies import models
    from forge_bridge.policies.scripted import ScriptedPolicy

    results: dict = {}
    for m, model_name in enumerate(args.models):
        policy: fb.Policy = fb.LocalPolicy(model_name) if args.sampled else ScriptedPolicy(
            script, models.load_tokenizer(model_name))
        results[model_name] = {"front_ends": {}}
        with tempfile.TemporaryDirectory() as tmp:
            recorder = fb.Recorder(Path(tmp) / "t.db", run_id="merge")
            for front_end, run in FRONT_ENDS.items():
                before = {t.id for t in recorder.store.trajectories()}
                with fb.sampling(temperature=1.0 if args.sampled else 0.0):
                    run(policy, recorder, args.episodes)
                trajs = [t for t in recorder.store.trajectories() if t.id not in before and len(t)]
                share, calls, n = shares(trajs)
                results[model_name]["front_ends"][front_end] = {"merge_share": share, "calls": calls, "trajectories": n}
                print(f"{model_name:<30}{front_end:<10} merge_share {share:.2f} ({calls} calls, {n} trajectories)",
                      flush=True)
                if front_end == "langchain":
                    langchain = trajs
            policy.close()
            if args.sampled:
                continue
            k = args.update_episodes[min(m, len(args.update_episodes) - 1)]
            cost = update_cost(model_name, langchain[:k], args.repeats, args.microbatch)
            results[model_name]["update"] = cost
            a, b = cost["per step"], cost["merged"]
            for name, row in cost.items():
                print(f"{model_name:<30}{name:<10} {row['calls']} calls in {row['sequences']} sequences, "
                      f"{row['tokens']} tokens ({row['padded_tokens']} padded), {row['optimizer_steps']} optimizer "
                      f"steps, {row['seconds']:.1f} s", flush=True)
            print(f"{model_name:<30}merged/per step: tokens {b['tokens'] / a['tokens']:.2f}, padded "
                  f"{b['padded_tokens'] / a['padded_tokens']:.2f}, seconds {b['seconds'] / a['seconds']:.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""How real models write their tool calls, and how many of them forge-bridge reads as calls.

Every real model available here runs greedy through an ordinary LangChain `create_agent` agent
with `ForgeMiddleware`, on requests of a public benchmark nobody here wrote (BFCL v4:
`forge_bridge.app.tasks.bfcl`): `--simple` requests whose one function fits, and `--irrelevance`
requests whose one function does not (the right reply calls nothing). The tool is LangChain's
`return_direct`, so each episode is one model call.

For each reply, two readings:
- forge-bridge's: the calls its parser made of the reply (`Action.tool_calls`, `call_format`);
- an independent, looser one (`held_calls`): any JSON object anywhere in the reply naming the
  offered function, or a Python call of it anywhere (in prose too). It is what the reply "holds".

Per model the table gives: the share of each format the replies were read in; of the replies that
hold a call, the share that became a call; false calls (a call made of a reply that holds none);
and exact-call accuracy (BFCL's check) through forge-bridge and of what the replies hold.
`--fixtures DIR` writes every reply (raw text, tools, the held calls) for the parser's tests.

    .venv/bin/python bench/real_models.py --models smollm2-135m-instruct qwen2.5-coder-0.5b-instruct \\
        --simple 100 --irrelevance 30 --out runs/bench-real-models --fixtures tests/fixtures/replies
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MAX_TOKENS = 256


def build_agent(policy, tool: dict):
    """An ordinary LangChain agent whose one tool is `tool` (it answers 'done' and ends the run)."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    from forge_bridge.adapters.langchain import ForgeMiddleware

    fn = tool["function"]
    lc_tool = StructuredTool.from_function(func=lambda **kwargs: "done", name=fn["name"],
                                           description=fn["description"] or fn["name"],
                                           args_schema=fn["parameters"], return_direct=True)
    model = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1")
    return create_agent(model, [lc_tool], middleware=[ForgeMiddleware(
        policy, temperature=0.0, max_tokens=MAX_TOKENS, max_model_calls=2)])


def held_calls(text: str, names: list[str]) -> tuple[list[tuple[str, object]], str]:
    """The calls a reply holds, read loosely, and where: every JSON object in it naming one of
    `names` (keys `name` + `arguments`/`parameters`; not a tool's schema, which has a
    `description`): 'json'; else every Python call of one of them in a `tool_code` fence or as the
    whole reply: 'python'; else one anywhere else (prose, a Python code sample, a `def`):
    'prose', which the parser must leave as text."""
    found, decoder = [], json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and value.get("name") in names and "description" not in value:  # not a schema
            args = value.get("arguments", value.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            found.append((value["name"], args))
    if found:
        return found, "json"
    for name in names:
        for match in re.finditer(rf"\b{re.escape(name)}\s*\(", text):
            call = _python_call_at(text, match.start(), name)
            if call is not None:
                found.append(call)
    code = re.fullmatch(r"\s*(?:```tool_code\s*\n)?(?:print\()?[\w.]+\(.*\)\)?\s*(?:```)?\s*", text, re.DOTALL)
    return found, ("python" if code else "prose") if found else ""


def _python_call_at(text: str, start: int, name: str) -> tuple[str, object] | None:
    for end in (m.end() for m in re.finditer(r"\)", text[start:])):
        try:
            node = ast.parse(text[start:start + end].strip(), mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call):
            try:
                return name, {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
            except ValueError:
                return name, None
    return None


def run_model(name: str, tasks: list, concurrency: int) -> tuple[list[dict], float]:
    """Every task once through the agent: one record per reply, and the wall seconds."""
    import forge_bridge as fb

    policy = fb.LocalPolicy(name)
    records = []

    def one(task) -> dict:
        with fb.sampling(temperature=0), fb.episode(task.id) as ep:
            try:
                build_agent(policy, task.tool).invoke({"messages": [{"role": "user", "content": task.request}]},
                                                      {"recursion_limit": 4})
            except Exception as exc:  # the agent's own error: recorded with the reply
                if isinstance(exc, fb.PolicyError):
                    raise
                ep.mark_end("crashed", f"{type(exc).__name__}: {exc}")
        step = ep.trajectory.transitions[0]
        raw = policy.tokenizer.decode(step.completion_token_ids, skip_special_tokens=True)
        return {"id": task.id, "request": task.request, "tools": [task.tool], "reply": raw,
                "finish_reason": step.action.finish_reason, "call_format": step.action.call_format,
                "calls": [(c.name, json.loads(c.arguments)) for c in step.action.tool_calls],
                "parse_errors": len(step.action.parse_errors),
                **dict(zip(("held", "held_in"), held_calls(raw, [task.tool["function"]["name"]])))}

    start = time.time()
    with ThreadPoolExecutor(concurrency) as pool:
        records = list(pool.map(one, tasks))
    seconds = time.time() - start
    policy.close()
    return records, seconds


def summarise(records: list[dict], tasks: dict) -> dict:
    from forge_bridge.app.tasks.bfcl import check_call

    formats: dict[str, int] = {}
    for r in records:
        key = r["call_format"] or ("malformed" if r["parse_errors"] else "text")
        formats[key] = formats.get(key, 0) + 1
    holding = [r for r in records if r["held"] and r["held_in"] != "prose"]
    simple = [r for r in records if tasks[r["id"]].answer is not None]
    return {
        "replies": len(records), "formats": {k: v / len(records) for k, v in sorted(formats.items())},
        "holding": len(holding), "read": sum(bool(r["calls"]) for r in holding) / max(len(holding), 1),
        "false_calls": sum(bool(r["calls"]) for r in records if r not in holding),
        "in_prose": sum(r["held_in"] == "prose" for r in records),
        "exact_forge": sum(check_call(tasks[r["id"]], [tuple(c) for c in r["calls"]]) for r in simple)
        / max(len(simple), 1),
        "exact_held": sum(check_call(tasks[r["id"]], [tuple(c) for c in r["held"]] if r in holding else [])
                          for r in simple)
        / max(len(simple), 1),
        "irrelevance_no_call": sum(not r["calls"] for r in records if tasks[r["id"]].answer is None)
        / max(len(records) - len(simple), 1),
        "missed": [r["reply"][:200] for r in holding if not r["calls"]][:5]}


def table(results: dict) -> str:
    lines = ["| model | replies | formats read | holding a call → a call | false calls | a call in prose (text) "
             "| exact (forge-bridge) | exact (held) | irrelevance: no call | wall |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in results.items():
        formats = ", ".join(f"{k} {v:.0%}" for k, v in s["formats"].items())
        lines.append(f"| {name} | {s['replies']} | {formats} | {s['read']:.0%} of {s['holding']} | {s['false_calls']} "
                     f"| {s['in_prose']} "
                     f"| {s['exact_forge']:.0%} | {s['exact_held']:.0%} | {s['irrelevance_no_call']:.0%} "
                     f"| {s['seconds'] / 60:.1f} min |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from forge_bridge.app.tasks import bfcl

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2-135m-instruct"], help="named models or model directories")
    p.add_argument("--simple", type=int, default=100, help="BFCL simple requests (drawn with seed 0)")
    p.add_argument("--irrelevance", type=int, default=30, help="BFCL irrelevance requests (seed 0)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", default="runs/bench-real-models")
    p.add_argument("--fixtures", help="write each model's replies here (<model>.jsonl)")
    p.add_argument("--again", action="store_true", help="read the replies back from --out, run no model")
    args = p.parse_args(argv)
    tasks = bfcl.load("simple", args.simple) + bfcl.load("irrelevance", args.irrelevance)
    by_id = {t.id: t for t in tasks}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.models:
        label = Path(name).name
        if args.again:
            records = [json.loads(line) for line in (out / f"{label}.jsonl").read_text().splitlines()]
            for r in records:
                r["held"], r["held_in"] = held_calls(r["reply"], [by_id[r["id"]].tool["function"]["name"]])
            seconds = json.loads((out / "results.json").read_text())[label]["seconds"]
        else:
            print(f"{name}: {len(tasks)} requests ...", flush=True)
            records, seconds = run_model(name, tasks, args.concurrency)
        (out / f"{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        if args.fixtures:
            Path(args.fixtures).mkdir(parents=True, exist_ok=True)
            keep = ("id", "tools", "reply", "finish_reason", "held", "held_in")
            (Path(args.fixtures) / f"{label}.jsonl").write_text(
                "".join(json.dumps({k: r[k] for k in keep}) + "\n" for r in records))
        results[label] = {**summarise(records, by_id), "seconds": seconds}
        print(json.dumps(results[label], indent=1), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

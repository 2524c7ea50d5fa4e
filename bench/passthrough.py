"""What record-only mode adds to each call, in each API the gateway speaks (chat completions,
OpenAI's Responses, Anthropic's Messages): an agent calling its upstream model directly, against the
same calls through the gateway with `--upstream` (the request translated to the chat form, the
reply rendered in the student's tokens and the step written to SQLite, the reply translated back),
side by side, interleaved call by call.

The upstream is a stub answering at once with a fixed tool call or a fixed answer (no model time)
in each API (`/v1/chat/completions`, `/v1/responses`, `/v1/messages`); the gateway asks it in chat
completions, whichever API the agent spoke. So the difference is the pass-through's own cost: the
extra HTTP hop on localhost, the translation, the chat template and tokenizer of the student (the
embedded SmolLM2-135M's), and the store write. Each episode is the agent's two calls (a tool call,
then the answer). The agent (this process), the gateway (`forge-bridge gateway --upstream`, with a
token) and the stub each run in a process of their own, as they do in production: in one process
their threads would share one GIL.

    .venv/bin/python bench/passthrough.py [--episodes 200] [--apis chat,responses,messages]

What it does not cover: a remote upstream (its network time is the same on both paths), streaming.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from forge_bridge.core.store import TrajectoryStore

ASK = [{"role": "user", "content": "What is 2 plus 3?"}]
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "type": "object"}}}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]}
AFTER = ASK + [CALL, {"role": "tool", "tool_call_id": "c1", "content": "5"}]
ANSWER = "The answer is 5."
FUNCTION = {"type": "function", **ADD["function"]}
FUNCTION_CALL = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}
TOOL = {"name": "add", "description": "Add two integers.", "input_schema": ADD["function"]["parameters"]}
TOOL_USE = {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 2, "b": 3}}
CALLS = {  # the agent's two calls in each API: the question, then the tool's result
    "chat": ("/chat/completions", [{"model": "m", "messages": m, "tools": [ADD], "temperature": 0, "max_tokens": 64}
                                   for m in (ASK, AFTER)]),
    "responses": ("/responses", [{"model": "m", "input": i, "tools": [FUNCTION], "temperature": 0, "store": False,
                                  "max_output_tokens": 64} for i in (ASK, [*ASK, FUNCTION_CALL, {
                                      "type": "function_call_output", "call_id": "c1", "output": "5"}])]),
    "messages": ("/messages", [{"model": "m", "messages": m, "tools": [TOOL], "temperature": 0, "max_tokens": 64}
                               for m in (ASK, [*ASK, {"role": "assistant", "content": [TOOL_USE]}, {
                                   "role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                                                "content": "5"}]}])]),
}


def stub_app():
    """The upstream in each API, answering instantly: a call to `add`, then the answer."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request: Request):
        body = await request.json()
        answered = any(m.get("role") == "tool" for m in body["messages"])
        message = {"role": "assistant", "content": ANSWER} if answered else CALL
        return JSONResponse({"id": "x", "object": "chat.completion", "model": "stub", "choices": [{
            "index": 0, "message": message, "finish_reason": "stop" if answered else "tool_calls"}]})

    async def responses(request: Request):
        body = await request.json()
        answered = any(i.get("type") == "function_call_output" for i in body["input"])
        item = {"type": "message", "id": "m1", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": ANSWER, "annotations": []}]} if answered else {**FUNCTION_CALL, "id": "f1"}
        return JSONResponse({"id": "r", "object": "response", "created_at": 0, "status": "completed", "model": "stub",
                             "output": [item], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []})

    async def messages(request: Request):
        body = await request.json()
        answered = isinstance(body["messages"][-1]["content"], list)
        return JSONResponse({"id": "m", "type": "message", "role": "assistant", "model": "stub",
                             "content": [{"type": "text", "text": ANSWER} if answered else TOOL_USE],
                             "stop_reason": "end_turn" if answered else "tool_use", "stop_sequence": None,
                             "usage": {"input_tokens": 0, "output_tokens": 0}})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/responses", responses, methods=["POST"]),
                             Route("/v1/messages", messages, methods=["POST"])])


def episode(client: httpx.Client, base: str, api: str) -> list[float]:
    """The two calls of one episode in `api`; their latencies in ms."""
    path, bodies = CALLS[api]
    out = []
    for body in bodies:
        t0 = time.perf_counter()
        resp = client.post(base + path, json=body)
        out.append((time.perf_counter() - t0) * 1000)
        assert resp.status_code == 200, resp.text
    return out


def serve_stub(port: int) -> None:
    """The stub upstream in this process (`--serve-stub PORT`: the bench starts it in its own)."""
    import uvicorn

    uvicorn.run(stub_app(), host="127.0.0.1", port=port, log_level="warning")


def ready(url: str, proc: subprocess.Popen, headers: dict | None = None) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited with {proc.returncode}")
        try:
            if httpx.get(url, headers=headers, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url}: not ready after 60 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--apis", default="chat,responses,messages", help="the APIs to time, comma-separated")
    ap.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the student whose tokens the gateway "
                    "records in: a named model (forge-bridge fetch --list) or a model directory")
    args = ap.parse_args()
    if args.serve_stub:
        return serve_stub(args.serve_stub)
    apis = args.apis.split(",")
    if set(apis) - set(CALLS):
        raise SystemExit(f"--apis: expected some of {', '.join(CALLS)}, got {args.apis}")

    from forge_bridge.policies.vllm_server import free_port

    stub_port, gateway_port, token = free_port(), free_port(), "bench-token"
    upstream = f"http://127.0.0.1:{stub_port}/v1"
    gateway = f"http://127.0.0.1:{gateway_port}"
    with tempfile.TemporaryDirectory() as tmp:
        stub = subprocess.Popen([sys.executable, __file__, "--serve-stub", str(stub_port)])
        spy = os.environ.get("BENCH_PROFILE_GATEWAY")  # e.g. "py-spy record -o gateway.svg --": a profiler's command
        served = subprocess.Popen([*(spy.split() if spy else []), sys.executable, "-m", "forge_bridge.app.cli", "gateway", "--upstream", upstream,
                                   "--model", args.model, "--store", str(Path(tmp) / "t.db"),
                                   "--port", str(gateway_port), "--token", token], stdout=subprocess.DEVNULL)
        try:
            ready(upstream.removesuffix("/v1") + "/health", stub)
            ready(gateway + "/health", served, {"Authorization": f"Bearer {token}"})
            with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
                direct, through = measure(client, upstream, gateway, apis, args.episodes)
        finally:
            for proc in (served, stub):
                proc.terminate()
                proc.wait(timeout=30)
        with TrajectoryStore(Path(tmp) / "t.db", readonly=True) as store:
            recorded = store.count(status="complete")
    report(direct, through, args.episodes, recorded)


def measure(client: httpx.Client, upstream: str, gateway: str, apis: list[str], episodes: int) -> tuple[dict, dict]:
    """Each API's call latencies (ms), direct and through the gateway, interleaved episode by episode."""
    for k in range(5):  # warm both paths up (connections, the tokenizer's caches)
        for api in apis:
            episode(client, upstream, api), episode(client, f"{gateway}/episodes/warm-{api}-{k}/v1", api)
    direct: dict[str, list[float]] = {api: [] for api in apis}
    through: dict[str, list[float]] = {api: [] for api in apis}
    for k in range(episodes):
        for api in apis:
            direct[api] += episode(client, upstream, api)
            through[api] += episode(client, f"{gateway}/episodes/{api}-{k}/v1", api)
            client.post(f"{gateway}/episodes/{api}-{k}/finish", json={})
    return direct, through


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def report(direct: dict, through: dict, episodes: int, recorded: int) -> None:
    print(f"\n{episodes} episodes x 2 calls per API, interleaved; the upstream answers at once (no model time)")
    print(f"{'API':10} {'direct p50':>10} {'p90':>6} {'gateway p50':>11} {'p90':>6} {'added p50':>9} {'p90':>6} "
          f"{'median diff':>11}  (ms)")
    for api in direct:
        d, t = direct[api], through[api]
        diffs = [b - a for a, b in zip(d, t)]
        print(f"{api:10} {pct(d, .5):10.2f} {pct(d, .9):6.2f} {pct(t, .5):11.2f} {pct(t, .9):6.2f} "
              f"{pct(t, .5) - pct(d, .5):+9.2f} {pct(t, .9) - pct(d, .9):+6.2f} {statistics.median(diffs):+11.2f}")
    print(f"episodes recorded complete: {recorded} of {episodes * len(direct)}")


if __name__ == "__main__":
    main()

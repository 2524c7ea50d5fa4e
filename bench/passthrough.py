"""What record-only mode adds to each call: an agent calling its upstream model directly, against
the same calls through the gateway with `--upstream` (the reply rendered in the student's tokens
and the step written to SQLite), side by side, interleaved call by call.

The upstream is a stub OpenAI server answering at once with a fixed tool call or a fixed answer
(no model time), so the difference is the pass-through's own cost: the extra HTTP hop on
localhost, the chat template and tokenizer of the student (the embedded SmolLM2-135M's), and the
store write. Each episode is the agent's two calls (a tool call, then the answer). The agent (this
process), the gateway (`forge-bridge gateway --upstream`, with a token) and the stub each run in a
process of their own, as they do in production: in one process their threads would share one GIL.

    .venv/bin/python bench/passthrough.py [--episodes 200]

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


def stub_app():
    """An OpenAI chat-completions endpoint that answers instantly: a call to `add`, then the answer."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request: Request):
        body = await request.json()
        answered = any(m.get("role") == "tool" for m in body["messages"])
        message = {"role": "assistant", "content": "The answer is 5."} if answered else CALL
        return JSONResponse({"id": "x", "object": "chat.completion", "model": "stub", "choices": [{
            "index": 0, "message": message, "finish_reason": "stop" if answered else "tool_calls"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def episode(client: httpx.Client, base: str) -> list[float]:
    """The two calls of one episode; their latencies in ms."""
    out = []
    for messages in (ASK, AFTER):
        t0 = time.perf_counter()
        resp = client.post(base + "/chat/completions", json={"model": "m", "messages": messages, "tools": [ADD],
                                                             "temperature": 0, "max_tokens": 64})
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
    ap.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the student whose tokens the gateway "
                    "records in: a named model (forge-bridge fetch --list) or a model directory")
    args = ap.parse_args()
    if args.serve_stub:
        return serve_stub(args.serve_stub)

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
                for k in range(5):  # warm both paths up (connections, the tokenizer's caches)
                    episode(client, upstream), episode(client, f"{gateway}/episodes/warm-{k}/v1")
                direct, through = [], []
                for k in range(args.episodes):
                    direct += episode(client, upstream)
                    through += episode(client, f"{gateway}/episodes/ep-{k}/v1")
                    client.post(f"{gateway}/episodes/ep-{k}/finish", json={})
        finally:
            for proc in (served, stub):
                proc.terminate()
                proc.wait(timeout=30)
        with TrajectoryStore(Path(tmp) / "t.db", readonly=True) as store:
            recorded = store.count(status="complete")

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]

    print(f"\n{args.episodes} episodes x 2 calls, interleaved; the upstream answers at once (no model time)")
    print(f"{'path':36} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
    for name, xs in (("agent -> upstream", direct), ("agent -> gateway --upstream -> upstream", through)):
        print(f"{name:36} {pct(xs, .5):8.2f} {pct(xs, .9):8.2f} {pct(xs, .99):8.2f}")
    print(f"pass-through overhead: p50 {pct(through, .5) - pct(direct, .5):+.2f} ms per call "
          f"(median of differences {statistics.median(t - d for t, d in zip(through, direct)):+.2f} ms); "
          f"episodes recorded complete: {recorded} of {args.episodes}")


if __name__ == "__main__":
    main()

"""What record-only mode adds to each call: an agent calling its upstream model directly, against
the same calls through the gateway with `--upstream` (the reply rendered in the student's tokens
and the step written to SQLite), side by side, interleaved call by call.

The upstream is a stub OpenAI server answering at once with a fixed tool call or a fixed answer
(no model time), so the difference is the pass-through's own cost: the extra HTTP hop on
localhost, the chat template and tokenizer of the student (the embedded SmolLM2-135M's), and the
store write. Each episode is the agent's two calls (a tool call, then the answer).

    .venv/bin/python bench/passthrough.py [--episodes 200]

What it does not cover: a remote upstream (its network time is the same on both paths), streaming.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=200)
    args = ap.parse_args()

    from forge_bridge.core.episode import Recorder
    from forge_bridge.core.store import TrajectoryStore
    from forge_bridge.policies import models
    from forge_bridge.policies.upstream import UpstreamPolicy
    from forge_bridge.serving.background import BackgroundServer
    from forge_bridge.serving.gateway import Gateway

    stub = BackgroundServer(stub_app(), name="stub-upstream")
    stub.start()
    upstream = f"http://127.0.0.1:{stub.port}/v1"
    tokenizer = models.load_tokenizer("smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as tmp:
        store = TrajectoryStore(Path(tmp) / "t.db")
        policy = UpstreamPolicy(upstream, tokenizer)
        with Gateway(policy, Recorder(store)) as gw, httpx.Client(timeout=30) as client:
            for k in range(5):  # warm both paths up (connections, the tokenizer's caches)
                episode(client, upstream), episode(client, gw.episode_url(f"warm-{k}"))
            direct, through = [], []
            for k in range(args.episodes):
                direct += episode(client, upstream)
                through += episode(client, gw.episode_url(f"ep-{k}"))
                client.post(f"{gw.address}/episodes/ep-{k}/finish", json={})
            recorded = store.count(status="complete")
        store.close()
        policy.close()
    stub.stop()

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

"""A stand-in for vLLM's OpenAI server that misbehaves on demand (the real server is used where
token ids and adapters matter; here only its failure modes are needed, reproducibly)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def completion(text: str, tool_call: bool) -> dict:
    message = {"role": "assistant", "content": "" if tool_call else text}
    if tool_call:
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    ids = [5, 6, 7, 2]
    return {"id": "x", "object": "chat.completion", "model": "base", "prompt_token_ids": [1, 2, 3, 4],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_call else "stop",
                         "token_ids": ids, "logprobs": {"content": [{"logprob": -0.5} for _ in ids]}}]}


class FakeVLLM:
    """`mode`: ok | 500 | not-json | no-token-ids | slow; `fail_first`: that many requests
    answer 500 before `mode` applies. Answers a tool call first, then text once a tool result
    is in the prompt."""

    def __init__(self, port: int = 0) -> None:
        self.mode, self.fail_first, self.slow_s = "ok", 0, 5.0
        self.requests = 0
        self.adapters: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.port = port
        self.server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if "lora_adapter" in self.path:  # adapter (un)loading always works here
                    fake.adapters.append((self.path.rsplit("/", 1)[-1], body.get("lora_name")))
                    return self._send(200, b"Success")
                with fake.lock:
                    fake.requests += 1
                    failing = fake.fail_first > 0
                    fake.fail_first -= failing
                mode = "500" if failing else fake.mode
                if mode == "slow":
                    time.sleep(fake.slow_s)
                if mode == "500":
                    return self._send(500, b'{"error": "internal error"}')
                if mode == "not-json":
                    return self._send(200, b"<html>502 Bad Gateway</html>")
                seen_tool = any(m.get("role") == "tool" for m in body["messages"])
                answer = completion("The answer is 5.", tool_call=not seen_tool)
                if mode == "no-token-ids":
                    del answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
                self._send(200, json.dumps(answer).encode())

            def _send(self, status: int, data: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

"""An OpenAI-compatible HTTP server in front of a policy that records every call.

For agents whose code cannot change: point their `base_url` (or `OPENAI_BASE_URL`) at the
gateway. The episode a call belongs to is named by the URL (`/episodes/<id>/v1/...`) or the
`X-Forge-Episode` header; a call that names none is recorded as a one-step episode of its own,
so nothing is dropped. The request's `model`, when it names a policy slot, picks that slot's
adapter (otherwise the default slot serves). `POST /episodes/<id>/finish` with `{"reward": r}`
closes an episode (`{"error": "why"}` ends it as failed, for an agent that crashed).

Responses carry vLLM's extra fields (`prompt_token_ids`, per-choice `token_ids`, per-token
logprobs), so a client that keeps them sees the exact tokens. Binds 127.0.0.1 unless told
otherwise; with a token set, requests without `Authorization: Bearer <token>` are refused.
"""

from __future__ import annotations

import hmac
import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from forge_bridge.core.episode import Episode, Recorder
from forge_bridge.core.errors import EpisodeClosed, InvalidArgument, NotFound, PolicyError, SchemaError
from forge_bridge.core.recording import DEFAULT_MAX_MODEL_CALLS, Limits, call_policy
from forge_bridge.core.types import END_REASONS, Action
from forge_bridge.policies.base import DEFAULT_SLOT, Policy, PolicyOutput

_EPISODE_PATH = re.compile(r"^/episodes/([A-Za-z0-9._-]{1,128})(/.*)$")
MAX_BODY = 16 * 1024 * 1024
MAX_ENDED_IDS = 100_000  # ended episode ids remembered (late calls to them get 409)


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # dozens of agents connecting at once: none refused by the backlog
    daemon_threads = True


class Gateway:
    """`with Gateway(policy, recorder) as gw: ChatOpenAI(base_url=gw.base_url, ...)`"""

    def __init__(self, policy: Policy, recorder: Recorder | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, model_name: str = "forge",
                 max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS) -> None:
        """`max_model_calls` (default 25; None: no limit): model calls one episode may make;
        past it the agent gets an empty final answer and the episode is marked truncated."""
        self.limits = Limits(max_model_calls=max_model_calls)
        self.policy = policy
        self.recorder = recorder or Recorder()
        self.token = token
        self.model_name = model_name
        self._episodes: dict[str, Episode] = {}
        # ids of ended episodes -> status: late calls get 409, and the Episode objects (with all
        # their steps) are released, so a long-running gateway does not grow with every episode
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._server = _Server((host, port), self._handler_class())
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def episode_url(self, episode_id: str) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/episodes/{episode_id}/v1"

    def start(self) -> str:
        self._thread = threading.Thread(target=self._server.serve_forever, name="forge-gateway",
                                        daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving. Episodes still open stay `incomplete` in the store: their agents never
        said they ended, and a trainer must not mistake them for finished ones."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "Gateway":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ episodes
    def episode(self, task_id: str | None = None, group_id: str | None = None, *,
                episode_id: str) -> Episode:
        """The open episode with this id, created on first use (arguments in `fb.episode`'s order)."""
        with self._lock:
            if episode_id in self._ended:
                raise EpisodeClosed(f"episode {episode_id} is finished ({self._ended[episode_id]}); "
                                    "open a new episode to record more steps")
            ep = self._episodes.get(episode_id)
            if ep is None:
                ep = self.recorder.episode(task_id, group_id, episode_id=episode_id,
                                           metadata={"source": "gateway"})
                self._episodes[episode_id] = ep
            return ep

    def finish(self, episode_id: str, reward: float | None, status: str | None,
               error: str | None = None) -> dict:
        """End an episode: with a reward, a status (`complete`, `failed` or any end reason, e.g.
        `truncated`), or (the agent crashed) an error reason."""
        end = {"complete": "terminated", "failed": "crashed"}.get(status, status)
        if end is not None and end not in END_REASONS:
            raise InvalidArgument(f"status: expected one of {sorted(set(END_REASONS) | {'complete', 'failed'})}, "
                             f"got {status!r}")
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is None and episode_id in self._ended:
                raise EpisodeClosed(f"episode {episode_id} already ended ({self._ended[episode_id]})")
        if ep is None:
            raise NotFound(episode_id)
        if reward is not None:
            ep.reward(reward)
        traj = ep.fail(str(error)) if error else ep.finish(end, detail="the agent said so")
        self._retire(episode_id, ep)
        return {"id": traj.id, "status": traj.status, "reward": traj.reward, "steps": len(traj)}

    def _retire(self, episode_id: str, ep: Episode) -> None:
        with self._lock:
            self._episodes.pop(episode_id, None)
            self._ended[episode_id] = ep.trajectory.status
            while len(self._ended) > MAX_ENDED_IDS:
                self._ended.popitem(last=False)

    # ------------------------------------------------------------------ the call
    def complete(self, body: dict, episode_id: str | None, headers: Any) -> dict:
        """One chat completion, recorded through the recording protocol. Past the episode's
        step limit the answer is an empty final message (nothing is recorded; the episode is
        marked truncated), so the agent's loop ends."""
        messages, tools = body.get("messages"), body.get("tools") or None
        sampling = {k: body.get(k) for k in ("temperature", "top_p", "max_tokens",
                                             "max_completion_tokens", "seed") if body.get(k) is not None}
        if episode_id is None:
            ep = self.recorder.episode(headers.get("X-Forge-Task"), headers.get("X-Forge-Group"),
                                       metadata={"source": "gateway", "single_call": True})
        else:
            ep = self.episode(headers.get("X-Forge-Task"), headers.get("X-Forge-Group"), episode_id=episode_id)
            ep.check_open()
            if isinstance(messages, list):
                ep.attach_tool_results([m for m in messages if isinstance(m, dict)])
        slot = body.get("model") if body.get("model") in self.policy.slots else DEFAULT_SLOT
        try:
            out = call_policy(self.policy, ep, messages, tools, source="gateway", limits=self.limits,
                              slot=slot, sampling=sampling)
        except (PolicyError, ValueError, TypeError) as exc:  # an outage, or the agent's bad request
            ep.fail(f"{type(exc).__name__}: {exc}", "outage" if isinstance(exc, PolicyError) else "crashed",
                    messages=len(messages or []))
            if episode_id is not None:
                self._retire(episode_id, ep)
            raise
        if episode_id is None:
            ep.finish()
        return self._completion(body, out)

    def _completion(self, body: dict, out: PolicyOutput | None) -> dict:
        if out is None:  # a limit ended the episode: an empty final answer ends the agent's loop
            out = PolicyOutput(Action(content="", finish_reason="stop"), [], [], [], None)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model") or self.model_name,
            "choices": [{"index": 0, "message": out.message, "finish_reason": out.finish_reason,
                         "token_ids": out.completion_token_ids,
                         "logprobs": {"content": [{"token": str(t), "logprob": lp}
                                                  for t, lp in zip(out.completion_token_ids,
                                                                   out.completion_logprobs)]}}],
            "usage": {"prompt_tokens": len(out.prompt_token_ids),
                      "completion_tokens": len(out.completion_token_ids),
                      "total_tokens": len(out.prompt_token_ids) + len(out.completion_token_ids)},
            "prompt_token_ids": out.prompt_token_ids, "adapter": out.adapter}

    def _chunks(self, completion: dict) -> list[dict]:
        """The same completion as streaming chunks: first the role and prompt token ids, then the
        content, then the tool calls with finish_reason."""
        choice = completion["choices"][0]
        base = {k: completion[k] for k in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"
        first = {**base, "prompt_token_ids": completion["prompt_token_ids"],
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}]}
        body = {**base, "choices": [{"index": 0, "delta": {"content": choice["message"]["content"]},
                                     "token_ids": choice["token_ids"], "logprobs": choice["logprobs"],
                                     "finish_reason": None}]}
        last_delta: dict[str, Any] = {}
        if choice["message"].get("tool_calls"):
            last_delta["tool_calls"] = [{**tc, "index": i}
                                        for i, tc in enumerate(choice["message"]["tool_calls"])]
        last = {**base, "choices": [{"index": 0, "delta": last_delta,
                                     "finish_reason": choice["finish_reason"]}],
                "usage": completion["usage"]}
        return [first, body, last]

    # ------------------------------------------------------------------ HTTP plumbing
    def _handler_class(self) -> type:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: calls are recorded, not logged
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
                self._send(status, {"error": {"message": message, "type": kind, "code": status}})

            def _authorized(self) -> bool:
                if gateway.token is None:
                    return True
                given = self.headers.get("Authorization", "")
                if hmac.compare_digest(given.encode(), f"Bearer {gateway.token}".encode()):
                    return True
                self._error(401, "missing or wrong bearer token", "authentication_error")
                return False

            def _route(self) -> tuple[str | None, str]:
                path = self.path.split("?", 1)[0]
                m = _EPISODE_PATH.match(path)
                if m:
                    return m.group(1), m.group(2)
                return self.headers.get("X-Forge-Episode"), path

            def do_GET(self) -> None:
                if self.path == "/health":
                    return self._send(200, {"status": "ok"})
                if not self._authorized():
                    return
                _, path = self._route()
                if path == "/v1/models":
                    names = [gateway.model_name] + [v for v in gateway.policy.versions() if v]
                    return self._send(200, {"object": "list", "data": [
                        {"id": n, "object": "model", "owned_by": "forge-bridge"} for n in names]})
                self._error(404, f"no route GET {path}")

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                episode_id, path = self._route()
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    return self._error(413, f"request body over {MAX_BODY} bytes")
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(body, dict):
                        raise InvalidArgument("the body must be a JSON object")
                except ValueError as exc:
                    return self._error(400, f"invalid JSON body: {exc}")
                if path == "/finish" and episode_id:
                    try:
                        return self._send(200, gateway.finish(episode_id, body.get("reward"),
                                                              body.get("status"), body.get("error")))
                    except NotFound:
                        return self._error(404, f"no open episode {episode_id}")
                    except EpisodeClosed as exc:
                        return self._error(409, str(exc))
                    except (ValueError, SchemaError) as exc:
                        return self._error(400, str(exc))
                if path != "/v1/chat/completions":
                    return self._error(404, f"no route POST {path}")
                try:
                    completion = gateway.complete(body, episode_id, self.headers)
                except EpisodeClosed as exc:
                    return self._error(409, str(exc))
                except PolicyError as exc:
                    return self._error(502, f"the policy failed: {exc}", "policy_error")
                except (ValueError, TypeError, SchemaError) as exc:
                    return self._error(400, str(exc))
                if not body.get("stream"):
                    return self._send(200, completion)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in gateway._chunks(completion):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler

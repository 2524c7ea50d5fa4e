"""An OpenAI- and Anthropic-compatible HTTP server in front of a policy that records every call.

For agents whose code cannot change: point their `base_url` (or `OPENAI_BASE_URL`,
`ANTHROPIC_BASE_URL`) at the gateway. It speaks three APIs: chat completions
(`/v1/chat/completions`), OpenAI's Responses (`/v1/responses`: Codex, the OpenAI Agents SDK) and
Anthropic's Messages (`/v1/messages`: Claude Code, Anthropic's SDK). Each request is translated
into one chat-form call (`ChatCall`: `responses_api`, `messages_api`), so the policy, its
template and its tool-call parsing are the same for all three, and each step records the API it
came in by (`info['api']`). The episode a call belongs to is named by the URL (`/episodes/<id>/v1/...`) or the
`X-Forge-Episode` header; a call that names none is recorded as a one-step episode of its own,
so nothing is dropped. The request's `model`, when it names a policy slot, picks that slot's
adapter (otherwise the default slot serves). `POST /episodes/<id>/finish` with `{"reward": r}`
closes an episode (`{"error": "why"}` ends it as failed, for an agent that crashed);
`POST /episodes/<id>/feedback` with `{"value": v}` records a judgement of it, then or days later.

It runs on Starlette and uvicorn (vLLM's own stack): requests are handled asynchronously, the
policy is awaited (the embedded policy's batching worker or vLLM over HTTP), so hundreds of
waiting agents hold no thread each. Every malformed request gets an OpenAI-style JSON error and
the connection stays usable. Responses carry vLLM's extra fields (`prompt_token_ids`,
per-choice `token_ids`, per-token logprobs), so a client that keeps them sees the exact tokens.
Binds 127.0.0.1 unless told otherwise; with a token set, requests without
`Authorization: Bearer <token>` (or Anthropic's `x-api-key: <token>`) are refused.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from forge_bridge.core.episode import Episode, Recorder
from forge_bridge.core.errors import (
    EpisodeClosed,
    InvalidArgument,
    InvalidState,
    NotFound,
    PolicyError,
)
from forge_bridge.core.recording import DEFAULT_MAX_MODEL_CALLS, Limits, StepRewards, acall_policy
from forge_bridge.core.types import END_REASONS, Action, Feedback
from forge_bridge.policies.base import DEFAULT_SLOT, Policy, PolicyOutput
from forge_bridge.serving.background import BackgroundServer
from forge_bridge.serving.http_api import MAX_BODY, ChatCall, RequestRefused, build_app, chat_call, check_request

if TYPE_CHECKING:
    from forge_bridge.serving.promotion import Shadow

MAX_ENDED_IDS = 100_000  # ended episode ids remembered (late calls to them get 409)
MAX_KEPT_RESPONSES = 256  # Responses kept per open episode for previous_response_id (the oldest go first)


class Gateway:
    """`with Gateway(policy, recorder) as gw: ChatOpenAI(base_url=gw.base_url, ...)`"""

    def __init__(self, policy: Policy, recorder: Recorder | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, model_name: str = "forge",
                 max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS, max_body_bytes: int = MAX_BODY,
                 step_rewards: StepRewards | None = None, shadow: "Shadow | None" = None) -> None:
        """`max_model_calls` (default 25; None: no limit): model calls one episode may make;
        past it the agent gets an empty final answer and the episode is marked truncated.
        `max_body_bytes`: larger requests are refused with 413. `step_rewards` (default off):
        rewards for malformed and repeated calls (the agent runs its tools out of our sight).
        `shadow`: the gate's shadow run, whose candidate answers a share of the requests too
        (`forge_bridge.serving.promotion.Shadow`)."""
        self.shadow = shadow
        self.limits = Limits(max_model_calls=max_model_calls)
        self.step_rewards = step_rewards
        self.policy = policy
        self.behaviour: str = policy.behaviour or "policy"
        """What its episodes record: the policy's own steps, or an upstream model's (`UpstreamPolicy`)."""
        self.recorder = recorder or Recorder()
        self.token = token
        self.model_name = model_name
        self.host, self.port, self.max_body_bytes = host, port, max_body_bytes
        self._episodes: dict[str, Episode] = {}
        # ids of ended episodes -> status: late calls get 409, and the Episode objects (with all
        # their steps) are released, so a long-running gateway does not grow with every episode
        self._ended: OrderedDict[str, str] = OrderedDict()
        # open episode id -> its Responses' conversations, by response id (previous_response_id)
        self._responses: dict[str, OrderedDict[str, list[dict]]] = {}
        self._lock = threading.Lock()
        self._server: BackgroundServer | None = None
        self.app = build_app(self)

    @property
    def address(self) -> str:
        if self._server is None or not self._server.running:
            raise InvalidState("the gateway is not running: start() it (or use it in a with block)")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.address}/v1"

    def episode_url(self, episode_id: str) -> str:
        return f"{self.address}/episodes/{episode_id}/v1"

    def start(self) -> str:
        """Serve on a background thread (uvicorn); returns the base URL once it accepts calls."""
        self._server = BackgroundServer(self.app, self.host, self.port, name="forge-gateway", backlog=2048,
                                        timeout_keep_alive=30)
        self._server.start()
        self.port = self._server.port
        return self.base_url

    def stop(self) -> None:
        """Stop serving. Episodes still open stay `incomplete` in the store: their agents never
        said they ended, and a trainer must not mistake them for finished ones."""
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> "Gateway":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ episodes
    def attach(self, episode: Episode) -> str:
        """Serve an episode opened elsewhere (by a trainer, say) at `episode_url(episode.id)`;
        its calls are recorded into it. Returns its id."""
        with self._lock:
            if episode.id in self._episodes or episode.id in self._ended:
                raise InvalidArgument(f"episode {episode.id} is already known to this gateway")
            self._episodes[episode.id] = episode
        return episode.id

    def release(self, episode_id: str) -> None:
        """Forget an attached episode (its owner finishes it); later calls to it get 409."""
        with self._lock:
            ep = self._episodes.get(episode_id)
        if ep is not None:
            self._retire(episode_id, ep)

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
                                           metadata={"source": "gateway"}, behaviour=self.behaviour)
                self._episodes[episode_id] = ep
            return ep

    def finish(self, episode_id: str, reward: float | None, status: str | None,
               error: str | None = None) -> dict:
        """End an episode: with a reward, a status (`complete`, `failed` or any end reason, e.g.
        `truncated`), or (the agent crashed) an error reason."""
        aliases: dict[str | None, str] = {"complete": "terminated", "failed": "crashed"}
        end = aliases.get(status, status)
        if end is not None and end not in END_REASONS:
            raise InvalidArgument(f"status: expected one of {sorted(set(END_REASONS) | {'complete', 'failed'})}, "
                             f"got {status!r}")
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is None and episode_id in self._ended:
                raise EpisodeClosed(f"episode {episode_id} already ended ({self._ended[episode_id]})")
        if ep is None:
            raise NotFound(f"no open episode {episode_id}")
        if reward is not None:
            ep.reward(reward)
        traj = ep.fail(str(error)) if error else ep.finish(end, detail="the agent said so")
        self._retire(episode_id, ep)
        return {"id": traj.id, "status": traj.status, "reward": traj.reward, "steps": len(traj)}

    def feedback(self, episode_id: str, body: dict) -> dict:
        """Record a judgement of an episode in the store (it may have ended days ago, or be
        running still): `{"value": v, "key": ..., "comment": ..., "step": ...}`."""
        event = Feedback(episode_id=episode_id, value=body["value"], key=body.get("key", "user"),
                         comment=body.get("comment"), step=body.get("step"), source="gateway")
        try:
            event = self.recorder.store.add_feedback(event)
        except NotFound:
            raise NotFound(f"no episode {episode_id!r} in this gateway's store") from None  # its path stays private
        return {"episode": event.episode_id, "seq": event.seq, "key": event.key, "value": event.value, "at": event.at}

    def _retire(self, episode_id: str, ep: Episode) -> None:
        with self._lock:
            self._episodes.pop(episode_id, None)
            self._responses.pop(episode_id, None)
            self._ended[episode_id] = ep.trajectory.status
            while len(self._ended) > MAX_ENDED_IDS:
                self._ended.popitem(last=False)

    # ------------------------------------------------------------------ the call
    async def call(self, call: ChatCall, episode_id: str | None, headers: Any) -> PolicyOutput:
        """One model call in the chat form, whichever API asked for it, recorded through the
        recording protocol (its step's `info['api']` names the API). Past the episode's step limit
        the answer is an empty final message (nothing is recorded; the episode is marked
        truncated), so the agent's loop ends."""
        if episode_id is None:
            ep = self.recorder.episode(headers.get("X-Forge-Task"), headers.get("X-Forge-Group"),
                                       metadata={"source": "gateway", "single_call": True}, behaviour=self.behaviour)
        else:
            ep = self.episode(headers.get("X-Forge-Task"), headers.get("X-Forge-Group"), episode_id=episode_id)
            ep.check_open()
            ep.attach_tool_results([m for m in call.messages if isinstance(m, dict)])
        slot = call.model if call.model in self.policy.slots else DEFAULT_SLOT
        try:
            out = await acall_policy(self.policy, ep, call.messages, call.tools, source="gateway",
                                     limits=self.limits, slot=slot, sampling=call.sampling,
                                     info={"api": call.api}, step_rewards=self.step_rewards)
        except (PolicyError, ValueError, TypeError) as exc:  # an outage, or the agent's bad request
            ep.fail(f"{type(exc).__name__}: {exc}", "outage" if isinstance(exc, PolicyError) else "crashed",
                    messages=len(call.messages))
            if episode_id is not None:
                self._retire(episode_id, ep)
            raise
        if episode_id is None:
            ep.finish()
        if self.shadow is not None and out is not None:
            self.shadow.offer(self.policy, call.messages, call.tools, out, call.sampling)
        if out is None:  # a limit ended the episode: an empty final answer ends the agent's loop
            return PolicyOutput(Action(content="", finish_reason="stop"), [], [], [], None)
        return out

    async def complete(self, body: dict, episode_id: str | None, headers: Any) -> dict:
        """One chat completion (a request `check_request` passed)."""
        return self._completion(body, await self.call(chat_call(body), episode_id, headers))

    async def respond(self, body: Any, episode_id: str | None, headers: Any) -> tuple[dict, bool]:
        """One call of the Responses API: (the Response, whether it streams). With
        `previous_response_id` the conversation it names (kept per episode) comes first."""
        from forge_bridge.serving import responses_api

        request = responses_api.parse(body)
        earlier = self._conversation(episode_id, request.previous_response_id)
        call, conversation = responses_api.chat_call(request, earlier)
        out = await self.call(call, episode_id, headers)
        reply = responses_api.response(request, out, self._model(request.model, out), tokens=self.behaviour != "upstream")
        if request.store and episode_id is not None:
            self._remember(episode_id, reply["id"], [*conversation, out.message])
        return reply, request.stream

    async def message(self, body: Any, episode_id: str | None, headers: Any) -> tuple[dict, bool]:
        """One call of Anthropic's Messages API: (the Message, whether it streams)."""
        from forge_bridge.serving import messages_api

        call, stream = messages_api.parse(body)
        out = await self.call(call, episode_id, headers)
        return messages_api.message(out, self._model(call.model, out), tokens=self.behaviour != "upstream"), stream

    def count_tokens(self, body: Any) -> dict:
        """Anthropic's `count_tokens`: the request's prompt tokens, in the policy's tokenizer."""
        from forge_bridge.serving import messages_api

        call, _ = messages_api.parse(body, counting=True)
        return {"input_tokens": messages_api.count_tokens(call, self.policy.tokenize)}

    def _model(self, asked: str | None, out: PolicyOutput) -> str:
        """The model a reply names: the upstream's own, else the one asked for, else the gateway's."""
        return (self.behaviour == "upstream" and out.info.get("upstream")) or asked or self.model_name

    def _conversation(self, episode_id: str | None, response_id: str | None) -> list[dict]:
        """The conversation (chat messages, instructions left out) a Response of this episode ended."""
        if response_id is None:
            return []
        with self._lock:
            kept = self._responses.get(episode_id or "", OrderedDict()).get(response_id)
        if kept is None:
            where = "this episode" if episode_id else "calls outside an episode (use the episode's URL)"
            raise RequestRefused(400, f"previous_response_id: no stored response {response_id!r} in {where}")
        return kept

    def _remember(self, episode_id: str, response_id: str, conversation: list[dict]) -> None:
        with self._lock:
            if episode_id in self._episodes:  # not one that ended meanwhile
                kept = self._responses.setdefault(episode_id, OrderedDict())
                kept[response_id] = conversation
                while len(kept) > MAX_KEPT_RESPONSES:
                    kept.popitem(last=False)

    def _completion(self, body: dict, out: PolicyOutput) -> dict:
        upstream = self.behaviour == "upstream"  # the upstream's reply as it gave it: the student's tokens are the store's
        choice = {"index": 0, "message": out.message, "finish_reason": out.finish_reason}
        completion = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                      "model": self._model(body.get("model"), out), "choices": [choice]}
        if upstream:
            if out.info.get("upstream_usage"):
                completion["usage"] = out.info["upstream_usage"]
            return completion
        choice["token_ids"] = out.completion_token_ids
        choice["logprobs"] = {"content": [{"token": str(t), "logprob": lp}
                                          for t, lp in zip(out.completion_token_ids, out.completion_logprobs)]}
        prompt, completion_tokens = len(out.prompt_token_ids), len(out.completion_token_ids)
        completion["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                               "total_tokens": prompt + completion_tokens}
        completion["prompt_token_ids"] = out.prompt_token_ids
        completion["version"] = out.version
        return completion

    def chunks(self, completion: dict) -> list[dict]:
        """The same completion as streaming chunks: first the role and prompt token ids, then the
        content, then the tool calls with finish_reason."""
        choice = completion["choices"][0]
        base = {k: completion[k] for k in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"
        tokens = {k: choice[k] for k in ("token_ids", "logprobs") if k in choice}  # none from an upstream
        first = {**base, **{k: completion[k] for k in ("prompt_token_ids",) if k in completion},
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}]}
        body = {**base, "choices": [{"index": 0, "delta": {"content": choice["message"]["content"]},
                                     **tokens, "finish_reason": None}]}
        last_delta: dict[str, Any] = {}
        if choice["message"].get("tool_calls"):
            last_delta["tool_calls"] = [{**tc, "index": i}
                                        for i, tc in enumerate(choice["message"]["tool_calls"])]
        last = {**base, "choices": [{"index": 0, "delta": last_delta, "finish_reason": choice["finish_reason"]}],
                **{k: completion[k] for k in ("usage",) if k in completion}}
        return [first, body, last]

    # ------------------------------------------------------------------ HTTP plumbing


__all__ = ["Gateway", "MAX_BODY", "check_request"]

"""The gateway's HTTP surface (Starlette): routes, bearer-token auth, body limits, request checks,
and JSON errors in the shape of the API asked (OpenAI's, or Anthropic's on `/v1/messages`).
`Gateway` (serving/gateway.py) holds what the routes call; each API's translation into the chat
form every call takes (`ChatCall`) lives in a module of its own (`responses_api`, `messages_api`)."""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

from forge_bridge.core.errors import EpisodeClosed, ForgeBridgeError, NotFound, PolicyError, SchemaError

if TYPE_CHECKING:
    from forge_bridge.serving.gateway import Gateway

MAX_BODY = 16 * 1024 * 1024
"""Largest request body accepted by default (bytes); larger ones get 413."""
EPISODE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_SAMPLING: dict[str, type | tuple[type, ...]]
_SAMPLING = {"temperature": (int, float), "top_p": (int, float), "max_tokens": int,
             "max_completion_tokens": int, "seed": int}


class RequestRefused(ForgeBridgeError):
    """A request refused with this status (turned into an OpenAI-style error response)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass(frozen=True)
class ChatCall:
    """One model call in the chat form every API is translated into: what the policy is asked and
    what the step records, whichever API the agent spoke."""

    messages: list[dict]
    """OpenAI chat messages (`tool` messages carry the results of earlier calls)."""
    tools: list[dict] | None
    """OpenAI function tools (`{"type": "function", "function": {...}}`), or None."""
    sampling: dict
    """temperature, top_p, max_tokens, ... as `Policy.chat` takes them."""
    model: str | None
    """The model the request named (a policy slot's name picks that slot)."""
    api: str
    """The API it came in by, recorded in the step's `info['api']`: chat, responses or messages."""


def expect(value: Any, kinds: type | tuple[type, ...], where: str, what: str) -> Any:
    """`value` if it is one of `kinds` (a bool is never a number), else a 400 naming the field."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool)):
        return value
    raise RequestRefused(400, f"{where}: expected {what}, got {json.dumps(value)[:80]}")


def check_fields(body: dict, known: Iterable[str], where: str = "the body") -> None:
    """A 400 naming the fields of `body` this API does not have (as OpenAI's and Anthropic's
    servers refuse them: a misspelt field is never silently ignored)."""
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise RequestRefused(400, f"{where}: unknown field{'s' * (len(unknown) > 1)} {', '.join(unknown)}")


def chat_call(body: dict) -> ChatCall:
    """A chat-completion request (checked: `check_request`) as the call it asks for."""
    sampling = {k: body.get(k) for k in _SAMPLING if body.get(k) is not None}
    return ChatCall(body["messages"], body.get("tools") or None, sampling, body.get("model"), "chat")


def check_request(body: Any) -> None:
    """A chat-completion request's shape, field by field (a 400 names the field)."""
    if not isinstance(body, dict):
        raise RequestRefused(400, "the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestRefused(400, "messages: expected a non-empty list of message objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestRefused(400, f"messages[{i}]: expected an object with a string 'role'")
    if body.get("tools") is not None and not (isinstance(body["tools"], list)
                                              and all(isinstance(t, dict) for t in body["tools"])):
        raise RequestRefused(400, "tools: expected a list of tool objects")
    for name, kinds in _SAMPLING.items():
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise RequestRefused(400, f"{name}: expected a number, got {value!r}")
    if body.get("n", 1) != 1:
        raise RequestRefused(400, "n: only n=1 is supported (one recorded step per call)")
    for name in ("model",):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise RequestRefused(400, f"{name}: expected a string")
    if not isinstance(body.get("stream", False), bool):
        raise RequestRefused(400, "stream: expected true or false")


def error(status: int, message: str, kind: str = "invalid_request_error") -> Any:
    """An OpenAI-style JSON error response."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


_ANTHROPIC_KINDS = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
                    502: "api_error"}


def anthropic_error(status: int, message: str, kind: str = "invalid_request_error") -> Any:
    """An Anthropic-style JSON error response (what its SDK reads on `/v1/messages`)."""
    from starlette.responses import JSONResponse

    return JSONResponse({"type": "error", "error": {"type": _ANTHROPIC_KINDS.get(status, kind), "message": message}},
                        status)


def authorize(gateway: "Gateway", request: Any) -> None:
    """Refuse (401) a request without the gateway's token, when it has one: `Authorization:
    Bearer <token>` (OpenAI's clients) or `x-api-key: <token>` (Anthropic's)."""
    if gateway.token is None:
        return
    bearer = request.headers.get("authorization", "")
    key = request.headers.get("x-api-key")
    if key is not None and hmac.compare_digest(key.encode(), gateway.token.encode()):
        return
    if not hmac.compare_digest(bearer.encode(), f"Bearer {gateway.token}".encode()):
        raise RequestRefused(401, "missing or wrong token (Authorization: Bearer <token>, or x-api-key)",
                             "authentication_error")


async def read_json(gateway: "Gateway", request: Any) -> Any:
    """The request's JSON body, refused (413) past `max_body_bytes` before it is all read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > gateway.max_body_bytes:
        raise RequestRefused(413, f"request body over {gateway.max_body_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > gateway.max_body_bytes:
            raise RequestRefused(413, f"request body over {gateway.max_body_bytes} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError as exc:
        raise RequestRefused(400, f"invalid JSON body: {exc}") from None
    except RecursionError:
        raise RequestRefused(400, "invalid JSON body: nested too deeply") from None


def episode_of(request: Any) -> str | None:
    """The episode a request names, by its URL or the X-Forge-Episode header (None: none)."""
    episode_id = request.path_params.get("episode_id") or request.headers.get("x-forge-episode")
    if episode_id is not None and not EPISODE_ID.match(episode_id):
        raise RequestRefused(400, "episode id: expected 1-128 letters, digits, '.', '_' or '-'")
    return episode_id


def handled(endpoint: Callable, shape: Callable[..., Any] = error) -> Callable:
    """The endpoint with forge-bridge's errors turned into their HTTP statuses, in `shape`."""
    async def run(request: Any):
        try:
            return await endpoint(request)
        except RequestRefused as exc:
            return shape(exc.status, str(exc), exc.kind)
        except NotFound as exc:
            return shape(404, exc.args[0] if exc.args else "not found")
        except EpisodeClosed as exc:
            return shape(409, str(exc))
        except PolicyError as exc:
            return shape(502, f"the policy failed: {exc}", "policy_error")
        except (ValueError, TypeError, SchemaError) as exc:
            return shape(400, str(exc))
    return run


def sse(events: Iterable[str]) -> Any:
    """Server-sent events, already formatted, as a streaming response."""
    from starlette.responses import StreamingResponse

    return StreamingResponse(iter(events), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def check_feedback(body: Any) -> dict:
    """A feedback request's body: a JSON object with a value, and nothing it does not know."""
    if not isinstance(body, dict) or "value" not in body:
        raise RequestRefused(400, 'the body must be a JSON object with a "value" (and optionally "key", '
                                  '"comment", "step")')
    unknown = set(body) - {"value", "key", "comment", "step"}
    if unknown:
        raise RequestRefused(400, f"unknown fields {sorted(unknown)}: expected value, key, comment, step")
    return body


async def not_found(request: Any, exc: Any) -> Any:
    """Starlette's 404 and 405, as OpenAI-style errors."""
    if exc.status_code == 405:
        return error(405, f"{request.method} is not allowed on {request.url.path}")
    return error(exc.status_code, f"no route {request.method} {request.url.path}")


def build_app(gateway: "Gateway") -> Any:
    """The gateway's Starlette app."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    @handled
    async def models(request: Request):
        authorize(gateway, request)
        names = [gateway.model_name] + [v for v in gateway.policy.versions() if v]
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "owned_by": "forge-bridge"} for n in names]})

    @handled
    async def finish(request: Request):
        authorize(gateway, request)
        body = await read_json(gateway, request)
        if not isinstance(body, dict):
            raise RequestRefused(400, "the body must be a JSON object")
        episode_id = cast(str, episode_of(request))  # the route's path names it
        return JSONResponse(gateway.finish(episode_id, body.get("reward"), body.get("status"),
                                           body.get("error")))

    @handled
    async def feedback(request: Request):
        authorize(gateway, request)
        body = check_feedback(await read_json(gateway, request))
        return JSONResponse(gateway.feedback(cast(str, episode_of(request)), body))  # the route's path names it

    episode = "/episodes/{episode_id:str}"
    routes = [Route("/health", health, methods=["GET"]),
              Route("/v1/models", models, methods=["GET"]),
              Route(f"{episode}/v1/models", models, methods=["GET"]),
              Route(f"{episode}/finish", finish, methods=["POST"]),
              Route(f"{episode}/feedback", feedback, methods=["POST"])]
    routes += [Route(f"{prefix}/v1{path}", endpoint, methods=["POST"])
               for path, endpoint in model_calls(gateway).items() for prefix in ("", episode)]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found})


def model_calls(gateway: "Gateway") -> dict[str, Callable]:
    """The endpoints of a model call, one per API, by their path under `/v1`."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    async def chat(request: Request):
        authorize(gateway, request)
        body = await read_json(gateway, request)
        check_request(body)
        completion = await gateway.complete(body, episode_of(request), request.headers)
        if not body.get("stream"):
            return JSONResponse(completion)
        return sse([*(f"data: {json.dumps(chunk)}\n\n" for chunk in gateway.chunks(completion)), "data: [DONE]\n\n"])

    async def responses(request: Request):
        from forge_bridge.serving import responses_api

        authorize(gateway, request)
        reply, stream = await gateway.respond(await read_json(gateway, request), episode_of(request), request.headers)
        return sse(responses_api.events(reply)) if stream else JSONResponse(reply)

    async def messages(request: Request):
        from forge_bridge.serving import messages_api

        authorize(gateway, request)
        reply, stream = await gateway.message(await read_json(gateway, request), episode_of(request), request.headers)
        return sse(messages_api.events(reply)) if stream else JSONResponse(reply)

    async def count_tokens(request: Request):
        authorize(gateway, request)
        episode_of(request)  # a malformed episode id is refused here too
        return JSONResponse(gateway.count_tokens(await read_json(gateway, request)))

    return {"/chat/completions": handled(chat), "/responses": handled(responses),
            "/messages": handled(messages, anthropic_error),
            "/messages/count_tokens": handled(count_tokens, anthropic_error)}


__all__ = ["MAX_BODY", "ChatCall", "RequestRefused", "anthropic_error", "build_app", "chat_call", "check_feedback",
           "check_fields", "check_request", "expect", "model_calls", "not_found", "sse"]

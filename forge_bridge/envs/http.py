"""Tools backed by an HTTP API, as an environment.

Each `HTTPTool` maps a tool call onto one request: `{name}` placeholders in the path take the
argument of that name (URL-quoted, so an argument can never add path segments or a query),
the other arguments go into the query string (GET, DELETE) or a JSON body (POST, PUT, PATCH).
The observation is the status line and the body (bounded); 4xx/5xx answers, timeouts and
refused connections are error observations, recorded with the status in the step's info.

`JSONService` is a small JSON API on 127.0.0.1 that the environment can start for itself, so a
task's world (an inventory, a ticket queue) lives in a real server the checker can inspect.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from forge_bridge.core.errors import InvalidArgument, InvalidState, WrongType
from forge_bridge.envs.tool import ToolEnvironment, ToolError, ToolTask, function_schema

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
Handler = Callable[[dict, Any], "tuple[int, Any]"]
"""(path and query parameters, JSON body or None) -> (HTTP status, JSON-able answer)."""


@dataclass(frozen=True)
class HTTPTool:
    """One tool = one request to the API."""

    name: str
    """Tool name the model calls."""
    description: str
    """What the tool does (shown to the model)."""
    method: str
    """HTTP method."""
    path: str
    """Path with `{argument}` placeholders, e.g. '/items/{sku}'."""
    parameters: dict = field(default_factory=dict)
    """JSON-schema properties of the arguments, e.g. {'sku': {'type': 'string'}}."""
    required: tuple[str, ...] = ()
    """Arguments the call must give (the path placeholders are always required)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", str(self.method).upper())
        if self.method not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            raise InvalidArgument(f"HTTPTool.method: expected GET, POST, PUT, PATCH or DELETE, got {self.method!r}")
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise InvalidArgument(f"HTTPTool.path: expected a path starting with '/', got {self.path!r}")
        missing = [p for p in _PLACEHOLDER.findall(self.path) if p not in self.parameters]
        if missing:
            raise InvalidArgument(f"HTTPTool.path: placeholder(s) {missing} are not in parameters")
        object.__setattr__(self, "required", tuple(dict.fromkeys(
            (*_PLACEHOLDER.findall(self.path), *self.required))))

    def schema(self) -> dict:
        return function_schema(self.name, self.description, self.parameters, self.required)


class HTTPToolEnvironment(ToolEnvironment):
    """HTTP tools against `base_url`, or against a `JSONService` the environment starts."""

    def __init__(self, tools: list[HTTPTool], *, base_url: str | None = None,
                 service: "JSONService | None" = None, timeout_s: float = 5.0,
                 max_observation_chars: int = 8000) -> None:
        import httpx

        if not tools or not all(isinstance(t, HTTPTool) for t in tools):
            raise WrongType("tools: expected a non-empty list of HTTPTool")
        if (base_url is None) == (service is None):
            raise InvalidArgument("pass either base_url (an API already running) or service (one to start)")
        self.http_tools = {t.name: t for t in tools}
        self.service = service
        if service is not None:
            service.start()
            base_url = service.url
        self.base_url = str(base_url).rstrip("/")
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s, trust_env=False)
        super().__init__(max_observation_chars, tool_timeout_s=timeout_s + 30)

    def tool_functions(self) -> dict[str, tuple[dict, Callable[..., Any]]]:
        return {name: (tool.schema(), lambda _tool=tool, **args: self.request(_tool, args))
                for name, tool in self.http_tools.items()}

    def begin(self, task: ToolTask) -> None:
        if self.service is not None:
            self.service.reset()

    def request(self, tool: HTTPTool, args: dict) -> tuple[str, dict]:
        import httpx

        rest = dict(args)
        path = _PLACEHOLDER.sub(lambda m: urllib.parse.quote(str(rest.pop(m.group(1))), safe=""), tool.path)
        send: dict[str, Any] = {"params": rest} if tool.method in ("GET", "DELETE") else {"json": rest}
        try:
            response = self._client.request(tool.method, self.base_url + path, **send)
        except httpx.TimeoutException:
            raise ToolError(f"{tool.method} {path} timed out after {self.timeout_s} s", http_status=None) from None
        except httpx.HTTPError as exc:
            raise ToolError(f"{tool.method} {path} failed: {type(exc).__name__}: {exc}", http_status=None) from None
        body = response.content.decode("utf-8", errors="replace")
        text = f"HTTP {response.status_code}\n{body}"
        if response.status_code >= 400:
            raise ToolError(text, http_status=response.status_code)
        return text, {"http_status": response.status_code}

    def close(self) -> None:
        self._client.close()
        if self.service is not None:
            self.service.stop()


class JSONService:
    """A small JSON API on 127.0.0.1 (a free port): routes `(METHOD, '/path/{param}') -> handler`.

    `state` is the service's world; `initial` is copied into it on every episode's reset, and
    the task's checker reads it to decide pass/fail.
    """

    def __init__(self, routes: dict[tuple[str, str], Handler], initial: dict | None = None,
                 host: str = "127.0.0.1") -> None:
        self.routes = [(m.upper(), re.compile("^" + _PLACEHOLDER.sub(r"(?P<\1>[^/]+)", p) + "$"), h)
                       for (m, p), h in routes.items()]
        self.initial = initial or {}
        self.state: dict = {}
        self.host = host
        self._server: ThreadingHTTPServer | None = None
        self.lock = threading.Lock()
        self.reset()

    @property
    def url(self) -> str:
        if self._server is None:
            raise InvalidState("the service is not running")
        return f"http://{self.host}:{self._server.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.state = json.loads(json.dumps(self.initial))

    def start(self) -> None:
        if self._server is not None:
            return
        service = self

        class _Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, answer = service.dispatch(self.command, url.path, url.query, raw)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        self._server = ThreadingHTTPServer((self.host, 0), _Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="json-service").start()

    def dispatch(self, method: str, path: str, query: str, raw: bytes) -> tuple[int, Any]:
        for route_method, pattern, handler in self.routes:
            match = pattern.match(path)
            if match and route_method == method:
                params = {k: urllib.parse.unquote(v) for k, v in match.groupdict().items()}
                params.update(dict(urllib.parse.parse_qsl(query)))
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    return 400, {"error": "the body is not JSON"}
                try:
                    with self.lock:
                        return handler(params, body)
                except Exception as exc:  # the service's own bug: a 500 the model observes
                    return 500, {"error": f"{type(exc).__name__}: {exc}"}
        return 404, {"error": f"no route for {method} {path}"}

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


__all__ = ["HTTPTool", "HTTPToolEnvironment", "JSONService"]

"""`forge-bridge inspect`: the pages served on 127.0.0.1 by Starlette and uvicorn, the gateway's
stack (`serving.background`), over one read-only store."""

from __future__ import annotations

import html
import traceback
import warnings
from pathlib import Path
from typing import Any

from forge_bridge.app.inspector import pages
from forge_bridge.app.inspector.data import Filters, RunView
from forge_bridge.core.errors import ForgeBridgeError, InvalidState, NotFound
from forge_bridge.serving.background import BackgroundServer

HEADERS = {
    # the pages run no script and load nothing: a text that slipped through cannot either
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


def route(view: RunView, path: str, query: dict[str, str]) -> tuple[int, str]:
    """(HTTP status, page) for a GET of `path`."""
    try:
        if path == "/":
            return 200, pages.index(view)
        if path == "/trajectories":
            return 200, pages.trajectories(view, Filters.from_query(query))
        if path.startswith("/trajectory/"):
            return 200, pages.trajectory(view, path.removeprefix("/trajectory/"), query.get("colour", "logprob"))
        if path.startswith("/group/"):
            return 200, pages.group(view, path.removeprefix("/group/"))
        if path == "/compare":
            return 200, pages.compare(view, query.get("task", ""), query.get("a", ""), query.get("b", ""))
        return 404, pages.layout("Not found", f"<p>No page {html.escape(path)}.</p>")
    except NotFound as exc:
        return 404, pages.layout("Not found", f"<p>{html.escape(str(exc))}</p>")
    except ForgeBridgeError as exc:  # a bad filter or sort: say so on the page
        return 400, pages.layout("Bad request", f"<p>{html.escape(str(exc))}</p>")


class Inspector:
    """The inspector over one run folder (or `store=`), served at `url` until `close()`."""

    def __init__(self, folder: str | Path | None = None, *, store: str | Path | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.view = RunView(folder, store=store)
        if host not in ("127.0.0.1", "localhost", "::1"):
            warnings.warn(f"inspect: serving on {host}, not loopback: anyone who can reach it reads every "
                          "trajectory of this run (there is no login)", RuntimeWarning, stacklevel=2)
        self.host = host
        self._server: BackgroundServer | None = BackgroundServer(self._app(), host, port, name="inspector")
        self._server.start()

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import HTMLResponse
        from starlette.routing import Route

        def page(request: Request) -> HTMLResponse:  # sync: Starlette runs it on its thread pool
            if not self.host_allowed(request.headers.get("host", "")):
                # another site's page, its name rebound to 127.0.0.1, would read the run: refuse
                status, body = 421, pages.layout("Refused", "<p>Unknown Host header.</p>")
            else:
                try:
                    status, body = route(self.view, request.scope["path"], dict(request.query_params))
                except Exception:  # a page bug: show it, keep serving
                    status, body = 500, pages.layout("Error", f"<pre>{html.escape(traceback.format_exc())}</pre>")
            return HTMLResponse(body, status_code=status, headers=HEADERS)

        return Starlette(routes=[Route("/{path:path}", page, methods=["GET"])])

    def host_allowed(self, header: str) -> bool:
        """The Host a browser sends must name this server: loopback (or the address it was
        bound to) and its port. Anything else is a DNS-rebinding page and is refused."""
        if self._server is None:
            return False
        port = self._server.port
        return header in {f"{name}:{port}" for name in ("127.0.0.1", "localhost", "[::1]", self.host)}

    @property
    def url(self) -> str:
        if self._server is None:
            raise InvalidState("the inspector is closed")
        return f"http://{self.host}:{self._server.port}"

    def serve_forever(self) -> None:
        """Block until interrupted (the command line's way)."""
        if self._server is not None:
            self._server.wait()
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
            self.view.close()

    def __enter__(self) -> "Inspector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Inspector", "route"]

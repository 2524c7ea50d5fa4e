"""An ASGI app (Starlette) served by uvicorn on a background thread: the gateway's and the
inspector's one way to serve. The socket is bound before the thread starts, so port 0 gets a
free port that is known at once, and `start` returns only when the server accepts connections."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from forge_bridge.core.errors import InvalidState


class BackgroundServer:
    """`server = BackgroundServer(app, "127.0.0.1", 0, name="forge-gateway"); server.start()`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, name: str = "forge-server",
                 **uvicorn_options: Any) -> None:
        self.app, self.host, self.port, self.name = app, host, port, name
        self.options = {"log_level": "warning", "lifespan": "off", "access_log": False, **uvicorn_options}
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.started and not self._server.should_exit

    def start(self, timeout_s: float = 30.0) -> None:
        """Bind, serve on a daemon thread, and wait until connections are accepted."""
        import uvicorn

        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, **self.options))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name=self.name,
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise InvalidState(f"{self.name} did not start (see the log above)")
            time.sleep(0.01)

    def wait(self) -> None:
        """Block until the server stops (the command line's way; Ctrl-C stops it)."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop serving (connections in flight finish first); safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=30)


__all__ = ["BackgroundServer"]

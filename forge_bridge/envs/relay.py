"""A byte relay between a TCP port and a Unix socket, so a sandboxed program reaches one server.

The sandbox has a network namespace of its own, empty but for its loopback; a program in it that
must call the gateway (an agent harness: Codex, Claude Code) gets it through a Unix socket bound
into the sandbox. Outside, `Relay(unix=path, tcp=(host, port))` accepts on the socket and
connects to the gateway; inside, this file runs as a script under the system's Python (standard
library only: the sandbox sees `/usr`, not the trainer's environment) --

    python3 relay.py --port P --socket /run/forge/gateway.sock -- PROGRAM ARGS...

-- listening on the sandbox's own 127.0.0.1:P, forwarding each connection to the socket, and
running the program; it exits with the program's exit status. Nothing else is reachable: every
other address fails as it does with no network at all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading
from typing import Callable


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy until `source` ends, then end the writing half of `sink` (a half-close, as HTTP's
    request-then-reply needs)."""
    with contextlib.suppress(OSError):
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _join(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    try:
        upstream = connect()
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


class Relay:
    """Accept on one side (a Unix socket path, or 127.0.0.1:port) and connect each connection
    to the other; `with Relay(unix=..., tcp=..., on_unix=True):` serves on a daemon thread."""

    def __init__(self, *, unix: str, tcp: tuple[str, int], on_unix: bool) -> None:
        self.unix, self.tcp, self.on_unix = unix, tcp, on_unix
        self._server: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self.on_unix:
            return socket.create_connection(self.tcp)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.unix)
        except OSError:
            s.close()
            raise
        return s

    def start(self) -> "Relay":
        if self.on_unix:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(self.unix)
            os.chmod(self.unix, 0o777)  # the sandbox's user (uid 65534 under a root trainer) connects
        else:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(self.tcp)
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), name="forge-relay", daemon=True).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:  # closed by stop()
                return
            threading.Thread(target=_join, args=(client, self._connect), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None

    def __enter__(self) -> "Relay":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    """Inside the sandbox: listen on 127.0.0.1:port, relay to the socket, run the program."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("no program to run after --")
    with Relay(unix=args.socket, tcp=("127.0.0.1", args.port), on_unix=False):
        try:
            return subprocess.call(program, stdin=subprocess.DEVNULL)
        except OSError as exc:
            print(f"relay: could not start {program[0]!r}: {exc.strerror or exc}", file=sys.stderr)
            return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A deadline for a synchronous call that cannot be interrupted (a tool function).

The call runs on a daemon thread; when the deadline passes the caller gets `TimeoutError` and
goes on. Python cannot kill a thread, so a tool that never returns keeps its thread until the
process ends: tools that can hang for good should run as confined subprocesses instead
(`forge_bridge.envs.confined`), which are killed.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Callable


def call_with_timeout(fn: Callable[..., Any], timeout_s: float | None, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, or TimeoutError after `timeout_s` seconds (None: no deadline)."""
    if timeout_s is None:
        return fn(*args, **kwargs)
    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()  # the current episode follows the call onto the thread

    def target() -> None:
        try:
            outcome["value"] = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed back to the caller below
            outcome["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name=f"deadline-{getattr(fn, '__name__', 'call')}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {timeout_s} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


__all__ = ["call_with_timeout"]

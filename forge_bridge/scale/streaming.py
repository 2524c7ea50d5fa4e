"""Episodes recorded on a worker, written into the trainer's store as they happen.

On the worker, `StreamingStore` is the store its episodes record into: an in-memory SQLite
store (the same checks as the trainer's) that also hands every write, as plain data, to the
queue of the job that made it. The trainer's side replays each write, in order, on its own
store with `apply`. A write is sent once and applied once; a worker that dies mid-episode has
sent every step recorded before it died, and the episode stays open (`incomplete`).
"""

from __future__ import annotations

import contextvars
import queue
import threading

from forge_bridge.core.errors import StoreError
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Trajectory, Transition

Op = tuple
"""("begin", trajectory dict) | ("append", id, step, transition dict) |
("update", id, step, transition dict) | ("finish", id, end reason, reward, metadata, detail)"""

SINK: contextvars.ContextVar["queue.Queue | None"] = contextvars.ContextVar("forge_bridge_sink", default=None)
"""The queue of the job running in this context (set by the worker around each episode)."""


class StreamingStore(TrajectoryStore):
    """A worker's store: keeps the episodes in flight in memory and streams every write."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self._sinks: dict[str, queue.Queue] = {}
        self._begun: dict[int, list[str]] = {}  # id(sink) -> trajectories its job began
        self._sinks_lock = threading.Lock()

    def _sink(self, trajectory_id: str) -> queue.Queue:
        with self._sinks_lock:
            sink = self._sinks.get(trajectory_id)
        if sink is None:
            raise StoreError(f"trajectory {trajectory_id} was not begun by a job on this worker")
        return sink

    def begin(self, trajectory: Trajectory) -> None:
        # A crew's role trajectory belongs to its parent's job, whatever thread or context begins
        # it (a framework thread may still carry an earlier job's context).
        parent = trajectory.metadata.get("parent")
        sink = self._sink(str(parent)) if parent is not None else SINK.get()
        if sink is None:
            raise StoreError(f"trajectory {trajectory.id}: begun outside a job on this worker")
        super().begin(trajectory)
        with self._sinks_lock:
            self._sinks[trajectory.id] = sink
            self._begun.setdefault(id(sink), []).append(trajectory.id)
        sink.put(("begin", trajectory.to_dict()))

    def append(self, trajectory_id: str, transition: Transition) -> int:
        step = super().append(trajectory_id, transition)
        self._sink(trajectory_id).put(("append", trajectory_id, step, transition.to_dict()))
        return step

    def update_step(self, trajectory_id: str, step: int, transition: Transition) -> None:
        super().update_step(trajectory_id, step, transition)
        self._sink(trajectory_id).put(("update", trajectory_id, step, transition.to_dict()))

    def finish(self, trajectory_id: str, end_reason: str, reward: float | None = None,
               metadata: dict | None = None, end_detail: str | None = None) -> None:
        super().finish(trajectory_id, end_reason, reward, metadata, end_detail)
        self._sink(trajectory_id).put(("finish", trajectory_id, end_reason, reward, metadata, end_detail))

    def forget(self, sink: queue.Queue) -> None:
        """Drop from memory every trajectory the job of `sink` began, once the trainer has them."""
        with self._sinks_lock:
            ids = self._begun.pop(id(sink), [])
            for tid in ids:
                self._sinks.pop(tid, None)
        self.delete(ids)


def apply(store: TrajectoryStore, op: Op) -> None:
    """Replay one write of a worker on the trainer's store."""
    kind = op[0]
    if kind == "begin":
        store.begin(Trajectory.from_dict(op[1]))
    elif kind == "append":
        _, tid, step, data = op
        got = store.append(tid, Transition.from_dict(data))
        if got != step:
            raise StoreError(f"trajectory {tid}: the worker recorded step {step}, the store has it as {got}")
    elif kind == "update":
        store.update_step(op[1], op[2], Transition.from_dict(op[3]))
    elif kind == "finish":
        _, tid, end_reason, reward, metadata, detail = op
        store.finish(tid, end_reason, reward=reward, metadata=metadata, end_detail=detail)
    else:
        raise StoreError(f"unknown store operation from a worker: {kind!r}")


__all__ = ["SINK", "StreamingStore", "apply"]

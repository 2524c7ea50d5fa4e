"""The user's rollout function on Ray actors, with the trainer's loop unchanged:

    rollouts = RayRollouts(lambda policy: make_rollout(build_agent(policy)), num_workers=4)
    trainer.train(rollout=rollouts, tasks=tasks, iterations=20)

Each worker actor builds its own agent once, with `make_rollout(policy)`, where `policy` is a
client of the trainer's policy backend (a `VLLMPolicy` URL, a `PolicyPool`, a `RayPolicy`).
Before each episode the worker's client mirrors the versions the trainer's policy serves, so
each step records the adapter that produced it. A job runs in an episode on the worker's
`StreamingStore`; its writes come back as they happen (long polls: each returns as soon as
there is a write) and the trainer's side replays them on its own store, once each, in order. A worker that dies mid-episode (killed, out of memory, its
node gone) leaves that episode `incomplete` with every step it had sent; the iteration goes on
with the other workers and a fresh worker takes the dead one's place.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import queue
import socket
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable

from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument, WrongType
from forge_bridge.policies.base import ClientSpec, Policy
from forge_bridge.scale.cluster import ensure_ray, require_ray
from forge_bridge.scale.streaming import SINK, StreamingStore, apply
from forge_bridge.trainer.rollouts import EpisodeRunner, Job, Outcome, Rollout, run_episode


class RolloutWorker:
    """One Ray actor: its own agent, its own policy client, episodes streamed back."""

    def __init__(self, make_rollout: Callable[[Policy], Rollout], spec: ClientSpec) -> None:
        self.policy = spec.connect()
        self.rollout = make_rollout(self.policy)
        if not callable(self.rollout):
            raise WrongType(f"make_rollout(policy) must return a function task -> reward, got "
                            f"{type(self.rollout).__name__}")
        self.store = StreamingStore()
        self.recorder = Recorder(self.store)
        self._sinks: dict[str, queue.Queue] = {}
        self._keys = itertools.count()
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        """Where this worker runs (host:pid), tagged on each of its episodes as `worker`."""

    def ready(self) -> int:
        return os.getpid()

    def start(self, job: Job, run_id: str, serving: dict) -> str:
        """Begin the job's episode on a thread of its own; returns the key `take` reads it by."""
        self.policy.mirror(serving)
        job = dataclasses.replace(job, metadata={**job.metadata, "worker": self.name})
        sink: queue.Queue = queue.Queue()
        key = f"{job.group_id}/{next(self._keys)}"
        self._sinks[key] = sink

        def episode() -> None:
            SINK.set(sink)  # this thread's context: every write of the job lands in its queue
            outcome = Outcome(crash=f"task {job.task_id!r}: the worker failed before the episode began")
            try:
                outcome = run_episode(self.rollout, job, self.recorder, run_id)
            except Exception as exc:  # the store or the episode itself failed on the worker
                outcome = Outcome(crash=f"task {job.task_id!r}: {type(exc).__name__}: {exc}")
            finally:
                sink.put(("done", outcome))

        threading.Thread(target=episode, daemon=True, name=f"episode-{key}").start()
        return key

    def take(self, key: str, wait_s: float = 1.0) -> list:
        """The writes of job `key` since the last `take`, waiting up to `wait_s` for the first;
        the list ends with ("done", Outcome) once the episode is over."""
        sink = self._sinks[key]
        try:
            batch = [sink.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while batch[-1][0] != "done":
            try:
                batch.append(sink.get_nowait())
            except queue.Empty:
                break
        if batch[-1][0] == "done":
            del self._sinks[key]
            self.store.forget(sink)
        return batch

    def close(self) -> None:
        self.policy.close()


class RayRollouts(EpisodeRunner):
    """An `EpisodeRunner`: the trainer hands it each iteration's jobs (see the module docstring)."""

    def __init__(self, make_rollout: Callable[[Policy], Rollout], *, num_workers: int = 2,
                 resources: dict | None = None, episodes_per_worker: int = 1,
                 ray_init: dict | None = None, start_timeout_s: float = 300.0,
                 poll_timeout_s: float = 60.0) -> None:
        """`make_rollout(policy)` builds one worker's agent and returns its rollout function;
        `resources`: Ray's options for each worker actor (`num_cpus`, `num_gpus`, `resources`,
        `runtime_env`, ...); `episodes_per_worker`: episodes one worker runs at once (its agent
        object is then shared by threads, as in the threaded loop); `ray_init`: `ray.init`
        arguments when this process has not joined a cluster yet; `start_timeout_s`: how long
        the workers may take to be scheduled and build their agents; `poll_timeout_s`: how long
        a worker may leave a poll unanswered (each returns within a second) before it counts as lost."""
        if not callable(make_rollout):
            raise WrongType(f"make_rollout: expected a function policy -> rollout, got {type(make_rollout).__name__}")
        for name, value in (("num_workers", num_workers), ("episodes_per_worker", episodes_per_worker)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name}: expected an int >= 1, got {value!r}")
        if resources is not None and not isinstance(resources, dict):
            raise WrongType(f"resources: expected Ray actor options as a dict, got {type(resources).__name__}")
        if "max_concurrency" in (resources or {}):
            raise InvalidArgument("resources: max_concurrency is set from episodes_per_worker; use that")
        self.make_rollout = make_rollout
        self.num_workers = num_workers
        self.resources = {"num_cpus": 1, **(resources or {})}
        self.episodes_per_worker = episodes_per_worker
        self.ray_init = ray_init
        self.start_timeout_s = float(start_timeout_s)
        self.poll_timeout_s = float(poll_timeout_s)
        self._spec: ClientSpec | None = None
        self._workers: list[Any] = []
        self._replaced: dict[Any, Any] = {}  # dead worker -> the one that took its place
        self._lock = threading.Lock()
        self.lost_workers = 0
        """Workers that died and were replaced."""

    @property
    def workers(self) -> list[Any]:
        """The live worker actors' handles."""
        with self._lock:
            return list(self._workers)

    def _new_worker(self) -> Any:
        ray = ensure_ray(self.ray_init)
        actor = ray.remote(RolloutWorker).options(max_concurrency=2 * self.episodes_per_worker + 2,
                                                  **self.resources)
        return actor.remote(self.make_rollout, self._spec)

    def _start(self, spec: ClientSpec) -> None:
        ray = ensure_ray(self.ray_init)
        if self._workers and spec == self._spec:
            return
        self.shutdown()
        self._spec = spec
        workers = [self._new_worker() for _ in range(self.num_workers)]
        pending = [w.ready.remote() for w in workers]
        try:
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=self.start_timeout_s)
            ray.get(ready)
        except ray.exceptions.RayError as exc:
            for w in workers:
                ray.kill(w)
            raise InvalidArgument(f"the rollout workers could not start: {exc}") from None
        if len(ready) < len(pending):
            for w in workers:
                ray.kill(w)
            raise InvalidArgument(
                f"only {len(ready)} of {len(pending)} rollout workers started within {self.start_timeout_s:.0f} s: "
                f"each asks for {self.resources} and the cluster has {ray.available_resources()} free "
                "(ray.init(num_cpus=...) sets how many logical CPUs a local cluster offers)")
        with self._lock:
            self._workers = workers

    def _current(self, worker: Any) -> Any:
        """`worker`, or the one that replaced it if it died."""
        with self._lock:
            while worker in self._replaced:
                worker = self._replaced[worker]
            return worker

    def _replace(self, dead: Any) -> Any:
        """The worker that takes a dead one's place (made once, whoever asks first)."""
        with self._lock:
            if dead in self._replaced:
                return self._replaced[dead]
            try:  # it may only be unreachable: make sure it is gone and frees its resources
                require_ray().kill(dead)
            except Exception:
                pass
            fresh = self._new_worker()
            self._replaced[dead] = fresh
            self._workers = [fresh if w is dead else w for w in self._workers]
            self.lost_workers += 1
            return fresh

    def run_episodes(self, jobs: list[Job], *, policy: Any, recorder: Recorder, run_id: str,
                     desc: str = "rollouts", progress: bool = True) -> list[Outcome]:
        """Run the jobs on the workers; each episode lands in `recorder`'s store."""
        from tqdm.auto import tqdm

        if not isinstance(policy, Policy):
            raise WrongType(f"policy: expected the forge_bridge Policy the trainer publishes to, "
                            f"got {type(policy).__name__}")
        ray = ensure_ray(self.ray_init)
        self._start(policy.client_spec())
        serving = policy.serving_state()
        idle: queue.Queue = queue.Queue()
        for worker in self.workers:
            for _ in range(self.episodes_per_worker):
                idle.put(worker)

        def one(job: Job) -> Outcome:
            worker = self._current(idle.get())
            for attempt in range(3):
                begun: list[dict] = []
                outcome: Outcome | None = None
                try:
                    # the worker may still be building its agent (a replacement): as long as a start
                    key = ray.get(worker.start.remote(job, run_id, serving), timeout=self.start_timeout_s)
                    while outcome is None:  # long polls: each returns as soon as there is a write
                        for op in ray.get(worker.take.remote(key), timeout=self.poll_timeout_s):
                            if op[0] == "done":
                                outcome = op[1]
                                continue
                            apply(recorder.store, op)
                            if op[0] == "begin":
                                begun.append(op[1])
                except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
                    # dead, unreachable, or not answering: replaced, and its job lost or run again
                    worker = self._replace(worker)
                    if not begun and attempt < 2:  # nothing was recorded: run the job on the fresh worker
                        continue
                    idle.put(worker)
                    roles = [t["id"] for t in begun if t["metadata"].get("parent")]
                    return Outcome(opened=roles or [t["id"] for t in begun],
                                   lost=f"task {job.task_id!r}: its worker was lost ({type(exc).__name__}) "
                                        f"mid-episode; {len(begun)} trajectory(ies) kept incomplete")
                idle.put(worker)
                return outcome
            raise AssertionError("unreachable")

        with ThreadPoolExecutor(self.num_workers * self.episodes_per_worker) as pool:
            futures = [pool.submit(one, job) for job in jobs]
            for f in tqdm(as_completed(futures), total=len(futures), desc=desc, leave=False,
                          disable=not progress):
                f.result()
        return [f.result() for f in futures]

    def shutdown(self) -> None:
        """Stop the workers (a later iteration starts fresh ones)."""
        ray: Any = ensure_ray(self.ray_init) if self._workers else None  # Ray itself (untyped), or no workers
        with self._lock:
            workers, self._workers = self._workers, []
            self._replaced.clear()
        for w in workers:
            try:
                ray.get(w.close.remote(), timeout=10)
            except Exception:  # already dead: nothing to close
                pass
            ray.kill(w)

    def __enter__(self) -> "RayRollouts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


__all__ = ["RayRollouts", "RolloutWorker"]

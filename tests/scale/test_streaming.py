"""A worker's episode, replayed write by write on the trainer's store, is the same trajectory;
a job's writes never land in another job's queue; what a worker had sent before it died stays."""

import queue
import threading

import pytest

from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import StoreError
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Observation, Trajectory, Transition
from forge_bridge.scale.streaming import SINK, StreamingStore, apply


def step(text: str) -> Transition:
    return Transition(observation=Observation(messages=[{"role": "user", "content": "hi"}]),
                      action=Action(content=text), prompt_token_ids=[1, 2], completion_token_ids=[3, 4],
                      completion_logprobs=[-0.5, -0.25], version="run-v2", temperature=0.7)


def record(worker: StreamingStore, sink: queue.Queue, name: str, steps: int, crew: bool = False) -> str:
    SINK.set(sink)
    with Recorder(worker, run_id="run").episode(name, "group", metadata={"iteration": 3}) as ep:
        target = ep.child("writer") if crew else ep
        for k in range(steps):
            target.record(step(f"{name} {k}"))
        target.step_reward(0.5, step=0)
        ep.reward(1.0)
    return ep.id


def drain(sink: queue.Queue) -> list:
    out = []
    while not sink.empty():
        out.append(sink.get())
    return out


def comparable(t) -> dict:
    d = t.to_dict()
    for s in d["transitions"]:
        s.pop("timestamp")
    return d


def test_a_replayed_episode_is_the_same_trajectory(tmp_path):
    worker, trainer = StreamingStore(), TrajectoryStore(tmp_path / "trainer.db")
    sinks = [queue.Queue(), queue.Queue()]
    ids = [None, None]

    def job(i: int) -> None:  # two jobs at once on one worker, each on its own thread and queue
        ids[i] = record(worker, sinks[i], f"task{i}", steps=2 + i, crew=(i == 1))

    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for i, sink in enumerate(sinks):
        ops = drain(sink)
        assert {op[1]["task_id"] for op in ops if op[0] == "begin"} == {f"task{i}"}  # never mixed
        for op in ops:
            apply(trainer, op)
    assert trainer.count() == worker.count() == 3  # the crew's role has its own trajectory
    for t in worker.trajectories():
        assert comparable(trainer.get(t.id)) == comparable(t)
    writer = [t for t in trainer.trajectories() if t.role == "writer"][0]
    assert writer.reward == 1.0 and writer.transitions[0].reward == 0.5 and len(writer.transitions) == 3
    for sink in sinks:  # each job's trajectories leave the worker's memory, a crew's parent too
        worker.forget(sink)
    assert worker.count() == 0


def test_a_role_begun_on_a_thread_carrying_another_jobs_context_goes_with_its_parent(tmp_path):
    worker = StreamingStore()
    mine, other = queue.Queue(), queue.Queue()
    SINK.set(mine)
    ep = Recorder(worker, run_id="run").episode("crew", "g")
    begun = []

    def framework_thread() -> None:  # still carries an earlier job's context
        SINK.set(other)
        begun.append(ep.child("writer").id)

    t = threading.Thread(target=framework_thread)
    t.start()
    t.join()
    assert other.empty() and [op[1]["id"] for op in drain(mine) if op[0] == "begin"] == [ep.id, begun[0]]


def test_writes_sent_before_a_worker_dies_stay_and_the_episode_stays_open(tmp_path):
    worker, trainer = StreamingStore(), TrajectoryStore(tmp_path / "trainer.db")
    sink: queue.Queue = queue.Queue()
    SINK.set(sink)
    ep = Recorder(worker, run_id="run").episode("t", "g")
    ep.record(step("first"))
    for op in drain(sink):  # the worker dies here: nothing more arrives
        apply(trainer, op)
    (t,) = trainer.trajectories()
    assert t.status == "incomplete" and t.end_reason is None and [s.action.content for s in t.transitions] == ["first"]


def test_a_write_that_does_not_fit_the_trainers_store_is_an_error(tmp_path):
    trainer = TrajectoryStore(tmp_path / "trainer.db")
    apply(trainer, ("begin", Trajectory(id="x", run_id="r").to_dict()))
    with pytest.raises(StoreError, match="step 3"):
        apply(trainer, ("append", "x", 3, step("late").to_dict()))
    with pytest.raises(StoreError, match="unknown"):
        apply(trainer, ("delete", "x"))
    SINK.set(None)
    with pytest.raises(StoreError, match="outside a job"):
        StreamingStore().begin(Trajectory())

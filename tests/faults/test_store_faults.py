"""Store faults: SIGKILL mid-write, many concurrent writers, a full disk and a read-only one:
a clear StoreError, and nothing already stored is lost."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Observation, Trajectory, Transition


def step(i: int, size: int = 3) -> Transition:
    return Transition(observation=Observation(messages=[{"role": "user", "content": f"q{i}" * size}]),
                      action=Action(content=f"a{i}", finish_reason="stop"),
                      prompt_token_ids=[1, 2, i] * size, completion_token_ids=[3, i],
                      completion_logprobs=[-0.1, -0.2], version="r-v0")


def test_killed_writer_leaves_every_committed_step_and_an_incomplete_trajectory(tmp_path):
    db = tmp_path / "kill.db"
    writer = textwrap.dedent(f"""
        import sys
        from forge_bridge.core.store import TrajectoryStore
        from forge_bridge.core.types import Action, Observation, Trajectory, Transition
        store = TrajectoryStore({str(db)!r})
        traj = Trajectory(id="victim", task_id="t")
        store.begin(traj)
        i = 0
        while True:
            t = Transition(observation=Observation(messages=[{{"role": "user", "content": "x" * 2000}}]),
                           action=Action(content=str(i)), prompt_token_ids=list(range(500)),
                           completion_token_ids=[i], completion_logprobs=[-1.0])
            store.append("victim", t)
            print(i, flush=True)
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    acknowledged = -1
    while acknowledged < 200:  # kill while it is writing as fast as it can
        acknowledged = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with TrajectoryStore(db) as store:
        traj = store.get("victim")
        assert traj.status == "incomplete"
        assert len(traj) >= acknowledged + 1  # nothing acknowledged was lost
        assert [t.completion_token_ids[0] for t in traj] == list(range(len(traj)))  # no gap, no torn row
        assert all(len(t.prompt_token_ids) == 500 for t in traj)


def test_sixteen_threads_fifty_episodes_each_lose_nothing(tmp_path):
    store = TrajectoryStore(tmp_path / "t.db")
    errors = []

    def worker(w: int) -> None:
        try:
            for e in range(50):
                traj = Trajectory(run_id="conc", task_id=f"w{w}", group_id=f"w{w}-e{e}")
                store.begin(traj)
                for i in range(3):
                    store.append(traj.id, step(w * 1000 + e * 10 + i))
                store.finish(traj.id, "terminated", reward=float(e))
        except Exception as exc:  # surfaced below: a thread's exception would vanish otherwise
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    trajs = store.trajectories(run_id="conc")
    assert len(trajs) == 800
    assert all(t.status == "complete" and len(t) == 3 for t in trajs)
    # Steps stayed in their own episode and in order.
    for t in trajs:
        w, e = t.task_id[1:], t.group_id.split("-e")[1]
        expected = [int(w) * 1000 + int(e) * 10 + i for i in range(3)]
        assert [s.prompt_token_ids[2] for s in t] == expected


FULL_DISK_WRITER = textwrap.dedent("""
    import resource, signal, sys
    sys.path.insert(0, {tests!r})
    from test_store_faults import step
    from forge_bridge.core.store import StoreError, TrajectoryStore
    from forge_bridge.core.types import Trajectory

    store = TrajectoryStore({db!r})
    store.begin(Trajectory(id="before"))
    store.append("before", step(0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit now fail like a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    store.begin(Trajectory(id="filling"))
    n = 0
    try:
        while True:
            store.append("filling", step(n, size=500))
            n += 1
    except StoreError as exc:
        print("ERROR", exc, flush=True)
    print("STORED", n, len(store.get("filling")), len(store.get("before")), flush=True)
""")


def test_a_full_disk_is_a_clear_error_and_every_step_already_stored_stays(tmp_path):
    db = tmp_path / "full.db"
    code = FULL_DISK_WRITER.format(tests=os.path.dirname(__file__), db=str(db), limit=400_000)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert "appending a step to filling failed" in error and "nothing already stored was changed" in error
    stored, readable, before = map(int, out.split("STORED")[1].split())
    assert stored > 0 and readable == stored and before == 1
    with TrajectoryStore(db) as store:  # after the process, with room again: all of it is there
        assert len(store.get("filling")) == stored and store.get("filling").status == "incomplete"
        store.append("filling", step(9999))  # and the store keeps working
        assert len(store.get("filling")) == stored + 1


def test_a_read_only_disk_is_a_clear_error_and_the_stored_data_stays_readable(tmp_path):
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-r", "-m", "true"]).returncode != 0:
        pytest.skip("no user+mount namespaces here to make a read-only mount")
    folder = tmp_path / "ro"
    folder.mkdir()
    with TrajectoryStore(folder / "s.db") as store:
        store.begin(Trajectory(id="kept", task_id="t"))
        store.append("kept", step(1))
    probe = ("import sys\nfrom forge_bridge.core.store import TrajectoryStore, StoreError\n"
             f"try:\n    TrajectoryStore({str(folder / 's.db')!r}).begin(__import__('forge_bridge').Trajectory())\n"
             "except StoreError as exc:\n    print('ERROR', exc)\n")
    script = f"mount --bind -o ro {folder} {folder} && {sys.executable} -c \"$0\""
    out = subprocess.run([unshare, "-r", "-m", "sh", "-c", script, probe], capture_output=True, text=True,
                         timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert "ERROR cannot open trajectory store" in out.stdout and "writable" in out.stdout, out.stderr
    with TrajectoryStore(folder / "s.db") as store:
        assert [len(t) for t in store.trajectories()] == [1]

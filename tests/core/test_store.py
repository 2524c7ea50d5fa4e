import json
import warnings

import pytest

from forge_bridge.core.errors import SchemaError, StoreError, WrongType
from forge_bridge.core.exchange import export_jsonl, export_parquet, import_jsonl
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Observation, Trajectory, Transition


def step(i: int, version: str = "r-v0") -> Transition:
    return Transition(observation=Observation(messages=[{"role": "user", "content": f"q{i}"}]),
                      action=Action(content=f"a{i}", finish_reason="stop"),
                      prompt_token_ids=[1, 2, i], completion_token_ids=[3, i],
                      completion_logprobs=[-0.1, -0.2], version=version)


@pytest.fixture
def store(tmp_path):
    with TrajectoryStore(tmp_path / "t.db") as s:
        yield s


def test_append_then_finish(store):
    traj = Trajectory(task_id="t", group_id="g", run_id="r")
    store.begin(traj)
    assert [store.append(traj.id, step(i)) for i in range(3)] == [0, 1, 2]
    assert store.get(traj.id).status == "incomplete"
    updated = step(1)
    updated.info["tool_results"] = {"c1": "5"}
    store.update_step(traj.id, 1, updated)
    store.finish(traj.id, "terminated", reward=1.0, metadata={"k": 1})
    got = store.get(traj.id)
    assert got.status == "complete" and got.reward == 1.0 and got.metadata == {"k": 1}
    assert [t.action.content for t in got] == ["a0", "a1", "a2"]
    assert got.transitions[1].info == {"tool_results": {"c1": "5"}}
    assert got.transitions[2].completion_token_ids == [3, 2]


def test_queries_filter_by_run_task_group_status_version(store):
    for i in range(6):
        t = Trajectory(run_id=f"r{i % 2}", task_id=f"t{i % 3}", group_id=f"g{i % 3}")
        store.begin(t)
        store.append(t.id, step(i, version=f"a-v{i % 2}"))
        store.finish(t.id, "terminated" if i < 4 else "crashed", reward=float(i))
    assert store.count() == 6
    assert store.count(run_id="r0") == 3
    assert store.count(task_id="t1") == 2
    assert store.count(status="failed") == 2
    assert store.count(status=["failed", "complete"]) == 6
    assert store.count(version="a-v1") == 3
    assert store.count(run_id="r0", status="complete") == 2
    groups = {g.group_id: g for g in store.groups()}
    assert sorted(groups) == ["g0", "g1", "g2"] and groups["g0"].rewards == [0.0, 3.0]


def test_the_old_filter_name_adapter_still_filters_by_version_for_a_release_and_warns(store):
    for i in range(4):
        t = Trajectory(run_id="r", task_id="t", group_id=f"g{i % 2}")
        store.begin(t)
        store.append(t.id, step(i, version=f"a-v{i % 2}"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        wanted = store.trajectories(version="a-v1")
    assert len(wanted) == 2 and {s.version for t in wanted for s in t} == {"a-v1"}
    for read in (lambda: store.trajectories(adapter="a-v1"), lambda: list(store.iter(adapter="a-v1")),
                 lambda: [t for g in store.groups(adapter="a-v1") for t in g.trajectories]):
        with pytest.warns(DeprecationWarning, match="adapter= is now version=") as caught:
            assert read() == wanted
        assert caught[0].filename == __file__  # it points at the caller
    with pytest.warns(DeprecationWarning, match="adapter= is now version="):
        assert store.count(adapter="a-v0") == 2
    with pytest.raises(WrongType, match="both adapter= and version="):
        store.count(adapter="a-v0", version="a-v1")


def test_export_jsonl_and_parquet(store, tmp_path):
    for i in range(3):
        t = Trajectory(run_id="r", task_id=f"t{i}")
        store.begin(t)
        store.append(t.id, step(i))
        store.append(t.id, step(i + 10))
        store.finish(t.id, "terminated", reward=1.0)
    assert export_jsonl(store, tmp_path / "out.jsonl") == 3
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [Trajectory.from_json(line) for line in lines] == store.trajectories()

    import pyarrow.parquet as pq
    assert export_parquet(store, tmp_path / "out.parquet", task_id="t1") == 2
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["step"] for r in table] == [0, 1]
    assert table[1]["prompt_token_ids"] == [1, 2, 11] and table[0]["task_id"] == "t1"
    assert json.loads(table[0]["action"])["content"] == "a1"


def test_malformed_file_imports_nothing_and_names_the_line(store, tmp_path):
    t = Trajectory(run_id="keep")
    store.begin(t)
    good = Trajectory(transitions=[step(1)]).to_json()
    bad = json.loads(good)
    bad["transitions"][0]["completion_logprobs"] = [0.3, -1.0]
    path = tmp_path / "in.jsonl"
    path.write_text(good + "\n" + Trajectory().to_json() + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SchemaError, match=r"line 3: .*completion_logprobs\[0\]"):
        import_jsonl(store, path)
    assert [x.id for x in store.trajectories()] == [t.id]
    path.write_text(good + "\n")
    assert import_jsonl(store, path) == 1 and store.count() == 2


def test_unwritable_path_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot open trajectory store"):
        TrajectoryStore(blocker / "t.db")


def test_failed_write_keeps_what_was_stored(store):
    t = Trajectory(id="same")
    store.begin(t)
    store.append("same", step(0))
    with pytest.raises(StoreError, match="nothing already stored was changed"):
        store.begin(Trajectory(id="same", transitions=[step(9)]))  # duplicate id
    with pytest.raises(StoreError):
        store.append("no-such-trajectory", step(1))
    assert len(store.get("same")) == 1
    with pytest.raises(SchemaError, match="end_reason"):
        store.finish("same", "done")

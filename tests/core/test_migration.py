"""Version-1 data (end reasons and roles as metadata keys, `truncated` meaning "hit max_tokens")
is read and migrated to the typed fields, from JSON and from a store written by version 1."""

import json
import sqlite3
import warnings

from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.store_views import TrajectoryQuery
from forge_bridge.core.types import SCHEMA_VERSION, Feedback, Trajectory, Transition

V1_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE trajectories (id TEXT PRIMARY KEY, run_id TEXT, task_id TEXT, group_id TEXT,
    status TEXT NOT NULL, reward REAL, metadata TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL);
CREATE TABLE transitions (trajectory_id TEXT NOT NULL REFERENCES trajectories(id),
    step INTEGER NOT NULL, adapter TEXT, data TEXT NOT NULL, PRIMARY KEY (trajectory_id, step));
INSERT INTO meta VALUES ('schema_version', '1');
"""


def v1_step(text: str, hit_max_tokens: bool = False) -> dict:
    return {"observation": {"messages": [{"role": "user", "content": "q"}], "tools": None},
            "action": {"content": text, "tool_calls": [],
                       "finish_reason": "length" if hit_max_tokens else "stop", "parse_errors": []},
            "prompt_token_ids": [1, 2], "completion_token_ids": [3], "completion_logprobs": [-0.1],
            "adapter": None, "reward": 0.0, "terminated": False, "truncated": hit_max_tokens,
            "info": {}, "timestamp": 1.0}


V1_ROWS = [  # (id, status, metadata) -> expected (end_reason, end_detail, role, remaining metadata)
    ("done", "complete", {"kind": "x"}, ("terminated", None, None, {"kind": "x"})),
    ("cut", "truncated", {"truncated": "more than 4 model calls"},
     ("truncated", "more than 4 model calls", None, {})),
    ("fault", "failed", {"error": "malformed tool call: bad JSON", "policy_fault": True},
     ("policy_fault", "malformed tool call: bad JSON", None, {})),
    ("down", "failed", {"errors": ["PolicyUnavailable: no server"]},
     ("outage", "PolicyUnavailable: no server", None, {})),
    ("crash", "failed", {"error": "ZeroDivisionError: division by zero"},
     ("crashed", "ZeroDivisionError: division by zero", None, {})),
    ("role", "complete", {"parent": "p", "role": "writer"}, ("terminated", None, "writer", {"parent": "p"})),
    ("open", "incomplete", {}, (None, None, None, {})),
]


def test_a_version_1_store_is_migrated_on_open(tmp_path):
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(V1_DDL)
    for tid, status, metadata, _ in V1_ROWS:
        db.execute("INSERT INTO trajectories VALUES (?,?,?,?,?,?,?,?,?)",
                   (tid, "r", "t", "g", status, 1.0, json.dumps(metadata), 0.0, 0.0))
        for i, s in enumerate([v1_step("a", hit_max_tokens=True), v1_step("b")]):
            db.execute("INSERT INTO transitions VALUES (?,?,?,?)", (tid, i, None, json.dumps(s)))
    db.commit()
    db.close()

    store = TrajectoryStore(path)
    for tid, status, _, (end, detail, role, metadata) in V1_ROWS:
        traj = store.get(tid)
        assert (traj.status, traj.end_reason, traj.end_detail, traj.role, traj.metadata) == \
            (status, end, detail, role, metadata), tid
        first, last = traj.transitions
        assert first.action.finish_reason == "length" and not first.truncated  # a finish reason now
        assert last.terminated == (end in ("terminated", "policy_fault"))
        assert last.truncated == (end == "truncated")
    store.close()
    version = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]
    assert int(version) == SCHEMA_VERSION
    assert TrajectoryStore(path).count() == len(V1_ROWS)  # opening again changes nothing


def test_a_version_1_json_line_reads_as_the_current_layout():
    old = {"schema_version": 1, "id": "x", "task_id": "t", "group_id": None, "run_id": None,
           "reward": 0.0, "status": "failed", "transitions": [v1_step("a", hit_max_tokens=True)],
           "metadata": {"error": "malformed tool call: no JSON", "policy_fault": True, "role": "r"}}
    traj = Trajectory.from_dict(old)
    assert (traj.end_reason, traj.role, traj.metadata) == ("policy_fault", "r", {})
    assert traj.transitions[0].terminated and not traj.transitions[0].truncated
    assert Trajectory.from_json(traj.to_json()).to_dict() == traj.to_dict()


def version_3_store(path):
    """A store as version 3 wrote it: no `behaviour` column, no teacher log-probabilities in credit."""
    db = sqlite3.connect(path)
    db.executescript(V1_DDL.replace("'1'", "'3'").replace("updated_at REAL NOT NULL);", "updated_at REAL NOT NULL, "
                                                          "end_reason TEXT, end_detail TEXT, role TEXT, excluded TEXT);")
                     + "CREATE TABLE credit (trajectory_id TEXT NOT NULL, step INTEGER NOT NULL, iteration INTEGER "
                       "NOT NULL, advantage REAL, trained_tokens INTEGER NOT NULL, PRIMARY KEY (trajectory_id, step));")
    db.execute("INSERT INTO trajectories VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
               ("old", "r", "t", "g", "complete", 1.0, json.dumps({"iteration": 1}), 0.0, 0.0, "terminated", None, None,
                None))
    db.execute("INSERT INTO transitions VALUES (?,?,?,?)", ("old", 0, None, json.dumps(v1_step("a"))))
    db.execute("INSERT INTO credit VALUES ('old', 0, 1, 0.5, 1)")
    db.commit()
    db.close()


def test_a_version_3_store_reads_read_only_and_migrates_to_behaviour_teacher_and_feedback(tmp_path):
    path = tmp_path / "v3.db"
    version_3_store(path)
    with TrajectoryStore(path, readonly=True) as store:  # the inspector, before anything migrated it
        assert store.get("old").behaviour == "policy"
        assert store.credit("old")[0].teacher_logprobs is None
        assert store.feedback() == {}  # no feedback table yet: none
        assert store.success_by_kind("r") == {"t": {1: 1.0}}
    with TrajectoryStore(path) as store:  # opened for writing: migrated, the old rows unchanged
        assert store.get("old").behaviour == "policy"
        guide = Trajectory(task_id="t", group_id="g", run_id="r", reward=0.0, end_reason="terminated",
                           metadata={"iteration": 1}, behaviour="guide")
        store.add_many([guide])
        store.record_credit(1, [("old", 0, 0.5, 1, [-0.25])])
        assert store.get(guide.id).behaviour == "guide" and store.credit("old")[0].teacher_logprobs == [-0.25]
        assert store.success_by_kind("r") == {"t": {1: 1.0}}  # a guide never counts in the policy's curve
        store.add_feedback(Feedback("old", 1.0, key="reviewer"))
        assert [e.key for e in store.feedback()["old"]] == ["reviewer"]
    version = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]
    assert int(version) == SCHEMA_VERSION
    assert Trajectory.from_json(guide.to_json()).behaviour == "guide"


V5_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE trajectories (id TEXT PRIMARY KEY, run_id TEXT, task_id TEXT, group_id TEXT, status TEXT NOT NULL,
    reward REAL, metadata TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    end_reason TEXT, end_detail TEXT, role TEXT, excluded TEXT, behaviour TEXT);
CREATE TABLE transitions (trajectory_id TEXT NOT NULL REFERENCES trajectories(id), step INTEGER NOT NULL,
    adapter TEXT, data TEXT NOT NULL, PRIMARY KEY (trajectory_id, step));
CREATE TABLE credit (trajectory_id TEXT NOT NULL REFERENCES trajectories(id), step INTEGER NOT NULL,
    iteration INTEGER NOT NULL, advantage REAL, trained_tokens INTEGER NOT NULL, teacher_logprobs TEXT,
    PRIMARY KEY (trajectory_id, step));
CREATE TABLE feedback (seq INTEGER PRIMARY KEY AUTOINCREMENT, trajectory_id TEXT NOT NULL REFERENCES trajectories(id),
    key TEXT NOT NULL, value REAL NOT NULL, comment TEXT, step INTEGER, source TEXT, at REAL NOT NULL);
CREATE INDEX feedback_trajectory ON feedback(trajectory_id, seq);
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL, slot TEXT,
    version TEXT, detail TEXT NOT NULL);
CREATE INDEX trajectories_run ON trajectories(run_id, status);
CREATE INDEX trajectories_created ON trajectories(created_at);
CREATE INDEX trajectories_task ON trajectories(task_id);
CREATE INDEX trajectories_group ON trajectories(group_id);
CREATE INDEX transitions_adapter ON transitions(adapter);
INSERT INTO meta VALUES ('schema_version', '5');
"""
"""The tables as version 5 made them: the version that served a step was its `adapter`."""

V5_LOGPROBS = [-0.123456789012345678, -1e-05, -3.0]


def v5_step(text: str, adapter: str | None) -> dict:
    """A step as version 5's `Transition.to_dict` wrote it."""
    return {"observation": {"messages": [{"role": "user", "content": "q"}], "tools": None},
            "action": {"content": text, "tool_calls": [], "finish_reason": "stop", "parse_errors": []},
            "prompt_token_ids": [1, 2], "completion_token_ids": [3, 4, 5], "completion_logprobs": V5_LOGPROBS,
            "adapter": adapter, "reward": 0.0, "terminated": False, "truncated": False, "info": {},
            "timestamp": 1.0, "temperature": 1.0, "slot": "default"}


def version_5_store(path):
    db = sqlite3.connect(path)
    db.executescript(V5_DDL)
    for tid, versions in (("old", ["r-v1", None]), ("base", [None])):
        db.execute("INSERT INTO trajectories VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                   (tid, "eval-r", "t", None, "complete", 1.0, "{}", 0.0, 0.0, "terminated", None, None, None, None))
        for i, version in enumerate(versions):
            db.execute("INSERT INTO transitions VALUES (?,?,?,?)",
                       (tid, i, version, json.dumps(v5_step(f"a{i}", version), allow_nan=False)))
    db.commit()
    db.close()


def columns_and_indexes(path):
    db = sqlite3.connect(path)
    try:
        columns = [r[1] for r in db.execute("PRAGMA table_info(transitions)")]
        indexes = {r[1] for r in db.execute("PRAGMA index_list(transitions)") if not r[1].startswith("sqlite_")}
        data = [json.loads(r[0]) for r in db.execute("SELECT data FROM transitions ORDER BY trajectory_id, step")]
        return columns, indexes, data
    finally:
        db.close()


def read_the_versions(store):
    """What a reader sees of the versions, none of it through a deprecated spelling."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        old = store.get("old")
        rows = {r.trajectory.id: r.version for r in store.page(TrajectoryQuery())[0]}
        return ([t.version for t in old], old.versions, store.count(version="r-v1"), rows,
                sorted(store.attempts("t"), key=lambda a: a[0]))


def test_a_version_5_store_reads_read_only_and_migrates_its_adapter_column_to_version(tmp_path):
    path = tmp_path / "v5.db"
    version_5_store(path)
    expected = (["r-v1", None], {"r-v1", None}, 1, {"old": "r-v1", "base": None},
                [("base", "eval-r", None, 1.0), ("old", "eval-r", "r-v1", 1.0)])
    with TrajectoryStore(path, readonly=True) as store:  # the inspector, before anything migrated it
        assert read_the_versions(store) == expected
    assert columns_and_indexes(path)[0][2] == "adapter"  # read-only: nothing changed

    with TrajectoryStore(path) as store:  # opened for writing: migrated
        assert read_the_versions(store) == expected
        store.append("base", Transition.from_dict({**v5_step("new", None), "adapter": "r-v2"}))
        assert store.count(version="r-v2") == 1 and store.get("base").transitions[-1].version == "r-v2"
    columns, indexes, data = columns_and_indexes(path)
    assert columns == ["trajectory_id", "step", "version", "data"]
    assert "transitions_version" in indexes and "transitions_adapter" not in indexes
    assert [d["version"] for d in data] == [None, "r-v2", "r-v1", None] and not any("adapter" in d for d in data)
    assert all(d["completion_logprobs"] == V5_LOGPROBS for d in data)  # the numbers exactly as written
    assert int(sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]) == SCHEMA_VERSION == 6

    db = sqlite3.connect(path)  # as if another process had read version 5 before this one migrated: again
    db.execute("UPDATE meta SET value = '5'")
    db.commit()
    db.close()
    with TrajectoryStore(path) as store:
        assert read_the_versions(store)[:3] == (["r-v1", None], {"r-v1", None}, 1)
    assert columns_and_indexes(path)[:2] == (columns, indexes)


def test_a_version_5_json_line_reads_its_adapter_as_the_version():
    old = {"schema_version": 5, "id": "x", "task_id": "t", "group_id": None, "run_id": "r", "reward": 1.0,
           "status": "complete", "end_reason": "terminated", "end_detail": None, "role": None, "excluded": None,
           "behaviour": "policy", "metadata": {}, "transitions": [v5_step("a", "r-v3"), v5_step("b", None)]}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        traj = Trajectory.from_json(json.dumps(old))
    assert [t.version for t in traj] == ["r-v3", None] and traj.versions == {"r-v3", None}
    new = traj.to_dict()
    assert new["schema_version"] == SCHEMA_VERSION and [s["version"] for s in new["transitions"]] == ["r-v3", None]
    assert not any("adapter" in s for s in new["transitions"])
    assert Trajectory.from_dict(new) == traj

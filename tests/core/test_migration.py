"""Version-1 data (end reasons and roles as metadata keys, `truncated` meaning "hit max_tokens")
is read and migrated to the typed fields, from JSON and from a store written by version 1."""

import json
import sqlite3

from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import SCHEMA_VERSION, Feedback, Trajectory

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
    assert int(version) == SCHEMA_VERSION == 5
    assert Trajectory.from_json(guide.to_json()).behaviour == "guide"

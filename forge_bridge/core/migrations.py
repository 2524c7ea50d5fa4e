"""Every schema migration, of the SQLite store and of the JSON layout, in one place.

The store keeps one version number, `meta.schema_version`, the same number as the JSON layout's
`schema_version`. A store or a JSON trajectory of an older version is brought to `SCHEMA_VERSION`
one step at a time, each step in one transaction (a crash leaves the store at the version before
the step, to be migrated again). What each version changed:

- 1 -> 2: the end reason, the role and truncation moved from `metadata` keys to typed columns;
  a step's `truncated` had meant "hit max_tokens" (kept as its finish reason) and now is
  Gymnasium's flag, set on the last step from how the episode ended.
- 2 -> 3: steps record the policy slot that served them (`Transition.slot`; None before).
- 3 -> 4: a trajectory records whose behaviour it is (`Trajectory.behaviour`: the policy's own,
  a recorded demonstration's, or a guide's in a GRPO group; 'policy' before), and a step's
  credit the teacher's log-probabilities of its tokens (on-policy distillation; none before).
- 4 -> 5: feedback on episodes, appended as it arrives (`feedback`: a value per key, from a user,
  a reviewer or a judge, hours or days after the episode ended; none before), and the serving
  events (`events`: a candidate adapter promoted or refused, a version rolled back).
- 5 -> 6: the version that served a step is called `version` (one meaning per word: an adapter
  is the LoRA files, a version their published name): a step's key `adapter` in the JSON layout
  and in the store's `transitions.data`, and the column `transitions.adapter` (with its index,
  `transitions_adapter`, now `transitions_version`).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Callable

SCHEMA_VERSION = 6
"""Version of the store's tables and of the JSON layout `Trajectory.to_dict` writes."""

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trajectories (
    id TEXT PRIMARY KEY,
    run_id TEXT, task_id TEXT, group_id TEXT,
    status TEXT NOT NULL,
    reward REAL,
    metadata TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    end_reason TEXT, end_detail TEXT, role TEXT, excluded TEXT,
    behaviour TEXT
);
CREATE TABLE IF NOT EXISTS transitions (
    trajectory_id TEXT NOT NULL REFERENCES trajectories(id),
    step INTEGER NOT NULL,
    version TEXT,
    data TEXT NOT NULL,
    PRIMARY KEY (trajectory_id, step)
);
CREATE TABLE IF NOT EXISTS credit (
    trajectory_id TEXT NOT NULL REFERENCES trajectories(id),
    step INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    advantage REAL,
    trained_tokens INTEGER NOT NULL,
    teacher_logprobs TEXT,
    PRIMARY KEY (trajectory_id, step)
);
CREATE TABLE IF NOT EXISTS feedback (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    trajectory_id TEXT NOT NULL REFERENCES trajectories(id),
    key TEXT NOT NULL,
    value REAL NOT NULL,
    comment TEXT,
    step INTEGER,
    source TEXT,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_trajectory ON feedback(trajectory_id, seq);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    slot TEXT,
    version TEXT,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trajectories_run ON trajectories(run_id, status);
CREATE INDEX IF NOT EXISTS trajectories_created ON trajectories(created_at);
CREATE INDEX IF NOT EXISTS trajectories_task ON trajectories(task_id);
CREATE INDEX IF NOT EXISTS trajectories_group ON trajectories(group_id);
"""
"""The current tables (`IF NOT EXISTS`: run on every open, it adds what an older store lacks)."""

INDEXES = ("CREATE INDEX IF NOT EXISTS transitions_version ON transitions(version)",)
"""Indexes on columns an older store has only once migrated: made after `migrate_store`, on every open."""

_OUTAGE_ERRORS = ("PolicyError", "PolicyUnavailable", "PolicyResponseError")
_V1_COLUMNS = ("end_reason", "end_detail", "role", "excluded")


# --------------------------------------------------------------------------- JSON, 1 -> 2
def v1_head(status: str, metadata: dict) -> dict:
    """A version-1 trajectory's typed fields, from the metadata keys version 1 kept them in."""
    metadata = dict(metadata)
    role = metadata.pop("role", None)
    fault = metadata.pop("policy_fault", None)
    truncated = metadata.pop("truncated", None)
    errors = metadata.pop("errors", None) or []
    error = metadata.pop("error", None)
    end, detail = {"complete": ("terminated", None), "incomplete": (None, None),
                   "truncated": ("truncated", truncated), "failed": ("crashed", None)}[status]
    if status == "failed":
        detail = str(error if error is not None else (errors[0] if errors else "failed"))
        end = ("policy_fault" if fault else
               "outage" if detail.split(":")[0].strip() in _OUTAGE_ERRORS else "crashed")
    if errors and status != "failed":
        metadata["errors"] = errors
    return {"end_reason": end, "end_detail": None if detail is None else str(detail),
            "role": None if role is None else str(role), "metadata": metadata}


def v1_steps(steps: list[dict], end_reason: str | None) -> list[dict]:
    """Version-1 steps: `truncated` meant "hit max_tokens" (kept as the finish reason); the last
    step gets Gymnasium's flags from how the episode ended."""
    steps = [{**s, "truncated": False, "terminated": False} for s in steps]
    if steps and end_reason in ("terminated", "policy_fault"):
        steps[-1]["terminated"] = True
    elif steps and end_reason == "truncated":
        steps[-1]["truncated"] = True
    return steps


def _json_1_to_2(data: dict) -> dict:
    head = v1_head(data.get("status", "incomplete"), data.get("metadata") or {})
    steps = data.get("transitions") or []
    if isinstance(steps, list) and all(isinstance(s, dict) for s in steps):
        steps = v1_steps(steps, head["end_reason"])
    return {**data, **head, "transitions": steps}


def _json_2_to_3(data: dict) -> dict:
    return data  # a step without `slot` reads as None


def v5_step(step: dict) -> dict:
    """A step dict of version 5 or older in the current layout (its `adapter` is `version`); one
    of the current layout, or holding both keys (left for the reader to refuse), unchanged."""
    if "adapter" not in step or "version" in step:
        return step
    return {("version" if k == "adapter" else k): v for k, v in step.items()}


def _json_5_to_6(data: dict) -> dict:
    steps = data.get("transitions") or []
    if isinstance(steps, list):
        steps = [v5_step(s) if isinstance(s, dict) else s for s in steps]
    return {**data, "transitions": steps}


_JSON_STEPS: dict[int, Callable[[dict], dict]] = {1: _json_1_to_2, 2: _json_2_to_3, 3: _json_2_to_3, 4: _json_2_to_3,
                                                  5: _json_5_to_6}
"""3 -> 4 is a no-op too (a trajectory without `behaviour` reads as the policy's own), and so is
4 -> 5 (feedback lives beside trajectories, not in them)."""


def migrate_json(data: dict) -> dict:
    """A trajectory dict of any readable version in the current layout; an unknown version is
    returned unchanged (the caller names it)."""
    version = data.get("schema_version")
    while version in _JSON_STEPS:
        data = {**_JSON_STEPS[version](data), "schema_version": version + 1}
        version += 1
    return data


# --------------------------------------------------------------------------- the store
def _store_1_to_2(db: sqlite3.Connection) -> None:
    add_columns(db, "trajectories", {column: "TEXT" for column in _V1_COLUMNS})
    for tid, status, metadata in db.execute("SELECT id, status, metadata FROM trajectories").fetchall():
        head = v1_head(status, json.loads(metadata))
        db.execute("UPDATE trajectories SET end_reason = ?, end_detail = ?, role = ?, metadata = ? WHERE id = ?",
                   (head["end_reason"], head["end_detail"], head["role"], json.dumps(head["metadata"]), tid))
        steps = db.execute("SELECT step, data FROM transitions WHERE trajectory_id = ? ORDER BY step",
                           (tid,)).fetchall()
        for (step, _), data in zip(steps, v1_steps([json.loads(d) for _, d in steps], head["end_reason"])):
            db.execute("UPDATE transitions SET data = ? WHERE trajectory_id = ? AND step = ?",
                       (json.dumps(data), tid, step))


def _store_2_to_3(db: sqlite3.Connection) -> None:
    """Nothing to rewrite: stored steps without `slot` read as None."""


def add_columns(db: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    """Add the columns (name -> SQL type) a table of an older store lacks."""
    have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
    for name, kind in columns.items():
        if name not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def _store_3_to_4(db: sqlite3.Connection) -> None:
    """New columns only: NULL `behaviour` reads as 'policy', NULL teacher log-probabilities as none."""
    add_columns(db, "trajectories", {"behaviour": "TEXT"})
    add_columns(db, "credit", {"teacher_logprobs": "TEXT"})


def _store_4_to_5(db: sqlite3.Connection) -> None:
    """Nothing to rewrite: the feedback table (DDL) starts empty."""


def _store_5_to_6(db: sqlite3.Connection) -> None:
    """The column `adapter` renamed `version` (its old index dropped: INDEXES makes the new one)
    and each stored step's key the same; what is renamed already (a migration run twice) is left."""
    if "adapter" in {r[1] for r in db.execute("PRAGMA table_info(transitions)")}:
        db.execute("ALTER TABLE transitions RENAME COLUMN adapter TO version")  # SQLite 3.25+
    db.execute("DROP INDEX IF EXISTS transitions_adapter")
    db.execute("UPDATE transitions SET data = json_remove(json_set(data, '$.version', json_extract(data, '$.adapter')), "
               "'$.adapter') WHERE json_type(data, '$.adapter') IS NOT NULL AND json_type(data, '$.version') IS NULL")


_STORE_STEPS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _store_1_to_2, 2: _store_2_to_3, 3: _store_3_to_4,
                                                                4: _store_4_to_5, 5: _store_5_to_6}


def stored_version(db: sqlite3.Connection) -> int | None:
    """The store's schema version (None: a new, empty file)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
        return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return None if row is None else int(row[0])


def migrate_store(db: sqlite3.Connection, version: int) -> None:
    """Bring a store of `version` to SCHEMA_VERSION, one transaction per step (autocommit
    connection); the tables of DDL must exist already."""
    while version in _STORE_STEPS:
        db.execute("BEGIN IMMEDIATE")
        try:
            _STORE_STEPS[version](db)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version + 1),))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        version += 1


READABLE_AS_IS = (2, 3, 4, 5, 6)
"""Versions whose rows read as the current ones without rewriting (a read-only store opens them;
the columns a version lacks read as their defaults: `TrajectoryStore` checks which exist; a step
of version 5 or older reads through `v5_step`, its column `adapter` as `version`)."""


def readable(version: int | None) -> bool:
    """Whether this forge-bridge reads a store or JSON of that version (migrating it)."""
    return version == SCHEMA_VERSION or version in _STORE_STEPS


__all__ = ["DDL", "INDEXES", "READABLE_AS_IS", "SCHEMA_VERSION", "migrate_json", "migrate_store", "readable",
           "stored_version", "v1_head", "v1_steps", "v5_step"]

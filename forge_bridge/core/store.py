"""Durable trajectory storage on SQLite in WAL mode.

Transitions are written one row per step as they happen, each in its own transaction, so a
process killed mid-episode leaves every finished step readable and the trajectory still marked
`incomplete`; SQLite's atomic commit means a row is either whole or absent. One connection per
store object behind a lock serialises this process's writers; WAL plus a busy timeout lets
several processes share one file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from forge_bridge.core.errors import NotFound, SchemaError, StoreError, WrongType
from forge_bridge.core.types import (
    END_REASONS,
    SCHEMA_VERSION,
    STATUS_OF_END,
    Trajectory,
    TrajectoryGroup,
    Transition,
    _finite,
    group_trajectories,
    migrate_v1_head,
    migrate_v1_steps,
)

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trajectories (
    id TEXT PRIMARY KEY,
    run_id TEXT, task_id TEXT, group_id TEXT,
    status TEXT NOT NULL,
    reward REAL,
    metadata TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    end_reason TEXT, end_detail TEXT, role TEXT, excluded TEXT
);
CREATE TABLE IF NOT EXISTS transitions (
    trajectory_id TEXT NOT NULL REFERENCES trajectories(id),
    step INTEGER NOT NULL,
    adapter TEXT,
    data TEXT NOT NULL,
    PRIMARY KEY (trajectory_id, step)
);
CREATE TABLE IF NOT EXISTS credit (
    trajectory_id TEXT NOT NULL REFERENCES trajectories(id),
    step INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    advantage REAL,
    trained_tokens INTEGER NOT NULL,
    PRIMARY KEY (trajectory_id, step)
);
CREATE INDEX IF NOT EXISTS trajectories_run ON trajectories(run_id, status);
CREATE INDEX IF NOT EXISTS trajectories_created ON trajectories(created_at);
CREATE INDEX IF NOT EXISTS trajectories_task ON trajectories(task_id);
CREATE INDEX IF NOT EXISTS trajectories_group ON trajectories(group_id);
CREATE INDEX IF NOT EXISTS transitions_adapter ON transitions(adapter);
"""
_HEAD = ("id", "run_id", "task_id", "group_id", "status", "reward", "metadata", "created_at",
         "updated_at", "end_reason", "end_detail", "role", "excluded")
_INSERT_HEAD = f"INSERT INTO trajectories ({', '.join(_HEAD)}) VALUES ({','.join('?' * len(_HEAD))})"
_V1_COLUMNS = ("end_reason", "end_detail", "role", "excluded")


class TrajectoryStore:
    """Append-as-you-go trajectory store; see the module docstring for the durability model."""

    def __init__(self, path: str | os.PathLike, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a killed process (not a power cut) at far less fsync cost.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_DDL)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                                 (str(SCHEMA_VERSION),))
            elif int(row[0]) == 1:
                self._migrate_v1()
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(f"trajectory store {self.path} has schema version {row[0]}; "
                                 f"this forge-bridge reads versions 1 and {SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open trajectory store at {self.path}: {exc}. "
                             "Pick a writable path (store=...).") from None
        self._lock = threading.Lock()

    def _migrate_v1(self) -> None:
        """Version 1 kept the end reason, role and truncation in metadata, and used a step's
        `truncated` for "hit max_tokens": move them to typed columns and Gymnasium's flags, in
        one transaction (a crash leaves the store at version 1, to be migrated again)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            have = {r[1] for r in db.execute("PRAGMA table_info(trajectories)")}
            for column in _V1_COLUMNS:
                if column not in have:
                    db.execute(f"ALTER TABLE trajectories ADD COLUMN {column} TEXT")
            rows = db.execute("SELECT id, status, metadata FROM trajectories").fetchall()
            for tid, status, metadata in rows:
                head = migrate_v1_head(status, json.loads(metadata))
                db.execute("UPDATE trajectories SET end_reason = ?, end_detail = ?, role = ?, "
                           "metadata = ? WHERE id = ?", (head["end_reason"], head["end_detail"],
                                                         head["role"], json.dumps(head["metadata"]), tid))
                steps = db.execute("SELECT step, data FROM transitions WHERE trajectory_id = ? "
                                   "ORDER BY step", (tid,)).fetchall()
                fixed = migrate_v1_steps([json.loads(d) for _, d in steps], head["end_reason"])
                for (step, _), data in zip(steps, fixed):
                    db.execute("UPDATE transitions SET data = ? WHERE trajectory_id = ? AND step = ?",
                               (json.dumps(data), tid, step))
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ writing
    def _write(self, what: str, statements: Iterable[tuple[str, tuple]]) -> list[Any]:
        results = []
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for sql, args in statements:
                        results.append(self._db.execute(sql, args).fetchone())
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:  # SQLite may have rolled back already (disk full)
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"{what} failed in {self.path}: {exc}; nothing already stored "
                                 "was changed") from None
        return results

    def begin(self, trajectory: Trajectory) -> None:
        """Create the trajectory row (status as given, normally `incomplete`) and its steps so far."""
        stmts = self._insert(trajectory)
        self._write(f"recording trajectory {trajectory.id}", stmts)

    add = begin

    @classmethod
    def _insert(cls, t: Trajectory) -> list[tuple[str, tuple]]:
        now = time.time()
        return [(_INSERT_HEAD, (t.id, t.run_id, t.task_id, t.group_id, t.status, t.reward,
                                json.dumps(t.metadata), now, now, t.end_reason, t.end_detail, t.role,
                                t.excluded))] + [cls._insert_step(t.id, i, s) for i, s in enumerate(t.transitions)]

    @staticmethod
    def _insert_step(trajectory_id: str, step: int, t: Transition) -> tuple[str, tuple]:
        return ("INSERT INTO transitions VALUES (?,?,?,?)",
                (trajectory_id, step, t.adapter, json.dumps(t.to_dict(), allow_nan=False)))

    def append(self, trajectory_id: str, transition: Transition) -> int:
        """Store the next step of an open trajectory and return its index."""
        if not isinstance(transition, Transition):
            raise WrongType(f"append() takes a Transition, got {type(transition).__name__}")
        (row,) = self._write(f"appending a step to {trajectory_id}", [(
            "INSERT INTO transitions SELECT ?, COALESCE(MAX(step) + 1, 0), ?, ? "
            "FROM transitions WHERE trajectory_id = ? RETURNING step",
            (trajectory_id, transition.adapter, json.dumps(transition.to_dict(), allow_nan=False),
             trajectory_id))])
        return row[0]

    def update_step(self, trajectory_id: str, step: int, transition: Transition) -> None:
        """Rewrite a stored step, e.g. once the tool results it asked for have arrived."""
        (row,) = self._write(f"updating step {step} of {trajectory_id}", [(
            "UPDATE transitions SET adapter = ?, data = ? WHERE trajectory_id = ? AND step = ? "
            "RETURNING step",
            (transition.adapter, json.dumps(transition.to_dict(), allow_nan=False), trajectory_id,
             step))])
        if row is None:
            raise StoreError(f"trajectory {trajectory_id} has no step {step}")

    def finish(self, trajectory_id: str, end_reason: str, reward: float | None = None,
               metadata: dict | None = None, end_detail: str | None = None) -> None:
        """Close an episode: its end reason (and the status that goes with it), outcome reward
        and (merged) metadata."""
        if end_reason not in END_REASONS:
            raise SchemaError(f"end_reason: expected one of {END_REASONS}, got {end_reason!r}")
        if reward is not None:
            reward = _finite("reward", reward)
        with self._lock:
            row = self._db.execute("SELECT metadata FROM trajectories WHERE id = ?",
                                   (trajectory_id,)).fetchone()
        if row is None:
            raise StoreError(f"no trajectory {trajectory_id} in {self.path}")
        merged = {**json.loads(row[0]), **(metadata or {})}
        self._write(f"finishing trajectory {trajectory_id}", [(
            "UPDATE trajectories SET status = ?, end_reason = ?, end_detail = ?, reward = ?, "
            "metadata = ?, updated_at = ? WHERE id = ?",
            (STATUS_OF_END[end_reason], end_reason, end_detail, reward, json.dumps(merged),
             time.time(), trajectory_id))])

    def exclude(self, trajectory_ids: Iterable[str], reason: str) -> int:
        """Mark trajectories never to be trained on, with why; they stay stored. Returns how many."""
        ids = list(trajectory_ids)
        self._write("excluding trajectories", [
            ("UPDATE trajectories SET excluded = ?, updated_at = ? WHERE id = ?", (reason, time.time(), i))
            for i in ids])
        return len(ids)

    def record_credit(self, iteration: int, rows: Iterable[tuple[str, int, float | None, int]]) -> int:
        """What the trainer made of each step in `iteration`: (trajectory id, step, advantage or
        None where none was computed, completion tokens the loss trained on). Returns how many."""
        rows = list(rows)
        self._write("recording credit", [
            ("INSERT OR REPLACE INTO credit (trajectory_id, step, iteration, advantage, trained_tokens) "
             "VALUES (?, ?, ?, ?, ?)", (tid, step, iteration, adv, trained)) for tid, step, adv, trained in rows])
        return len(rows)

    # ------------------------------------------------------------------ reading
    def _select_ids(self, run_id: str | None, task_id: str | None, group_id: str | None,
                    status: str | Iterable[str] | None, adapter: str | None) -> list[str]:
        where, args = [], []
        for column, value in (("run_id", run_id), ("task_id", task_id), ("group_id", group_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            where.append(f"status IN ({','.join('?' * len(statuses))})")
            args += statuses
        if adapter is not None:
            where.append("id IN (SELECT trajectory_id FROM transitions WHERE adapter = ?)")
            args.append(adapter)
        sql = "SELECT id FROM trajectories"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._lock:
            return [r[0] for r in self._db.execute(sql + " ORDER BY created_at, id", args)]

    def get(self, trajectory_id: str) -> Trajectory:
        with self._lock:
            head = self._db.execute(
                "SELECT id, run_id, task_id, group_id, status, reward, metadata, end_reason, "
                "end_detail, role, excluded FROM trajectories WHERE id = ?", (trajectory_id,)).fetchone()
            steps = self._db.execute(
                "SELECT data FROM transitions WHERE trajectory_id = ? ORDER BY step",
                (trajectory_id,)).fetchall()
        if head is None:
            raise NotFound(f"no trajectory {trajectory_id} in {self.path}")
        return Trajectory(id=head[0], run_id=head[1], task_id=head[2], group_id=head[3],
                          status=head[4], reward=head[5], metadata=json.loads(head[6]),
                          end_reason=head[7], end_detail=head[8], role=head[9], excluded=head[10],
                          transitions=[Transition.from_dict(json.loads(s[0])) for s in steps])

    def iter(self, *, run_id: str | None = None, task_id: str | None = None,
             group_id: str | None = None, status: str | Iterable[str] | None = None,
             adapter: str | None = None) -> Iterator[Trajectory]:
        """Trajectories matching every filter given, oldest first, loaded one at a time."""
        for tid in self._select_ids(run_id, task_id, group_id, status, adapter):
            yield self.get(tid)

    def trajectories(self, **filters: Any) -> list[Trajectory]:
        return list(self.iter(**filters))

    def count(self, **filters: Any) -> int:
        return len(self._select_ids(filters.get("run_id"), filters.get("task_id"),
                                    filters.get("group_id"), filters.get("status"),
                                    filters.get("adapter")))

    def groups(self, **filters: Any) -> list[TrajectoryGroup]:
        """Trajectories that share a group id (and role), as GRPO groups (ungrouped ones are left
        out)."""
        return group_trajectories(self.iter(**filters))

    # ------------------------------------------------------------------ export / import
    def export_jsonl(self, path: str | os.PathLike, **filters: Any) -> int:
        """One trajectory per line, in the versioned JSON layout; returns how many."""
        n = 0
        tmp = Path(f"{path}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for t in self.iter(**filters):
                f.write(t.to_json() + "\n")
                n += 1
        os.replace(tmp, path)
        return n

    def export_parquet(self, path: str | os.PathLike, **filters: Any) -> int:
        """One row per transition with its trajectory's columns; returns the row count."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows: dict[str, list] = {k: [] for k in (
            "trajectory_id", "run_id", "task_id", "group_id", "status", "end_reason", "role",
            "excluded", "final_reward", "step",
            "adapter", "reward", "terminated", "truncated", "prompt_token_ids",
            "completion_token_ids", "completion_logprobs", "observation", "action", "info")}
        for traj in self.iter(**filters):
            for step, t in enumerate(traj.transitions):
                for key, value in (
                        ("trajectory_id", traj.id), ("run_id", traj.run_id),
                        ("task_id", traj.task_id), ("group_id", traj.group_id),
                        ("status", traj.status), ("end_reason", traj.end_reason),
                        ("role", traj.role), ("excluded", traj.excluded),
                        ("final_reward", traj.reward), ("step", step),
                        ("adapter", t.adapter), ("reward", t.reward),
                        ("terminated", t.terminated), ("truncated", t.truncated),
                        ("prompt_token_ids", t.prompt_token_ids),
                        ("completion_token_ids", t.completion_token_ids),
                        ("completion_logprobs", t.completion_logprobs),
                        ("observation", json.dumps(t.observation.to_dict())),
                        ("action", json.dumps(t.action.to_dict())),
                        ("info", json.dumps(t.info))):
                    rows[key].append(value)
        schema = pa.schema([
            ("trajectory_id", pa.string()), ("run_id", pa.string()), ("task_id", pa.string()),
            ("group_id", pa.string()), ("status", pa.string()), ("end_reason", pa.string()),
            ("role", pa.string()), ("excluded", pa.string()), ("final_reward", pa.float64()),
            ("step", pa.int32()), ("adapter", pa.string()), ("reward", pa.float64()),
            ("terminated", pa.bool_()), ("truncated", pa.bool_()),
            ("prompt_token_ids", pa.list_(pa.int32())), ("completion_token_ids", pa.list_(pa.int32())),
            ("completion_logprobs", pa.list_(pa.float32())), ("observation", pa.string()),
            ("action", pa.string()), ("info", pa.string())])
        tmp = Path(f"{path}.tmp")
        pq.write_table(pa.table(rows, schema=schema), tmp)
        os.replace(tmp, path)
        return len(rows["step"])

    def import_jsonl(self, path: str | os.PathLike) -> int:
        """Add every trajectory of a JSONL export; the whole file is checked before anything is
        written, so a malformed line adds nothing and names its line number."""
        parsed = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    parsed.append(Trajectory.from_json(line))
                except SchemaError as exc:
                    raise SchemaError(f"{path}, line {lineno}: {exc}") from None
        stmts = [stmt for t in parsed for stmt in self._insert(t)]
        self._write(f"importing {path}", stmts)
        return len(parsed)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

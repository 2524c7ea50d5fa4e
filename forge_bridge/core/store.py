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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from forge_bridge.core import migrations, validate
from forge_bridge.core.errors import NotFound, SchemaError, StoreError, WrongType
from forge_bridge.core.types import (END_REASONS, STATUS_OF_END, StepCredit, Trajectory, TrajectoryGroup,
                                     TrajectoryRow, Transition, group_trajectories)

_HEAD = ("id", "run_id", "task_id", "group_id", "status", "reward", "metadata", "created_at",
         "updated_at", "end_reason", "end_detail", "role", "excluded", "behaviour")
_INSERT_HEAD = f"INSERT INTO trajectories ({', '.join(_HEAD)}) VALUES ({','.join('?' * len(_HEAD))})"
_READ_HEAD = "id, run_id, task_id, group_id, reward, metadata, end_reason, end_detail, role, excluded, behaviour"
# A trajectory's kind: what its task said (metadata), else its task id without the trailing number.
_KIND = "COALESCE(json_extract(metadata, '$.kind'), rtrim(rtrim(task_id, '0123456789'), '-'))"
_ITERATION = "json_extract(metadata, '$.iteration')"
_OWN = "COALESCE(behaviour, 'policy') = 'policy'"
_SUCCESS = "(status = 'complete' AND COALESCE(reward, 0) >= 1)"
SORTS = {"created": "created_at", "reward": "reward", "task": "task_id", "status": "status",
         "iteration": _ITERATION}
"""The orders `TrajectoryQuery.sort` names, and the column each sorts by."""


class TrajectoryStore:
    """Append-as-you-go trajectory store; see the module docstring for the durability model."""

    def __init__(self, path: str | os.PathLike, *, timeout_s: float = 30.0, readonly: bool = False) -> None:
        """`readonly`: open an existing store without ever writing to it (SQLite's mode=ro; it
        reads in WAL mode while another process writes), as the inspector does."""
        self.path, self.readonly = Path(path), readonly
        try:
            self._db = self._connect(timeout_s)
            version = migrations.stored_version(self._db)
            if not readonly:
                self._open_for_writing(version)
            elif version not in migrations.READABLE_AS_IS:
                raise StoreError(f"{self.path} holds schema version {version}: open it once for writing "
                                 "(any TrajectoryStore(path)) to migrate it, then read it" if migrations.readable(version)
                                 else f"{self.path} is not a forge-bridge trajectory store this version reads")
            have = {t: {r[1] for r in self._db.execute(f"PRAGMA table_info({t})")} for t in ("trajectories", "credit")}
            self._has_credit = bool(have["credit"])
            typed = "behaviour" in have["trajectories"]  # an older store read-only: newer columns read as defaults
            self._head, self._own = (_READ_HEAD, _OWN) if typed else (_READ_HEAD.replace("behaviour", "NULL"), "1")
            self._teacher = "teacher_logprobs" if "teacher_logprobs" in have["credit"] else "NULL"
        except (sqlite3.Error, OSError) as exc:
            if readonly:
                raise StoreError(f"{self.path} is not a forge-bridge trajectory store: {exc}") from None
            raise StoreError(f"cannot open trajectory store at {self.path}: {exc}. "
                             "Pick a writable path (store=...).") from None
        self._lock = threading.Lock()

    def _connect(self, timeout_s: float) -> sqlite3.Connection:
        if self.readonly:
            if not self.path.is_file():
                raise NotFound(f"no trajectory store at {self.path}")
            db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s,
                                 isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
            return db
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a killed process (not a power cut) at far less fsync cost.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def _open_for_writing(self, version: int | None) -> None:
        if version is not None and not migrations.readable(version):
            raise StoreError(f"trajectory store {self.path} has schema version {version}; this forge-bridge "
                             f"reads versions 1 to {migrations.SCHEMA_VERSION}")
        self._db.executescript(migrations.DDL)
        if version is None:
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                             (str(migrations.SCHEMA_VERSION),))
        else:
            migrations.migrate_store(self._db, version)

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
        """Create the trajectory row (its end as given, normally none yet) and its steps so far."""
        self.add_many([trajectory], f"recording trajectory {trajectory.id}")

    def add_many(self, trajectories: Iterable[Trajectory], what: str = "adding trajectories") -> int:
        """Add whole trajectories in one transaction (an import, a benchmark's synthetic store):
        all of them or, on any error, none. Returns how many."""
        items = list(trajectories)
        self._write(what, [stmt for t in items for stmt in self._insert(t)])
        return len(items)

    @classmethod
    def _insert(cls, t: Trajectory) -> list[tuple[str, tuple]]:
        now = time.time()
        return [(_INSERT_HEAD, (t.id, t.run_id, t.task_id, t.group_id, t.status, t.reward,
                                json.dumps(t.metadata), now, now, t.end_reason, t.end_detail, t.role,
                                t.excluded, t.behaviour))] + [cls._insert_step(t.id, i, s) for i, s in enumerate(t.transitions)]

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
            reward = validate.finite("reward", reward)
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

    def delete(self, trajectory_ids: Iterable[str]) -> int:
        """Remove trajectories with their steps and credit, in one transaction (a worker's
        in-memory store forgets what the trainer's store now holds). Returns how many."""
        ids = list(trajectory_ids)
        self._write("deleting trajectories", [
            stmt for tid in ids for stmt in (("DELETE FROM credit WHERE trajectory_id = ?", (tid,)),
                                              ("DELETE FROM transitions WHERE trajectory_id = ?", (tid,)),
                                              ("DELETE FROM trajectories WHERE id = ?", (tid,)))])
        return len(ids)

    def record_credit(self, iteration: int, rows: Iterable[tuple]) -> int:
        """What the trainer made of each step in `iteration`: (trajectory id, step, advantage or None, completion
        tokens trained on[, the teacher's log-probabilities of its tokens or None]). Returns how many."""
        rows = [tuple(row) + (None,) * (5 - len(row)) for row in rows]
        self._write("recording credit", [(
            "INSERT OR REPLACE INTO credit (trajectory_id, step, iteration, advantage, trained_tokens, teacher_logprobs) "
            "VALUES (?, ?, ?, ?, ?, ?)", (tid, step, iteration, adv, n, None if teacher is None else json.dumps(list(teacher))))
            for tid, step, adv, n, teacher in rows])
        return len(rows)

    # ------------------------------------------------------------------ reading
    def _select_ids(self, *, run_id: str | None = None, task_id: str | None = None, group_id: str | None = None,
                    status: str | Iterable[str] | None = None, adapter: str | None = None) -> list[str]:
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
        sql = "SELECT id FROM trajectories" + (" WHERE " + " AND ".join(where) if where else "")
        with self._lock:
            return [r[0] for r in self._db.execute(sql + " ORDER BY created_at, id", args)]

    def get(self, trajectory_id: str) -> Trajectory:
        with self._lock:
            head = self._db.execute(f"SELECT {self._head} FROM trajectories WHERE id = ?",
                                    (trajectory_id,)).fetchone()
            steps = self._db.execute("SELECT data FROM transitions WHERE trajectory_id = ? ORDER BY step",
                                     (trajectory_id,)).fetchall()
        if head is None:
            raise NotFound(f"no trajectory {trajectory_id!r} in {self.path}")
        return _trajectory(head, [Transition.from_dict(json.loads(s[0])) for s in steps])

    def iter(self, *, run_id: str | None = None, task_id: str | None = None, group_id: str | None = None,
             status: str | Iterable[str] | None = None, adapter: str | None = None) -> Iterator[Trajectory]:
        """Trajectories matching every filter given, oldest first, loaded one at a time."""
        for tid in self._select_ids(run_id=run_id, task_id=task_id, group_id=group_id, status=status, adapter=adapter):
            yield self.get(tid)

    def trajectories(self, **filters: Any) -> list[Trajectory]:
        return list(self.iter(**filters))

    def count(self, **filters: Any) -> int:
        return len(self._select_ids(**filters))

    def groups(self, **filters: Any) -> list[TrajectoryGroup]:
        """Trajectories that share a group id (and role), as GRPO groups (ungrouped ones are left
        out)."""
        return group_trajectories(self.iter(**filters))

    # ------------------------------------------------------------------ views (the inspector's)
    def _query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"reading {self.path} failed: {exc}") from None

    def page(self, query: TrajectoryQuery, limit: int = 50, offset: int = 0) -> tuple[list[TrajectoryRow], int]:
        """One page of the trajectories matching `query`, in its order, and how many match in all;
        only the page is read (a store of 100,000+ trajectories is never loaded whole)."""
        where, args = query.where()
        total = self._query(f"SELECT COUNT(*) FROM trajectories{where}", args)[0][0]
        rows = self._query(f"SELECT {self._head}, {_ITERATION}, {_KIND} FROM trajectories{where} ORDER BY "
                           f"{SORTS[query.sort]} {query.order.upper()}, id LIMIT ? OFFSET ?", [*args, limit, offset])
        ids = [r[0] for r in rows]
        steps = {tid: (n, adapter) for tid, n, adapter in self._query(
            "SELECT trajectory_id, COUNT(*), MAX(adapter) FROM transitions WHERE trajectory_id IN "
            f"({','.join('?' * len(ids))}) GROUP BY trajectory_id", ids)} if ids else {}
        return [TrajectoryRow(_trajectory(r[:11], []), r[11], r[12], *steps.get(r[0], (0, None))) for r in rows], total

    def runs(self) -> list[tuple[str | None, int, int, float | None]]:
        """(run id, trajectories, completed, mean reward) of every run in the store, newest first."""
        return self._query("SELECT run_id, COUNT(*), SUM(status = 'complete'), AVG(reward) FROM trajectories "
                           "GROUP BY run_id ORDER BY MAX(created_at) DESC")

    def kinds(self) -> list[str]:
        """The task kinds in the store (a task's `kind`, else its id without the trailing number)."""
        return [r[0] for r in self._query(f"SELECT DISTINCT {_KIND} FROM trajectories ORDER BY 1") if r[0]]

    def success_by_kind(self, run_id: str, threshold: float = 1.0) -> dict[str, dict[int, float]]:
        """kind -> iteration -> success rate (reward >= threshold) of a run's training rollouts."""
        out: dict[str, dict[int, float]] = {}
        for kind, it, rate in self._query(
                f"SELECT {_KIND}, {_ITERATION}, AVG(COALESCE(reward, 0) >= ?) FROM trajectories WHERE run_id = ? "
                f"AND {_ITERATION} IS NOT NULL AND {self._own} GROUP BY 1, 2 ORDER BY 2", (threshold, run_id)):
            out.setdefault(kind or "?", {})[int(it)] = float(rate)
        return out

    def evaluation_success(self) -> dict[str, dict[str, float]]:
        """Evaluation run ('eval-*') -> kind -> success rate (reward >= 1), oldest run first."""
        out: dict[str, dict[str, float]] = {}
        for run_id, kind, rate in self._query(
                f"SELECT run_id, {_KIND}, AVG(COALESCE(reward, 0) >= 1) FROM trajectories WHERE run_id LIKE 'eval-%' "
                "GROUP BY 1, 2 ORDER BY MIN(created_at)"):
            out.setdefault(run_id, {})[kind] = float(rate)
        return out

    def latest_training_run(self) -> str | None:
        """The run id of the newest training rollout (one recorded with an iteration), if any."""
        rows = self._query(f"SELECT run_id FROM trajectories WHERE {_ITERATION} IS NOT NULL "
                           "ORDER BY created_at DESC LIMIT 1")
        return rows[0][0] if rows else None

    def credit(self, trajectory_id: str) -> dict[int, StepCredit]:
        """step -> what the trainer made of it (`record_credit`); steps no trainer used are absent."""
        if not self._has_credit:  # a store older than credit, read without migrating it
            return {}
        return {step: StepCredit(it, adv, n, None if teacher is None else json.loads(teacher))
                for step, it, adv, n, teacher in self._query(
                    f"SELECT step, iteration, advantage, trained_tokens, {self._teacher} FROM credit "
                    "WHERE trajectory_id = ?", (trajectory_id,))}

    def attempts(self, task_id: str) -> list[tuple[str, str | None, str | None, float | None]]:
        """Every recorded attempt at a task: (trajectory id, run id, adapter of its first step,
        reward), oldest first."""
        return self._query("SELECT t.id, t.run_id, (SELECT adapter FROM transitions WHERE trajectory_id = t.id "
                           "ORDER BY step LIMIT 1), t.reward FROM trajectories t WHERE t.task_id = ? "
                           "ORDER BY t.created_at", (task_id,))

    def evaluated_tasks(self) -> list[str]:
        """Tasks answered in more than one evaluation run (held-out tasks to compare versions on)."""
        return [r[0] for r in self._query("SELECT task_id FROM trajectories WHERE run_id LIKE 'eval-%' "
                                          "GROUP BY task_id HAVING COUNT(DISTINCT run_id) > 1 ORDER BY task_id")]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _trajectory(head: tuple, transitions: list[Transition]) -> Trajectory:
    """A Trajectory from the columns of `_READ_HEAD`, in that order."""
    tid, run_id, task_id, group_id, reward, metadata, end_reason, end_detail, role, excluded, behaviour = head
    return Trajectory(id=tid, run_id=run_id, task_id=task_id, group_id=group_id, reward=reward,
                      metadata=json.loads(metadata), end_reason=end_reason, end_detail=end_detail, role=role,
                      excluded=excluded, behaviour=behaviour or "policy", transitions=transitions)


@dataclass(frozen=True)
class TrajectoryQuery:
    """Which trajectories a view lists, and in what order (every filter optional: '' = any)."""

    run: str = ""
    """Run id."""
    iteration: str = ""
    """Training iteration (as its number)."""
    kind: str = ""
    """Task kind (the task's `kind`, else its id without the trailing number)."""
    status: str = ""
    """Coarse status: complete, failed, truncated or incomplete."""
    task: str = ""
    """Part of the task id."""
    group: str = ""
    """Group id."""
    behaviour: str = ""
    """Whose behaviour: policy, demonstration or guide (BEHAVIOURS)."""
    outcome: str = ""
    """'success' (complete with reward >= 1), 'failure' (anything else) or '' (both)."""
    sort: str = "created"
    """One of SORTS."""
    order: str = "desc"
    """'asc' or 'desc'."""

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise SchemaError(f"sort: expected one of {sorted(SORTS)}, got {self.sort!r}")
        if self.outcome not in ("", "success", "failure"):
            raise SchemaError(f"outcome: expected success or failure, got {self.outcome!r}")
        if self.order not in ("asc", "desc"):
            raise SchemaError(f"order: expected asc or desc, got {self.order!r}")

    def where(self) -> tuple[str, list[Any]]:
        clauses, args = [], []
        for column, value in (("run_id", self.run), ("status", self.status), ("group_id", self.group),
                              ("COALESCE(behaviour, 'policy')", self.behaviour)):
            if value:
                clauses.append(f"{column} = ?")
                args.append(value)
        if self.iteration:
            clauses.append(f"{_ITERATION} = ?")
            args.append(int(self.iteration) if self.iteration.isdigit() else self.iteration)
        if self.kind:
            clauses.append(f"{_KIND} = ?")
            args.append(self.kind)
        if self.outcome:
            clauses.append(_SUCCESS if self.outcome == "success" else f"NOT {_SUCCESS}")
        if self.task:
            clauses.append("task_id LIKE ?")
            args.append(f"%{self.task}%")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


__all__ = ["SORTS", TrajectoryQuery, "TrajectoryStore"]

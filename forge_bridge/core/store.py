"""Durable trajectory storage on SQLite in WAL mode.

Transitions are written one row per step as they happen, each in its own transaction, so a
process killed mid-episode leaves every finished step readable and the trajectory still marked
`incomplete`; SQLite's atomic commit means a row is either whole or absent. One connection per
store object behind a lock serialises this process's writers; WAL plus a busy timeout lets
several processes share one file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from forge_bridge.core import migrations, validate
from forge_bridge.core.deprecated import renamed_argument, renamed_keyword
from forge_bridge.core.store_views import SORTS, StoreViews, TrajectoryQuery, trajectory_of
from forge_bridge.core.errors import NotFound, SchemaError, StoreError, WrongType
from forge_bridge.core.types import (END_REASONS, STATUS_OF_END, Feedback, StepCredit, Trajectory,
                                     TrajectoryGroup, Transition, group_trajectories)

_HEAD = ("id", "run_id", "task_id", "group_id", "status", "reward", "metadata", "created_at",
         "updated_at", "end_reason", "end_detail", "role", "excluded", "behaviour")
_INSERT_HEAD = f"INSERT INTO trajectories ({', '.join(_HEAD)}) VALUES ({','.join('?' * len(_HEAD))})"
_READ_HEAD = "id, run_id, task_id, group_id, reward, metadata, end_reason, end_detail, role, excluded, behaviour"
_OWN = "COALESCE(behaviour, 'policy') = 'policy'"


class TrajectoryStore(StoreViews):
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
            have = {t: {r[1] for r in self._db.execute(f"PRAGMA table_info({t})")}
                    for t in ("trajectories", "transitions", "credit", "feedback", "events")}
            self._has_credit, self._has_feedback = bool(have["credit"]), bool(have["feedback"])
            self._has_events = bool(have["events"])
            typed = "behaviour" in have["trajectories"]  # an older store read-only: newer columns read as defaults
            self._head, self._own = (_READ_HEAD, _OWN) if typed else (_READ_HEAD.replace("behaviour", "NULL"), "1")
            self._teacher = "teacher_logprobs" if "teacher_logprobs" in have["credit"] else "NULL"
            self._version = "version" if "version" in have["transitions"] else "adapter"  # its name until version 6
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
        for sql in migrations.INDEXES:
            self._db.execute(sql)

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
                (trajectory_id, step, t.version, json.dumps(t.to_dict(), allow_nan=False)))

    def append(self, trajectory_id: str, transition: Transition) -> int:
        """Store the next step of an open trajectory and return its index."""
        if not isinstance(transition, Transition):
            raise WrongType(f"append() takes a Transition, got {type(transition).__name__}")
        (row,) = self._write(f"appending a step to {trajectory_id}", [(
            "INSERT INTO transitions SELECT ?, COALESCE(MAX(step) + 1, 0), ?, ? "
            "FROM transitions WHERE trajectory_id = ? RETURNING step",
            (trajectory_id, transition.version, json.dumps(transition.to_dict(), allow_nan=False),
             trajectory_id))])
        return row[0]

    def update_step(self, trajectory_id: str, step: int, transition: Transition) -> None:
        """Rewrite a stored step, e.g. once the tool results it asked for have arrived."""
        (row,) = self._write(f"updating step {step} of {trajectory_id}", [(
            "UPDATE transitions SET version = ?, data = ? WHERE trajectory_id = ? AND step = ? "
            "RETURNING step",
            (transition.version, json.dumps(transition.to_dict(), allow_nan=False), trajectory_id,
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
                    status: str | Iterable[str] | None = None, version: str | None = None,
                    since: float | None = None) -> list[str]:
        where: list[str] = []
        args: list[Any] = []
        if since is not None:
            where.append("created_at >= ?")
            args.append(float(since))
        for column, value in (("run_id", run_id), ("task_id", task_id), ("group_id", group_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            where.append(f"status IN ({','.join('?' * len(statuses))})")
            args += statuses
        if version is not None:
            where.append(f"id IN (SELECT trajectory_id FROM transitions WHERE {self._version} = ?)")
            args.append(version)
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
        return trajectory_of(head, [Transition.from_dict(json.loads(s[0])) for s in steps])

    def iter(self, *, run_id: str | None = None, task_id: str | None = None, group_id: str | None = None,
             status: str | Iterable[str] | None = None, version: str | None = None,
             since: float | None = None, adapter: str | None = None) -> Iterator[Trajectory]:
        """Trajectories matching every filter given (`version`: one of its steps served by that
        version; `since`: recorded at or after that unix time), oldest first, loaded one at a time.
        `adapter`: `version`'s deprecated name."""
        version = renamed_argument("TrajectoryStore filter", "adapter", "version", adapter, version)
        return self._load(run_id=run_id, task_id=task_id, group_id=group_id, status=status, version=version,
                          since=since)

    def _load(self, **filters: Any) -> Iterator[Trajectory]:
        for tid in self._select_ids(**filters):
            yield self.get(tid)

    def trajectories(self, **filters: Any) -> list[Trajectory]:
        """`iter`'s trajectories, as a list."""
        return list(self.iter(**renamed_keyword("TrajectoryStore filter", "adapter", "version", filters)))

    def count(self, **filters: Any) -> int:
        """How many trajectories match `iter`'s filters."""
        return len(self._select_ids(**renamed_keyword("TrajectoryStore filter", "adapter", "version", filters)))

    def groups(self, **filters: Any) -> list[TrajectoryGroup]:
        """Trajectories that share a group id (and role), as GRPO groups (ungrouped ones are left
        out)."""
        return group_trajectories(self.iter(**renamed_keyword("TrajectoryStore filter", "adapter", "version", filters)))

    # ------------------------------------------------------------------ feedback
    def add_feedback(self, feedback: Feedback) -> Feedback:
        """Append one feedback event on a stored episode; returns it with its place in the arrival
        order and its time. An episode the store does not hold is `NotFound`: nothing is written."""
        if not isinstance(feedback, Feedback):
            raise WrongType(f"add_feedback() takes a Feedback, got {type(feedback).__name__}")
        f = feedback
        (row,) = self._write(f"adding feedback to {f.episode_id}", [(
            "INSERT INTO feedback (trajectory_id, key, value, comment, step, source, at) SELECT ?, ?, ?, ?, ?, ?, ? "
            "WHERE EXISTS (SELECT 1 FROM trajectories WHERE id = ?) RETURNING seq, at",
            (f.episode_id, f.key, f.value, f.comment, f.step, f.source, time.time(), f.episode_id))])
        if row is None:
            raise NotFound(f"no episode {f.episode_id!r} in {self.path}: feedback is kept for stored episodes only")
        return dataclasses.replace(f, seq=row[0], at=row[1])

    def feedback(self, episode_ids: Iterable[str] | None = None, *, after: int = 0) -> dict[str, list[Feedback]]:
        """episode id -> its feedback in arrival order (episodes without any are absent): of these
        episodes, or of all; `after`: only events past that place in the arrival order."""
        if not self._has_feedback:  # an older store read without migrating it
            return {}
        sql = "SELECT trajectory_id, value, key, comment, step, source, seq, at FROM feedback WHERE seq > ?"
        ids = None if episode_ids is None else list(dict.fromkeys(episode_ids))
        # The ids go in chunks: old SQLite builds take at most 999 variables in a statement.
        chunks: list[list[str] | None] = [None] if ids is None else [ids[k:k + 900] for k in range(0, len(ids), 900)]
        out: dict[str, list[Feedback]] = {}
        for chunk in chunks:
            where = "" if chunk is None else f" AND trajectory_id IN ({','.join('?' * len(chunk))})"
            for row in self._query(sql + where + " ORDER BY seq", [after] + (chunk or [])):
                out.setdefault(row[0], []).append(Feedback(*row))
        return out

    # ------------------------------------------------------------------ serving events
    def add_event(self, kind: str, *, version: str | None = None, slot: str | None = None,
                  detail: dict | None = None) -> int:
        """Record what happened to the served versions (a promotion, a refused candidate, a
        rollback) with its time; returns its place in the order."""
        if not isinstance(kind, str) or not kind:
            raise SchemaError(f"event kind: expected a non-empty string, got {kind!r}")
        (row,) = self._write(f"recording the event {kind}", [(
            "INSERT INTO events (at, kind, slot, version, detail) VALUES (?, ?, ?, ?, ?) RETURNING seq",
            (time.time(), kind, slot, version, json.dumps(detail or {}, allow_nan=False)))])
        return row[0]

    def events(self, kind: str | None = None, *, episode: str | None = None) -> list[dict]:
        """The serving events, oldest first: {seq, at, kind, slot, version, detail}; of one kind,
        and (`episode`) only those whose detail names that episode (a judge's failure, say)."""
        if not self._has_events:
            return []
        where, args = [], []
        if kind:
            where, args = ["kind = ?"], [kind]
        if episode is not None:  # its id as the detail's JSON writes it, LIKE's wildcards escaped
            quoted = json.dumps(episode).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append("detail LIKE ? ESCAPE '\\'")
            args.append(f"%{quoted}%")
        rows = self._query("SELECT seq, at, kind, slot, version, detail FROM events"
                           + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY seq", args)
        exact = json.dumps(episode) if episode is not None else ""  # LIKE ignores ASCII case: this does not
        return [{"seq": s, "at": at, "kind": k, "slot": slot, "version": v, "detail": json.loads(d)}
                for s, at, k, slot, v, d in rows if exact in d]

    def _query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"reading {self.path} failed: {exc}") from None

    def credit(self, trajectory_id: str) -> dict[int, StepCredit]:
        """step -> what the trainer made of it (`record_credit`); steps no trainer used are absent."""
        if not self._has_credit:  # a store older than credit, read without migrating it
            return {}
        return {step: StepCredit(it, adv, n, None if teacher is None else json.loads(teacher))
                for step, it, adv, n, teacher in self._query(
                    f"SELECT step, iteration, advantage, trained_tokens, {self._teacher} FROM credit "
                    "WHERE trajectory_id = ?", (trajectory_id,))}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SORTS", "TrajectoryQuery", "TrajectoryStore"]

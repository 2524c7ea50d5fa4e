"""The trajectory store's reads for the inspector and the curves: a page of a filtered, sorted
list, runs, kinds, success by kind and iteration, evaluations, attempts at a task. SQL lives here
and in store.py only; `TrajectoryStore` inherits these."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from forge_bridge.core.errors import SchemaError
from forge_bridge.core.types import Trajectory, TrajectoryRow, Transition

# A trajectory's kind: what its task said (metadata), else its task id without the trailing number.
_KIND = "COALESCE(json_extract(metadata, '$.kind'), rtrim(rtrim(task_id, '0123456789'), '-'))"
_ITERATION = "json_extract(metadata, '$.iteration')"
_SUCCESS = "(status = 'complete' AND COALESCE(reward, 0) >= 1)"
SORTS = {"created": "created_at", "reward": "reward", "task": "task_id", "status": "status",
         "iteration": _ITERATION}
"""The orders `TrajectoryQuery.sort` names, and the column each sorts by."""


class StoreViews:
    """What the inspector reads; the store supplies `_query` (one read under its lock), `_head`
    (the trajectory columns this store has), `_own` (the policy's own trajectories) and `_version`
    (the column of the version that served a step, in this store's schema)."""

    _head: str
    _own: str
    _version: str

    def _query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        raise NotImplementedError

    def page(self, query: TrajectoryQuery, limit: int = 50, offset: int = 0) -> tuple[list[TrajectoryRow], int]:
        """One page of the trajectories matching `query`, in its order, and how many match in all;
        only the page is read (a store of 100,000+ trajectories is never loaded whole)."""
        where, args = query.where()
        total = self._query(f"SELECT COUNT(*) FROM trajectories{where}", args)[0][0]
        rows = self._query(f"SELECT {self._head}, {_ITERATION}, {_KIND} FROM trajectories{where} ORDER BY "
                           f"{SORTS[query.sort]} {query.order.upper()}, id LIMIT ? OFFSET ?", [*args, limit, offset])
        ids = [r[0] for r in rows]
        steps = {tid: (n, version) for tid, n, version in self._query(
            f"SELECT trajectory_id, COUNT(*), MAX({self._version}) FROM transitions WHERE trajectory_id IN "
            f"({','.join('?' * len(ids))}) GROUP BY trajectory_id", ids)} if ids else {}
        return [TrajectoryRow(trajectory_of(r[:11], []), r[11], r[12], *steps.get(r[0], (0, None))) for r in rows], total

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

    def attempts(self, task_id: str) -> list[tuple[str, str | None, str | None, float | None]]:
        """Every recorded attempt at a task: (trajectory id, run id, version of its first step,
        reward), oldest first."""
        return self._query(f"SELECT t.id, t.run_id, (SELECT {self._version} FROM transitions WHERE trajectory_id = t.id "
                           "ORDER BY step LIMIT 1), t.reward FROM trajectories t WHERE t.task_id = ? "
                           "ORDER BY t.created_at", (task_id,))

    def evaluated_tasks(self) -> list[str]:
        """Tasks answered in more than one evaluation run (held-out tasks to compare versions on)."""
        return [r[0] for r in self._query("SELECT task_id FROM trajectories WHERE run_id LIKE 'eval-%' "
                                          "GROUP BY task_id HAVING COUNT(DISTINCT run_id) > 1 ORDER BY task_id")]


def trajectory_of(head: tuple, transitions: list[Transition]) -> Trajectory:
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
        clauses: list[str] = []
        args: list[Any] = []
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


__all__ = ["SORTS", "StoreViews", "TrajectoryQuery", "trajectory_of"]

"""What `forge-bridge inspect` shows, read from a run folder: the SQLite store (read-only, safe
while a run is writing to it in WAL mode), `metrics.jsonl`, `results.json` and the tokenizer
the trainer saved beside them. Every list is a query with LIMIT/OFFSET, so a store of 100,000+
trajectories is never loaded whole.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_bridge.core.errors import InvalidArgument, NotFound, StoreError

SORTS = {"created": "created_at", "reward": "reward", "task": "task_id", "status": "status",
         "iteration": "iteration"}
# A trajectory's kind: what its task said (metadata), else its task id without the trailing number.
_KIND = "COALESCE(json_extract(metadata, '$.kind'), rtrim(rtrim(task_id, '0123456789'), '-'))"
_ITERATION = "json_extract(metadata, '$.iteration')"


@dataclass
class Filters:
    """The trajectory table's filters, as given in the page's query string."""

    run: str = ""
    iteration: str = ""
    kind: str = ""
    status: str = ""
    task: str = ""
    group: str = ""
    outcome: str = ""
    """'success' (complete with reward >= 1), 'failure' (anything else) or '' (both)."""
    sort: str = "created"
    order: str = "desc"
    page: int = 1

    @classmethod
    def from_query(cls, query: dict[str, str]) -> "Filters":
        f = cls(**{k: v for k, v in query.items() if k in cls.__dataclass_fields__ and k != "page"})
        try:
            f.page = max(1, int(query.get("page", "1")))
        except ValueError:
            raise InvalidArgument(f"page: expected a number, got {query.get('page')!r}") from None
        if f.sort not in SORTS:
            raise InvalidArgument(f"sort: expected one of {sorted(SORTS)}, got {f.sort!r}")
        if f.outcome not in ("", "success", "failure"):
            raise InvalidArgument(f"outcome: expected success or failure, got {f.outcome!r}")
        if f.order not in ("asc", "desc"):
            raise InvalidArgument(f"order: expected asc or desc, got {f.order!r}")
        return f

    def where(self) -> tuple[str, list[Any]]:
        clauses, args = [], []
        for column, value in (("run_id", self.run), ("status", self.status), ("group_id", self.group)):
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
            success = "(status = 'complete' AND COALESCE(reward, 0) >= 1)"
            clauses.append(success if self.outcome == "success" else f"NOT {success}")
        if self.task:
            clauses.append("task_id LIKE ?")
            args.append(f"%{self.task}%")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


@dataclass
class Step:
    """One model call as recorded, with what the trainer made of it."""

    index: int
    data: dict
    iteration: int | None = None
    advantage: float | None = None
    trained_tokens: int = 0
    new_prompt_ids: list[int] = field(default_factory=list)
    """Prompt tokens not in the previous step's prompt + completion (tool results, template)."""


class RunView:
    """Read-only access to one run folder (or a bare store)."""

    def __init__(self, folder: str | Path | None = None, *, store: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else None
        if store is None:
            if self.folder is None:
                raise InvalidArgument("inspect: give a run folder, or --store for a store outside one")
            store = self.folder / "trajectories.db"
        self.store_path = Path(store)
        if not self.store_path.is_file():
            raise NotFound(f"no trajectory store at {self.store_path} (a run folder holds trajectories.db; "
                           "--store points at one elsewhere)")
        self._tokenizer: Any = None
        try:  # fail now, clearly, on something that is not our store
            self.query("SELECT 1 FROM trajectories LIMIT 1")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.store_path} is not a forge-bridge trajectory store: {exc}") from None
        # a store written before the trainer recorded credit has no such table (read-only: not added)
        self.has_credit = bool(self.query("SELECT 1 FROM sqlite_master WHERE name = 'credit'"))

    def connect(self) -> sqlite3.Connection:
        """A read-only connection (SQLite's mode=ro: it never writes, and reads in WAL mode while
        the trainer writes)."""
        db = sqlite3.connect(f"{self.store_path.resolve().as_uri()}?mode=ro", uri=True, timeout=10,
                             check_same_thread=False)
        db.execute("PRAGMA query_only=ON")
        return db

    def query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        db = self.connect()
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    # ------------------------------------------------------------------ runs and curves
    def metrics(self) -> list[dict]:
        """metrics.jsonl, one dict per iteration (a line being written is skipped)."""
        path = self.folder / "metrics.jsonl" if self.folder else None
        if path is None or not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(item, dict) and isinstance(item.get("iteration"), int):
                out.append(item)
        return out

    def results(self) -> dict | None:
        path = self.folder / "results.json" if self.folder else None
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None

    def runs(self) -> list[tuple[str, int, int, float | None]]:
        """(run id, trajectories, completed, mean reward), most recent first."""
        return self.query("SELECT run_id, COUNT(*), SUM(status = 'complete'), AVG(reward) FROM trajectories "
                          "GROUP BY run_id ORDER BY MAX(created_at) DESC")

    def kinds(self) -> list[str]:
        return [r[0] for r in self.query(f"SELECT DISTINCT {_KIND} FROM trajectories ORDER BY 1") if r[0]]

    def success_by_kind(self, run_id: str, threshold: float = 1.0) -> dict[str, dict[int, float]]:
        """kind -> iteration -> success rate of the run's training rollouts."""
        out: dict[str, dict[int, float]] = {}
        rows = self.query(f"SELECT {_KIND}, {_ITERATION}, AVG(COALESCE(reward, 0) >= ?) FROM trajectories "
                          f"WHERE run_id = ? AND {_ITERATION} IS NOT NULL GROUP BY 1, 2 ORDER BY 2",
                          (threshold, run_id))
        for kind, it, rate in rows:
            out.setdefault(kind or "?", {})[int(it)] = float(rate)
        return out

    def evaluations(self) -> dict[str, dict[str, float]]:
        """Held-out success, phase -> kind -> rate: results.json's, else the store's eval-* runs."""
        results = self.results()
        if results and isinstance(results.get("results"), dict):
            return results["results"]
        out: dict[str, dict[str, float]] = {}
        for run_id, kind, rate in self.query(
                f"SELECT run_id, {_KIND}, AVG(COALESCE(reward, 0) >= 1) FROM trajectories WHERE run_id LIKE 'eval-%' "
                "GROUP BY 1, 2 ORDER BY MIN(created_at)"):
            out.setdefault(run_id, {})[kind] = float(rate)
        return out

    def training_run_id(self) -> str | None:
        path = self.folder / "run.json" if self.folder else None
        try:
            return str(json.loads(path.read_text())["run_id"])
        except (AttributeError, OSError, json.JSONDecodeError, KeyError, TypeError):
            pass  # no run.json (a bare store) or an unreadable one: the newest training rollout says
        rows = self.query(f"SELECT run_id FROM trajectories WHERE {_ITERATION} IS NOT NULL "
                          "ORDER BY created_at DESC LIMIT 1")
        return rows[0][0] if rows else None

    # ------------------------------------------------------------------ the trajectory table
    def list_trajectories(self, f: Filters, per_page: int = 50) -> tuple[list[dict], int]:
        """One page of matching trajectories and how many match in all."""
        where, args = f.where()
        total = self.query(f"SELECT COUNT(*) FROM trajectories{where}", args)[0][0]
        order = SORTS[f.sort] if f.sort != "iteration" else _ITERATION
        rows = self.query(
            f"SELECT id, run_id, task_id, group_id, status, end_reason, reward, {_ITERATION}, {_KIND}, excluded "
            f"FROM trajectories{where} ORDER BY {order} {f.order.upper()}, id LIMIT ? OFFSET ?",
            [*args, per_page, (f.page - 1) * per_page])
        ids = [r[0] for r in rows]
        steps = {}
        if ids:
            steps = {tid: (n, adapter) for tid, n, adapter in self.query(
                f"SELECT trajectory_id, COUNT(*), MAX(adapter) FROM transitions WHERE trajectory_id IN "
                f"({','.join('?' * len(ids))}) GROUP BY trajectory_id", ids)}
        keys = ("id", "run", "task", "group", "status", "end_reason", "reward", "iteration", "kind", "excluded")
        out = []
        for row in rows:
            item = dict(zip(keys, row))
            item["steps"], item["adapter"] = steps.get(row[0], (0, None))
            out.append(item)
        return out, total

    # ------------------------------------------------------------------ one trajectory
    def trajectory(self, trajectory_id: str) -> tuple[dict, list[Step]]:
        head = self.query("SELECT id, run_id, task_id, group_id, status, reward, metadata, end_reason, end_detail, "
                          "role, excluded FROM trajectories WHERE id = ?", (trajectory_id,))
        if not head:
            raise NotFound(f"no trajectory {trajectory_id!r} in {self.store_path}")
        keys = ("id", "run", "task", "group", "status", "reward", "metadata", "end_reason", "end_detail", "role",
                "excluded")
        info = dict(zip(keys, head[0]))
        info["metadata"] = json.loads(info["metadata"])
        credit = {step: (it, adv, n) for step, it, adv, n in self.query(
            "SELECT step, iteration, advantage, trained_tokens FROM credit WHERE trajectory_id = ?", (trajectory_id,))
        } if self.has_credit else {}
        steps, previous = [], []
        for index, data in self.query("SELECT step, data FROM transitions WHERE trajectory_id = ? ORDER BY step",
                                      (trajectory_id,)):
            step = Step(index, json.loads(data))
            if index in credit:
                step.iteration, step.advantage, step.trained_tokens = credit[index]
            prompt = step.data.get("prompt_token_ids") or []
            shared = 0
            while shared < min(len(prompt), len(previous)) and prompt[shared] == previous[shared]:
                shared += 1
            step.new_prompt_ids = prompt[shared:]
            previous = prompt + (step.data.get("completion_token_ids") or [])
            steps.append(step)
        return info, steps

    def group(self, group_id: str) -> list[tuple[dict, list[Step]]]:
        ids = [r[0] for r in self.query("SELECT id FROM trajectories WHERE group_id = ? ORDER BY created_at, id",
                                        (group_id,))]
        if not ids:
            raise NotFound(f"no group {group_id!r} in {self.store_path}")
        return [self.trajectory(i) for i in ids]

    def answers_to(self, task_id: str) -> list[tuple[str, str, str | None, float | None]]:
        """Every recorded attempt at a task: (trajectory id, run id, adapter, reward), oldest first."""
        return self.query("SELECT t.id, t.run_id, (SELECT adapter FROM transitions WHERE trajectory_id = t.id "
                          "ORDER BY step LIMIT 1), t.reward FROM trajectories t WHERE t.task_id = ? "
                          "ORDER BY t.created_at", (task_id,))

    def evaluated_tasks(self) -> list[str]:
        """Tasks answered in more than one evaluation run (held-out tasks to compare versions on)."""
        return [r[0] for r in self.query("SELECT task_id FROM trajectories WHERE run_id LIKE 'eval-%' "
                                         "GROUP BY task_id HAVING COUNT(DISTINCT run_id) > 1 ORDER BY task_id")]

    # ------------------------------------------------------------------ tokens
    def tokenizer_path(self) -> Path | None:
        """The trainer's copy in `tokenizer/`, else that of the model the run folder's
        config.json names (a model directory, or the embedded model's converted copy)."""
        if self.folder is None:
            return None
        candidates = [self.folder / "tokenizer" / "tokenizer.json"]
        for name in ("trainer.json", "config.json"):  # the trainer's record, the demo's settings
            try:
                model = json.loads((self.folder / name).read_text()).get("model")
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
            if isinstance(model, str):
                from forge_bridge.policies import models

                candidates += [Path(model) / "tokenizer.json", models.cache_dir() / "models" / model / "tokenizer.json"]
        return next((p for p in candidates if p.is_file()), None)

    def tokenizer(self) -> Any:
        """The run's tokenizer, or None: tokens then show as their ids."""
        if self._tokenizer is None:
            path = self.tokenizer_path()
            if path is None:
                self._tokenizer = False
            else:
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_file(str(path))
        return self._tokenizer or None

    def token_texts(self, ids: list[int]) -> list[str]:
        tokenizer = self.tokenizer()
        if tokenizer is None:
            return [f"⟨{i}⟩" for i in ids]
        return [tokenizer.decode([i], skip_special_tokens=False) or f"⟨{i}⟩" for i in ids]


def first_divergence(steps_per_rollout: list[list[Step]]) -> int | None:
    """The first step index where the rollouts' completions differ (None: identical throughout)."""
    for k in range(max((len(s) for s in steps_per_rollout), default=0)):
        seen = {tuple(s[k].data.get("completion_token_ids") or []) if k < len(s) else None for s in steps_per_rollout}
        if len(seen) > 1:
            return k
    return None


__all__ = ["Filters", "RunView", "Step", "first_divergence"]

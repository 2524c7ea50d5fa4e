"""Trajectories in and out of a store as files: JSONL (the versioned JSON layout, one
trajectory per line) and Parquet (one row per step, for analysis). Reads and writes go through
the store's own methods; each file is written to a temporary name and renamed into place."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forge_bridge.core.errors import SchemaError
from forge_bridge.core.types import Trajectory

if TYPE_CHECKING:
    from forge_bridge.core.store import TrajectoryStore

_COLUMNS = (("trajectory_id", "string"), ("run_id", "string"), ("task_id", "string"), ("group_id", "string"),
            ("status", "string"), ("end_reason", "string"), ("role", "string"), ("excluded", "string"),
            ("final_reward", "float64"), ("step", "int32"), ("version", "string"), ("slot", "string"),
            ("reward", "float64"), ("terminated", "bool_"), ("truncated", "bool_"),
            ("prompt_token_ids", "ids"), ("completion_token_ids", "ids"), ("completion_logprobs", "floats"),
            ("observation", "string"), ("action", "string"), ("info", "string"))


def export_jsonl(store: "TrajectoryStore", path: str | os.PathLike, **filters: Any) -> int:
    """One trajectory per line, in the versioned JSON layout; returns how many."""
    n = 0
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for t in store.iter(**filters):
            f.write(t.to_json() + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def _row(traj: Trajectory, step: int) -> dict:
    t = traj.transitions[step]
    return {"trajectory_id": traj.id, "run_id": traj.run_id, "task_id": traj.task_id, "group_id": traj.group_id,
            "status": traj.status, "end_reason": traj.end_reason, "role": traj.role, "excluded": traj.excluded,
            "final_reward": traj.reward, "step": step, "version": t.version, "slot": t.slot, "reward": t.reward,
            "terminated": t.terminated, "truncated": t.truncated, "prompt_token_ids": t.prompt_token_ids,
            "completion_token_ids": t.completion_token_ids, "completion_logprobs": t.completion_logprobs,
            "observation": json.dumps(t.observation.to_dict()), "action": json.dumps(t.action.to_dict()),
            "info": json.dumps(t.info)}


def export_parquet(store: "TrajectoryStore", path: str | os.PathLike, **filters: Any) -> int:
    """One row per transition with its trajectory's columns (needs pyarrow: the `[parquet]`
    extra); returns the row count."""
    from forge_bridge.core.extras import require

    pa = require("pyarrow", "parquet")
    import pyarrow.parquet as pq

    types = {"ids": pa.list_(pa.int32()), "floats": pa.list_(pa.float32())}
    schema = pa.schema([(name, types[kind] if kind in types else getattr(pa, kind)()) for name, kind in _COLUMNS])
    rows: dict[str, list] = {name: [] for name, _ in _COLUMNS}
    for traj in store.iter(**filters):
        for step in range(len(traj.transitions)):
            for key, value in _row(traj, step).items():
                rows[key].append(value)
    tmp = Path(f"{path}.tmp")
    pq.write_table(pa.table(rows, schema=schema), tmp)
    os.replace(tmp, path)
    return len(rows["step"])


def import_jsonl(store: "TrajectoryStore", path: str | os.PathLike) -> int:
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
    store.add_many(parsed, what=f"importing {path}")
    return len(parsed)


__all__ = ["export_jsonl", "export_parquet", "import_jsonl"]

"""Run folders: one training run per folder, named by a run id that keys everything it writes.

A trainer's folder holds `run.json` (the run id), its adapters, checkpoints, `metrics.jsonl` and
its trajectory store. Every trajectory, group id and metrics line of the run carries the run id,
so two runs never mix: a new run in a folder that already holds one is refused unless it
resumes that run, or the old one is set aside first (`set_aside`, `forge-bridge train --new`).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from forge_bridge.core.errors import RunExistsError

RUN_FILE = "run.json"


def holds_run(out: Path) -> bool:
    """Does `out` hold a training run (its id file, a checkpoint or metrics)?"""
    return any((out / name).exists() for name in (RUN_FILE, "checkpoints", "metrics.jsonl"))


def read_run_id(out: Path, legacy: str) -> str:
    """The run id of the run in `out` (`legacy`, the run name, for a folder from before run ids)."""
    path = out / RUN_FILE
    if not path.is_file():
        return legacy
    return str(json.loads(path.read_text())["run_id"])


def new_run(out: Path, run_name: str) -> str:
    """Start a run in `out`: a fresh id, written to `run.json` (atomically); returns it."""
    run_id = f"{run_name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps({"run_id": run_id, "run_name": run_name, "created": time.time()}))
    os.replace(tmp, out / RUN_FILE)
    return run_id


def refuse(out: Path, run_id: str) -> RunExistsError:
    return RunExistsError(
        f"{out} already holds run {run_id!r}. Continue it with resume=True (forge-bridge train "
        f"--resume), or set it aside first with forge_bridge.core.runs.set_aside({str(out)!r}) "
        "(forge-bridge train --new), or pick another out_dir; runs are never mixed in one folder.")


def set_aside(out: str | os.PathLike) -> Path | None:
    """Move an earlier run out of the way (to `<out>-<its time>`), so a new run never mixes its
    metrics and trajectories into it and nothing of it is lost; returns where it went."""
    out = Path(out)
    if not out.exists() or not any(out.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(out.stat().st_mtime))
    earlier, n = out.with_name(f"{out.name}-{stamp}"), 1
    while earlier.exists():
        earlier, n = out.with_name(f"{out.name}-{stamp}-{n}"), n + 1
    out.rename(earlier)
    return earlier


__all__ = ["RunExistsError", "holds_run", "new_run", "read_run_id", "refuse", "set_aside"]

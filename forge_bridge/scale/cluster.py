"""Ray itself: imported on first use with a clear error when the extra is missing, and a local
cluster started when none is running (workers then see this process's import path)."""

from __future__ import annotations

import os
import sys
from typing import Any

from forge_bridge.core.extras import require


def require_ray() -> Any:
    """The `ray` module, or a clear error naming the extra that installs it."""
    return require("ray", "ray")


def ensure_ray(init: dict | None = None) -> Any:
    """Ray, connected: to the cluster already joined, else `ray.init(**init)` (default: a local
    one on this machine's CPUs, no dashboard, no usage report). Workers of a cluster started
    here import from this process's `sys.path`; on a cluster of several machines, ship the code
    with Ray's own `runtime_env` (`init={"address": "auto", "runtime_env": {...}}`)."""
    ray = require_ray()
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        paths = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        kwargs = {"include_dashboard": False, "runtime_env": {"env_vars": {"PYTHONPATH": paths}},
                  **(init or {})}
        ray.init(**kwargs)
    return ray


__all__ = ["ensure_ray", "require_ray"]

"""Reward curves from a run folder's metrics.jsonl, as a PNG a person can look at."""

from __future__ import annotations

import json
from pathlib import Path

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.extras import require


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Plot mean reward and success rate per iteration; returns the PNG's path."""
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    log = run_dir / "metrics.jsonl"
    if not log.is_file():
        raise FileNotFoundError(f"{log} does not exist: is {run_dir} a training run folder?")
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    if not rows:
        raise InvalidArgument(f"{log} holds no iterations yet")
    it = [r["iteration"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(it, [r["reward_mean"] for r in rows], marker="o", label="mean reward (rollouts)")
    ax.plot(it, [r["success_rate"] for r in rows], marker=".", linestyle="--", label="success rate")
    ax.set_xlabel("iteration (adapter version)")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"forge-bridge training: {run_dir.name}")
    fig.tight_layout()
    path = Path(out) if out else run_dir / "reward_curve.png"
    fig.savefig(path)
    plt.close(fig)
    return path

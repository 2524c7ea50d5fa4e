"""The run log: metrics (`metrics.jsonl` and TensorBoard), one line per iteration, and the line
a person reads of each."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any


class RunLog:
    """Metrics of one run folder, one dict per iteration, in `metrics.jsonl` and TensorBoard."""

    def __init__(self, folder: Path, run_id: str) -> None:
        self.folder, self.run_id = folder, run_id
        self.history: list[dict] = []
        """Every iteration's metrics so far (resumed ones included)."""
        self._tb: Any = None

    def log(self, metrics: dict) -> None:
        """Append one iteration's metrics (tagged with the run id) everywhere they go."""
        metrics = {"run_id": self.run_id, **metrics}
        self.history.append(metrics)
        with open(self.folder / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        writer = self._writer()
        if writer is None:
            return
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and key != "iteration":
                writer.add_scalar(key, value, metrics["iteration"])
        writer.flush()

    def log_event(self, name: str, metrics: dict) -> None:
        """A one-off step outside the iterations (the warm start, the probe): `events.jsonl`, and
        TensorBoard at step 0 under '<name>/...'."""
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        with open(self.folder / "events.jsonl", "a") as f:
            f.write(json.dumps({"run_id": self.run_id, "event": name, **metrics}, default=str) + "\n")
        writer = self._writer()
        if writer is not None:
            for key, value in numbers.items():
                writer.add_scalar(key if key.startswith(f"{name}/") else f"{name}/{key}", value, 0)
            writer.flush()

    def _writer(self) -> Any:
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # a bare GPU machine: metrics.jsonl still has every number
                self._tb = False
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=3)
            else:
                self._tb = SummaryWriter(str(self.folder / "tb"))
        return self._tb or None

    def keep_until(self, iteration: int) -> None:
        """Read the logged metrics back, dropping lines past `iteration` (logged, not checkpointed)."""
        path = self.folder / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        self.history = [m for m in map(json.loads, filter(str.strip, lines)) if m["iteration"] <= iteration]
        path.write_text("".join(json.dumps(m) + "\n" for m in self.history))

    def close(self) -> None:
        if self._tb:
            self._tb.close()


def summary_line(metrics: dict) -> str:
    """One iteration in a line: reward, success (per kind when the tasks have one), the format the
    tool calls were read in, the share of groups with no reward spread, and a warning when no group
    had any signal."""
    parts = [f"iteration {metrics['iteration']}: reward {metrics.get('reward_mean', 0.0):.2f}",
             f"success {metrics.get('success_rate', 0.0):.0%}"]
    kinds = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("success/")}
    if kinds:
        parts[-1] += " (" + ", ".join(f"{kind} {v:.0%}" for kind, v in kinds.items()) + ")"
    calls = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("calls/")}
    if calls:
        parts.append("calls read as " + ", ".join(f"{name} {v:.0%}" for name, v in calls.items()))
    shares = {k: v for k, v in metrics.items() if k.endswith("zero_signal_share")}
    if shares:
        parts.append("no-spread groups " + ", ".join(f"{v:.0%}" for v in shares.values()))
    line = "; ".join(parts)
    if shares and all(v >= 1.0 for v in shares.values()):
        line += ("\n  no group had any reward spread this iteration: nothing was learned from rewards "
                 "(run the probe: forge-bridge probe; docs/own-agent.md#no-signal)")
    return line


__all__ = ["RunLog", "summary_line"]

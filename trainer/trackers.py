"""The trackers a run reports to besides `metrics.jsonl` (`RunConfig.report_to`, as Hugging Face's
Trainer has it): TensorBoard, Weights & Biases and MLflow. Each gets the same numbers: every
metric of every iteration at its iteration as the step, each one-off event (the warm start, the
probe, validation) under '<event>/...' at step 0, and the run's config as one flat dict.

Where each reads its settings (as their own libraries do):
    tensorboard  <run folder>/tb
    wandb        WANDB_PROJECT (default 'forge-bridge'), WANDB_MODE, WANDB_DIR (default the run folder);
                 the run's id is the forge-bridge run id, so a resumed run continues the same one
    mlflow       the tracking URI (`mlflow.set_tracking_uri`, MLFLOW_TRACKING_URI), MLFLOW_EXPERIMENT_NAME
                 (default 'forge-bridge'); a resumed run continues the MLflow run tagged with its id
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from forge_bridge.core.extras import require
PROJECT = "forge-bridge"
"""The W&B project and MLflow experiment a run goes to unless the environment names another."""


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics line every tracker gets (the iteration is the step, not a metric)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and k != "iteration"}


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict (`TrainerConfig.to_dict`) as one level: {'optimizer.lr': 3e-4, ...}."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out |= flat_config(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


class Tracker:
    """One place a run's numbers go besides metrics.jsonl."""

    def log(self, numbers: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and end the run there."""


class TensorBoard(Tracker):
    """<run folder>/tb, read by `tensorboard --logdir`; the config as a text panel."""

    def __init__(self, writer: Any, config: dict[str, Any]) -> None:
        self.writer = writer
        self.writer.add_text("config", "\n".join(f"    {k}: {json.dumps(v)}" for k, v in config.items()), 0)

    def log(self, numbers: dict[str, float], step: int) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB(Tracker):
    """A Weights & Biases run: every metric plotted against `iteration` (so an event logged at 0
    after the iterations is kept, where W&B drops a step lower than its last)."""

    def __init__(self, folder: Path, run_id: str, name: str, config: dict[str, Any]) -> None:
        wandb = require("wandb", "wandb")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), id=_wandb_id(run_id), name=name,
                              resume="allow", config=config, dir=os.environ.get("WANDB_DIR", str(folder)),
                              reinit="create_new", settings=wandb.Settings(console="off"))
        self.run.define_metric("iteration")
        self.run.define_metric("*", step_metric="iteration")

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log({**numbers, "iteration": step})

    def close(self) -> None:
        self.run.finish()


class MLflow(Tracker):
    """An MLflow run (through `MlflowClient`: the user's own active run, if any, is left alone)."""

    def __init__(self, run_id: str, name: str, config: dict[str, Any]) -> None:
        require("mlflow", "mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        earlier = self.client.search_runs([experiment_id], f"tags.forge_bridge_run_id = '{run_id}'", max_results=1)
        if earlier:  # a resumed run: its parameters are logged already (MLflow refuses to change one)
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        self.run_id = self.client.create_run(experiment_id, run_name=name,
                                             tags={"forge_bridge_run_id": run_id}).info.run_id
        params = [Param(_mlflow_key(k), (v if isinstance(v, str) else json.dumps(v))[:6000]) for k, v in config.items()]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log(self, numbers: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in numbers.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def open_trackers(names: Sequence[str], folder: Path, run_id: str, name: str, config: dict[str, Any]) -> list[Tracker]:
    """The trackers `names` asks for, each started; a missing extra is a `MissingExtra` naming
    its install (before anything trains). TensorBoard is part of the core: where it is absent
    (a bare GPU machine) it is left out with a warning, metrics.jsonl still holding every number."""
    flat = flat_config(config)
    trackers: list[Tracker] = []
    for tracker in names:
        if tracker == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=4)
                continue
            trackers.append(TensorBoard(SummaryWriter(str(folder / "tb")), flat))
        elif tracker == "wandb":
            trackers.append(WandB(folder, run_id, name, flat))
        else:
            trackers.append(MLflow(run_id, name, flat))
    return trackers


def _wandb_id(run_id: str) -> str:
    """W&B run ids take letters, digits, '-' and '_'."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", run_id)


def _mlflow_key(key: str) -> str:
    """MLflow names take letters, digits, '_', '-', '.', ' ', '/'; anything else becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", key)


__all__ = ["MLflow", "PROJECT", "TensorBoard", "Tracker", "WandB", "flat_config", "open_trackers",
           "scalars"]

"""The run folder: the run's id, its store, its metrics, its checkpoints and random state, and
the iteration it has reached.

A run killed at any point resumes from its last checkpoint: the LoRAs, optimizers, heads and
random states come back, a metrics line logged after that checkpoint is dropped, and the
rollouts of the interrupted iteration stay stored, marked `excluded`, while that iteration runs
again with fresh ones.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from forge_bridge.core import runs
from forge_bridge.core.episode import Recorder
from forge_bridge.core.types import TrajectoryGroup
from forge_bridge.trainer import checkpoint
from forge_bridge.trainer.batch import Sample, trained_tokens_per_step
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.trainer.runlog import RunLog

if TYPE_CHECKING:
    from forge_bridge.trainer.learner import Learner


class RunFolder:
    """One run's folder (a new run, or the one it holds), its store, its log and its checkpoints."""

    def __init__(self, config: TrainerConfig, source: str, algorithm: str, recorder: Recorder | None,
                 tokenizer: object) -> None:
        self.folder = Path(config.out_dir)
        self.config = config
        self.folder.mkdir(parents=True, exist_ok=True)
        self.previous_run = runs.holds_run(self.folder)
        """The folder held a run when this trainer was made: train() resumes it or refuses."""
        self.run_id = (runs.read_run_id(self.folder, config.run_name) if self.previous_run
                       else runs.new_run(self.folder, config.run_name))
        """Keys every trajectory, group id and metrics line of this run."""
        self.recorder = recorder or Recorder(self.folder / "trajectories.db", run_id=self.run_id)
        if not (self.folder / "tokenizer").is_dir():  # the run folder reads on its own (forge-bridge inspect)
            tokenizer.save_pretrained(self.folder / "tokenizer")
        (self.folder / "trainer.json").write_text(json.dumps(
            {"trainer": algorithm, "model": source, "config": dataclasses.asdict(config)},
            indent=1, default=str))  # out_dir may be a Path
        self.log = RunLog(self.folder, self.run_id)
        """The metrics, one line per iteration (`metrics.jsonl`, TensorBoard)."""
        self.rng = random.Random(config.seed)
        """Draws the tasks' order and the minibatches; checkpointed."""
        self.iteration = 0
        """Iterations done (resumed ones included)."""

    def refuse_to_overwrite(self) -> None:
        """A folder that held a run before, trained again without `resume`: refused."""
        if self.previous_run and self.iteration == 0:
            raise runs.refuse(self.folder, self.run_id)

    def record_credit(self, groups: Sequence[TrajectoryGroup], samples: Sequence[Sample], iteration: int,
                      advantages: dict[tuple[str, int], float], teacher: dict[tuple[str, int], list[float]]) -> None:
        """Store what an iteration made of each step -- the advantage it was given and the
        completion tokens the loss trains on (0: its group was uniform, or it was cut or
        untrainable) -- so `forge-bridge inspect` shows exactly what the update saw."""
        trained = trained_tokens_per_step(samples)
        self.recorder.store.record_credit(iteration, [
            (t.id, k, advantages.get((t.id, k)), trained.get((t.id, k), 0), teacher.get((t.id, k)))
            for group in groups for t in group.trajectories for k in range(len(t.transitions))])

    def end_iteration(self, metrics: dict, learner: "Learner", state: dict, full: dict | None) -> None:
        """Iteration `metrics['iteration']` is done: log it, then checkpoint it (`checkpoint`)."""
        self.iteration = metrics["iteration"]
        self.log.log(metrics)
        self.checkpoint(learner, state, full)

    def checkpoint(self, learner: "Learner", state: dict, full: dict | None) -> Path:
        """The learner's LoRAs, optimizers and heads and the random states at this iteration;
        `state`: what the algorithm checks on resume; `full`: the gathered LoRA and optimizer
        states where the model holds shards (FSDP2)."""
        return checkpoint.save(self.folder / "checkpoints", self.iteration, learner.model, learner.optimizers,
                               learner.heads, {"config": self.config.to_dict(),
                                               "trainer_rng": list(self.rng.getstate()[1]), **state}, full)

    def resume(self, learner: "Learner", check: Callable[[dict, Path], None]) -> bool:
        """Restore the learner and the random states from the last checkpoint (none: start over),
        after `check(state, path)` accepted it (a refusal changes nothing); the interrupted
        iteration's rollouts are excluded. Returns whether a checkpoint was restored."""
        path = checkpoint.latest(self.folder / "checkpoints")
        if path is not None:
            check(json.loads((path / "state.json").read_text()), path)
        state = None if path is None else checkpoint.load(path, learner.model, learner.optimizers, learner.heads)
        done = 0 if state is None else state["iteration"]
        store = self.recorder.store
        interrupted = [t.id for t in store.iter(run_id=self.run_id)
                       if t.excluded is None and t.metadata.get("iteration", 0) > done]
        store.exclude(interrupted, f"iteration {done + 1} was interrupted; it ran again on resume with fresh rollouts")
        if state is None:
            return False
        self.iteration = state["iteration"]
        self.rng.setstate((3, tuple(state["trainer_rng"]), None))
        self.log.keep_until(self.iteration)
        return True


__all__ = ["RunFolder"]

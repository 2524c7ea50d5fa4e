"""The run folder: the run's id, its store, its metrics (`metrics.jsonl` and the trackers), its
checkpoints and random state, the iteration it has reached, and the versions it publishes.

Version N of the shared LoRA is '<run>-vN', of a role slot's '<run>-<slot>-vN'; each is saved
atomically under `<run folder>/adapters/` and loaded into the policy's slot, which then serves it
on its next call (`Publisher`).

Checkpoints survive a SIGKILL: written to a temporary folder, renamed into place, and only then
named by the `latest` pointer (itself replaced atomically). Tensors go to safetensors and the
rest to JSON, so loading a checkpoint never unpickles anything.

A run killed at any point resumes from its last checkpoint: the LoRAs, optimizers, heads and
random states come back, a metrics line logged after that checkpoint is dropped, and the
rollouts of the interrupted iteration stay stored, marked `excluded`, while that iteration runs
again with fresh ones.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from safetensors.torch import load_file, save_file

from forge_bridge.core import runs
from forge_bridge.core.atomic import write_dir
from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidState
from forge_bridge.core.types import TrajectoryGroup
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.policies.base import DEFAULT_SLOT, Policy
from forge_bridge.trainer.lora import DEFAULT_ADAPTER, save_adapter
from forge_bridge.trainer.trackers import Tracker, open_trackers, scalars

if TYPE_CHECKING:
    from forge_bridge.trainer.learner import Learner


class RunFolder:
    """One run's folder (a new run, or the one it holds), its store, its log and its checkpoints."""

    def __init__(self, config: TrainerConfig, source: str, algorithm: str, recorder: Recorder | None,
                 tokenizer: Any) -> None:
        self.folder = Path(config.run.out_dir)
        self.config = config
        self.folder.mkdir(parents=True, exist_ok=True)
        self.previous_run = runs.holds_run(self.folder)
        """The folder held a run when this trainer was made: train() resumes it or refuses."""
        self.run_id = (runs.read_run_id(self.folder, config.run.name) if self.previous_run
                       else runs.new_run(self.folder, config.run.name))
        """Keys every trajectory, group id and metrics line of this run."""
        self.recorder = recorder or Recorder(self.folder / "trajectories.db", run_id=self.run_id)
        if not (self.folder / "tokenizer").is_dir():  # the run folder reads on its own (forge-bridge inspect)
            tokenizer.save_pretrained(self.folder / "tokenizer")
        self.settings = config.to_dict()
        """The config as checkpoints record it."""
        (self.folder / "trainer.json").write_text(json.dumps(
            {"trainer": algorithm, "model": source, "config": self.settings}, indent=1))
        self.log = RunLog(self.folder, self.run_id, open_trackers(
            config.run.report_to, self.folder, self.run_id, config.run.name,
            {"trainer": algorithm, "model": source, **self.settings}))
        """The metrics, one line per iteration (`metrics.jsonl` and the trackers of `report_to`)."""
        self.rng = random.Random(config.run.seed)
        """Draws the tasks' order and the minibatches; checkpointed."""
        self.iteration = 0
        """Iterations done (resumed ones included)."""
        self.resumed_state: dict = {}
        """What the checkpoint a resume restored held besides the weights (its `state`)."""

    def refuse_to_overwrite(self) -> None:
        """A folder that held a run before, trained again without `resume`: refused."""
        if self.previous_run and self.iteration == 0:
            raise runs.refuse(self.folder, self.run_id)

    def record_credit(self, groups: Sequence[TrajectoryGroup], trained: dict[tuple[str, int], int], iteration: int,
                      advantages: dict[tuple[str, int], float], teacher: dict[tuple[str, int], list[float]]) -> None:
        """Store what an iteration made of each step -- the advantage it was given and the
        completion tokens the loss trains on (`trained`; 0: its group was uniform, or it was cut
        or untrainable) -- so `forge-bridge inspect` shows exactly what the update saw."""
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
        return save_checkpoint(self.folder / "checkpoints", self.iteration, learner.model, learner.optimizers,
                               learner.heads, {"config": self.settings,
                                               "trainer_rng": list(self.rng.getstate()[1]), **state}, full)

    def exclude_iterations(self, iterations: Sequence[int], why: str) -> int:
        """Mark the run's rollouts of these iterations (1-based) excluded from training, with why;
        returns how many."""
        store = self.recorder.store
        ids = [t.id for t in store.iter(run_id=self.run_id)
               if t.excluded is None and t.metadata.get("iteration") in set(iterations)]
        store.exclude(ids, why)
        return len(ids)

    def resume(self, learner: "Learner", check: Callable[[dict, Path], None]) -> bool:
        """Restore the learner and the random states from the last checkpoint (none: start over),
        after `check(state, path)` accepted it (a refusal changes nothing); the interrupted
        iteration's rollouts are excluded. Returns whether a checkpoint was restored."""
        path = latest_checkpoint(self.folder / "checkpoints")
        if path is not None:
            check(json.loads((path / "state.json").read_text()), path)
        state = None if path is None else load_checkpoint(path, learner.model, learner.optimizers, learner.heads)
        self.resumed_state = state or {}
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


WARM_START = "sft"
"""The version the SFT warm start publishes ('<run>-sft'): not an RL iteration, whose versions
count from v1."""


def version_name(run_name: str, n: int | str, slot: str = DEFAULT_SLOT) -> str:
    """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's; '<run>-sft' and
    '<run>-<slot>-sft' for the warm start (n = `WARM_START`)."""
    tag = WARM_START if n == WARM_START else f"v{n}"
    return f"{run_name}-{tag}" if slot == DEFAULT_SLOT else f"{run_name}-{slot}-{tag}"


class Publisher:
    """Saves each version of the run's LoRAs and makes the live policy serve it."""

    def __init__(self, policy: Policy | None, folder: Path, run_name: str, slots: Sequence[str]) -> None:
        self.policy, self.folder, self.run_name, self.slots = policy, Path(folder), run_name, list(slots)

    def version_name(self, n: int | str, slot: str = DEFAULT_SLOT) -> str:
        """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's ('-sft' for the warm start)."""
        return version_name(self.run_name, n, slot)

    def path(self, n: int | str, slot: str = DEFAULT_SLOT) -> Path:
        """Where version `n` of a slot's LoRA is saved."""
        return self.folder / self.version_name(n, slot)

    def folder_of(self, version: str) -> Path | None:
        """The adapter folder this run saved `version` in (None: it saved no such version)."""
        path = self.folder / version
        return path if path.is_dir() else None

    def publish(self, model: Any, n: int | str, weights: dict | None = None) -> dict[str, str]:
        """Save version `n` of every slot's LoRA atomically and make the live policy serve each
        from its slot (a version it already holds is not loaded twice); returns slot -> version.
        `weights`: the LoRA's full tensors by parameter name, when the model holds a shard only."""
        assert self.policy is not None  # a follower rank (no policy) never publishes
        versions = {}
        for slot in self.slots:
            version = versions[slot] = self.version_name(n, slot)
            path = save_adapter(model, self.path(n, slot), adapter=slot, weights=weights)
            if version not in self.policy.versions(slot):
                self.policy.load_adapter(path, version, slot=slot)
        return versions


class RunLog:
    """Metrics of one run folder, one dict per iteration, in `metrics.jsonl` and each tracker
    `report_to` names (`trainer/trackers.py`): one path, so every place gets the same numbers."""

    def __init__(self, folder: Path, run_id: str, trackers: Sequence[Tracker] = ()) -> None:
        self.folder, self.run_id = folder, run_id
        self.history: list[dict] = []
        """Every iteration's metrics so far (resumed ones included)."""
        self.trackers = list(trackers)
        """Where the numbers go besides metrics.jsonl (TensorBoard, W&B, MLflow)."""

    def log(self, metrics: dict) -> None:
        """Append one iteration's metrics (tagged with the run id) everywhere they go."""
        metrics = {"run_id": self.run_id, **metrics}
        self.history.append(metrics)
        with open(self.folder / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        numbers = scalars(metrics)
        for tracker in self.trackers:
            tracker.log(numbers, metrics["iteration"])

    def log_event(self, name: str, metrics: dict) -> None:
        """A one-off step outside the iterations (the warm start, the probe): `events.jsonl`, and
        each tracker at step 0 under '<name>/...'."""
        numbers = {k: v for k, v in scalars(metrics).items() if not isinstance(metrics[k], bool)}
        with open(self.folder / "events.jsonl", "a") as f:
            f.write(json.dumps({"run_id": self.run_id, "event": name, **metrics}, default=str) + "\n")
        named = {key if key.startswith(f"{name}/") else f"{name}/{key}": value for key, value in numbers.items()}
        for tracker in self.trackers:
            tracker.log(named, 0)

    def keep_until(self, iteration: int) -> None:
        """Read the logged metrics back, dropping lines past `iteration` (logged, not checkpointed)."""
        path = self.folder / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        self.history = [m for m in map(json.loads, filter(str.strip, lines)) if m["iteration"] <= iteration]
        path.write_text("".join(json.dumps(m) + "\n" for m in self.history))

    def close(self) -> None:
        """End the run in every tracker (each is closed once)."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()


def summary_line(metrics: dict) -> str:
    """One iteration in a line: reward, success (per kind when the tasks have one), the format the
    tool calls were read in, and the share of groups with no reward spread (`no_signal` warns
    when no group had any)."""
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
    return "; ".join(parts)


def no_signal(metrics: dict) -> str | None:
    """The warning for an iteration in which no group had any reward spread (None: some had)."""
    shares = [v for k, v in metrics.items() if k.endswith("zero_signal_share")]
    if not shares or any(v < 1.0 for v in shares):
        return None
    return (f"iteration {metrics['iteration']}: no group had any reward spread: nothing was learned from rewards "
            "(run the probe: forge-bridge probe; docs/own-agent.md#no-signal)")


def _optimizer_tensors(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {}
    for idx, entry in state["state"].items():
        for key, value in entry.items():
            tensors[f"{idx}.{key}"] = (value if torch.is_tensor(value) else torch.tensor(value)).contiguous()
    return tensors, {"param_groups": state["param_groups"]}


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _optimizer_file(slot: str) -> str:
    return "optimizer.safetensors" if slot == DEFAULT_ADAPTER else f"optimizer-{slot}.safetensors"


def save_checkpoint(root: Path, iteration: int, model: Any, optimizers: dict[str, torch.optim.Optimizer],
         extra_modules: dict[str, torch.nn.Module], state: dict, gathered: dict | None = None) -> Path:
    """Every adapter of the model (the shared one, and one per role slot) with its optimizer.
    `gathered`: the full LoRA weights and optimizer states where the model holds shards (FSDP2,
    `distributed.gather`): a checkpoint is the same whatever the world size that wrote it."""
    def write(tmp: Path) -> None:
        weights = {} if gathered is None else {"state_dict": gathered["weights"]}
        model.save_pretrained(str(tmp / "adapter"), safe_serialization=True, **weights)  # named ones in subfolders
        metas = {}
        for slot, optimizer in optimizers.items():
            full = optimizer.state_dict() if gathered is None else gathered["optimizers"][slot]
            tensors, metas[slot] = _optimizer_tensors(full)
            save_file(tensors, str(tmp / _optimizer_file(slot)))
        for name, module in extra_modules.items():
            save_file({k: v.contiguous() for k, v in module.state_dict().items()},
                      str(tmp / f"{name}.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps({
            **state, "iteration": iteration, "optimizer": metas.pop(DEFAULT_ADAPTER), "role_optimizers": metas,
            "python_random": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]]}))

    final = write_dir(root / f"it-{iteration:05d}", write)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    return final


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def load_checkpoint(path: Path, model: Any, optimizers: dict[str, torch.optim.Optimizer],
         extra_modules: dict[str, torch.nn.Module]) -> dict:
    """Restore the LoRA weights, optimizers, extra modules and RNG; returns the saved state."""
    from peft import set_peft_model_state_dict

    state = json.loads((path / "state.json").read_text())
    metas = {DEFAULT_ADAPTER: state["optimizer"], **state.get("role_optimizers", {})}
    if set(metas) != set(optimizers):
        raise InvalidState(f"checkpoint {path} holds the adapters {sorted(metas)}, this trainer trains "
                           f"{sorted(optimizers)}: resume with the run's own role_slots")
    for slot, optimizer in optimizers.items():
        folder = path / "adapter" if slot == DEFAULT_ADAPTER else path / "adapter" / slot
        set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")), adapter_name=slot)
        optimizer.load_state_dict(_optimizer_state(load_file(str(path / _optimizer_file(slot))), metas[slot]))
    for name, module in extra_modules.items():
        module.load_state_dict(load_file(str(path / f"{name}.safetensors")))
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
    version, internal, gauss = state["python_random"]
    random.setstate((version, tuple(internal), gauss))
    return state

__all__ = ["Publisher", "RunFolder", "RunLog", "WARM_START", "latest_checkpoint", "load_checkpoint", "save_checkpoint", "no_signal", "summary_line", "version_name"]

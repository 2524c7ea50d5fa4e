"""What GRPO and PPO share: the trainer's parts, the loop over iterations, and the named steps
each algorithm's recipe calls.

A trainer is made of parts, each with one job:

    learner    the model with a LoRA per slot, their optimizers, any heads, scoring, the update (`learner.py`)
    run        the run folder: its id, store, metrics, checkpoints, random state (`run.py`)
    reference  the model the KL term compares with (`learner.py`)
    publisher  each version saved and served to the live policy (`run.py`)
    ranks      alone, or this process's place in a job of several (`distributed.py`)

Each algorithm's `run_iteration` is its recipe, top to bottom, in its own file (`grpo.py`,
`ppo.py`; the warm start in `sft.py`): collect -> advantages -> samples -> update -> publish ->
log. This file holds the loop around it and the steps the recipes name (`collect`, `update`,
`publish`, `end_iteration`), and nothing of their math.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument, InvalidState, Unsupported, WrongType
from forge_bridge.core.types import Trajectory, TrajectoryGroup
from forge_bridge.policies import machine
from forge_bridge.policies.base import DEFAULT_SLOT, Policy
from forge_bridge.trainer import distributed, rollouts
from forge_bridge.trainer.batch import Sample
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.trainer.learner import Heads, Learner, Reference, plan
from forge_bridge.trainer.rollouts import Rollout, TaskSchedule
from forge_bridge.trainer.run import WARM_START, Publisher, RunFolder, no_signal, summary_line
from forge_bridge.trainer.validation import Best, Validating, Validation, serve_best

if TYPE_CHECKING:
    from forge_bridge.trainer.probe import ProbeReport

log = logging.getLogger(__name__)
"""What needs the user's attention (no signal, an idle role slot), shown with or without progress bars."""


class Trainer:
    """The parts and the loop; `GRPOTrainer` and `PPOTrainer` supply `run_iteration` and `objective`."""

    heads: Heads | None = None
    """Modules trained beside the LoRA (PPO's value head)."""
    per_role_loras = True
    """Whether this algorithm can train a LoRA per crew role (PPO's value head is shared: no)."""

    def __init__(self, policy: Policy, config: TrainerConfig, *, model: str | None = None,
                 recorder: Recorder | None = None) -> None:
        if not isinstance(config, TrainerConfig):
            raise WrongType(f"config: expected a GRPOConfig or PPOConfig, got {type(config).__name__}")
        self.ranks = distributed.join(config.distributed)
        """Alone, or this process's place in a job spreading the update over several."""
        if not isinstance(policy, Policy) and not (self.follower and policy is None):
            raise WrongType(f"policy: expected a forge_bridge Policy, got {type(policy).__name__}")
        source = model or getattr(policy, "model_path", None)
        if source is None:
            raise InvalidArgument("the trainer needs the base model the policy serves: pass "
                                  "model='<name or directory>' (a VLLMPolicy does not know it)")
        self.policy, self.config = policy, config
        torch.manual_seed(config.run.seed)
        self.role_slots = role_slots(config.lora.role_slots, getattr(self.policy, "role_slots", {}))
        """Role -> slot: the config's, with what the policy's front ends declared they serve."""
        if self.role_slots and not self.per_role_loras:
            raise Unsupported(f"{type(self).__name__} trains one LoRA for every role, but the policy serves roles "
                              f"from their own slots ({self.role_slots}): train per-role LoRAs with GRPO")
        slots = [DEFAULT_SLOT] + sorted(set(self.role_slots.values()) - {DEFAULT_SLOT})
        self.learner = Learner(str(source), config, slots, self.ranks, self.heads)
        self.reference = Reference()
        """The KL reference (the base model until `freeze_reference`)."""
        self.publisher = Publisher(policy, Path(config.run.out_dir) / "adapters", config.run.name, slots)
        self.run: RunFolder = None if self.follower else RunFolder(  # type: ignore[assignment]
            config, str(source), type(self).__name__, recorder, self.learner.tokenizer)
        """The run folder and its store: the leader's."""
        self.step_advantages: dict[tuple[str, int], float] = {}
        """(trajectory id, step) -> the advantage this iteration gave it (`record_credit`)."""
        self.step_teacher: dict[tuple[str, int], list[float]] = {}
        """(trajectory id, step) -> the teacher's log-probabilities of its tokens (distillation)."""
        self.validating: Validating | None = None
        """Validation inside training, while `train(validation=...)` runs."""
        self.ahead: rollouts.Ahead | None = None
        """The next iteration's rollouts running during the update, while `train` runs with `max_staleness`."""

    # ------------------------------------------------------------------ what an algorithm supplies
    def run_iteration(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: Sequence[Any] | TaskSchedule,
                      it: int) -> dict:
        """Iteration `it` (0-based), the algorithm's recipe; returns its metrics."""
        raise NotImplementedError

    def objective(self, logp: torch.Tensor, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        """The algorithm's loss on one collated microbatch (a `learner.Loss`)."""
        raise NotImplementedError

    def resumable_state(self) -> dict:
        """What the algorithm records in its checkpoints to check on resume (`check_resumable`)."""
        return {}

    def check_resumable(self, state: dict, path: Path) -> None:
        """Raise `InvalidState` when a checkpoint cannot continue this run as it is."""

    # ------------------------------------------------------------------ the loop
    def train(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: Sequence[Any] | TaskSchedule,
              iterations: int, *, resume: bool = False, validation: Sequence[Any] | Validation | None = None,
              eval_every: int = 1, patience: int | None = None, margin: float = 0.0) -> list[dict]:
        """Run iterations until `iterations` in all have been done (counting resumed ones).

        `tasks`: the training tasks (`tasks_per_iteration` of them are drawn each iteration), or
        a schedule `iteration -> tasks` that picks each iteration's tasks itself (a curriculum,
        or one task of each kind so no kind is starved). `validation`: tasks the policy runs
        greedily at the start and every `eval_every` iterations; training stops after
        `patience` evaluations without a gain (by more than `margin`), and ends serving the best
        version on them, never one below the start (`trainer/validation.py`). In a job of
        several processes the leader runs the loop and the others take their share of each
        update."""
        spec = None if validation is None else validation if isinstance(validation, Validation) else Validation(
            tuple(validation), every=eval_every, patience=patience, margin=margin)
        return self.ranks.run(lambda: self._loop(rollout, tasks, iterations, resume, spec), self.follow_update)

    def _loop(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: Sequence[Any] | TaskSchedule,
              iterations: int, resume: bool, validation: Validation | None) -> list[dict]:
        from tqdm.auto import tqdm

        if not callable(rollout) and not isinstance(rollout, rollouts.EpisodeRunner):
            raise WrongType(f"rollout: expected a function task -> reward (or an EpisodeRunner such as "
                            f"RayRollouts), got {type(rollout).__name__}")
        if not callable(tasks):
            tasks = list(tasks)
            if not tasks:
                raise InvalidArgument("tasks: expected at least one task")
        if resume:
            self.resume()
        else:
            self.run.refuse_to_overwrite()
        self.validating = None if validation is None else self.start_validation(rollout, validation, iterations, resume)
        if self.config.rollout.max_staleness:
            self.ahead = rollouts.Ahead(lambda n: self.roll(rollout, self.tasks_for(tasks, n), n), iterations)
        try:
            bar = tqdm(range(self.iteration, iterations), desc="training", unit="it",
                       disable=not self.config.run.progress, initial=self.iteration, total=iterations)
            for it in bar:
                v = self.validating
                if v is not None and v.best.out_of_patience(v.spec.patience):  # a resumed run that had stopped too
                    self.say(f"stopping after iteration {it}: {v.spec.patience} validations without a gain")
                    break
                metrics = self.run_iteration(rollout, tasks, it)
                bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}", success=f"{metrics['success_rate']:.2f}")
            if self.validating is not None:
                self.end_validation()
        finally:
            self.validating = None
            if self.ahead is not None:
                left, self.ahead = self.ahead.close(), None
                if left:  # recorded, never to be trained by this call: excluded, and why
                    n = self.run.exclude_iterations([it + 1 for it in left], f"collected ahead for iteration "
                                                    f"{left[0] + 1}; the run stopped before training it")
                    self.run.log.log_event("rollouts_not_trained", {"iteration": left[0] + 1, "trajectories": n})
        return self.history

    def start_validation(self, rollout: Rollout | rollouts.EpisodeRunner, validation: Validation, iterations: int,
                         resume: bool) -> Validating:
        """Validation for this `train` call: the scores a resumed run had, else the start's, scored first
        (the best is never below it)."""
        kept = self.run.resumed_state.get("validation") if resume else None
        self.validating = Validating(rollout, validation, Best.from_state(kept) if kept else Best(), iterations)
        if not self.validating.best.scores:
            self.run.log.log_event("validation", self.validate(self.iteration))
        return self.validating

    def validate(self, iteration: int) -> dict:
        """Run the validation tasks greedily on the versions served now; their metrics."""
        v = self.validating
        assert v is not None
        report = self.probe(v.rollout, v.spec.tasks, name=f"val-{iteration}", greedy=True, kind_key=v.spec.kind_key,
                            require_kind=False)
        served = {slot: self.policy.current(slot) for slot in self.publisher.slots}
        gain = v.best.observe(iteration, report.success_rate, served, v.spec.margin)
        kinds = {k: x for k, x in report.metrics("val").items() if k.startswith("val/success/")}
        return {"val/success": report.success_rate, **kinds, "val/gain": gain, "val/best_iteration": v.best.best}

    def end_validation(self) -> None:
        """Serve the best version on validation, and say which and why."""
        v = self.validating
        assert v is not None and v.best.best is not None
        best = v.best.best
        served = serve_best(self.policy, v.best, self.publisher.folder_of)
        start = min(v.best.scores)
        why = (f"the best on validation ({v.best.scores[best]:.0%}, against {v.best.scores[start]:.0%} at the start)"
               if best != start else f"no later version beat the start on validation ({v.best.scores[start]:.0%})")
        self.run.log.log_event("best_on_validation", {"iteration": best, "versions": served,
                                                       "success": v.best.scores[best], "scores": v.best.scores})
        self.say(f"serving {served.get(DEFAULT_SLOT)} (iteration {best}): {why}")

    # ------------------------------------------------------------------ the steps a recipe names
    def collect(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: list[tuple[str, Any]], it: int
                ) -> tuple[list[TrajectoryGroup], dict]:
        """Iteration `it`'s rollouts of these (task id, task) pairs, as trainable groups: on
        threads here, or on the runner's workers (which reach the policy this trainer publishes to).
        With `max_staleness` >= 1 they were collected during the last update, and the next
        iteration's start now; a trajectory older than that bound is left out (`rollouts.drop_stale`)."""
        ahead = self.ahead.take(it) if self.ahead is not None else None
        groups, stats = ahead if ahead is not None else self.roll(rollout, tasks, it)
        if self.ahead is None:
            return groups, stats
        self.ahead.start(it + 1)
        # a step's lag: the update's version (it; 0: the start) less its own (0: not one of this run's)
        served = {self.version_name(n, slot): n for n in range(1, it + 1) for slot in self.publisher.slots}
        groups, stale = rollouts.drop_stale(groups, lambda version: it - served.get(version or "", 0),
                                            self.config.rollout.max_staleness)
        return groups, stats | stale

    def roll(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: list[tuple[str, Any]], it: int
             ) -> tuple[list[TrajectoryGroup], dict]:
        """Run iteration `it`'s rollouts now (`rollouts.collect`), with the decoding rates they had."""
        before = self.policy.decoding_counts()
        groups, stats = rollouts.collect(
            rollout, tasks, it, recorder=self.recorder, run_id=self.run_id, group_size=self.config.rollout.group_size,
            concurrency=self.config.rollout.concurrency, success_threshold=self.config.rollout.success_threshold,
            progress=self.config.run.progress, policy=self.policy, seed=self.config.run.seed)
        after = self.policy.decoding_counts()
        if before and after:
            stats |= machine.decoding_rates(self.policy, before, after)
        return groups, stats

    def tasks_for(self, tasks: Sequence[Any] | TaskSchedule, it: int) -> list[tuple[str, Any]]:
        """Iteration `it`'s (task id, task) pairs (`rollouts.tasks_for`)."""
        return rollouts.tasks_for(it, tasks, self.config.rollout.tasks_per_iteration, self.config.run.seed)

    def by_slot(self, groups: list[TrajectoryGroup]) -> list[tuple[str, list[TrajectoryGroup]]]:
        """The groups each LoRA trains, every group checked before anything trains; the shared
        LoRA always, a role slot's only when it has groups."""
        slots = [self.slot_of(g) for g in groups]
        idle = [slot for slot in self.learner.slots if slot != DEFAULT_SLOT and slot not in slots]
        if idle and groups:
            roles = {slot: sorted(r for r, s in self.role_slots.items() if s == slot) for slot in idle}
            log.warning("no trainable episodes of role(s) %s this iteration: slot(s) %s not trained, their roles "
                        "served as before", ", ".join(r for rs in roles.values() for r in rs) or "-", ", ".join(idle))
        return [(slot, [g for g, s in zip(groups, slots) if s == slot]) for slot in self.learner.slots
                if slot == DEFAULT_SLOT or slot in slots]

    def update(self, samples: list[Sample]) -> dict:
        """The active slot's optimizer steps on these samples (`Learner.update`: epochs x
        minibatches, each forward, objective, backward, clip and step), on every rank of a job."""
        c = self.config.optimizer
        steps = plan(self.run.rng, [s.calls for s in samples], c.epochs, c.minibatch_size)
        return self._update(self.learner.active_slot, samples, steps)

    def follow_update(self, slot: str, samples: list[Sample], steps: list) -> dict:
        """A rank other than the leader: the update the leader sent."""
        with self.learner.training(slot):
            return self._update(slot, samples, steps)

    def _update(self, slot: str, samples: list[Sample], steps: list) -> dict:
        with self.ranks.updating(self.learner, self.reference, slot, samples, steps):
            return self.learner.update(samples, steps, self.objective, self.learner.stepping())

    def publish(self, n: int | str) -> str:
        """Publish version `n` of every LoRA (an iteration, or `WARM_START`); returns the shared
        LoRA's version."""
        return self.publish_all(n)[DEFAULT_SLOT]

    def publish_all(self, n: int | str) -> dict[str, str]:
        """Save version `n` of every LoRA and make the live policy serve each from its slot."""
        full = self.ranks.full_state()
        return self.publisher.publish(self.learner.model, n, full["weights"] if full else None)

    def end_iteration(self, metrics: dict) -> None:
        """Validate the iteration when it is due, log it, checkpoint it, and tell the person watching."""
        state = self.resumable_state()
        v = self.validating
        if v is not None:
            if v.spec.due(metrics["iteration"], v.last):
                metrics.update(self.validate(metrics["iteration"]))
            state = {**state, "validation": v.best.state()}
        self.run.end_iteration(metrics, self.learner, state, self.ranks.full_state())
        self.say(summary_line(metrics))
        warning = no_signal(metrics)
        if warning:
            log.warning(warning)

    def record_credit(self, groups: list[TrajectoryGroup], trained: dict[tuple[str, int], int], iteration: int) -> None:
        """Store what this iteration made of each step: its advantage, and the tokens trained
        (`batch.trained_tokens_per_step`) (`RunFolder.record_credit`)."""
        self.run.record_credit(groups, trained, iteration, self.step_advantages, self.step_teacher)

    def remember_advantages(self, trajectories: Sequence[Trajectory], advantages: Sequence[torch.Tensor]) -> None:
        """Keep what the advantages gave each step ([S_i] per trajectory), for `record_credit`."""
        self.step_advantages = {(t.id, k): float(a[k]) for t, a in zip(trajectories, advantages) for k in range(len(a))}

    def say(self, line: str) -> None:
        """A line for the person watching (above the progress bars), when `progress` is on."""
        if self.config.run.progress and line:
            from tqdm.auto import tqdm

            tqdm.write(line)

    @staticmethod
    def timed(metrics: dict, t0: float, t1: float, t2: float, trained_tokens: int) -> dict:
        """The iteration's timings: rollouts t0-t1, update t1-t2, publishing t2-now."""
        t3 = time.perf_counter()
        return metrics | {"time_rollout_s": t1 - t0, "time_update_s": t2 - t1, "time_publish_s": t3 - t2,
                          "tokens_per_s": trained_tokens / max(t2 - t1, 1e-9)}

    # ------------------------------------------------------------------ slots
    def slot_of(self, group: TrajectoryGroup) -> str:
        """The policy slot (and LoRA) a group's trajectories train: its role's, else the default."""
        return self.slot_of_steps(group.role, group.trajectories)

    def slot_of_role(self, role: str | None) -> str:
        """The slot (and LoRA) a role's trajectories train (no role, or none of its own: the default)."""
        return self.role_slots.get(role, DEFAULT_SLOT) if role else DEFAULT_SLOT

    def slot_of_steps(self, role: str | None, trajectories: Sequence[Trajectory]) -> str:
        """The slot a role's trajectories train, checked against the slots that served their steps."""
        return check_served(role, self.slot_of_role(role), trajectories, self.role_slots)

    # ------------------------------------------------------------------ the reference
    def old_logprobs(self, logp: torch.Tensor, batch: dict) -> torch.Tensor:
        """pi_old [B, T]: the trainer's own log-probabilities before this update (`Learner.old_logprobs`),
        or, when the update is a single optimizer step, the current ones without gradient (the
        same numbers, no extra pass)."""
        return batch["trainer_logprobs"] if "trainer_logprobs" in batch else logp.detach()

    def reference_logprobs(self, batch: dict) -> torch.Tensor | None:
        """Log-probabilities [B, T] under the KL reference, without gradient (None: no KL term)."""
        if self.config.loss.kl_beta <= 0:
            return None
        return self.reference.logprobs(self.learner.model, batch, self.learner.share_prefix)

    def freeze_reference(self) -> Path:
        """Make the current weights the KL reference, e.g. the SFT warm start: the KL then holds
        RL near what SFT taught, where the base model (the default reference) cannot even call
        tools. Saved in the run folder, so a resumed run keeps the same reference."""
        if len(self.learner.slots) > 1:
            raise Unsupported("freeze_reference with per-role adapters (role_slots): the KL "
                              "reference is the base model there")
        self.ranks.check_local("freeze_reference")
        return self.reference.freeze(self.learner.model, self.out / "reference")

    # ------------------------------------------------------------------ probe, checkpoint, resume
    def probe(self, rollout: rollouts.Rollout, tasks: Sequence[Any], *, name: str = "probe",
              greedy: bool = False, group_size: int | None = None, kind_key: str = "kind",
              require_kind: bool = True) -> "ProbeReport":
        """Sample one group of every task with the policy as it serves now and report, per task
        kind, the success rate and the share of groups with no reward spread (`trainer/probe.py`);
        recorded under the run id '<run>-<name>', nothing trained. `greedy`: one greedy rollout
        per task (a held-out check)."""
        from forge_bridge.trainer.probe import probe

        return probe(rollout, tasks, recorder=self.recorder, run_id=f"{self.run_id}-{name}",
                     group_size=group_size or self.config.rollout.group_size, kind_key=kind_key, greedy=greedy,
                     concurrency=self.config.rollout.concurrency, success_threshold=self.config.rollout.success_threshold,
                     progress=self.config.run.progress, policy=self.policy, seed=self.config.run.seed,
                     require_kind=require_kind)

    def save_checkpoint(self) -> Path:
        """The LoRAs, optimizers, heads and random states at the current iteration."""
        return self.run.checkpoint(self.learner, self.resumable_state(), self.ranks.full_state())

    def resume(self) -> int:
        """Continue the run in the folder from its last checkpoint (none: from the start), the
        version it had reached served again; returns the iteration it continues after."""
        self.ranks.check_local("resume")
        if (self.out / "reference" / "adapter_model.safetensors").is_file():
            self.reference.load(self.learner.model, self.out / "reference")
        if self.run.resume(self.learner, self.check_resumable):
            if self.iteration:
                self.publish(self.iteration)
            elif self.publisher.path(WARM_START).is_dir():
                self.publish(WARM_START)  # the checkpoint holds the warm start's weights
        return self.iteration

    # ------------------------------------------------------------------ what users read
    @property
    def model(self) -> Any:
        """The peft model being trained (the base with its LoRAs)."""
        return self.learner.model

    @property
    def tokenizer(self) -> Any:
        return self.learner.tokenizer

    @property
    def out(self) -> Path:
        """The run folder."""
        return Path(self.config.run.out_dir)

    @property
    def recorder(self) -> Recorder:
        """Where this run's rollouts are recorded (the run folder's store, unless one was given)."""
        return self.run.recorder

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def previous_run(self) -> bool:
        """The folder held a run when this trainer was made: train() resumes it or refuses."""
        return self.run is not None and self.run.previous_run

    @property
    def iteration(self) -> int:
        """Iterations done (resumed ones included)."""
        return self.run.iteration

    @property
    def history(self) -> list[dict]:
        """Every iteration's metrics so far (resumed ones included)."""
        return self.run.log.history

    def version_name(self, n: int | str, slot: str = DEFAULT_SLOT) -> str:
        """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's ('-sft' for the warm start)."""
        return self.publisher.version_name(n, slot)

    @property
    def follower(self) -> bool:
        """A rank of a job other than the leader: it only takes its share of updates."""
        return not self.ranks.leader

    def close(self) -> None:
        if not self.follower:
            self.run.log.close()
        self.ranks.leave(self.learner)


def role_slots(configured: Mapping[str, str] | None, declared: dict[str, str]) -> dict[str, str]:
    """The role -> slot mapping a trainer trains by: the config's and the policy's declared one
    together; a role the two put in different slots is refused, naming both."""
    configured = configured or {}
    clash = {role: (slot, declared[role]) for role, slot in configured.items() if declared.get(role, slot) != slot}
    if clash:
        raise InvalidArgument("role_slots: " + "; ".join(
            f"role {role!r} is in slot {mine!r} here but the policy serves it from {theirs!r}"
            for role, (mine, theirs) in clash.items()) + f" (GRPOConfig(role_slots={configured}), policy: {declared})")
    return {**declared, **configured}


def check_served(role: str | None, slot: str, trajectories: Sequence[Trajectory], mapping: dict[str, str]) -> str:
    """`slot`, the one a role's trajectories would train, once checked against the slots that
    served their steps: a LoRA trained on one slot's steps and published to another would never
    serve them (the crew would not improve), so a mismatch is refused, naming both mappings."""
    served = {s.slot for t in trajectories for s in t.transitions if s.slot is not None}
    if served - {slot}:
        raise InvalidState(
            f"role {role!r} was served from slot {', '.join(sorted(served))} but this trainer would train "
            f"slot {slot!r} (its role -> slot mapping: {mapping or 'none'}); give the trainer the "
            "mapping the agent is served with (GRPOConfig(role_slots=...)), or create the trainer after "
            "ForgeLLM(policy, role_slot=...), which declares it on the policy. Nothing was trained.")
    return slot


__all__ = ["Trainer", "check_served", "role_slots"]


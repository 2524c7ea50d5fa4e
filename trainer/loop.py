"""The loop GRPO and PPO share: collect -> prepare -> update -> publish -> log, per iteration.

Each iteration collects `group_size` rollouts of each chosen task through the user's own
rollout function (`rollouts.collect`; on threads, or on Ray workers with `RayRollouts`), has the
algorithm turn them into samples (`prepare`: its advantage function, then `batch.build_samples`),
takes the optimizer steps (`update.update`, with the algorithm's `loss`), publishes adapter vN to
the live policy (`publish`) and logs and checkpoints the iteration (`runlog`). The algorithms
live in `grpo.py` and `ppo.py`; this file holds what they share and nothing of their math.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from forge_bridge.core import runs
from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument, Unsupported, WrongType
from forge_bridge.core.types import Trajectory, TrajectoryGroup
from forge_bridge.policies.base import DEFAULT_SLOT, Policy
from forge_bridge.policies.device import autocast, bf16_supported, resolve_device
from forge_bridge.trainer import distributed, memory, rollouts, runlog
from forge_bridge.trainer.batch import BatchStats, Sample, collate, trained_tokens_per_step
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.trainer.logprobs import EAGER_MAX_LEN, choose_attention, token_logprobs
from forge_bridge.trainer.lora import adapter_parameters, attach_lora
from forge_bridge.trainer.publish import Reference, publish_all, version_name
from forge_bridge.trainer.rollouts import Rollout, TaskSchedule
from forge_bridge.trainer.slots import check_served, role_slots

if TYPE_CHECKING:
    from forge_bridge.trainer.probe import ProbeReport


class Trainer:
    """Shared machinery; `GRPOTrainer` and `PPOTrainer` supply `prepare` and `loss`."""

    extra_modules: dict[str, torch.nn.Module]
    per_role_loras = True
    """Whether this algorithm can train a LoRA per crew role (PPO's value head is shared: no)."""

    def __init__(self, policy: Policy, config: TrainerConfig, *, model: str | None = None,
                 recorder: Recorder | None = None) -> None:
        if not isinstance(config, TrainerConfig):
            raise WrongType(f"config: expected a GRPOConfig or PPOConfig, got {type(config).__name__}")
        self.group = distributed.join(config.distributed)
        """This process's place in a process group spreading the update (None: alone)."""
        if not isinstance(policy, Policy) and not (self.follower and policy is None):
            raise WrongType(f"policy: expected a forge_bridge Policy, got {type(policy).__name__}")
        source = model or getattr(policy, "model_path", None)
        if source is None:
            raise InvalidArgument("the trainer needs the base model the policy serves: pass "
                                  "model='<name or directory>' (a VLLMPolicy does not know it)")
        self.policy, self.config = policy, config
        self.out = Path(config.out_dir)
        torch.manual_seed(config.seed)
        self.rng = random.Random(config.seed)
        self.device = self.group.device(resolve_device(config.device)) if self.group else resolve_device(config.device)
        """Where the model, the batches and the optimizer state live."""
        self.bodies: dict[str, torch.nn.Module] = {}
        """Slot -> the decoder body wrapped in DDP for that slot's LoRA (in a DDP group, once spread)."""
        self.gathered: dict | None = None
        """The full LoRA and optimizer states after the last FSDP2 update (the leader's, to save)."""
        self._build_model(str(source))
        self.reference = Reference()
        """The KL reference (the base model until `freeze_reference`)."""
        self.step_advantages: dict[tuple[str, int], float] = {}
        """(trajectory id, step) -> the advantage `prepare` computed for the current iteration."""
        self.step_teacher: dict[tuple[str, int], list[float]] = {}  # (trajectory id, step) -> teacher logprobs
        self.iteration = 0
        if not self.follower:  # the run folder and the store are the leader's
            self._open_run(str(source), recorder)

    def _open_run(self, source: str, recorder: Recorder | None) -> None:
        """The run folder (a new run, or the one it holds), the store and the metrics log."""
        config = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        self.previous_run = runs.holds_run(self.out)
        """The folder held a run when this trainer was made: train() resumes it or refuses."""
        self.run_id = (runs.read_run_id(self.out, config.run_name) if self.previous_run
                       else runs.new_run(self.out, config.run_name))
        """Keys every trajectory, group id and metrics line of this run."""
        self.recorder = recorder or Recorder(self.out / "trajectories.db", run_id=self.run_id)
        if not (self.out / "tokenizer").is_dir():  # the run folder reads on its own (forge-bridge inspect)
            self.tokenizer.save_pretrained(self.out / "tokenizer")
        (self.out / "trainer.json").write_text(json.dumps(
            {"trainer": type(self).__name__, "model": source, "config": dataclasses.asdict(config)},
            indent=1, default=str))  # out_dir may be a Path
        self.runlog = runlog.RunLog(self.out, self.run_id)

    def _build_model(self, source: str) -> None:
        """The base model with a LoRA per slot this run trains, and an optimizer for each."""
        from forge_bridge.policies import models

        config = self.config
        base, self.tokenizer = models.load(source)
        self.pad_id: int = self.tokenizer.pad_token_id or 0
        """What collated batches are padded with (masked out wherever it lands)."""
        base.to(self.device)
        self.eager_up_to = EAGER_MAX_LEN if str(self.device) == "cpu" and hasattr(base, "set_attn_implementation") else 0
        """Batches up to this many tokens run eager attention (see `attention`); 0: the model's own."""
        if self.eager_up_to:
            base.set_attn_implementation("eager")
        if config.gradient_checkpointing:
            base.activation_checkpointing_enable({"use_reentrant": False})
        self.share_prefix = not config.gradient_checkpointing
        """Whether a microbatch's shared token prefix runs once (not under activation checkpointing)."""
        self.role_slots = role_slots(config.role_slots, getattr(self.policy, "role_slots", {}))
        """Role -> slot: the config's, with what the policy's front ends declared they serve."""
        if self.role_slots and not self.per_role_loras:
            raise Unsupported(f"{type(self).__name__} trains one LoRA for every role, but the policy serves roles "
                              f"from their own slots ({self.role_slots}): train per-role LoRAs with GRPO")
        self.slots = [DEFAULT_SLOT] + sorted(set(self.role_slots.values()) - {DEFAULT_SLOT})
        """The LoRAs this run trains, by policy slot: the shared one and one per role slot."""
        self.model = attach_lora(base, config.lora_rank, config.lora_alpha, config.lora_targets,
                                 extra_adapters=self.slots[1:], seed=config.seed)
        self.bf16 = bf16_supported(self.device) if config.bf16 is None else config.bf16
        self.extra_modules = {name: module.to(self.device) for name, module in
                              self.make_extra_modules(base.config.hidden_size).items()}
        self.group_names, self.optimizers, self.base_lrs = {}, {}, {}
        for slot in self.slots:
            self.remake_optimizer(slot)
        self.active_slot = DEFAULT_SLOT
        """The slot whose LoRA forward passes, updates and `optimizer` use now (`training`)."""
        self.chunker = memory.budget_chunker(self.model, base.config, config, self.device, self.eager_up_to)
        """Cuts a minibatch's sorted lengths into microbatches within `max_memory_gb` (None: no budget)."""

    def remake_optimizer(self, slot: str) -> None:
        """A fresh optimizer for a slot's LoRA (one per LoRA: a role's updates never move another
        role's adapter or state), with its parameter groups' names ('0': the LoRA) and rates."""
        groups = self.param_groups(slot)
        self.group_names[slot] = [g.pop("name", str(n)) for n, g in enumerate(groups)]
        self.optimizers[slot] = torch.optim.AdamW(groups)
        self.base_lrs[slot] = [g["lr"] for g in self.optimizers[slot].param_groups]

    # ------------------------------------------------------------------ what an algorithm supplies
    def make_extra_modules(self, hidden_size: int) -> dict[str, torch.nn.Module]:
        """Modules trained beside the LoRA (PPO's value head), by name."""
        return {}

    def param_groups(self, slot: str) -> list[dict]:
        """The optimizer's parameter groups for a slot's LoRA (the LoRA first)."""
        return [{"params": adapter_parameters(self.model, slot), "lr": self.config.lr}]

    def prepare(self, groups: list[TrajectoryGroup]) -> tuple[list[Sample], BatchStats, dict]:
        """The algorithm: advantages of the groups' steps, as training samples."""
        raise NotImplementedError

    def loss(self, logp: torch.Tensor, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        """The algorithm's loss on one collated microbatch (scored by `score`)."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict:
        """What a subclass records in its checkpoints to check on resume (`check_resumable`)."""
        return {}

    def check_resumable(self, state: dict, path: Path) -> None:
        """Raise `InvalidState` when a checkpoint cannot continue this run as it is."""

    # ------------------------------------------------------------------ slots
    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of the LoRA being trained now (the shared one outside an update)."""
        return self.optimizers[self.active_slot]

    def slot_of(self, group: TrajectoryGroup) -> str:
        """The policy slot (and LoRA) a group's trajectories train: its role's, else the default."""
        return self.slot_of_steps(group.role, group.trajectories)

    def slot_of_role(self, role: str | None) -> str:
        """The slot (and LoRA) a role's trajectories train (no role, or none of its own: the default)."""
        return self.role_slots.get(role, DEFAULT_SLOT) if role else DEFAULT_SLOT

    def slot_of_steps(self, role: str | None, trajectories: Sequence[Trajectory]) -> str:
        """The slot a role's trajectories train, checked against the slots that served their steps."""
        return check_served(role, self.slot_of_role(role), trajectories, self.role_slots)

    @contextmanager
    def training(self, slot: str):
        """Forward passes, updates and `optimizer` use the LoRA of `slot` inside this block."""
        self.model.set_adapter(slot)
        self.active_slot = slot
        try:
            yield
        finally:
            self.model.set_adapter(DEFAULT_SLOT)
            self.active_slot = DEFAULT_SLOT

    # ------------------------------------------------------------------ the loop
    def train(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: Sequence[Any] | TaskSchedule,
              iterations: int, *, resume: bool = False) -> list[dict]:
        """Run iterations until `iterations` in all have been done (counting resumed ones).

        `tasks`: the training tasks (`tasks_per_iteration` of them are drawn each iteration), or
        a schedule `iteration -> tasks` that picks each iteration's tasks itself (a curriculum,
        or one task of each kind so no kind is starved)."""
        from tqdm.auto import tqdm

        if self.follower:  # the leader collects; this rank takes its share of each update
            distributed.follow(self)
            return []
        if not callable(rollout) and not isinstance(rollout, rollouts.EpisodeRunner):
            raise WrongType(f"rollout: expected a function task -> reward (or an EpisodeRunner such as "
                            f"RayRollouts), got {type(rollout).__name__}")
        if not callable(tasks):
            tasks = list(tasks)
            if not tasks:
                raise InvalidArgument("tasks: expected at least one task")
        try:
            if resume:
                self.resume()
            elif self.previous_run and self.iteration == 0:
                raise runs.refuse(self.out, self.run_id)
            bar = tqdm(range(self.iteration, iterations), desc="training", unit="it",
                       disable=not self.config.progress, initial=self.iteration, total=iterations)
            for it in bar:
                metrics = self.run_iteration(rollout, tasks, it)
                bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}", success=f"{metrics['success_rate']:.2f}")
        finally:
            distributed.stop(self)
        return self.history

    def run_iteration(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: Sequence[Any] | TaskSchedule,
                      it: int) -> dict:
        """Iteration `it` (0-based): collect, learn on each slot, publish, log, checkpoint."""
        t0 = time.perf_counter()
        groups, rollout_stats = self.collect(rollout, rollouts.tasks_for(
            it, tasks, self.config.tasks_per_iteration, self.config.seed), it)
        t1 = time.perf_counter()
        learned, trained_tokens = self.learn(groups, it)
        t2 = time.perf_counter()
        versions = self.publish_all(it + 1)
        t3 = time.perf_counter()
        metrics = {"iteration": it + 1, "adapter": versions[DEFAULT_SLOT],
                   **{f"adapter_{slot}": v for slot, v in versions.items() if slot != DEFAULT_SLOT},
                   **rollout_stats, **learned,
                   "time_rollout_s": t1 - t0, "time_update_s": t2 - t1, "time_publish_s": t3 - t2,
                   "tokens_per_s": trained_tokens / max(t2 - t1, 1e-9)}
        self.iteration = it + 1
        self.log(metrics)
        self.save_checkpoint()
        self.say(runlog.summary_line(metrics))
        return metrics

    def say(self, line: str) -> None:
        """A line for the person watching (above the progress bars), when `progress` is on."""
        if self.config.progress and line:
            from tqdm.auto import tqdm

            tqdm.write(line)

    def learn(self, groups: list[TrajectoryGroup], it: int) -> tuple[dict, int]:
        """Prepare and update each slot's LoRA on its own roles' groups; returns the statistics
        (prefixed by slot when there are several) and the tokens trained."""
        learned, trained_tokens = {}, 0
        slots = [self.slot_of(g) for g in groups]  # every group checked before anything trains
        for slot in self.slots:
            mine = [g for g, s in zip(groups, slots) if s == slot]
            if not mine and slot != DEFAULT_SLOT:
                continue
            with self.training(slot):
                samples, batch_stats, adv_stats = self.prepare(mine)
                self.record_credit(mine, samples, it + 1)
                update_stats = distributed.run_update(self, samples) if samples else {}
            trained_tokens += batch_stats.trained_tokens
            stats = {**adv_stats, **{f"batch_{k}": v for k, v in vars(batch_stats).items()}, **update_stats}
            learned.update(stats if len(self.slots) == 1 else {f"{slot}/{k}": v for k, v in stats.items()})
        return learned, trained_tokens

    def collect(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: list[tuple[str, Any]], it: int
                ) -> tuple[list[TrajectoryGroup], dict]:
        """Iteration `it`'s rollouts of these (task id, task) pairs, as trainable groups: on
        threads here, or on the runner's workers (which reach the policy this trainer publishes to)."""
        return rollouts.collect(rollout, tasks, it, recorder=self.recorder, run_id=self.run_id,
                                group_size=self.config.group_size, concurrency=self.config.concurrency,
                                success_threshold=self.config.success_threshold,
                                progress=self.config.progress, policy=self.policy, seed=self.config.seed)

    def probe(self, rollout: rollouts.Rollout, tasks: Sequence[Any], *, name: str = "probe",
              greedy: bool = False, group_size: int | None = None, kind_key: str = "kind",
              require_kind: bool = True) -> "ProbeReport":
        """Sample one group of every task with the policy as it serves now and report, per task
        kind, the success rate and the share of groups with no reward spread (`trainer/probe.py`);
        recorded under the run id '<run>-<name>', nothing trained. `greedy`: one greedy rollout
        per task (a held-out check)."""
        from forge_bridge.trainer.probe import probe

        return probe(rollout, tasks, recorder=self.recorder, run_id=f"{self.run_id}-{name}",
                     group_size=group_size or self.config.group_size, kind_key=kind_key, greedy=greedy,
                     concurrency=self.config.concurrency, success_threshold=self.config.success_threshold,
                     progress=self.config.progress, policy=self.policy, seed=self.config.seed,
                     require_kind=require_kind)

    def remember_advantages(self, trajectories: Sequence[Trajectory], advantages: Sequence[torch.Tensor]) -> None:
        """Keep what `prepare` gave each step ([S_i] per trajectory), for `record_credit`."""
        self.step_advantages = {(t.id, k): float(a[k]) for t, a in zip(trajectories, advantages) for k in range(len(a))}

    def record_credit(self, groups: list[TrajectoryGroup], samples: list[Sample], iteration: int) -> None:
        """Store what this iteration made of each step -- the advantage `prepare` gave it and the
        completion tokens the loss trains on (0: its group was uniform, or it was cut or
        untrainable) -- so `forge-bridge inspect` shows exactly what the update saw."""
        trained = trained_tokens_per_step(samples)
        self.recorder.store.record_credit(iteration, [
            (t.id, k, self.step_advantages.get((t.id, k)), trained.get((t.id, k), 0), self.step_teacher.get((t.id, k)))
            for group in groups for t in group.trajectories for k in range(len(t.transitions))])

    # ------------------------------------------------------------------ scoring
    def autocast(self):
        """The precision context of forward passes (bf16 autocast where the device has it)."""
        return autocast(self.device, self.bf16)

    def collate(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        """The samples as padded tensors on the trainer's device."""
        return collate(samples, self.pad_id, self.device)

    def attention(self, length: int) -> None:
        """Choose the attention for a batch of `length` tokens (`logprobs.choose_attention`)."""
        if self.eager_up_to:
            choose_attention(self.model.get_base_model(), length, self.eager_up_to)

    def score(self, batch: dict, with_entropy: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logp [B, T], hidden [B, T, H], entropy) of the batch under the model being trained, at
        each sample's sampling temperature."""
        self.attention(batch["input_ids"].shape[1])
        with self.autocast():
            return token_logprobs(self.model, batch["input_ids"], batch["attention_mask"],
                                  batch["loss_mask"], with_entropy, batch["temperature"],
                                  share_prefix=self.share_prefix, body=self.bodies.get(self.active_slot))

    def old_logprobs(self, logp: torch.Tensor, batch: dict) -> torch.Tensor:
        """pi_old [B, T]: the trainer's own log-probabilities before this update (`update.score_old`),
        or, when the update is a single optimizer step, the current ones without gradient (the
        same numbers, no extra pass)."""
        return batch["trainer_logprobs"] if "trainer_logprobs" in batch else logp.detach()

    def reference_logprobs(self, batch: dict) -> torch.Tensor | None:
        """Log-probabilities [B, T] under the KL reference, without gradient (None: no KL term)."""
        if self.config.kl_beta <= 0:
            return None
        return self.reference.logprobs(self.model, batch, self.share_prefix)

    def freeze_reference(self) -> Path:
        """Make the current weights the KL reference, e.g. the SFT warm start: the KL then holds
        RL near what SFT taught, where the base model (the default reference) cannot even call
        tools. Saved in the run folder, so a resumed run keeps the same reference."""
        if len(self.slots) > 1:
            raise Unsupported("freeze_reference with per-role adapters (role_slots): the KL "
                              "reference is the base model there")
        distributed.check_local(self, "freeze_reference")
        return self.reference.freeze(self.model, self.out / "reference")

    # ------------------------------------------------------------------ publish, log, checkpoint
    def version_name(self, n: int | str, slot: str = DEFAULT_SLOT) -> str:
        """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's ('-sft' for the warm start)."""
        return version_name(self.config.run_name, n, slot)

    def publish(self, n: int | str) -> str:
        """Publish version `n` of every LoRA (an iteration, or `WARM_START`); returns the shared
        LoRA's version."""
        return self.publish_all(n)[DEFAULT_SLOT]

    def publish_all(self, n: int | str) -> dict[str, str]:
        """Save version `n` of every LoRA and make the live policy serve each from its slot."""
        weights = self.gathered["weights"] if self.group is not None and self.group.sharded else None
        return publish_all(self.model, self.policy, self.out / "adapters", self.config.run_name, self.slots, n, weights)

    @property
    def history(self) -> list[dict]:
        """Every iteration's metrics so far (resumed ones included)."""
        return self.runlog.history

    def log(self, metrics: dict) -> None:
        self.runlog.log(metrics)

    def save_checkpoint(self) -> Path:
        return runlog.save_checkpoint(self)

    def resume(self) -> int:
        """Continue the run in the folder from its last checkpoint (`runlog.resume`)."""
        distributed.check_local(self, "resume")
        return runlog.resume(self)

    @property
    def follower(self) -> bool:
        """A rank of a process group other than the leader: it only takes its share of updates."""
        return self.group is not None and not self.group.leader

    def close(self) -> None:
        if not self.follower:
            self.runlog.close()
        distributed.leave(self)


"""Trainer settings: frozen dataclasses, validated on creation."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields, is_dataclass

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.policies.device import check_device


def _check(cond: bool, name: str, expected: str, value: object) -> None:
    if not cond:
        raise InvalidArgument(f"{name}: expected {expected}, got {value!r}")


_SLOT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Distributed:
    """The update spread over processes, one per device (torchrun or Ray Train start them; docs/scale.md)."""

    strategy: str = "ddp"
    """'ddp' (every process holds the model; gradients all-reduced) or 'fsdp' (FSDP2 `fully_shard`:
    each process holds a shard of every layer's weights, gradients and optimizer state)."""
    backend: str = "auto"
    """torch.distributed backend when this process group is started here: 'auto' (nccl on CUDA,
    else gloo), 'gloo' or 'nccl'."""
    offload: bool = False
    """FSDP2 only: keep the sharded parameters on the CPU between uses (a GPU's memory lever)."""
    timeout_s: float = 86400.0
    """How long a rank waits on the others when this process group is started here: the other
    ranks wait out the leader's rollouts (and warm start) each iteration, so hours, not torch's
    default 30 minutes. Ray Train starts its own group: give it `TorchConfig(timeout_s=...)`."""

    def __post_init__(self) -> None:
        _check(self.strategy in ("ddp", "fsdp"), "strategy", "'ddp' or 'fsdp'", self.strategy)
        _check(self.backend in ("auto", "gloo", "nccl"), "backend", "'auto', 'gloo' or 'nccl'", self.backend)
        _check(isinstance(self.offload, bool), "offload", "a bool", self.offload)
        _check(not self.offload or self.strategy == "fsdp", "offload", "False with strategy 'ddp'", self.offload)
        _check(_number(self.timeout_s) and self.timeout_s > 0, "timeout_s", "a number of seconds > 0", self.timeout_s)


@dataclass(frozen=True)
class TrainerConfig:
    """Settings shared by GRPO and PPO."""

    gamma: float = 0.95
    """Discount over the model calls of a trajectory: G_t = r_t + gamma * G_{t+1}."""
    span_weight: float = 1.0
    """Weight of span rewards (`Episode.span_reward`) added to their tokens' advantages, after
    PPO's whitening and as recorded there, centred only by GRPO's `span_baseline` (0: ignore them)."""
    group_size: int = 8
    """Rollouts per task per iteration (GRPO's group)."""
    tasks_per_iteration: int | None = None
    """Tasks sampled for each iteration (None: all of them)."""
    concurrency: int = 8
    """Rollouts run at once (the embedded policy batches their model calls)."""
    lr: float = 1e-4
    """AdamW learning rate for the LoRA (the value head has its own, `value_lr`)."""
    epochs: int = 1
    """Passes over each iteration's samples."""
    minibatch_size: int = 8
    """Sequences per optimiser step (more than an iteration's samples: one step on all of them)."""
    microbatch_size: int | None = None
    """Sequences per forward/backward pass, accumulated into the step (None: the whole minibatch)."""
    clip_low: float = 0.2
    """Lower clip of the importance ratio: 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip of the importance ratio: 1 + clip_high (asymmetric clipping when different)."""
    tis_cap: float | None = 2.0
    """Truncated importance sampling: each token weighted by min(pi_old / pi_sampler, tis_cap), for
    the sampler (vLLM in bf16, a batched embedded policy) not matching the trainer (None: off)."""
    kl_beta: float = 0.0
    """Weight of the k3 KL to the reference (the base model, or what `freeze_reference` froze); 0 skips it."""
    warmup_steps: int = 0
    """Optimizer steps over which the learning rate rises linearly to `lr` (0: none)."""
    loss_aggregation: str = "token"
    """'token' (every trained token weighs the same) or 'sequence' (each sequence the same)."""
    lora_rank: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha (scale = alpha / rank)."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Module names that get LoRA."""
    role_slots: dict[str, str] | None = None
    """Crew role -> policy slot: each slot named here gets a LoRA of its own, trained only on its
    roles' trajectories (own advantages, optimizer, checkpoints) and published to that slot, as
    `ForgeLLM(role_slot=...)` serves it (None: one LoRA shared by every role, in the default slot)."""
    max_seq_len: int = 1024
    """Longest training sequence; longer ones are truncated and counted."""
    merge_steps: bool = False
    """Merge consecutive calls whose prompt extends the previous sequence into one sample."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    success_threshold: float = 1.0
    """A rollout whose reward reaches this counts as a success in the metrics."""
    skip_uniform_groups: bool = True
    """GRPO with the group baseline: leave out groups whose every advantage is 0 and whose span
    rewards do not differ (no signal against their own group; keep them when the KL term should
    hold their prompts near the reference)."""
    device: str = "auto"
    """Where the update runs: 'auto' (CUDA, then MPS, then CPU), 'cpu', 'cuda', 'cuda:N' or 'mps'."""
    bf16: bool | None = None
    """bf16 autocast for the update (None: where the device computes bf16 fast)."""
    gradient_checkpointing: bool = False
    """Recompute the decoder's activations in the backward pass: less memory, more time."""
    max_memory_gb: float | None = None
    """Peak memory the update may reach: each minibatch is cut into the largest microbatches that
    fit (trainer/memory.py; `microbatch_size` still caps them). None: `microbatch_size` alone."""
    run_name: str = "run"
    """Adapter versions are published as '<run_name>-v<N>'."""
    out_dir: str = "runs/train"
    """Run folder: adapters, checkpoints, metrics.jsonl, TensorBoard logs, trajectories.db."""
    seed: int = 0
    """Seed for task sampling, shuffling, initialisation and the rollouts' sampling (each rollout
    gets its own seed, so a rerun samples the same rollouts whatever the thread timing)."""
    progress: bool = True
    """Show progress bars."""
    distributed: Distributed | None = None
    """Spread the update over the processes torchrun or Ray Train started (None: this process alone)."""

    def __post_init__(self) -> None:
        _check(self.distributed is None or isinstance(self.distributed, Distributed), "distributed",
               "None or a Distributed(...)", self.distributed)
        _check(_number(self.gamma) and 0 <= self.gamma <= 1, "gamma", "a number in [0, 1]", self.gamma)
        _check(_number(self.span_weight) and 0 <= self.span_weight < math.inf, "span_weight",
               "a finite number >= 0", self.span_weight)
        for name in ("group_size", "concurrency", "epochs", "minibatch_size", "lora_rank",
                     "lora_alpha", "max_seq_len"):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                   "an int >= 1", value)
        _check(self.microbatch_size is None or (isinstance(self.microbatch_size, int)
               and not isinstance(self.microbatch_size, bool) and self.microbatch_size >= 1),
               "microbatch_size", "an int >= 1 or None", self.microbatch_size)
        _check(isinstance(self.warmup_steps, int) and not isinstance(self.warmup_steps, bool)
               and self.warmup_steps >= 0, "warmup_steps", "an int >= 0", self.warmup_steps)
        _check(self.tasks_per_iteration is None or (isinstance(self.tasks_per_iteration, int)
               and self.tasks_per_iteration >= 1), "tasks_per_iteration", "an int >= 1 or None",
               self.tasks_per_iteration)
        _check(_number(self.lr) and self.lr > 0, "lr", "a number > 0", self.lr)
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            _check(_number(value) and 0 < value < 1, name, "a number in (0, 1)", value)
        _check(self.tis_cap is None or (_number(self.tis_cap) and self.tis_cap >= 1), "tis_cap",
               "None or a number >= 1", self.tis_cap)
        _check(_number(self.kl_beta) and self.kl_beta >= 0, "kl_beta", "a number >= 0", self.kl_beta)
        _check(self.loss_aggregation in ("token", "sequence"), "loss_aggregation",
               "'token' or 'sequence'", self.loss_aggregation)
        _check(isinstance(self.lora_targets, tuple) and all(isinstance(t, str) for t in self.lora_targets)
               and len(self.lora_targets) > 0, "lora_targets", "a non-empty tuple of module names",
               self.lora_targets)
        _check(_number(self.grad_clip) and self.grad_clip > 0, "grad_clip", "a number > 0", self.grad_clip)
        check_device(self.device)
        if self.role_slots is not None:
            _check(isinstance(self.role_slots, dict) and self.role_slots and all(
                isinstance(k, str) and k and isinstance(v, str) and _SLOT.match(v)
                for k, v in self.role_slots.items()), "role_slots",
                "a non-empty dict of role -> slot name (letters, digits, - and _)", self.role_slots)
        for name in ("gradient_checkpointing", "skip_uniform_groups", "merge_steps", "progress"):
            _check(isinstance(getattr(self, name), bool), name, "a bool", getattr(self, name))
        _check(self.bf16 is None or isinstance(self.bf16, bool), "bf16", "a bool or None", self.bf16)
        _check(self.max_memory_gb is None or (_number(self.max_memory_gb) and self.max_memory_gb > 0),
               "max_memory_gb", "a number > 0 (GiB) or None", self.max_memory_gb)
        _check(isinstance(self.run_name, str) and self.run_name.replace("-", "").replace("_", "").isalnum(),
               "run_name", "letters, digits, - and _", self.run_name)

    def to_dict(self) -> dict:
        """The settings as JSON-ready values (a nested config, such as `guidance`, as a dict)."""
        return {f.name: asdict(v) if is_dataclass(v) else v for f in fields(self) for v in [getattr(self, f.name)]}


@dataclass(frozen=True)
class Guidance:
    """Guide trajectories in GRPO groups the policy fails (LUFFY, arXiv 2504.14945)."""

    below: float = 0.0
    """A group is guided when its on-policy success rate is at or below this."""
    k: int = 2
    """Guide trajectories added to such a group."""
    source: str = "demonstrations"
    """'demonstrations' (the teacher's recorded ones of the same task) or 'teacher' (the teacher's
    rollouts of the task through the same agent, recorded like the student's)."""
    shaping: float = 0.1
    """gamma of the guide tokens' weight f(pi) = pi / (pi + gamma), in place of the clipped ratio."""

    def __post_init__(self) -> None:
        _check(_number(self.below) and 0 <= self.below <= 1, "below", "a success rate in [0, 1]", self.below)
        _check(isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 1, "k", "an int >= 1", self.k)
        _check(self.source in ("demonstrations", "teacher"), "source", "'demonstrations' or 'teacher'", self.source)
        _check(_number(self.shaping) and self.shaping > 0, "shaping", "a number > 0", self.shaping)


@dataclass(frozen=True)
class GRPOConfig(TrainerConfig):
    """Multi-turn GRPO: an episode-level advantage plus a step-level one within anchor states."""

    credit: str = "anchor"
    """'anchor' (episode advantage + step advantage within groups of steps taken from the same
    state) or 'trajectory' (the episode advantage on every step: outcome-level GRPO)."""
    step_weight: float = 1.0
    """omega: weight of the step-level advantage added to the episode-level one ('anchor')."""
    scale_by_std: bool = True
    """Divide by the group's standard deviation (False: only subtract the mean, as Dr. GRPO)."""
    baseline: str = "group"
    """What a return is compared with: 'group' (GRPO: the other rollouts of the same task) or
    'batch' (every rollout of the iteration: a task that all rollouts failed, or all passed,
    still says which behaviour to leave or keep, against the other tasks)."""
    span_baseline: str = "none"
    """Span rewards as recorded ('none'), or each keyed one minus the mean over the rollouts compared
    of their value for its key, 0 where a rollout has none ('group': `centre_span_rewards`)."""
    guidance: Guidance | None = None
    """Add a teacher's guide trajectories to groups the policy fails (needs `GRPOTrainer(teacher=)`)."""
    distill_beta: float = 0.0
    """On-policy distillation: each sampled token's advantage gains distill_beta * (log pi_teacher -
    log pi_student), the reverse KL to the teacher as a per-token reward (0: off; needs a teacher
    that scores tokens in the student's vocabulary)."""
    relabel_weight: float = 0.0
    """DAgger: on steps of failed rollouts, the teacher's own action there is imitated, weighted
    by this against the policy-gradient terms (0: off)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.guidance is None or isinstance(self.guidance, Guidance), "guidance", "a Guidance or None",
               self.guidance)
        for name in ("distill_beta", "relabel_weight"):
            _check(_number(getattr(self, name)) and 0 <= getattr(self, name) < math.inf, name,
                   "a finite number >= 0", getattr(self, name))
        _check(self.baseline in ("group", "batch"), "baseline", "'group' or 'batch'", self.baseline)
        _check(self.span_baseline in ("none", "group"), "span_baseline", "'none' or 'group'", self.span_baseline)
        _check(self.credit in ("anchor", "trajectory"), "credit", "'anchor' or 'trajectory'", self.credit)
        _check(_number(self.step_weight) and self.step_weight >= 0, "step_weight", "a number >= 0",
               self.step_weight)

    def teacher_settings(self) -> tuple[str, ...]:
        """The settings that ask for a teacher, as a user would write them (empty: none does)."""
        guide = (f"Guidance(source={self.guidance.source!r})",) if self.guidance else ()
        return guide + tuple(name for name in ("distill_beta", "relabel_weight") if getattr(self, name) > 0)


@dataclass(frozen=True)
class PPOConfig(TrainerConfig):
    """Multi-turn PPO: GAE over steps with a value head on the policy's hidden states."""

    lam: float = 0.95
    """GAE lambda."""
    value_coef: float = 0.5
    """Weight of the value loss; it trains only the head, whose gradient is clipped on its own, so
    under Adam this weight changes little."""
    value_lr: float = 0.05
    """Learning rate of the value head (from zero); Adam's first step moves a value by ~2x this."""
    normalize_advantages: bool = False
    """Whiten advantages over each iteration's batch (off by default: when most rollouts agree,
    whitening blows value-estimate noise up to unit-size advantages and the policy drifts)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(_number(self.lam) and 0 <= self.lam <= 1, "lam", "a number in [0, 1]", self.lam)
        _check(_number(self.value_coef) and self.value_coef >= 0, "value_coef", "a number >= 0",
               self.value_coef)
        _check(_number(self.value_lr) and self.value_lr > 0, "value_lr", "a number > 0", self.value_lr)
        _check(self.role_slots is None, "role_slots", "None with PPO (its value head is shared by "
               "every role; train per-role adapters with GRPO)", self.role_slots)
        _check(self.distributed is None, "distributed", "None with PPO (a distributed update trains LoRAs "
               "only, not the value head; spread GRPO's)", self.distributed)


@dataclass(frozen=True)
class SFTConfig:
    """The supervised warm start on demonstrations (`fb.sft`)."""

    epochs: int = 4
    """Passes over the demonstrations (with `lr`, chosen by a sweep on the default model:
    docs/own-agent.md#the-warm-starts-defaults)."""
    lr: float = 1e-3
    """AdamW learning rate of the LoRA (the trainer's RL rate, 1e-4, leaves the default model
    where it was on a dozen demonstrations: the same sweep)."""
    batch_size: int | None = 8
    """Sequences per optimizer step (None: the trainer's `minibatch_size`)."""
    publish: bool = True
    """Publish the result to the live policy as version '<run>-sft'."""

    def __post_init__(self) -> None:
        _check(isinstance(self.epochs, int) and not isinstance(self.epochs, bool) and self.epochs >= 1,
               "epochs", "an int >= 1", self.epochs)
        _check(_number(self.lr) and self.lr > 0, "lr", "a number > 0", self.lr)
        _check(self.batch_size is None or (isinstance(self.batch_size, int) and not isinstance(
            self.batch_size, bool) and self.batch_size >= 1), "batch_size", "an int >= 1 or None",
            self.batch_size)
        _check(isinstance(self.publish, bool), "publish", "a bool", self.publish)


WHERE_KEYS = frozenset({"task_id", "group_id", "adapter"})
"""The store filters `OfflineConfig.where` takes (`TrajectoryStore.iter`'s)."""


@dataclass(frozen=True)
class OfflineConfig:
    """Training from the store (`train_offline`): which episodes, and how each kind is learned from."""

    since: float | None = None
    """Only episodes recorded at or after this unix time (None: all)."""
    run_id: str | None = None
    """Only episodes of this run id (None: every run in the store)."""
    where: dict[str, str] | None = None
    """More store filters every episode must match: `task_id`, `group_id`, `adapter` (the version that served it)."""
    threshold: float = 1.0
    """An episode whose reward is at least this is a good one: its steps are imitated."""
    imitate: bool = True
    """Imitate the good episodes that are not the student's own samples (upstream, demonstration)."""
    reinforce: bool = True
    """Policy gradient on the student's own recorded episodes, against the batch's mean reward."""
    sft: SFTConfig = SFTConfig(epochs=2, lr=1e-3, publish=False)
    """The imitation's passes and rate (it never publishes on its own: the iteration does)."""
    publish: bool = True
    """Make the policy serve the result at once (False: save it only, for a gate to decide: `Promotion.consider`)."""

    def __post_init__(self) -> None:
        _check(self.since is None or _number(self.since), "since", "None or a unix time", self.since)
        _check(self.run_id is None or isinstance(self.run_id, str), "run_id", "None or a run id", self.run_id)
        _check(self.where is None or (isinstance(self.where, dict) and set(self.where) <= WHERE_KEYS
                                      and all(isinstance(v, str) for v in self.where.values())),
               "where", f"None or a dict of store filters ({', '.join(sorted(WHERE_KEYS))}) to strings", self.where)
        _check(_number(self.threshold) and math.isfinite(self.threshold), "threshold", "a finite number", self.threshold)
        for name in ("imitate", "reinforce", "publish"):
            _check(isinstance(getattr(self, name), bool), name, "a bool", getattr(self, name))
        _check(isinstance(self.sft, SFTConfig) and not self.sft.publish, "sft", "an SFTConfig with publish=False",
               self.sft)


__all__ = ["Distributed", "GRPOConfig", "Guidance", "OfflineConfig", "PPOConfig", "SFTConfig", "TrainerConfig"]

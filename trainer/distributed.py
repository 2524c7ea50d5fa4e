"""The update on many processes: DDP or FSDP2 over torch.distributed, one process per device.

torchrun (`forge-bridge train --nproc N`) or Ray Train's `TorchTrainer` starts the processes;
each runs the same script and makes the same trainer. Rank 0, the leader, does everything a
single process does -- rollouts, the store, the run folder, publishing, checkpoints -- and, at
each update, sends the iteration's samples and their minibatch plan to the other ranks, which
wait in `follow` (their `train()` call) for it. Every rank then takes its share of each
minibatch's microbatches (balanced by tokens, `assign`), torch reduces the gradients (DDP's
all-reduce, FSDP2's reduce-scatter), and every rank takes the same optimizer step: the weights
are those of one process taking the whole minibatch.

The processes are spread (`spread`) at the first update: the leader's weights and optimizer
state (its warm start, or a resumed checkpoint, saved by any world size) are sent to the others,
then the decoder body is wrapped in DDP, or each of its layers sharded with `fully_shard`. After
that, under FSDP2 every rank holds a shard only: the leader gathers the full LoRA and optimizer
state after each update (`gather`) for publishing and checkpoints, and what would change its
weights alone (SFT, resuming, a new KL reference) is refused.
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any, Sequence

import torch

from forge_bridge.core.errors import ForgeBridgeError, InvalidState, Unsupported
from forge_bridge.trainer.config import Distributed

if TYPE_CHECKING:
    from forge_bridge.trainer.batch import Sample
    from forge_bridge.trainer.loop import Trainer


class Group:
    """This process's place in the job: its rank, the world size and the strategy."""

    def __init__(self, config: Distributed) -> None:
        import torch.distributed as dist

        self.config = config
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.leader = self.rank == 0
        """Rank 0: the one process that collects, records, publishes and checkpoints."""
        self.spread = False
        """Whether the model is wrapped (DDP) or sharded (FSDP2) yet: at the first update."""
        self.failed: str | None = None
        """Why a collective failed: the group is unusable after it (the job must restart)."""
        self.owned = False
        """Whether `join` started the process group (then `leave` ends it; Ray Train ends its own)."""

    @property
    def sharded(self) -> bool:
        """FSDP2 after the first update: no rank holds the full weights."""
        return self.config.strategy == "fsdp" and self.spread

    def device(self, resolved: str) -> str:
        """A CUDA process's own GPU (LOCAL_RANK), else the device as resolved."""
        if resolved == "cuda":
            local = int(os.environ.get("LOCAL_RANK", self.rank))
            torch.cuda.set_device(local)
            return f"cuda:{local}"
        return resolved

    def broadcast(self, value: Any = None) -> Any:
        """The leader's `value`, on every rank."""
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, by rank, on every rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value)
        return out


def join(config: Distributed | None) -> Group | None:
    """This process's group: the one torch.distributed already has (Ray Train starts it), or one
    started from torchrun's environment. None when the config asks for none, or when this process
    is alone (no WORLD_SIZE, or 1): the update then runs here as usual."""
    if config is None:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        backend = config.backend if config.backend != "auto" else "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout_s))
        started = True
    else:
        started = False
    if dist.get_world_size() <= 1:
        return None
    group = Group(config)
    group.owned = started
    return group


def leave(trainer: "Trainer") -> None:
    """End the process group this process started, before the interpreter exits: a gloo group
    left to the exit can abort the process ('terminate called without an active exception')."""
    import torch.distributed as dist

    group = trainer.group
    if group is not None and group.owned and dist.is_initialized():
        trainer.group, trainer.bodies = None, {}
        dist.destroy_process_group()


def leader() -> bool:
    """Whether this process is rank 0 of its job (or alone): the one to build the policy the
    agent calls, and the rollouts; the other ranks make their trainer with `policy=None`."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def assign(sizes: Sequence[int], ranks: int) -> list[list[int]]:
    """Indices of `sizes` (tokens per microbatch) shared among `ranks`, largest first to the
    rank with the fewest tokens so far (ties: the lowest rank): ranks x [indices], each sorted."""
    shares: list[list[int]] = [[] for _ in range(ranks)]
    load = [0] * ranks
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        shares[r].append(i)
        load[r] += sizes[i]
    return [sorted(s) for s in shares]


# ---------------------------------------------------------------------------------------- the leader
def run_update(trainer: "Trainer", samples: list["Sample"]) -> dict:
    """The update of the active slot's LoRA on these samples: here, or on every rank of the group."""
    from forge_bridge.trainer import update

    plan = update.plan(trainer, len(samples))
    group = trainer.group
    if group is None:
        return update.update(trainer, samples, plan)
    check_usable(group)
    try:
        group.broadcast(("update", trainer.active_slot, samples, plan))
        return execute(trainer, samples, plan)
    except RuntimeError as exc:  # a rank died or the network failed mid-collective
        if isinstance(exc, ForgeBridgeError):
            raise
        group.failed = str(exc)
        raise InvalidState(
            f"the update failed on the process group ({exc}); nothing of this iteration was published or "
            "checkpointed: restart the job and resume the run (any world size resumes it)") from exc


def stop(trainer: "Trainer") -> None:
    """Release the waiting ranks from `follow` (the leader's `train()` is over)."""
    group = trainer.group
    if group is not None and group.leader and group.failed is None:
        group.broadcast(("stop",))


def check_usable(group: Group) -> None:
    if group.failed is not None:
        raise InvalidState(f"the process group failed earlier ({group.failed}): restart the job and resume the run")


def check_local(trainer: "Trainer", what: str) -> None:
    """Refuse, once the processes are spread, what would change the leader's weights alone."""
    group = trainer.group
    if group is not None and group.spread:
        raise Unsupported(f"{what} after the first distributed update: the other ranks hold their own copy (DDP) "
                          "or shard (FSDP2) of the weights and would not see it; do it before train(), or "
                          "in a job of its own")


# ---------------------------------------------------------------------------------------- every rank
def follow(trainer: "Trainer") -> None:
    """A non-leader rank's `train()`: take the leader's updates until it stops."""
    group = trainer.group
    while True:
        command = group.broadcast()
        if command[0] == "stop":
            return
        _, slot, samples, plan = command
        with trainer.training(slot):
            execute(trainer, samples, plan)


def execute(trainer: "Trainer", samples: list["Sample"], plan: list[list[list[int]]]) -> dict:
    """One update, run on every rank at once (spreading the model first, the first time)."""
    from forge_bridge.trainer import update

    if not trainer.group.spread:
        spread(trainer)
    stats = update.update(trainer, samples, plan)
    if trainer.group.sharded:
        full = gather(trainer)
        trainer.gathered = full if trainer.group.leader else None
    return stats


def spread(trainer: "Trainer") -> None:
    """Give every rank the leader's weights, then wrap the body in DDP or shard it with FSDP2."""
    group = trainer.group
    slots = group.broadcast(trainer.slots)
    if slots != trainer.slots:
        raise InvalidState(f"rank {group.rank} trains the slots {trainer.slots}, the leader {slots}: give every "
                           "rank the same role_slots (GRPOConfig(role_slots=...))")
    state = group.broadcast(local_state(trainer) if group.leader else None)
    if not group.leader:
        load_state(trainer, state)
    body = trainer.model.get_base_model().model
    if group.config.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(trainer.device).index] if str(trainer.device).startswith("cuda") else None
        for slot in trainer.slots:  # DDP hooks the parameters that require grad: the active slot's
            with trainer.training(slot):  # no init sync: the LoRAs were just sent, the base is the same files
                trainer.bodies[slot] = DistributedDataParallel(body, device_ids=ids, init_sync=False,
                                                               forward_sync_buffers=False)
    else:
        shard(trainer, body)
    group.spread = True


def shard(trainer: "Trainer", body: torch.nn.Module) -> None:
    """FSDP2: each decoder layer, then the body, sharded over the ranks; the optimizers remade on
    the sharded parameters with their state's shards."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    if len(trainer.slots) > 1:
        raise Unsupported("FSDP2 with per-role LoRAs (role_slots): use Distributed(strategy='ddp')")
    if trainer.group.config.offload and not str(trainer.device).startswith("cuda"):
        raise Unsupported("Distributed(offload=True) keeps a GPU's parameters on the CPU: this update runs on "
                          f"{trainer.device}")
    options = {"offload_policy": CPUOffloadPolicy()} if trainer.group.config.offload else {}
    before = {slot: optimizer.state_dict() for slot, optimizer in trainer.optimizers.items()}
    for layer in body.layers:
        fully_shard(layer, **options)
    fully_shard(body, **options)  # embeddings and the final norm; a tied lm_head keeps its own full copy
    trainer.share_prefix = False  # a prefix pass would give ranks different numbers of collective calls
    for slot in trainer.slots:
        trainer.remake_optimizer(slot)
        optimizer = trainer.optimizers[slot]
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for index, entry in before[slot]["state"].items():
            optimizer.state[params[index]] = {k: _shard_like(v, params[index]) for k, v in entry.items()}


def _shard_like(value: torch.Tensor, param: Any) -> torch.Tensor:
    """A full optimizer-state tensor as the shard of `param`'s (a scalar such as Adam's step as is)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor) and value.dim() > 0:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value


def _full(value: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def local_state(trainer: "Trainer") -> dict:
    """The leader's LoRA weights (every slot) and optimizer states, and the frozen KL reference."""
    from forge_bridge.trainer.lora import is_lora

    return {"weights": {n: p.detach().cpu() for n, p in trainer.model.named_parameters() if is_lora(n)},
            "optimizers": {slot: opt.state_dict() for slot, opt in trainer.optimizers.items()},
            "reference": trainer.reference.weights()}


def load_state(trainer: "Trainer", state: dict) -> None:
    """Make this rank's weights, optimizers and KL reference the leader's (`local_state`)."""
    params = dict(trainer.model.named_parameters())
    with torch.no_grad():
        for name, value in state["weights"].items():
            params[name].copy_(value.to(params[name].device))
    for slot, optimizer in trainer.optimizers.items():
        optimizer.load_state_dict(state["optimizers"][slot])
    if state["reference"] is not None:
        trainer.reference.load_weights(trainer.model, state["reference"])


def gather(trainer: "Trainer") -> dict:
    """FSDP2: the full LoRA weights and optimizer states, gathered from the shards (every rank
    takes part; the leader keeps them for publishing and checkpoints)."""
    from forge_bridge.trainer.lora import is_lora

    weights = {n: _full(p.detach()).cpu() for n, p in trainer.model.named_parameters() if is_lora(n)}
    optimizers = {}
    for slot, optimizer in trainer.optimizers.items():
        state = optimizer.state_dict()
        optimizers[slot] = {"param_groups": state["param_groups"], "state": {
            index: {k: _full(v).cpu() for k, v in sorted(entry.items())} for index, entry in sorted(state["state"].items())}}
    return {"weights": weights, "optimizers": optimizers}


def reducing(trainer: "Trainer", now: bool) -> Any:
    """Whether this backward pass reduces the gradients over a DDP group (the last of a step's
    microbatches) or only accumulates them here (`no_sync`); FSDP2 reduce-scatters each one."""
    from contextlib import nullcontext

    body = trainer.bodies.get(trainer.active_slot)
    return nullcontext() if now or body is None else body.no_sync()


def full_norm(norm: torch.Tensor) -> float:
    """A gradient norm as a number (FSDP2's is a replicated DTensor)."""
    return float(_full(norm))


__all__ = ["Group", "assign", "check_local", "follow", "join", "leader", "leave", "reducing", "run_update", "stop"]

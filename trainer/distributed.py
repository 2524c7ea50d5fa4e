"""The update on many processes: DDP or FSDP2 over torch.distributed, one process per device.

torchrun (`forge-bridge train --nproc N`) or Ray Train's `TorchTrainer` starts the processes;
each runs the same script and makes the same trainer. Rank 0, the leader, does everything a
single process does -- rollouts, the store, the run folder, publishing, checkpoints -- and, at
each update, sends the iteration's samples and their minibatch plan to the other ranks, which
wait in `Ranks.follow` (their `train()` call) for it. Every rank then takes its share of each
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
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, cast

import torch

from forge_bridge.core.errors import ForgeBridgeError, InvalidState, Unsupported
from forge_bridge.trainer.config import Distributed

if TYPE_CHECKING:
    from forge_bridge.trainer.batch import Sample

Learner = Any
"""The trainer's `learner.Learner` (its LoRAs, optimizers, wrapped bodies), named here without
importing it: the learner uses this module, not the other way round."""
Reference = Any
"""The trainer's `learner.Reference` (the frozen KL reference's weights travel with the model)."""

Chunks = list[tuple[list["Sample"], float]]
"""A minibatch's microbatches with their weights (`learner.microbatches`)."""


class Alone:
    """One process: the whole update runs here, and each step of a process group does nothing."""

    size, rank, leader, sharded = 1, 0, True, False

    def device(self, resolved: str) -> str:
        """The device this process trains on: the one resolved."""
        return resolved

    def microbatch_size(self, count: int, given: int | None) -> int | None:
        """The microbatch size: the config's (None: the whole minibatch)."""
        return given

    def share(self, chunks: Chunks) -> tuple[list[tuple[int | None, list["Sample"]]], list[int]]:
        """The (index, chunk) pairs this process runs: all of them (and no loads to compare)."""
        return list(enumerate(c for c, _ in chunks)), []

    def gather(self, value: Any) -> list[Any]:
        """Every process's `value`: this one's."""
        return [value]

    def reduce(self, stats: dict[str, float], loads: list[int]) -> dict[str, float]:
        """A step's statistics over every process: this one's."""
        return stats

    def reducing(self, learner: Learner, now: bool) -> Any:
        """Whether a backward pass reduces the gradients over the processes: nothing to reduce."""
        return nullcontext()

    def norm(self, norm: torch.Tensor) -> float:
        """A gradient norm as a number."""
        return float(norm)

    def check_local(self, what: str) -> None:
        """Refuse what would change one process's weights alone: there is only one."""

    @contextmanager
    def updating(self, learner: Learner, reference: Reference, slot: str, samples: list["Sample"],
                 steps: list) -> Iterator[None]:
        """Around one update: nothing to send, spread or gather."""
        yield

    def full_state(self) -> dict | None:
        """The full LoRA and optimizer states where the model holds shards (None: it holds them whole)."""
        return None

    def run(self, lead: Callable[[], list[dict]], update: Callable[[str, list, list], Any]) -> list[dict]:
        """`train()` on this process: the whole loop (`lead`)."""
        return lead()

    def leave(self, learner: Learner) -> None:
        """End the process group: there is none."""


class Ranks:
    """This process's place in a job of several: its rank, the world size and the strategy."""

    def __init__(self, config: Distributed) -> None:
        import torch.distributed as dist

        self.config = config
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.leader = self.rank == 0
        """Rank 0: the one process that collects, records, publishes and checkpoints."""
        self.spread = False
        """Whether the model is wrapped (DDP) or sharded (FSDP2) yet: at the first update."""
        self.failed: str | None = None
        """Why a collective failed: the job is unusable after it (it must restart)."""
        self.owned = False
        """Whether `join` started the process group (then `leave` ends it; Ray Train ends its own)."""
        self.gathered: dict | None = None
        """The full LoRA and optimizer states after the last FSDP2 update (the leader's, to save)."""

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

    # ------------------------------------------------------------------ one optimizer step
    def microbatch_size(self, count: int, given: int | None) -> int | None:
        """The microbatch size: the config's, at most a rank's even share of the minibatch, so that
        every rank has a microbatch to run."""
        share = -(-count // self.size)
        return share if given is None else min(given, share)

    def share(self, chunks: Chunks) -> tuple[list[tuple[int | None, list["Sample"]]], list[int]]:
        """This rank's (index, chunk) pairs, its share by tokens (`assign`), padded with index None
        (a chunk run for nothing) to as many as any rank runs, since every rank must make the same
        collective calls; and the tokens each rank runs."""
        sizes = [sum(len(s.input_ids) for s in c) for c, _ in chunks]
        shares = assign(sizes, self.size)
        mine, filler = shares[self.rank], min(range(len(chunks)), key=lambda i: sizes[i])
        runs: list[tuple[int | None, list[Sample]]] = [(i, chunks[i][0]) for i in mine]
        runs += [(None, chunks[filler][0])] * (max(map(len, shares)) - len(mine))
        return runs, [sum(sizes[i] for i in share) for share in shares]

    def reduce(self, stats: dict[str, float], loads: list[int]) -> dict[str, float]:
        """A step's statistics summed over the ranks, with the world size and the token balance."""
        out = {key: sum(part.get(key, 0.0) for part in self.gather(stats)) for key in sorted(stats)}
        return out | {"world_size": self.size, "rank_tokens_max": max(loads), "rank_tokens_min": min(loads)}

    def reducing(self, learner: Learner, now: bool) -> Any:
        """Whether this backward pass reduces the gradients over a DDP group (the last of a step's
        microbatches) or only accumulates them here (`no_sync`); FSDP2 reduce-scatters each one."""
        body = learner.bodies.get(learner.active_slot)
        return nullcontext() if now or body is None else body.no_sync()

    def norm(self, norm: torch.Tensor) -> float:
        """A gradient norm as a number (FSDP2's is a replicated DTensor)."""
        return float(_full(norm))

    # ------------------------------------------------------------------ the update on every rank
    def check_local(self, what: str) -> None:
        """Refuse, once the processes are spread, what would change the leader's weights alone."""
        if self.spread:
            raise Unsupported(f"{what} after the first distributed update: the other ranks hold their own copy "
                              "(DDP) or shard (FSDP2) of the weights and would not see it; do it before train(), "
                              "or in a job of its own")

    def check_usable(self) -> None:
        if self.failed is not None:
            raise InvalidState(f"the process group failed earlier ({self.failed}): restart the job and resume the run")

    @contextmanager
    def updating(self, learner: Learner, reference: Reference, slot: str, samples: list["Sample"],
                 steps: list) -> Iterator[None]:
        """Around one update, on every rank: the leader sends the samples and their plan to the
        others (waiting in `follow`), the model is spread the first time, and under FSDP2 the full
        state is gathered after it. A collective that fails marks the job unusable."""
        self.check_usable()
        try:
            if self.leader:
                self.broadcast(("update", slot, samples, steps))
            if not self.spread:
                self.spread_model(learner, reference)
            yield
            if self.sharded:
                full = self.gather_state(learner)
                self.gathered = full if self.leader else None
        except RuntimeError as exc:  # a rank died or the network failed mid-collective
            if isinstance(exc, ForgeBridgeError):
                raise
            self.failed = str(exc)
            raise InvalidState(
                f"the update failed on the process group ({exc}); nothing of this iteration was published or "
                "checkpointed: restart the job and resume the run (any world size resumes it)") from exc

    def full_state(self) -> dict | None:
        """The full LoRA and optimizer states gathered after the last update, where the model holds
        shards (FSDP2); None where every rank holds them whole."""
        return self.gathered if self.sharded else None

    def run(self, lead: Callable[[], list[dict]], update: Callable[[str, list, list], Any]) -> list[dict]:
        """`train()` on this rank: the leader runs the loop (`lead`) and then releases the others;
        every other rank runs each update the leader sends (`update(slot, samples, steps)`) until then."""
        if not self.leader:
            self.follow(update)
            return []
        try:
            return lead()
        finally:
            if self.failed is None:
                self.broadcast(("stop",))

    def follow(self, update: Callable[[str, list, list], Any]) -> None:
        """A non-leader rank's `train()`: take the leader's updates until it stops."""
        while True:
            command = self.broadcast()
            if command[0] == "stop":
                return
            update(*command[1:])

    def spread_model(self, learner: Learner, reference: Reference) -> None:
        """Give every rank the leader's weights, then wrap the body in DDP or shard it with FSDP2."""
        slots = self.broadcast(learner.slots)
        if slots != learner.slots:
            raise InvalidState(f"rank {self.rank} trains the slots {learner.slots}, the leader {slots}: give every "
                               "rank the same role_slots (GRPOConfig(role_slots=...))")
        state = self.broadcast({"weights": learner.lora_weights(), "reference": reference.weights(),
                                "optimizers": {slot: o.state_dict() for slot, o in learner.optimizers.items()}}
                               if self.leader else None)
        if not self.leader:
            learner.load_state(state["weights"], state["optimizers"])
            if state["reference"] is not None:
                reference.load_weights(learner.model, state["reference"])
        body = learner.model.get_base_model().model
        if self.config.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [torch.device(learner.device).index] if str(learner.device).startswith("cuda") else None
            for slot in learner.slots:  # DDP hooks the parameters that require grad: the active slot's
                with learner.training(slot):  # no init sync: the LoRAs were just sent, the base is the same files
                    learner.wrap(slot, DistributedDataParallel(body, device_ids=ids, init_sync=False,
                                                               forward_sync_buffers=False))
        else:
            self.shard(learner, body)
        self.spread = True

    def shard(self, learner: Learner, body: torch.nn.Module) -> None:
        """FSDP2: each decoder layer, then the body, sharded over the ranks; the optimizers remade on
        the sharded parameters with their state's shards."""
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        if len(learner.slots) > 1:
            raise Unsupported("FSDP2 with per-role LoRAs (role_slots): use Distributed(strategy='ddp')")
        if self.config.offload and not str(learner.device).startswith("cuda"):
            raise Unsupported("Distributed(offload=True) keeps a GPU's parameters on the CPU: this update runs on "
                              f"{learner.device}")
        options: dict[str, Any] = {"offload_policy": CPUOffloadPolicy()} if self.config.offload else {}
        before = {slot: optimizer.state_dict() for slot, optimizer in learner.optimizers.items()}
        for layer in cast(torch.nn.ModuleList, body.layers):  # nn.Module types its submodules as Tensor | Module
            fully_shard(layer, **options)
        fully_shard(body, **options)  # embeddings and the final norm; a tied lm_head keeps its own full copy
        learner.sharded()
        for slot in learner.slots:
            optimizer = learner.optimizers[slot]
            params = [p for g in optimizer.param_groups for p in g["params"]]
            for index, entry in before[slot]["state"].items():
                optimizer.state[params[index]] = {k: _shard_like(v, params[index]) for k, v in entry.items()}

    def gather_state(self, learner: Learner) -> dict:
        """FSDP2: the full LoRA weights and optimizer states, gathered from the shards (every rank
        takes part; the leader keeps them for publishing and checkpoints)."""
        from forge_bridge.trainer.lora import is_lora

        weights = {n: _full(p.detach()).cpu() for n, p in learner.model.named_parameters() if is_lora(n)}
        optimizers = {}
        for slot, optimizer in learner.optimizers.items():
            state = optimizer.state_dict()
            optimizers[slot] = {"param_groups": state["param_groups"], "state": {
                index: {k: _full(v).cpu() for k, v in sorted(entry.items())}
                for index, entry in sorted(state["state"].items())}}
        return {"weights": weights, "optimizers": optimizers}

    def leave(self, learner: Learner) -> None:
        """End the process group this process started, before the interpreter exits: a gloo group
        left to the exit can abort the process ('terminate called without an active exception')."""
        import torch.distributed as dist

        if self.owned and dist.is_initialized():
            learner.bodies.clear()
            dist.destroy_process_group()
            self.owned = False


def join(config: Distributed | None) -> Alone | Ranks:
    """This process's place: the process group torch.distributed already has (Ray Train starts
    it), or one started from torchrun's environment. `Alone` when the config asks for none, or
    when this process is alone (no WORLD_SIZE, or 1): the update then runs here as usual."""
    if config is None:
        return Alone()
    import torch.distributed as dist

    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return Alone()
        backend = config.backend if config.backend != "auto" else "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout_s))
        started = True
    else:
        started = False
    if dist.get_world_size() <= 1:
        return Alone()
    ranks = Ranks(config)
    ranks.owned = started
    return ranks


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


def _shard_like(value: torch.Tensor, param: Any) -> torch.Tensor:
    """A full optimizer-state tensor as the shard of `param`'s (a scalar such as Adam's step as is)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor) and value.dim() > 0:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value


def _full(value: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


__all__ = ["Alone", "Ranks", "assign", "join", "leader"]

"""Training samples from recorded token ids (never from a re-applied chat template).

One sample per model call: `prompt_token_ids + completion_token_ids`, trained on the completion
only. Consecutive calls of a trajectory may be merged into one sequence when the next prompt
extends the previous prompt + completion exactly (the tokens in between, tool results, are not
trained on). Token p of a sample carries the behaviour logprob and its advantage (the step's, or
its own from the token-signal stage, `advantages.all_token_advantages`), and the sample the
temperature its tokens were sampled at (the trainer scores them at that temperature). A sequence
over the length limit is cut to its first `max_len` tokens and flagged; one whose completion would
be cut away entirely is left out and counted, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Trajectory


@dataclass
class Sample:
    """One training sequence; every list is aligned with `input_ids`."""

    input_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    """The logprobs the sampling policy recorded (0 on prompt tokens)."""
    advantages: list[float]
    value_positions: list[int] = field(default_factory=list)
    """Per step in this sample: the position of its last prompt token (where V(s_t) is read)."""
    returns: list[float] = field(default_factory=list)
    """Per step in this sample: the value target (PPO)."""
    steps: list[tuple[str, int]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    """Per step in this sample: where its completion lies in `input_ids` ([start, end))."""
    cut: bool = False
    """Longer than `max_seq_len`: its first tokens kept (a sequence cut, not an episode's truncation)."""
    temperature: float = 1.0
    """The sampling temperature of its completions (1 where unknown or greedy)."""
    trainer_logprobs: list[float] | None = None
    """pi_old: the trainer's own logprobs before the update, when it had to compute them apart."""
    calls: int = 1
    """The model calls it trains: one, and one more for each step merged into it."""
    loss_term: str = "policy"
    """How the objective treats its completion tokens: 'policy' (its own samples: the clipped
    surrogate), 'guide' (a guide trajectory's: shaped) or 'relabel' (a teacher's action: imitated)."""


def scoring_temperature(temperature: float | None) -> float:
    """The temperature a step's tokens are scored at: its sampling temperature; 1 where it was
    greedy (0: no distribution to match) or unknown."""
    return float(temperature) if temperature else 1.0


@dataclass
class BatchStats:
    """What building an iteration's samples did (logged as `batch_<field>`)."""

    samples: int = 0
    trained_tokens: int = 0
    merged_steps: int = 0
    cut: int = 0
    """Samples longer than `max_seq_len`, kept cut to it."""
    too_long: int = 0
    """Samples whose completion the cut left nothing of: left out, and counted here."""
    untrainable_steps: int = 0
    continuing: dict[str, list[int]] = field(default_factory=dict)
    """Front end (a step's `info['source']`) -> [later steps whose prompt continues the step
    before's prompt and completion token for token, later steps]: where merging can apply."""

    def metrics(self) -> dict[str, float]:
        """`batch_<field>` for the counts, and `merge_share/<front end>` for `continuing`."""
        counts = {f"batch_{k}": v for k, v in vars(self).items() if k != "continuing"}
        return counts | {f"merge_share/{source}": c / n for source, (c, n) in self.continuing.items() if n}


def cut_to(sample: Sample, max_len: int, stats: BatchStats) -> bool:
    """Cut a sample longer than `max_len` tokens to that length (counted in `stats`); returns
    whether anything is left to train on."""
    if len(sample.input_ids) <= max_len:
        return True
    keep = [p for p in sample.value_positions if p < max_len - 1]
    sample.returns = sample.returns[:len(keep)]
    sample.value_positions = keep
    for name in ("input_ids", "loss_mask", "sampler_logprobs", "advantages"):
        setattr(sample, name, getattr(sample, name)[:max_len])
    sample.spans = [(min(a, max_len), min(b, max_len)) for a, b in sample.spans]
    sample.cut = True
    if sum(sample.loss_mask) == 0:
        stats.too_long += 1
        return False
    stats.cut += 1
    return True


def token_row(advantage, n_tokens: int) -> list[float]:
    """One step's advantage as a value per completion token: a scalar (a number or a 0-d tensor)
    on every token, or one value per token as given."""
    if isinstance(advantage, (int, float)) or (torch.is_tensor(advantage) and advantage.dim() == 0):
        return [float(advantage)] * n_tokens
    row = [float(a) for a in advantage]
    if len(row) != n_tokens:
        raise InvalidArgument(f"advantages: {len(row)} for a step of {n_tokens} completion tokens")
    return row


def build_samples(trajectories: Sequence[Trajectory], advantages: Sequence[Sequence | torch.Tensor], max_len: int,
                  merge: bool = False, step_returns: Sequence[torch.Tensor] | None = None
                  ) -> tuple[list[Sample], BatchStats]:
    """trajectories[i] has S_i steps; `advantages[i][t]` is step t's advantage, one value for every
    token or one per completion token (`advantages.all_token_advantages`); step_returns[i] is [S_i].
    A guide trajectory's samples are marked 'guide'."""
    samples: list[Sample] = []
    stats = BatchStats()
    for i, traj in enumerate(trajectories):
        current: Sample | None = None
        count_continuing(traj, stats.continuing)
        for s, step in enumerate(traj.transitions):
            if not step.has_tokens or len(step.completion_logprobs) != len(step.completion_token_ids):
                stats.untrainable_steps += 1
                current = None
                continue
            adv = token_row(advantages[i][s], len(step.completion_token_ids))
            ret = float(step_returns[i][s]) if step_returns is not None else 0.0
            prompt, completion = step.prompt_token_ids, step.completion_token_ids
            temperature = scoring_temperature(step.temperature)
            term = "guide" if traj.behaviour == "guide" else "policy"
            if (merge and current is not None and current.temperature == temperature
                    and prompt[:len(current.input_ids)] == current.input_ids):
                gap = prompt[len(current.input_ids):]
                current.value_positions.append(len(current.input_ids) + len(gap) - 1)
                start = len(current.input_ids) + len(gap)
                current.spans.append((start, start + len(completion)))
                current.input_ids += gap + completion
                current.loss_mask += [0] * len(gap) + [1] * len(completion)
                current.sampler_logprobs += [0.0] * len(gap) + list(step.completion_logprobs)
                current.advantages += [0.0] * len(gap) + adv
                current.returns.append(ret)
                current.steps.append((traj.id, s))
                current.calls += 1
                stats.merged_steps += 1
                continue
            current = Sample(input_ids=list(prompt) + list(completion),
                             loss_mask=[0] * len(prompt) + [1] * len(completion),
                             sampler_logprobs=[0.0] * len(prompt) + list(step.completion_logprobs),
                             advantages=[0.0] * len(prompt) + adv,
                             value_positions=[len(prompt) - 1], returns=[ret], steps=[(traj.id, s)],
                             spans=[(len(prompt), len(prompt) + len(completion))], temperature=temperature,
                             loss_term=term)
            samples.append(current)
    kept = [sample for sample in samples if cut_to(sample, max_len, stats)]
    stats.samples = len(kept)
    stats.trained_tokens = sum(sum(s.loss_mask) for s in kept)
    return kept, stats


def count_continuing(traj: Trajectory, counts: dict[str, list[int]]) -> None:
    """Add the trajectory's later steps to `counts` (`BatchStats.continuing`), by front end."""
    steps = traj.transitions
    for before, step in zip(steps, steps[1:]):
        if before.has_tokens and step.has_tokens:
            seen = before.prompt_token_ids + before.completion_token_ids
            c = counts.setdefault(str(step.info.get("source", "unknown")), [0, 0])
            c[0] += step.prompt_token_ids[:len(seen)] == seen
            c[1] += 1


def trained_tokens_per_step(samples: Sequence[Sample]) -> dict[tuple[str, int], int]:
    """(trajectory id, step) -> completion tokens the loss trains on, after merging and the
    length cut (each step's span of the sample, as cut)."""
    return {step: sum(sample.loss_mask[a:b]) for sample in samples for step, (a, b) in zip(sample.steps, sample.spans)}


def collate(samples: Sequence[Sample], pad_id: int, device: str | None = None) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, attention_mask, loss_mask, sampler_logprobs (recorded by
    the policy that sampled), advantages, guide_mask and relabel_mask (1 on the tokens of samples
    of that `loss_term`) [B, T], and trainer_logprobs [B, T] when every sample has them;
    temperature [B]; value_positions, returns, value_mask [B, S_max]; on `device` (None: the CPU)."""
    B = len(samples)
    T = max(len(s.input_ids) for s in samples)
    S = max(max(len(s.value_positions) for s in samples), 1)
    out = {
        "input_ids": torch.full((B, T), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((B, T), dtype=torch.long),
        "loss_mask": torch.zeros((B, T), dtype=torch.float32),
        "sampler_logprobs": torch.zeros((B, T), dtype=torch.float32),
        "advantages": torch.zeros((B, T), dtype=torch.float32),
        "value_positions": torch.zeros((B, S), dtype=torch.long),
        "returns": torch.zeros((B, S), dtype=torch.float32),
        "value_mask": torch.zeros((B, S), dtype=torch.float32),
        "temperature": torch.tensor([s.temperature for s in samples], dtype=torch.float32),
        "guide_mask": torch.zeros((B, T), dtype=torch.float32),
        "relabel_mask": torch.zeros((B, T), dtype=torch.float32),
    }
    if all(s.trainer_logprobs is not None for s in samples):
        out["trainer_logprobs"] = torch.zeros((B, T), dtype=torch.float32)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        out["input_ids"][b, :n] = torch.tensor(s.input_ids)
        out["attention_mask"][b, :n] = 1
        out["loss_mask"][b, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        out["sampler_logprobs"][b, :n] = torch.tensor(s.sampler_logprobs)
        if "trainer_logprobs" in out:
            out["trainer_logprobs"][b, :n] = torch.tensor(s.trainer_logprobs)
        out["advantages"][b, :n] = torch.tensor(s.advantages)
        if s.loss_term != "policy":
            out[f"{s.loss_term}_mask"][b, :n] = 1.0
        k = len(s.value_positions)
        if k:
            out["value_positions"][b, :k] = torch.tensor(s.value_positions)
            out["returns"][b, :k] = torch.tensor(s.returns)
            out["value_mask"][b, :k] = 1
    return out if device is None else {k: v.to(device) for k, v in out.items()}

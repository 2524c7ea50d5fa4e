"""One GRPO job of the distributed tests, run alone, or on every rank by torchrun or Ray Train:
the synthetic tool-choice task (training_task.py), the same settings whatever the world size,
so the adapters each run publishes can be compared tensor by tensor."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forge_bridge as fb  # noqa: E402
from forge_bridge.trainer import distributed  # noqa: E402

import training_task  # noqa: E402


def run(model: str, out: str, strategy: str | None = None, iterations: int = 2, microbatch: int | None = None,
        kill_at: int | None = None, resume: bool = False, staleness: int = 0) -> list[dict]:
    """`iterations` of GRPO; `kill_at`: rank 1 SIGKILLs itself as that update (1-based) starts."""
    config = fb.GRPOConfig(group_size=4, lr=1e-3, kl_beta=0.05, minibatch_size=8, microbatch_size=microbatch,
                           lora_rank=8, lora_alpha=16, bf16=False, concurrency=1, progress=False, seed=0,
                           out_dir=out, run_name="dist", max_staleness=staleness,
                           merge_steps=False,  # a sample per call: the uneven split's 8 samples
                           distributed=fb.Distributed(strategy=strategy) if strategy else None)
    policy = fb.LocalPolicy(model, device="cpu") if distributed.leader() else None
    trainer = fb.GRPOTrainer(policy, config, model=model)
    if kill_at is not None and trainer.follower:
        follow, calls = trainer.follow_update, []

        def dying(*args):
            calls.append(1)
            if len(calls) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return follow(*args)
        trainer.follow_update = dying
    rollout = training_task.make_rollout(training_task.agent_for(policy)) if policy is not None else None
    try:
        return trainer.train(rollout, training_task.TASKS, iterations, resume=resume)
    finally:
        trainer.close()
        if policy is not None:
            policy.close()


def ray_loop(settings: dict) -> None:
    """Ray Train's `train_loop_per_worker`: the process group is Ray's."""
    run(**settings)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default=None)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--microbatch", type=int, default=None)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--staleness", type=int, default=0)
    a = p.parse_args()
    run(a.model, a.out, a.strategy, a.iterations, a.microbatch, a.kill_at, a.resume, a.staleness)

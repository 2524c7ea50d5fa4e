"""Each rollout samples from its own seed, so a rerun gives the same rollouts whatever the
thread timing (which calls of concurrent agents shared a batch)."""

import forge_bridge as fb
from forge_bridge.core.episode import derive_seed
from forge_bridge.core.recording import Limits, call_policy
from forge_bridge.policies import models


class SeenSampling(fb.Policy):
    """Answers 'ok' and keeps the sampling arguments of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def generate(self, messages, tools, sampling, adapter):
        self.calls.append({"seed": sampling.seed})
        return fb.PolicyOutput(fb.Action(content="ok"), [1, 2], [3], completion_logprobs=[0.0], version=adapter)

    def load_version(self, path, version):
        pass

    def unload_version(self, version):
        pass


def test_an_episode_seed_gives_each_call_its_own_seed_and_a_callers_seed_wins(tmp_path):
    policy, recorder = SeenSampling(), fb.Recorder(tmp_path / "t.db")
    messages = [{"role": "user", "content": "hi"}]
    with fb.episode("t", recorder=recorder, seed=7) as ep:
        for sampling in ({}, {"temperature": 1.0}, {"seed": 123}):
            call_policy(policy, ep, messages, None, source="test", limits=Limits(), sampling=sampling)
    with fb.episode("t", recorder=recorder) as unseeded:
        call_policy(policy, unseeded, messages, None, source="test", limits=Limits())
    seeds = [c.get("seed") for c in policy.calls]
    assert seeds == [derive_seed(7, "step", 0), derive_seed(7, "step", 1), 123, None]
    assert seeds[0] != seeds[1] and all(0 <= s < 2**31 for s in seeds[:3])
    assert recorder.store.get(ep.id).metadata["seed"] == 7
    # a crew role's calls draw from a seed of their own, not the parent's
    with fb.episode("t", recorder=recorder, seed=7) as parent:
        role = parent.child("writer")
        call_policy(policy, role, messages, None, source="test", limits=Limits())
    assert policy.calls[-1]["seed"] == derive_seed(derive_seed(7, "role", "writer"), "step", 0)


def _rollouts(policy, tmp_path, name: str, concurrency: int, seed: int) -> dict:
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=3, concurrency=concurrency, seed=seed,
                                                   out_dir=str(tmp_path / name), progress=False))

    def rollout(task) -> float:
        ep = fb.current_episode()
        messages = [{"role": "user", "content": task["prompt"]}]
        for _ in range(2):  # two sampled calls, the second on a longer prompt
            out = call_policy(policy, ep, messages, None, source="test", limits=Limits(),
                              sampling={"temperature": 1.0, "max_tokens": 6})
            messages = messages + [{"role": "assistant", "content": out.action.content or "."},
                                   {"role": "user", "content": "and then?"}]
        return float(len(out.completion_token_ids) % 2)

    tasks = [(f"t{i}", {"prompt": "word " * (1 + 3 * i)}) for i in range(4)]  # unequal lengths
    groups, _ = trainer.collect(rollout, tasks, 0)
    return {(g.task_id, k): [s.completion_token_ids for s in traj.transitions]
            for g in groups for k, traj in enumerate(g.trajectories)}


def test_rollouts_are_the_same_whatever_shares_their_batch(tmp_path):
    # fp32: batch composition then moves logits by ~1e-6, far below what flips a sampled token
    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")), dtype="float32", max_batch=8)
    alone = _rollouts(policy, tmp_path, "alone", concurrency=1, seed=3)
    together = _rollouts(policy, tmp_path, "together", concurrency=12, seed=3)
    other_seed = _rollouts(policy, tmp_path, "other", concurrency=12, seed=4)
    policy.close()
    assert len(alone) == 12
    assert together == alone
    assert other_seed != alone
    # the rollouts of one task differ from each other: each has its own seed
    assert len({str(alone[("t0", k)]) for k in range(3)}) > 1

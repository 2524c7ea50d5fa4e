"""GRPO and PPO on a real tiny model through a real LangChain agent: they learn, only the LoRA
(and value head) moves, and each new adapter serves the live agent's next call."""

import pytest
import torch

import forge_bridge as fb
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.trainer.sft import SFTConfig, sft

import training_task


@pytest.fixture(scope="module")
def choice_model_dir(tmp_path_factory):
    return training_task.choice_model(tmp_path_factory.mktemp("choice") / "model")


SOUND = {"grpo": -0.10, "ppo": -0.40}
"""The least gain a seed's run may show: mean - 4 std over 20 seeds, rounded down (bench/margins.py)."""


def success_rate(rollout, n: int = 96) -> float:
    # One at a time: with the seeds fixed, the run is then the same on every machine.
    return sum(rollout(training_task.TASKS[0]) for _ in range(n)) / n


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_rl_moves_only_the_lora_and_the_success_rate_within_its_measured_spread(algo, choice_model_dir, tmp_path,
                                                                              learning):
    torch.manual_seed(learning.seed)
    policy = fb.LocalPolicy(choice_model_dir)
    agent = training_task.agent_for(policy)  # built once; every new adapter serves it in place
    rollout = training_task.make_rollout(agent)
    before = success_rate(rollout)
    # GRPO's lr was chosen over seeds 0-2 (after-training success 0.72 / 0.83 / 0.76); at 3e-3,
    # with anchor credit's larger advantage on the deciding step, seed 0 fell to 0.42.
    common = dict(group_size=8, lr=1e-3 if algo == "grpo" else 2e-3, epochs=2, lora_rank=8,
                  lora_alpha=16, out_dir=str(tmp_path / "run"), run_name=algo, progress=False,
                  seed=learning.seed, concurrency=1)
    trainer = (fb.GRPOTrainer(policy, fb.GRPOConfig(**common)) if algo == "grpo"
               else fb.PPOTrainer(policy, fb.PPOConfig(**common)))
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    value_before = [p.detach().clone() for m in trainer.learner.heads.values() for p in m.parameters()]
    history = trainer.train(rollout, training_task.TASKS, iterations=12)
    after = success_rate(rollout)
    print(f"{algo}: success {before:.2f} -> {after:.2f}; rewards per iteration "
          f"{[round(h['reward_mean'], 2) for h in history]}")
    # The gain over 20 seeds (bench/margins.py, docs/experiments/margins.md): GRPO +0.10 to +0.41
    # (0.27 ± 0.09), PPO -0.28 to +0.47 (0.27 ± 0.16). A threshold 4 standard deviations below
    # the mean is all a test can hold without failing by chance, and it is below 0: this asserts
    # the run stays within that spread; whether RL learns is measured with seeds, not asserted here.
    least = SOUND[algo]
    learning.note(before, after, least)
    assert after >= before + least, (before, after)
    for n, p in trainer.model.named_parameters():
        if "lora_" in n:
            continue
        assert torch.equal(p, base_before[n]), f"base weight {n} moved"
    assert any(not torch.equal(p, lora_before[n]) for n, p in trainer.model.named_parameters() if "lora_" in n)
    if algo == "ppo":
        assert any(not torch.equal(p, v) for p, v in zip(
            (p for m in trainer.learner.heads.values() for p in m.parameters()), value_before))
        assert all(h["grad_norm_value_head"] > 0 and h["grad_norm"] > 0 for h in history)  # clipped each on its own
        assert all(-0.5 < h["value_mean"] < 1.5 for h in history), [h["value_mean"] for h in history]  # rewards in [0, 1]
    # The metrics, the run folder and the live policy agree.
    assert [h["iteration"] for h in history] == list(range(1, 13))
    assert policy.current() == f"{algo}-v12"
    assert (tmp_path / "run" / "adapters" / f"{algo}-v12" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 12
    assert list((tmp_path / "run" / "tb").iterdir())
    for key in ("reward_mean", "reward_std", "success_rate", "kl", "clip_fraction", "entropy",
                "tokens_per_s", "time_rollout_s", "time_update_s"):
        assert key in history[0], key


def test_new_adapter_serves_the_next_call_of_running_langchain_and_crewai_agents(taught_model_dir, tmp_path):
    from forge_bridge.adapters.crewai import ForgeLLM

    import crew_demos

    policy = fb.LocalPolicy(str(taught_model_dir))  # knows the test crew's prompts
    agent = training_task.agent_for(policy)
    crew = crew_demos.calculator_crew(ForgeLLM(policy, temperature=0, max_tokens=48))  # built before training
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, out_dir=str(tmp_path / "run"),
                                                   run_name="swap", progress=False))
    trainer.train(training_task.make_rollout(agent), training_task.TASKS, iterations=1)
    recorder = fb.Recorder(TrajectoryStore(tmp_path / "after.db"))
    with fb.episode("lc", recorder=recorder) as lc_ep:
        agent.invoke({"messages": [{"role": "user", "content": training_task.QUESTION}]})
    with fb.episode("crew", recorder=recorder) as crew_ep:
        crew.kickoff()
    assert recorder.store.get(lc_ep.id).versions == {"swap-v1"}
    (role,) = crew_ep.children.values()
    assert recorder.store.get(role.id).versions == {"swap-v1"}


def test_sft_warm_start_fits_demonstrations(choice_model_dir, tmp_path, learning):
    # seeded: the success before SFT is otherwise sampled from whatever state earlier tests left
    # (0.41-0.51 over seeds 0-2; after 16 epochs 0.96 on each, after 8 only 0.59-0.67)
    torch.manual_seed(learning.seed)
    from forge_bridge.policies import models
    from forge_bridge.policies.scripted import ScriptedPolicy

    tokenizer = models.load(choice_model_dir)[1]
    expert = ScriptedPolicy(lambda m, t: "The answer is 5." if m[-1]["role"] == "tool" else
                            '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
                            tokenizer)
    recorder = fb.Recorder(TrajectoryStore(tmp_path / "demos.db"), run_id="demos")
    demo_agent = training_task.agent_for(expert)
    for i in range(4):
        with fb.episode(f"demo-{i}", recorder=recorder) as ep:
            demo_agent.invoke({"messages": [{"role": "user", "content": training_task.QUESTION}]})
            ep.reward(1.0)
    policy = fb.LocalPolicy(choice_model_dir)
    rollout = training_task.make_rollout(training_task.agent_for(policy))
    before = success_rate(rollout)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(lr=3e-3, out_dir=str(tmp_path / "run"),
                                                   run_name="sft", progress=False, seed=learning.seed))
    result = sft(trainer, recorder.store.trajectories(run_id="demos"), SFTConfig(epochs=16, lr=3e-3))
    after = success_rate(rollout)
    print(f"sft: success {before:.2f} -> {after:.2f}, loss {result['sft_loss_first']:.3f} -> "
          f"{result['sft_loss_last']:.3f}")
    assert result["version"] == "sft-sft" == policy.current()
    assert result["sft_loss_last"] < result["sft_loss_first"]
    # +0.32 to +0.55 over 20 seeds (0.44 ± 0.06): sound at 0.20
    learning.note(before, after, 0.2)
    assert after >= before + 0.2


def test_bad_trainer_input_is_a_clear_error(choice_model_dir, tmp_path):
    with pytest.raises(ValueError, match="gamma"):
        fb.GRPOConfig(gamma=1.5)
    with pytest.raises(ValueError, match="group_size"):
        fb.GRPOConfig(group_size=0)
    with pytest.raises(ValueError, match="lam"):
        fb.PPOConfig(lam="high")
    policy = fb.LocalPolicy(choice_model_dir)
    with pytest.raises(TypeError, match="GRPOConfig or PPOConfig"):
        fb.GRPOTrainer(policy, {"gamma": 0.9})
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, out_dir=str(tmp_path), progress=False))
    with pytest.raises(TypeError, match="rollout"):
        trainer.train("not a function", training_task.TASKS, iterations=1)
    # A reward function that returns NaN stops the run with a clear error before any training;
    # its episodes are kept, failed, with the reason (more cases: tests/faults).
    with pytest.raises(ValueError, match="must return a finite number"):
        trainer.train(lambda task: float("nan"), training_task.TASKS, iterations=1)
    failed = trainer.recorder.store.trajectories(status="failed")
    assert len(failed) == 2 and all("finite number" in t.end_detail for t in failed)
    assert trainer.iteration == 0


def test_an_iterations_prompt_tokens_are_each_prefilled_once_shared_or_reused(choice_model_dir, tmp_path):
    """Every prompt token of an iteration's calls is fed through the model, copied from a call
    beside it with the same prompt (the group's rollouts start together), or covered by a
    finished call's KV; the metrics count each, and the group's first prompt is fed once."""
    # a long wait gathers the group's first calls into one prefill, however busy the machine
    policy = fb.LocalPolicy(choice_model_dir, batch_wait_s=3.0)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, concurrency=4, out_dir=str(tmp_path / "run"),
                                                   run_name="prefill", progress=False))
    (metrics,) = trainer.train(training_task.make_rollout(training_task.agent_for(policy)), training_task.TASKS,
                               iterations=1)
    steps = [s for t in trainer.recorder.store.trajectories(run_id=trainer.run_id) for s in t.transitions]
    fed, shared, reused = (metrics[k] for k in ("prefill_tokens", "prefill_shared_tokens", "prefill_reused_tokens"))
    assert fed + shared + reused == sum(len(s.prompt_token_ids) for s in steps)
    first = len(steps[0].prompt_token_ids)  # every rollout's first call asks the same
    assert shared >= first, (fed, shared, reused, first)  # at least one copy (all three, when they arrive together)
    # where the time went: the rates and their share of the machine's measured matmul rate
    assert metrics["matmul_gflops"] > 0 and metrics["decode_tokens"] > 0
    assert metrics["prefill_tokens_per_s"] > 0 and metrics["decode_tokens_per_s"] > 0
    assert metrics["decode_share_of_limit"] > 0 and metrics["prefill_share_of_limit"] > 0
    trainer.close()
    policy.close()

"""The signal probe: per task kind, the success rate and the share of groups with no reward
spread, with advice where GRPO has nothing to compare; the per-iteration summary line says the
same, and an iteration with no signal at all says so."""

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.trainer.probe import probe
from forge_bridge.trainer.run import no_signal, summary_line

import training_task


def rollout_for(policy):
    """'never' always fails, 'always' always passes, 'coin' passes on what the model sampled."""
    agent = training_task.agent_for(policy)  # recorded through the agent's middleware

    def rollout(task):
        result = agent.invoke({"messages": [{"role": "user", "content": training_task.QUESTION}]})
        passed = float("5" in str(result["messages"][-1].content))
        return {"never": 0.0, "always": 1.0}.get(task.get("kind"), passed)
    return rollout


TASKS = [{"id": "n1", "kind": "never"}, {"id": "n2", "kind": "never"}, {"id": "a1", "kind": "always"},
         {"id": "c1", "kind": "coin"}]


def test_the_probe_reports_each_kind_and_advises_where_there_is_no_signal(taught_model_dir, tmp_path):
    policy = fb.LocalPolicy(str(taught_model_dir))
    recorder = fb.Recorder(fb.TrajectoryStore(tmp_path / "probe.db"))
    try:
        report = probe(rollout_for(policy), TASKS, recorder=recorder, run_id="p", group_size=8, progress=False)
    finally:
        policy.close()
    never, always, coin = (report.kinds[k] for k in ("never", "always", "coin"))
    assert (never.rollouts, never.successes, never.groups, never.uniform_groups) == (16, 0, 2, 2)
    assert (always.rollouts, always.successes, always.groups, always.uniform_groups) == (8, 8, 1, 1)
    assert coin.rollouts == 8 and coin.groups == 1 and coin.uniform_groups == int(coin.successes in (0, 8))
    assert report.zero_signal_share == pytest.approx((3 + coin.uniform_groups) / 4)
    text = str(report)
    assert ("the kind 'never' succeeded in 0 of 16 rollouts: GRPO has nothing to compare there; add "
            "demonstrations of it (fb.sft) or a teacher (docs/own-agent.md#no-signal)") in text
    assert "the kind 'always' succeeded in every one of its 8 rollouts" in text
    assert recorder.store.count(run_id="p") == 32  # recorded like training, under its own run id
    metrics = report.metrics()
    assert metrics["probe/success/never"] == 0.0 and metrics["probe/success/always"] == 1.0


def test_a_task_without_a_kind_is_a_clear_error_or_counted_as_all(taught_model_dir, tmp_path):
    policy = fb.LocalPolicy(str(taught_model_dir))
    recorder = fb.Recorder(fb.TrajectoryStore(tmp_path / "probe.db"))
    try:
        with pytest.raises(InvalidArgument, match=r"task 'x' has no 'kind' .*kind_key="):
            probe(rollout_for(policy), TASKS + [{"id": "x"}], recorder=recorder, progress=False)
        assert recorder.store.count() == 0  # every task is checked before any rollout
        with pytest.raises(InvalidArgument, match="at least one task"):
            probe(rollout_for(policy), [], recorder=recorder)
        report = probe(rollout_for(policy), [{"id": "x", "kind": "coin"}, {"id": "y"}], recorder=recorder,
                       group_size=2, require_kind=False, progress=False)
        assert set(report.kinds) == {"coin", "all"}
        greedy = probe(rollout_for(policy), [{"id": "x", "level": "hard"}], recorder=recorder, kind_key="level",
                       greedy=True, progress=False)
        assert greedy.kinds["hard"].rollouts == 1 and "probe/zero_signal_share" not in greedy.metrics()
    finally:
        policy.close()


def test_the_summary_line_gives_success_per_kind_and_warns_when_nothing_had_signal():
    line = summary_line({"iteration": 3, "reward_mean": 0.5, "success_rate": 0.5, "success/rate": 1.0,
                         "success/convert": 0.0, "zero_signal_share": 0.5})
    assert line == "iteration 3: reward 0.50; success 50% (rate 100%, convert 0%); no-spread groups 50%"
    calls = summary_line({"iteration": 2, "reward_mean": 1.0, "success_rate": 1.0, "calls/fenced_json": 0.75,
                          "calls/malformed": 0.25})
    assert calls == "iteration 2: reward 1.00; success 100%; calls read as fenced_json 75%, malformed 25%"
    silent = {"iteration": 1, "reward_mean": 0.0, "success_rate": 0.0, "zero_signal_share": 1.0}
    assert "\n" not in summary_line(silent)  # the warning goes through logging (`no_signal`), progress bars or not
    assert no_signal(silent).startswith("iteration 1: no group had any reward spread")
    assert no_signal({"iteration": 2, "zero_signal_share": 0.5}) is None
    assert no_signal({"iteration": 3, "a/zero_signal_share": 1.0, "b/zero_signal_share": 0.5}) is None


def test_grpo_counts_only_groups_with_signal_as_trained(taught_model_dir, tmp_path):
    policy = fb.LocalPolicy(str(taught_model_dir))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, out_dir=str(tmp_path / "run"), progress=False,
                                                   seed=0))
    try:
        (metrics,) = trainer.train(rollout_for(policy), [{"id": "n", "kind": "never"}, {"id": "a", "kind": "always"}],
                                   iterations=1)
    finally:
        trainer.close()
    assert metrics["groups_trained"] == 0 and metrics["groups_uniform"] == 2 and metrics["zero_signal_share"] == 1.0
    assert metrics["success/never"] == 0.0 and metrics["success/always"] == 1.0

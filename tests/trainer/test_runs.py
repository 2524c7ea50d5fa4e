"""Training runs never mix: a second run in a folder is refused unless it resumes the first; a
resumed iteration trains on exactly `group_size` fresh rollouts per task, the interrupted ones
kept and marked; a model that loops until the framework's own limit is trained on as truncated
with reward 0, not skipped as a crash."""

import json

import pytest

import forge_bridge as fb
from forge_bridge.app import testing
from forge_bridge.core.errors import RunExistsError
from forge_bridge.core.runs import set_aside
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.trainer.config import GRPOConfig
from forge_bridge.trainer.grpo import GRPOTrainer
from forge_bridge.trainer.rollouts import tasks_for

import crew_demos
import training_task


def spy_on_groups(trainer) -> list[dict]:
    seen: list[dict] = []
    prepare = trainer.prepare

    def spying(groups):
        seen.append({(g.group_id, g.role): sorted(t.id for t in g.trajectories) for g in groups})
        return prepare(groups)

    trainer.prepare = spying
    return seen


def test_a_second_run_in_a_folder_is_refused_or_resumed_and_never_mixed(tmp_path):
    model = training_task.choice_model(tmp_path / "model")
    config = GRPOConfig(group_size=2, lr=1e-3, out_dir=str(tmp_path / "run"), progress=False)
    policy = fb.LocalPolicy(model)
    rollout = training_task.make_rollout(training_task.agent_for(policy))

    first = GRPOTrainer(policy, config)
    first.train(rollout, training_task.TASKS, iterations=1)
    # iteration 2 starts, records its rollouts, and the process dies before its checkpoint
    first.collect(rollout, tasks_for(1, training_task.TASKS, None, config.seed), 1)
    store = first.recorder.store
    assert store.count() == 4

    second = GRPOTrainer(policy, config)
    assert second.run_id == first.run_id
    with pytest.raises(RunExistsError, match=r"resume=True.*--new"):
        second.train(rollout, training_task.TASKS, iterations=2)
    assert store.count() == 4  # nothing was recorded or trained

    third = GRPOTrainer(policy, config)
    seen = spy_on_groups(third)
    third.train(rollout, training_task.TASKS, iterations=2, resume=True)
    (groups,) = seen  # only iteration 2 ran
    (trained,) = groups.values()
    assert len(trained) == config.group_size  # exactly group_size fresh rollouts
    interrupted = [t for t in store.iter(run_id=first.run_id) if t.excluded]
    assert len(interrupted) == 2 and not {t.id for t in interrupted} & set(trained)
    assert all("interrupted" in t.excluded and t.metadata["iteration"] == 2 for t in interrupted)
    assert {t.run_id for t in store.iter()} == {first.run_id} and store.count() == 6
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["run_id"], m["iteration"]) for m in metrics] == [(first.run_id, 1), (first.run_id, 2)]

    # forge-bridge train --new: the old run is set aside whole, the new one starts clean
    earlier = set_aside(tmp_path / "run")
    assert TrajectoryStore(earlier / "trajectories.db").count() == 6
    fresh = GRPOTrainer(fb.LocalPolicy(model), config)
    assert fresh.run_id != first.run_id
    fresh.train(training_task.make_rollout(training_task.agent_for(fresh.policy)), training_task.TASKS,
                iterations=1)
    assert {t.run_id for t in fresh.recorder.store.iter()} == {fresh.run_id}
    assert fresh.recorder.store.count() == 2


def loops(messages, tools) -> str:
    return testing.CALL  # calls add for ever


def langchain_rollout(policy):
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from forge_bridge.adapters.langchain import ForgeMiddleware

    agent = create_agent(FakeListChatModel(responses=["unused"]), [training_task.add],
                         middleware=[ForgeMiddleware(policy, max_model_calls=None)])

    def rollout(task) -> float:  # LangGraph's recursion limit ends the loop with an exception
        result = agent.invoke({"messages": [{"role": "user", "content": training_task.QUESTION}]},
                              {"recursion_limit": 7})
        return 1.0 if "5" in str(result["messages"][-1].content) else 0.0
    return rollout


def crewai_rollout(policy):
    from forge_bridge.adapters.crewai import ForgeLLM

    llm = ForgeLLM(policy, max_model_calls=None)

    def rollout(task) -> float:  # CrewAI's max_iter ends the loop with a forced last call
        return 1.0 if crew_demos.calculator_crew(llm, max_iter=2).kickoff().raw == "5" else 0.0
    return rollout


@pytest.mark.parametrize("make_rollout", [langchain_rollout, crewai_rollout], ids=["langchain", "crewai"])
def test_a_model_looping_until_the_framework_limit_is_trained_on_as_truncated(make_rollout, taught_model_dir,
                                                                             tmp_path):
    tokenizer = models.load(str(taught_model_dir))[1]
    policy = ScriptedPolicy(loops, tokenizer)
    trainer = GRPOTrainer(policy, GRPOConfig(group_size=2, out_dir=str(tmp_path / "run"), progress=False,
                                             skip_uniform_groups=False), model=str(taught_model_dir))
    groups, stats = trainer.collect(make_rollout(policy), [("loop", {"id": "loop"})], 0)
    (group,) = groups
    assert len(group) == 2 and group.role == (None if make_rollout is langchain_rollout else "calculator") and stats["episodes_crashed"] == 0 and stats["episodes_truncated"] == 2
    for traj in group.trajectories:
        assert traj.end_reason == "truncated" and traj.reward == 0.0 and len(traj) >= 2
        assert traj.transitions[-1].truncated
    samples, batch_stats, _ = trainer.prepare(groups)
    # every step is trained: a sequence of its own, or merged into the one before
    assert sum(s.calls for s in samples) == batch_stats.samples + batch_stats.merged_steps == sum(
        len(t) for t in group.trajectories) and batch_stats.untrainable_steps == 0

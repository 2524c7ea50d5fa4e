"""The demo's task suite: exact answers, disjoint splits, and an expert that solves it all
through the same LangChain agent the demo trains."""

import re

import forge_bridge as fb
from forge_bridge.app.demo import build_agent, rates, run_tasks
from forge_bridge.app.tasks import CITIES, check_answer, expert_reply, held_out_tasks, make_splits
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy


def test_splits_are_fixed_and_held_out_cities_are_unseen():
    train, held_out = make_splits(seed=0)
    assert (train, held_out) == make_splits(seed=0)
    assert len(train) == 72 and len(held_out) == 30
    city = re.compile(r"population of (.+)\?")
    seen = {city.search(t.question).group(1) for t in train if city.search(t.question)}
    unseen = {city.search(t.question).group(1) for t in held_out if city.search(t.question)}
    assert seen and unseen and not seen & unseen and seen | unseen <= set(CITIES)
    assert {t.kind for t in held_out} == {"multiply", "lookup", "lookup_multiply"}


def test_the_held_out_tasks_name_cities_no_training_or_validation_task_names():
    train, validation = make_splits(seed=0)
    held_out = held_out_tasks(seed=0)
    assert held_out == held_out_tasks(seed=0) and held_out != held_out_tasks(seed=1)
    assert len(held_out) == 30 and {t.kind for t in held_out} == {"multiply", "lookup", "lookup_multiply"}
    city = re.compile(r"population of (.+)\?")
    named = [{city.search(t.question).group(1) for t in tasks if city.search(t.question)}
             for tasks in (train, validation, held_out)]
    assert named[2] and not named[2] & (named[0] | named[1]) and named[2] <= set(CITIES)
    # every held-out city is asked about in the two-step kind too, not only in plain lookups
    assert len({city.search(t.question).group(1) for t in held_out if t.kind == "lookup_multiply"}) == 7
    assert not {t.id for t in held_out} & {t.id for t in train + validation}
    assert all(check_answer(t, str(t.answer)) for t in held_out)


def test_check_answer_is_exact():
    (task,) = [t for t in make_splits()[1] if t.kind == "multiply"][:1]
    assert check_answer(task, f"The answer is {task.answer:,}.")
    assert check_answer(task, f"{task.answer}")
    assert not check_answer(task, f"The answer is {task.answer + 1}.")
    assert not check_answer(task, "I do not know.")


def test_the_scripted_expert_solves_every_task_through_the_agent(tmp_path):
    tokenizer = models.tiny_tokenizer()
    agent = build_agent(ScriptedPolicy(expert_reply, tokenizer), 0.0, 64)
    train, held_out = make_splits(train_per_kind=3, eval_per_kind=3)
    recorder = fb.Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="expert")
    passed = run_tasks(agent, held_out, recorder, greedy=True, concurrency=4, desc="x", progress=False)
    assert rates(held_out, passed) == {"all": 1.0, "multiply": 1.0, "lookup": 1.0, "lookup_multiply": 1.0}
    two_step = [t for t in recorder.store.trajectories() if t.metadata["kind"] == "lookup_multiply"]
    assert all([len(t) for t in two_step]) and all(len(t) == 3 for t in two_step)
    assert [c.name for s in two_step[0] for c in s.action.tool_calls] == ["lookup", "multiply"]


def test_the_three_call_kind_is_solved_by_two_lookups_and_an_add(tmp_path):
    from forge_bridge.app.tasks import ALL_KINDS

    agent = build_agent(ScriptedPolicy(expert_reply, models.tiny_tokenizer()), 0.0, 64, with_add=True)
    train, held_out = make_splits(train_per_kind=2, eval_per_kind=2, kinds=ALL_KINDS)
    assert (train[:6], held_out[:6]) == make_splits(train_per_kind=2, eval_per_kind=2)  # the demo's suite unchanged
    tasks = [t for t in held_out if t.kind == "lookup_add"]
    recorder = fb.Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="expert")
    assert run_tasks(agent, tasks, recorder, greedy=True, concurrency=2, desc="x", progress=False,
                     max_model_calls=6) == [True, True]
    for traj in recorder.store.trajectories():
        assert [c.name for s in traj for c in s.action.tool_calls] == ["lookup", "lookup", "add"]

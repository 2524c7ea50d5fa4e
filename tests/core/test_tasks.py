"""The demo's task suite: exact answers, disjoint splits, and an expert that solves it all
through the same LangChain agent the demo trains."""

import re

import forge_bridge as fb
from forge_bridge.app.demo import build_agent, run_tasks
from forge_bridge.app.report import rates
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


def test_the_agents_instructions_reach_every_model_call(tmp_path):
    seen = []

    def expert(messages, tools):
        seen.append(messages[0])
        return expert_reply(messages, tools)

    agent = build_agent(ScriptedPolicy(expert, models.tiny_tokenizer()), 0.0, 64, system_prompt="Look it up first.")
    tasks = [t for t in make_splits(train_per_kind=1, eval_per_kind=1)[1] if t.kind == "lookup_multiply"]
    recorder = fb.Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="expert")
    assert run_tasks(agent, tasks, recorder, greedy=True, concurrency=1, desc="x", progress=False) == [True]
    assert seen == [{"role": "system", "content": "Look it up first."}] * 3  # lookup, multiply, answer


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


def test_bridge_kinds_are_demonstrated_on_training_cities_and_leave_the_splits_as_they_were(tmp_path):
    import hashlib

    import pytest

    from forge_bridge.app.tasks import ALL_KINDS, BRIDGE_KINDS, bridge_tasks
    from forge_bridge.core.errors import InvalidArgument

    def fingerprint(tasks):
        return hashlib.sha256("\n".join(f"{t.id}|{t.kind}|{t.question}|{t.answer}" for t in tasks).encode()).hexdigest()[:16]

    # the splits of seed 0 as they were before the bridge kinds existed (computed at commit 01dafdc)
    train, validation = make_splits(seed=0)
    assert [fingerprint(train), fingerprint(validation), fingerprint(held_out_tasks(seed=0)),
            fingerprint(sum(make_splits(seed=2, kinds=ALL_KINDS), []))] == [
        "713b059ffdde0408", "53340368a055a999", "2e35a847857cf124", "e846c12d88f8b8a7"]
    assert not set(BRIDGE_KINDS) & set(ALL_KINDS)  # bench/credit.py's suite is ALL_KINDS
    tasks = [t for kind in BRIDGE_KINDS for t in bridge_tasks(kind, 3, seed=1)]
    assert tasks == [t for kind in BRIDGE_KINDS for t in bridge_tasks(kind, 3, seed=1)]
    train_cities = {re.search(r"population of (.+)\?", t.question).group(1) for t in make_splits(seed=1)[0]
                    if t.kind == "lookup"}
    named = {c for t in tasks for c in CITIES if c in t.question}
    assert named and named <= train_cities
    with pytest.raises(InvalidArgument, match="lookup_multiply"):
        bridge_tasks("lookup_multiply", 3)

    agent = build_agent(ScriptedPolicy(expert_reply, models.tiny_tokenizer()), 0.0, 64)
    recorder = fb.Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="expert")
    assert all(run_tasks(agent, tasks, recorder, greedy=True, concurrency=4, desc="x", progress=False))
    calls = {t.task_id: [(c.name, c.arguments) for s in t for c in s.action.tool_calls]
             for t in recorder.store.trajectories()}
    assert len(calls) == len(tasks) == 3 * len(BRIDGE_KINDS)
    for task in tasks:
        if task.kind == "multiply_chain":  # the second call takes the first's result
            a, b, c = map(int, re.findall(r"\d+", task.question))
            assert calls[task.id] == [("multiply", f'{{"a": {a}, "b": {b}}}'), ("multiply", f'{{"a": {a * b}, "b": {c}}}')]
        elif task.kind == "lookup_max":  # both cities looked up, the larger population the answer
            first, second = re.match(r"Which is larger, the population of (.+) or of (.+)\?", task.question).groups()
            assert calls[task.id] == [("lookup", f'{{"city": "{first}"}}'), ("lookup", f'{{"city": "{second}"}}')]
            assert task.answer == max(CITIES[first], CITIES[second]) != min(CITIES[first], CITIES[second])
        else:  # two tools, but the lookup's result is never an argument: the product's come from the question
            city, a, b = re.match(r"What is the population of (.+), and what is (\d+) times (\d+)\?",
                                  task.question).groups()
            assert calls[task.id] == [("lookup", f'{{"city": "{city}"}}'), ("multiply", f'{{"a": {a}, "b": {b}}}')]


def test_the_demo_demonstrates_the_kinds_named_and_only_the_first_multi_step_tasks():
    from forge_bridge.app.demo import DemoConfig, demonstration_tasks

    train, _ = make_splits(train_per_kind=6, eval_per_kind=2)
    every = demonstration_tasks(DemoConfig(train_per_kind=6, multi_step_demos=None), train)
    assert every == train
    few = demonstration_tasks(DemoConfig(train_per_kind=6, multi_step_demos=2), train)
    assert [t.id for t in few if t.kind == "lookup_multiply"] == ["lookup_multiply-0", "lookup_multiply-1"]
    assert [t for t in few if t.kind != "lookup_multiply"] == [t for t in train if t.kind != "lookup_multiply"]
    assert not [t for t in demonstration_tasks(DemoConfig(train_per_kind=6, multi_step_demos=0), train)
                if t.kind == "lookup_multiply"]
    bridged = demonstration_tasks(DemoConfig(train_per_kind=6, demonstrate=("lookup", "lookup_max")), train)
    assert [t.kind for t in bridged] == ["lookup"] * 6 + ["lookup_max"] * 6


def test_the_expert_gives_up_on_a_result_it_cannot_compute_with():
    messages = [{"role": "user", "content": "What is 3 times the population of Atlantis?"}]
    assert expert_reply(messages, None).startswith("<tool_call>")  # it looks the city up
    messages += [{"role": "assistant", "content": "..."}, {"role": "tool", "content": "unknown city: Atlantis"}]
    assert expert_reply(messages, None) == "I cannot answer that."
    assert expert_reply([{"role": "user", "content": "Hello?"}], None) == "I cannot answer that."

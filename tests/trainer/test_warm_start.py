"""The warm start in the public API: demonstrations recorded through the user's own agent from a
plan per task, imported from OpenAI-format JSONL, or read from the store; `fb.sft` publishes
'<run>-sft' (not an RL iteration) and checks itself on held-out tasks; bad input is a clear error."""

import json

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.policies import models
from forge_bridge.policies.toolcalls import parse, render_calls
from forge_bridge.trainer.probe import KindSignal, ProbeReport
from forge_bridge.trainer.sft import verdict

import training_task

PLAN = [{"tool": "add", "args": {"a": 2, "b": 3}}, "The answer is 5."]


def make_rollout(policy):
    return training_task.make_rollout(training_task.agent_for(policy))


def tasks(n=2, plan=PLAN):
    return [{"id": f"add-{i}", "kind": "add", "question": training_task.QUESTION, "demo": plan} for i in range(n)]


def rendered(tokenizer, messages, tools):
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture
def recorder(tmp_path):
    return fb.Recorder(fb.TrajectoryStore(tmp_path / "demos.db"))


def test_a_plan_per_task_is_recorded_through_the_users_agent_in_its_own_tokens(taught_model_dir, recorder):
    tokenizer = models.load_tokenizer(taught_model_dir)
    demos = fb.record_demonstrations(make_rollout, tasks(), tokenizer, recorder, progress=False)
    assert [t.task_id for t in demos] == ["add-0", "add-1"]
    for t in demos:
        assert t.reward == 1.0 and t.end_reason == "terminated" and len(t.transitions) == 2
        call, answer = t.transitions
        assert [(c.name, json.loads(c.arguments)) for c in call.action.tool_calls] == [("add", {"a": 2, "b": 3})]
        # the tokens are the agent's own prompt (its tool schemas included) and the rendered call
        assert call.prompt_token_ids == rendered(tokenizer, call.observation.messages, call.observation.tools)
        assert tokenizer.decode(call.completion_token_ids).startswith(render_calls("", [("add", {"a": 2, "b": 3})]))
        assert answer.action.content == "The answer is 5." and answer.observation.messages[-1]["role"] == "tool"
    assert fb.read_demonstrations(recorder.store) == demos  # the same, read back from the store


def test_render_calls_is_read_back_by_parse_in_every_format():
    calls = [("lookup", {"city": "Paris"}), ("multiply", {"a": 2, "b": 3})]
    for fmt in ("hermes", "mistral"):
        action = parse(render_calls("Let me see.", calls, fmt), "stop", fmt)
        assert [(c.name, json.loads(c.arguments)) for c in action.tool_calls] == calls and action.content.strip() == "Let me see."
    action = parse(render_calls("", calls[:1], "llama3_json"), "stop", "llama3_json")
    assert [(c.name, json.loads(c.arguments)) for c in action.tool_calls] == calls[:1]


@pytest.mark.parametrize("plan, says", [
    ([{"tool": "divide", "args": {"a": 6, "b": 3}}, "2"], "calls the tool 'divide', which the agent does not have "
                                                          "(its tools: add, multiply)"),
    ([{"tool": "add", "args": {"a": 2, "b": 3}}], "has 1 steps, but the agent asked for model call 2"),
    ([{"name": "add"}], "a scripted step must be text, {'tool': name"),
])
def test_a_plan_the_agent_cannot_follow_is_a_clear_error(taught_model_dir, recorder, plan, says):
    with pytest.raises(InvalidArgument, match="record_demonstrations") as info:
        fb.record_demonstrations(make_rollout, tasks(1, plan), models.load_tokenizer(taught_model_dir), recorder,
                                 progress=False)
    assert says in str(info.value)
    (kept,) = recorder.store.trajectories()  # what was recorded is kept, and not as a demonstration
    assert kept.end_reason != "terminated" and fb.read_demonstrations(recorder.store) == []


def test_a_task_without_a_plan_and_an_empty_set_are_refused(taught_model_dir, recorder, tmp_path):
    tokenizer = models.load_tokenizer(taught_model_dir)
    with pytest.raises(InvalidArgument, match="task 'a' has no 'demo' plan"):
        fb.record_demonstrations(make_rollout, [{"id": "a", "question": "?"}], tokenizer, recorder)
    with pytest.raises(InvalidArgument, match="expected at least one task"):
        fb.record_demonstrations(make_rollout, [], tokenizer, recorder)
    trainer = fb.GRPOTrainer(fb.LocalPolicy(str(taught_model_dir)),
                             fb.GRPOConfig(out_dir=str(tmp_path / "run"), progress=False))
    try:
        with pytest.raises(InvalidArgument, match="no demonstrations to learn from .0 given"):
            fb.sft(trainer, [])
        with pytest.raises(InvalidArgument, match="needs both rollout= and held_out="):
            fb.sft(trainer, fb.record_demonstrations(make_rollout, tasks(1), tokenizer, recorder, progress=False),
                   held_out=tasks(1))
    finally:
        trainer.close()


def test_demonstrations_the_checker_fails_are_named_not_learned(taught_model_dir, recorder, caplog):
    wrong = [{"tool": "add", "args": {"a": 2, "b": 3}}, "The answer is 7."]
    demos = fb.record_demonstrations(make_rollout, tasks(1) + [dict(tasks(1, wrong)[0], id="bad")],
                                     models.load_tokenizer(taught_model_dir), recorder, progress=False)
    assert [t.task_id for t in demos] == ["add-0"]
    assert "not learning from 1 of 2 (e.g. task 'bad': terminated, reward 0.0)" in caplog.text


def test_openai_jsonl_conversations_are_imported_as_demonstrations(taught_model_dir, recorder, tmp_path):
    tokenizer = models.load_tokenizer(taught_model_dir)
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    conversation = {"messages": [{"role": "user", "content": "What is 2 plus 3?"},
                                 {"role": "assistant", "content": None, "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "5"},
                                 {"role": "assistant", "content": "The answer is 5."}],
                    "tools": training_task.TOOLS}
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(conversation) + "\n\n" + json.dumps(conversation) + "\n")
    demos = fb.import_demonstrations(path, tokenizer, recorder)
    assert len(demos) == 2 and all(t.reward == 1.0 and len(t.transitions) == 2 for t in demos)
    first, second = demos[0].transitions
    assert [(c.name, json.loads(c.arguments)) for c in first.action.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert second.prompt_token_ids == rendered(tokenizer, second.observation.messages, training_task.TOOLS)
    assert tokenizer.decode(second.completion_token_ids).startswith("The answer is 5.")
    bad = tmp_path / "bad.jsonl"
    for line, says in (("{not json", "bad.jsonl:2: not JSON"),
                       ('{"messages": [{"role": "user", "content": "hi"}]}', "bad.jsonl:2: the conversation has no assistant"),
                       ('{"text": "hi"}', "bad.jsonl:2: expected {'messages'")):
        bad.write_text(json.dumps(conversation) + "\n" + line + "\n")
        count = recorder.store.count()
        with pytest.raises(InvalidArgument, match=says.replace("{", r"\{").replace("[", r"\[")):
            fb.import_demonstrations(bad, tokenizer, recorder)
        assert recorder.store.count() == count  # nothing recorded from a file with a bad line
    bad.write_text("\n")
    with pytest.raises(InvalidArgument, match="no conversations"):
        fb.import_demonstrations(bad, tokenizer, recorder)


def test_sft_publishes_the_warm_start_not_an_iteration_and_checks_it_on_held_out_tasks(taught_model_dir, tmp_path):
    policy = fb.LocalPolicy(str(taught_model_dir))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, out_dir=str(tmp_path / "run"), run_name="mine",
                                                   progress=False, seed=0))
    rollout = make_rollout(policy)
    try:
        demos = fb.record_demonstrations(make_rollout, tasks(2), trainer.tokenizer, trainer.recorder, progress=False)
        held_out = [{"id": "h", "kind": "add", "question": training_task.QUESTION}]
        result = fb.sft(trainer, demos, fb.SFTConfig(epochs=1), rollout=rollout, held_out=held_out)
        assert result["version"] == "mine-sft" == policy.current() and trainer.iteration == 0
        assert set(result["held_out_base"]) == set(result["held_out_sft"]) == {"add"}
        assert result["held_out_verdict"].startswith("held-out check of the warm start, greedy (1 tasks)")
        checks = {t.run_id: t for t in trainer.recorder.store.trajectories() if t.run_id.endswith(("check-base", "check-sft"))}
        assert {t.transitions[0].version for t in checks.values()} == {None, "mine-sft"}  # before, then after
        (history,) = [trainer.train(rollout, tasks(1), iterations=1)]
        assert history[0]["iteration"] == 1 and policy.current() == "mine-v1"  # RL counts from v1
    finally:
        trainer.close()
    events = [json.loads(l) for l in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["sft"] and "held_out_sft/add" in events[0]
    # a resumed run starts from the warm start's checkpoint (iteration 0) and serves it
    again = fb.LocalPolicy(str(taught_model_dir))
    resumed = fb.GRPOTrainer(again, fb.GRPOConfig(group_size=2, out_dir=str(tmp_path / "run2"), run_name="mine",
                                                  progress=False))
    try:
        fb.sft(resumed, demos, fb.SFTConfig(epochs=1))
    finally:
        resumed.close()
    back = fb.GRPOTrainer(fb.LocalPolicy(str(taught_model_dir)), fb.GRPOConfig(
        group_size=2, out_dir=str(tmp_path / "run2"), run_name="mine", progress=False))
    try:
        assert back.resume() == 0 and back.policy.current() == "mine-sft"
    finally:
        back.close()


def kinds(**counts):
    return {k: KindSignal(k, n, s, n, 0) for k, (s, n) in counts.items()}


def test_the_verdict_says_kind_by_kind_whether_the_warm_start_learned():
    before = ProbeReport(kinds(rate=(0, 6), convert=(1, 6)), 1, True)
    after = ProbeReport(kinds(rate=(5, 6), convert=(1, 6)), 1, True)
    assert verdict(before, after).splitlines() == [
        "held-out check of the warm start, greedy (12 tasks): 8% before, 50% after",
        "  rate: 0 -> 5 of 6 (learned)",
        "  convert: 1 -> 1 of 6 (learned nothing: more demonstrations of it, more epochs or a higher lr "
        "(docs/own-agent.md))"]

"""MiniWoB++ tasks on real headless Chromium (the `miniwob` package's pages, Playwright, the system's
Chromium): a right action sequence scores MiniWoB's reward 1 and a wrong one 0, refs stay with
their elements for the episode, every fault of an action is an error the model sees, MiniWoB's
clock is stopped (or stretched, and then its end is a truncation), and an episode runs through
HarnessAgent and through a LangChain agent."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument, NotFound, WrongType
from forge_bridge.core.types import Action, ToolCall
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.miniwob import (
    MiniWoBConfig,
    MiniWoBEnvironment,
    MiniWoBPageError,
    MiniWoBTask,
    task_names,
)
from forge_bridge.envs.miniwob_dom import dom_text
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env():
    environment = MiniWoBEnvironment()
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def tokenizer():
    return models.tiny_tokenizer()


def step(env, name, **args):
    return env.step(Action(tool_calls=[ToolCall(id=f"c-{name}", name=name, arguments=json.dumps(args))]))


def page_of(result) -> str:
    """What the model observes after one tool call (the text of the tool message)."""
    (message,) = result.observation
    return message["content"]


def ref(page: str, pattern: str) -> int:
    """The ref of the first element line matching `pattern` (a regex after `[N] `)."""
    match = re.search(rf"^\s*\[(\d+)\] {pattern}", page, re.MULTILINE)
    assert match, f"no element {pattern!r} on the page:\n{page}"
    return int(match.group(1))


def utterance(page: str) -> str:
    return page.splitlines()[0].removeprefix("Task: ")


def first_page(env, name: str, seed: int = 0) -> str:
    (message,) = env.reset(MiniWoBTask(name, seed))
    return message["content"]


# ------------------------------------------------------------------ scripted solutions
def test_click_test_right_and_wrong(env):
    page = first_page(env, "click-test")
    assert utterance(page) == "Click the button."
    assert [t["function"]["name"] for t in env.tools] == ["click", "type", "press", "select"]
    wrong = step(env, "click", ref=ref(page, "div#area"))  # not the button: the task goes on
    assert not wrong.done and "[" in page_of(wrong)
    assert env.step(Action(content="Done.")).reward == 0.0  # answering ends it, unsolved
    page = first_page(env, "click-test")
    right = step(env, "click", ref=ref(page, r'button#subbtn "Click Me!"'))
    assert right.terminated and not right.truncated and right.reward == 1.0
    assert right.info["miniwob"] == {"task": "click-test", "seed": 0, "done": True, "raw_reward": 1.0, "reason": None}
    assert "The task is over (success): reward 1" in page_of(right)


def test_click_button_right_and_wrong(env):
    page = first_page(env, "click-button", seed=3)
    target = re.search(r'Click on the "(.+)" button', utterance(page)).group(1)
    buttons = re.findall(r'\[(\d+)\] button "([^"]*)"', page)
    others = [int(r) for r, text in buttons if text != target]
    assert others, page  # this seed's page has a wrong button to press
    assert step(env, "click", ref=ref(page, f'button "{re.escape(target)}"')).reward == 1.0
    page = first_page(env, "click-button", seed=3)
    wrong = step(env, "click", ref=others[0])
    assert wrong.terminated and wrong.reward == 0.0 and wrong.info["miniwob"]["raw_reward"] == -1.0


def test_enter_text_right_and_wrong(env):
    for text, reward in [(None, 1.0), ("somebody else", 0.0)]:
        page = first_page(env, "enter-text", seed=3)
        name = re.search(r'Enter "(.+)" into', utterance(page)).group(1)
        typed = step(env, "type", ref=ref(page, "input_text#tt"), text=text or name)
        assert f'input_text#tt value={json.dumps(text or name)}' in page_of(typed)
        done = step(env, "click", ref=ref(page, 'button#subbtn "Submit"'))
        assert done.terminated and done.reward == reward


def test_choose_list_right_and_wrong(env):
    for right in (True, False):
        page = first_page(env, "choose-list", seed=2)
        wanted = re.search(r"Select (.+) from the list", utterance(page)).group(1)
        options = re.search(r"select#options options: (.+) selected=", page).group(1)
        options = [json.loads(o) for o in options.split(" | ")]
        choice = wanted if right else next(o for o in options if o != wanted)
        chosen = step(env, "select", ref=ref(page, "select#options"), option=choice)
        assert f"selected={json.dumps(choice)}" in page_of(chosen)
        assert step(env, "click", ref=ref(page, 'button "Submit"')).reward == (1.0 if right else 0.0)


def login_steps(page: str, password_right: bool = True) -> list[tuple[str, dict]]:
    user, password = re.search(r'username "(.+)" and the password "(.+)" into', utterance(page)).groups()
    return [("type", {"ref": ref(page, "input_text#username"), "text": user}),
            ("type", {"ref": ref(page, "input_password#password"), "text": password if password_right else "x"}),
            ("click", {"ref": ref(page, 'button#subbtn "Login"')})]


def test_login_user_takes_three_actions_and_refs_stay_with_their_elements(env):
    for right in (True, False):
        page = first_page(env, "login-user", seed=5)
        pages = [page]
        for i, (name, args) in enumerate(login_steps(page, right)):
            result = step(env, name, **args)
            assert result.done == (i == 2)
            pages.append(page_of(result))
        assert result.reward == (1.0 if right else 0.0)
    elements = [[re.sub(r" value=.*| \(focused\)", "", line.strip()) for line in p.splitlines()
                 if line.strip().startswith("[")] for p in pages[:3]]
    assert len(elements[0]) > 5 and elements[0] == elements[1] == elements[2]  # same refs, same elements
    assert 'value="x"' in pages[2] and "(focused)" in pages[2]


def test_a_key_press_acts_on_the_focused_field(env):
    page = first_page(env, "enter-text", seed=3)
    field = ref(page, "input_text#tt")
    step(env, "type", ref=field, text="abcd")
    pressed = step(env, "press", key="Backspace")
    assert 'input_text#tt value="abc"' in page_of(pressed) and not pressed.done
    retyped = step(env, "type", ref=field, text="xy")  # type replaces what the field held
    assert 'input_text#tt value="xy"' in page_of(retyped)


def test_the_same_seed_draws_the_same_problem(env):
    assert first_page(env, "login-user", seed=7) == first_page(env, "login-user", seed=7)
    assert utterance(first_page(env, "login-user", seed=8)) != utterance(first_page(env, "login-user", seed=7))


# ------------------------------------------------------------------ faults the model sees
@pytest.mark.parametrize("name, arguments, error", [
    ("click", "{not json", "not valid JSON"),
    ("click", '{"ref": "the button"}', "argument 'ref' must be integer"),
    ("click", '{"target": 4}', "missing argument(s) ref"),
    ("scroll", '{"ref": 4}', "unknown tool 'scroll'"),
    ("click", '{"ref": 999}', "no element [999] on this page"),
    ("type", '{"ref": 999, "text": "x"}', "no element [999]"),
    ("press", '{"key": "NoSuchKey"}', "Unknown key"),
    ("select", '{"ref": 4, "option": "x"}', "is not a select element"),
])
def test_a_malformed_action_or_unknown_ref_is_an_error_the_model_sees(env, name, arguments, error):
    page = first_page(env, "click-test")
    result = env.step(Action(tool_calls=[ToolCall(id="c1", name=name, arguments=arguments)]))
    (outcome,) = result.info["tool_results"].values()
    assert not result.done and outcome["status"] == "error" and error in outcome["content"], outcome
    assert page_of(result) == outcome["content"]  # what the model sees is what is recorded
    assert step(env, "click", ref=ref(page, "button#subbtn")).reward == 1.0  # the episode went on


def test_typing_into_what_is_not_a_field_and_a_missing_option_are_errors(env):
    page = first_page(env, "choose-list", seed=2)
    typed = step(env, "type", ref=ref(page, 'button "Submit"'), text="x")
    assert "is a button, not a text field" in page_of(typed)
    missing = step(env, "select", ref=ref(page, "select#options"), option="Atlantis")
    assert "has no option 'Atlantis' (options: " in page_of(missing) and not missing.done


def test_an_unknown_task_name_lists_near_matches(env):
    with pytest.raises(NotFound, match=r"no task 'clik-buton'.*did you mean click-button"):
        MiniWoBTask("clik-buton")
    with pytest.raises(NotFound, match="no task 'login'"):
        env.reset("login")
    with pytest.raises(WrongType):
        env.reset({"name": "click-test"})
    with pytest.raises(InvalidArgument, match="seed"):
        MiniWoBTask("click-test", seed=-1)
    assert len(task_names()) == 125 and {"click-test", "login-user", "choose-list"} <= set(task_names())
    with pytest.raises(NotFound, match="no task 'hover-shape'"):  # a page miniwob ships but does not register
        MiniWoBTask("hover-shape")
    assert MiniWoBTask("click-test", 4).id == "click-test-4" and MiniWoBTask("click-test").kind == "click-test"


def test_bad_settings_are_clear_errors():
    for bad in ({"episode_time_s": 0}, {"episode_time_s": True}, {"action_timeout_s": -1},
                {"max_observation_chars": 10}, {"mode": "dev"}):
        with pytest.raises(InvalidArgument, match=next(iter(bad))):
            MiniWoBConfig(**bad)
    with pytest.raises(WrongType, match="MiniWoBConfig"):
        MiniWoBEnvironment({"episode_time_s": 60})


def test_a_page_that_fails_to_load_is_a_recorded_crash_not_a_lost_episode(env, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(env, "start_url", env.start_url + "/gone")  # every task page answers 404
    harness = HarnessAgent(ScriptedPolicy(lambda m, t: "unused", tokenizer), env)
    with pytest.raises(MiniWoBPageError, match=r"the page of MiniWoB task 'click-test' .* did not load: HTTP 404"):
        harness.run(MiniWoBTask("click-test"), recorder=fb.Recorder(tmp_path / "t.db", "miniwob"))
    with fb.TrajectoryStore(tmp_path / "t.db") as store:
        (traj,) = store.trajectories()
    assert traj.task_id == "click-test-0" and traj.end_reason == "crashed" and "HTTP 404" in traj.end_detail
    monkeypatch.undo()
    assert "Click Me!" in first_page(env, "click-test")  # the environment goes on with the next episode


# ------------------------------------------------------------------ the clock
def test_the_clock_is_stopped_by_default(env):
    first_page(env, "click-test")
    timer = env._call(lambda: env._page.evaluate("() => [core.EP_TIMER, WOB_DONE_GLOBAL]"))
    assert timer == ["stopped", False]  # MiniWoB's end-of-episode timer is not running


def test_a_stretched_clock_that_runs_out_truncates_the_episode(tokenizer, tmp_path):
    with MiniWoBEnvironment(MiniWoBConfig(episode_time_s=1.0)) as timed:
        page = first_page(timed, "click-test")
        timed._call(lambda: timed._page.wait_for_function("() => WOB_DONE_GLOBAL", timeout=10_000))
        late = step(timed, "click", ref=ref(page, "button#subbtn"))  # the right action, too late
        assert late.truncated and not late.terminated and late.reward == 0.0
        assert late.info["miniwob"]["reason"] == "timed out" and late.observation is None

        def slow(messages, tools):  # the model's turn outlasts the clock
            timed._call(lambda: timed._page.wait_for_function("() => WOB_DONE_GLOBAL", timeout=10_000))
            return {"tool": "click", "args": {"ref": ref(messages[-1]["content"], "button#subbtn")}}

        traj = HarnessAgent(ScriptedPolicy(slow, tokenizer), timed).run(
            MiniWoBTask("click-test"), recorder=fb.Recorder(tmp_path / "t.db", "miniwob"))
    assert traj.status == "truncated" and traj.reward == 0.0 and "clock ran out" in traj.end_detail


# ------------------------------------------------------------------ through agents
def test_an_episode_through_harness_agent_is_recorded_with_token_ids(env, tokenizer, tmp_path):
    def expert(messages, tools):
        pages = [m["content"] for m in messages if m["role"] in ("user", "tool")]
        plan = login_steps(pages[0])
        name, args = plan[len(pages) - 1]
        return {"tool": name, "args": args}

    traj = HarnessAgent(ScriptedPolicy(expert, tokenizer), env, system="You operate a web page.").run(
        MiniWoBTask("login-user", 11), recorder=fb.Recorder(tmp_path / "h.db", "miniwob"))
    assert traj.status == "complete" and traj.reward == 1.0 and traj.task_id == "login-user-11"
    assert len(traj.transitions) == 3 and traj.transitions[-1].terminated
    for t in traj.transitions:
        assert t.prompt_token_ids and t.completion_token_ids and t.info["source"] == "harness"
        assert {x["function"]["name"] for x in t.observation.tools} == {"click", "type", "press", "select"}
    assert traj.transitions[-1].info["env_info"]["miniwob"]["raw_reward"] == 1.0
    (typed,) = traj.transitions[0].info["tool_results"].values()
    assert typed["status"] == "success" and "input_text#username value=" in typed["content"]


def test_an_episode_through_a_langchain_agent_one_tool_per_action(env, tokenizer, tmp_path):
    from forge_bridge.envs.agent import AgentEnvironment

    spec = importlib.util.spec_from_file_location("miniwob_agent_example", ROOT / "examples" / "miniwob_agent.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    def expert(messages, tools):
        done = sum(m["role"] == "tool" for m in messages)
        page = next(m["content"] for m in messages if m["role"] == "user")
        target = re.search(r'Click on the "(.+)" button', utterance(page)).group(1)
        if done == 0:
            return {"tool": "click", "args": {"ref": 999}}  # a ref that is not there: the agent sees why
        if done == 1:
            return {"tool": "click", "args": {"ref": ref(page, f'button "{re.escape(target)}"')}}
        return "Clicked."

    agent_env = AgentEnvironment(*example.langchain_miniwob_agent(env), timeout_s=60)
    try:
        traj = HarnessAgent(ScriptedPolicy(expert, tokenizer), agent_env).run(
            MiniWoBTask("click-button", 3), recorder=fb.Recorder(tmp_path / "lc.db", "miniwob-lc"))
    finally:
        agent_env.close()
    assert traj.status == "complete" and traj.reward == 1.0 and len(traj.transitions) == 3
    assert {t["function"]["name"] for t in traj.transitions[0].observation.tools} == {"click", "type", "press",
                                                                                       "select"}
    missed, over = (t.observation.messages[-1] for t in traj.transitions[1:])
    assert missed["role"] == "tool" and "no element [999]" in missed["content"]
    assert over["role"] == "tool" and "The task is over (success)" in over["content"]
    assert all(t.prompt_token_ids and t.completion_token_ids for t in traj.transitions)


# ------------------------------------------------------------------ the page as text
def test_the_page_text_shows_values_checks_options_and_loose_text():
    tree = {"ref": 1, "tag": "body", "id": "", "text": "", "children": [
        {"ref": 2, "tag": "div", "id": "area", "text": "", "children": [
            {"ref": -1, "tag": "t", "id": "", "text": "Pick one:", "children": []},
            {"ref": 3, "tag": "input_checkbox", "id": "c", "text": "", "value": True, "children": []},
            {"ref": 4, "tag": "input_text", "id": "", "text": "", "value": 'say "hi"', "focused": True,
             "children": []},
            {"ref": 5, "tag": "select", "id": "", "text": "", "options": ["a", "b"], "selected": "b",
             "children": []},
            {"ref": 6, "tag": "span", "id": "", "text": "x" * 150, "children": []}]}]}
    text = dom_text("Do it.", tree, 4000)
    assert text.splitlines() == [
        "Task: Do it.", "[1] body", " [2] div#area", '  "Pick one:"', "  [3] input_checkbox#c checked",
        '  [4] input_text value="say \\"hi\\"" (focused)', '  [5] select options: "a" | "b" selected="b"',
        f'  [6] span "{"x" * 100}..."']
    assert "more characters cut" in dom_text("Do it.", tree, 100)

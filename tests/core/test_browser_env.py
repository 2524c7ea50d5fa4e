"""BrowserEnvironment on real headless Chromium (Debian's, driven by Playwright) over the local
shop: every tool works, navigation off the allow-list is an error observation, each task's
checker passes after a correct sequence and fails after a wrong one, and a HarnessAgent episode
is recorded with token ids like any other."""

import json
import re

import pytest

import forge_bridge as fb
from forge_bridge.app.tasks.shop import BY_SKU, CATALOGUE, KINDS, ShopSite, make_shop_splits, make_task
from forge_bridge.core.errors import InvalidArgument, InvalidState
from forge_bridge.core.types import Action, ToolCall
from forge_bridge.envs.browser import BrowserEnvironment, BrowserUnavailable
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy

MUG, RED, PEN = BY_SKU["mug-blue"], BY_SKU["mug-red"], BY_SKU["pen-gel"]


@pytest.fixture(scope="module")
def env():
    environment = BrowserEnvironment(ShopSite())
    yield environment
    environment.close()


def act(env, name, **args) -> dict:
    step = env.step(Action(tool_calls=[ToolCall(id=f"c-{name}", name=name, arguments=json.dumps(args))]))
    assert not step.done
    (outcome,) = step.info["tool_results"].values()
    assert step.observation[0]["content"] == outcome["content"]  # what the model sees is what is recorded
    return outcome


def element_id(page_text: str, label: str) -> str:
    match = re.search(rf'\[(\d+)\] \w+ "{re.escape(label)}"', page_text)
    assert match, f"{label!r} not on the page:\n{page_text}"
    return match.group(1)


def test_the_first_observation_is_the_task_and_the_sites_home_page(env):
    first = env.reset(make_task("price", MUG, RED))
    text = first[0]["content"]
    assert text.startswith("What does the Blue mug cost")
    assert env.site.url in text and "# Shop" in text and f'link "{MUG.name}"' in text
    assert [t["function"]["name"] for t in env.tools] == ["goto", "click", "type", "read", "back"]


def test_each_tool_works_on_the_local_app(env):
    home = env.reset(make_task("add", MUG, RED, quantity=2))[0]["content"]
    product = act(env, "click", target=element_id(home, MUG.name))  # by element id
    assert product["status"] == "success" and "/product/mug-blue" in product["content"]
    assert f"Price: ${MUG.price}" in product["content"]
    typed = act(env, "type", target=element_id(product["content"], "Quantity"), text="2")
    assert typed["status"] == "success"
    assert 'field "Quantity" value: "2"' in act(env, "read")["content"]
    cart = act(env, "click", target="Add to cart")  # by a button's text
    assert "/cart" in cart["content"] and "Blue mug x 2 ($16)" in cart["content"]
    back = act(env, "back")
    assert "/product/mug-blue" in back["content"]
    searched = act(env, "goto", url="/search?q=mug")  # a path on the site
    assert searched["status"] == "success" and 'link "Red mug"' in searched["content"]
    assert 'link "Pen' not in searched["content"]
    typed = act(env, "type", target="Search products", text="notebook")  # by a field's label
    results = act(env, "click", target="Search")
    assert 'link "Grid notebook"' in results["content"] and 'link "Red mug"' not in results["content"]
    assert env.step(Action(content="Added.")).reward == 1.0


@pytest.mark.parametrize("tool,args,refused", [
    ("goto", {"url": "https://example.com/"}, "not an allowed origin"),
    ("goto", {"url": "file:///etc/passwd"}, "file: URLs are refused"),
    ("goto", {"url": "javascript:alert(1)"}, "javascript: URLs are refused"),
    ("click", {"target": "Help centre"}, "navigation to https://help.example.com/shop"),
    ("click", {"target": "Open in a new tab"}, "popup"),
    ("click", {"target": "Download the catalogue"}, "download of"),
])
def test_leaving_the_allowed_origins_is_an_error_observation(env, tool, args, refused):
    env.reset(make_task("price", MUG, RED))
    outcome = act(env, tool, **args)
    assert outcome["status"] == "error" and "refused" in outcome["content"] and refused in outcome["content"]
    assert env.refused and env.url.startswith(env.site.url)  # still on the site
    assert act(env, "read")["status"] == "success"  # and the episode goes on


def test_a_page_cannot_open_a_websocket_or_fetch_off_the_site(env):
    env.reset(make_task("price", MUG, RED))
    state = env._call(lambda: env._page.evaluate("""async () => {
        const ws = new WebSocket('ws://203.0.113.7:9/');
        const closed = await new Promise(done => { ws.onclose = () => done('closed'); ws.onopen = () => done('open'); });
        let fetched = 'fetched';
        try { await fetch('http://203.0.113.7:9/x'); } catch (e) { fetched = 'blocked'; }
        return [closed, fetched];
    }"""))
    assert state == ["closed", "blocked"]
    assert any(r.startswith("websocket to ws://203.0.113.7:9") for r in env.refused)
    assert any(r.startswith("request to http://203.0.113.7:9/x") for r in env.refused)


def test_a_closed_environment_says_so():
    closed = BrowserEnvironment(ShopSite())
    closed.close()
    with pytest.raises(InvalidState, match="closed"):
        closed.read()
    closed.close()  # twice is fine


def test_faults_are_error_observations_not_crashes(env):
    env.reset(make_task("price", MUG, RED))
    for name, args, expected in [
        ("click", {"target": "999"}, "no element '999'"),
        ("click", {"target": "No such button"}, "no element"),
        ("type", {"target": "Home", "text": "x"}, "Error"),  # a link is not a field
        ("goto", {"url": "/no/such/page"}, None),  # a 404 page is still a page
    ]:
        outcome = act(env, name, **args)
        if expected is None:
            assert outcome["status"] == "success" and "No such page" in outcome["content"]
        else:
            assert outcome["status"] == "error" and expected in outcome["content"], outcome


def test_observations_are_bounded():
    with BrowserEnvironment(ShopSite(), max_observation_chars=300) as small:
        first = small.reset(make_task("price", MUG, RED))
        outcome = act(small, "read")
        assert len(outcome["content"]) < 400 and "more characters cut" in outcome["content"]
        assert "more characters cut" in first[0]["content"]


def solve(env, task_kind: str, product, other) -> str:
    """A scripted correct sequence for each kind; returns the final answer."""
    if task_kind == "price":
        page = act(env, "click", target=product.name)["content"]
        price = re.search(r"Price: \$(\d+)", page).group(1)
        return f"It costs ${price}."
    if task_kind == "remove":
        act(env, "click", target=f"Cart ({2})")
        act(env, "click", target=f"Remove {product.name}")
        return "Removed."
    act(env, "click", target=product.name)
    if task_kind == "add":
        act(env, "type", target="Quantity", text="2")
    act(env, "click", target="Add to cart")
    if task_kind == "buy":
        placed = act(env, "click", target="Checkout")
        assert "Order placed" in placed["content"]
    return "Done."


@pytest.mark.parametrize("kind", KINDS)
def test_each_kinds_checker_passes_after_a_correct_sequence_and_fails_after_a_wrong_one(env, kind):
    task = make_task(kind, MUG, RED, quantity=2)
    env.reset(task)
    assert env.step(Action(content=solve(env, kind, MUG, RED))).reward == 1.0
    env.reset(task)  # the site is back to its initial state: the same sequence on the wrong product fails
    wrong = solve(env, kind, RED, MUG)
    assert env.step(Action(content=wrong)).reward == 0.0


def test_each_episode_gets_a_fresh_browser_context_and_site_state(env):
    env.reset(make_task("add", MUG, RED, quantity=1))
    act(env, "click", target=MUG.name)
    act(env, "click", target="Add to cart")
    env._call(lambda: env._page.evaluate("localStorage.setItem('seen', 'yes'); document.cookie = 'c=1'"))
    env.reset(make_task("add", MUG, RED, quantity=1))
    assert env.site.cart == {} and "Cart (0)" in act(env, "read")["content"]
    assert env._call(lambda: env._page.evaluate("[localStorage.getItem('seen'), document.cookie]")) == [None, ""]


def test_bad_settings_are_clear_errors():
    with pytest.raises(InvalidArgument, match="pass a site"):
        BrowserEnvironment()
    with pytest.raises(InvalidArgument, match="only http"):
        BrowserEnvironment(start_url="http://127.0.0.1:1", allowed_origins=["file:///"])
    with pytest.raises(BrowserUnavailable, match="did not start"):
        BrowserEnvironment(start_url="http://127.0.0.1:1", executable_path="/nonexistent/chromium")


def test_the_splits_hold_out_whole_products():
    train, held = make_shop_splits(seed=0)
    def products(tasks):
        return {t.id.split("-", 1)[1].rsplit("-", 1)[0] if t.id.startswith("add-") else t.id.split("-", 1)[1]
                for t in tasks}
    assert len(held) == 4 * len(KINDS) and len(train) == (len(CATALOGUE) - 4) * len(KINDS)
    assert not products(train) & products(held)
    assert make_shop_splits(seed=0)[1][0].id == held[0].id and make_shop_splits(seed=1)[1] != held
    with pytest.raises(InvalidArgument, match="held_out_products"):
        make_shop_splits(held_out_products=1)  # a remove task would have no second product


def test_a_price_answer_must_be_one_number_the_right_one(env):
    task = make_task("price", MUG, RED)
    for answer, reward in [("It costs $8.", 1.0), ("8 dollars", 1.0), ("It costs 8.00", 1.0),
                           (" ".join(str(i) for i in range(1, 41)), 0.0), ("$9", 0.0), ("cheap", 0.0)]:
        env.reset(task)
        assert env.step(Action(content=answer)).reward == reward, answer


def test_a_harness_episode_in_the_browser_is_recorded_with_token_ids(tmp_path):
    def expert(messages, tools):
        done = sum(m["role"] == "tool" for m in messages)
        if done == 0:
            return f'<tool_call>\n{json.dumps({"name": "click", "arguments": {"target": PEN.name}})}\n</tool_call>'
        if done == 1:
            return f'<tool_call>\n{json.dumps({"name": "click", "arguments": {"target": "Add to cart"}})}\n</tool_call>'
        return "Added one pen."

    policy = ScriptedPolicy(expert, models.tiny_tokenizer())
    harness = HarnessAgent(policy, lambda: BrowserEnvironment(ShopSite()), system="You use a web browser.")
    traj = harness.run(make_task("add", PEN, MUG, quantity=1), recorder=fb.Recorder(tmp_path / "b.db", "browser"))
    assert traj.status == "complete" and traj.reward == 1.0 and len(traj.transitions) == 3
    for t in traj.transitions:
        assert t.prompt_token_ids and t.completion_token_ids and t.info["source"] == "harness"
        assert {x["function"]["name"] for x in t.observation.tools} == {"goto", "click", "type", "read", "back"}
    (clicked,) = traj.transitions[0].info["tool_results"].values()
    assert clicked["status"] == "success" and "Price: $2" in clicked["content"]
    stored = fb.Recorder(tmp_path / "b.db", "browser").store.get(traj.id)
    assert [t.completion_token_ids for t in stored.transitions] == [t.completion_token_ids for t in traj.transitions]


def test_a_langchain_agent_drives_the_browser_through_agent_environment(tmp_path):
    """examples/browser_agent.py's LangChain agent: its own tools click in the browser, each of
    its model calls one recorded step."""
    import importlib.util
    from pathlib import Path

    from forge_bridge.envs.agent import AgentEnvironment

    path = Path(__file__).resolve().parents[2] / "examples" / "browser_agent.py"
    spec = importlib.util.spec_from_file_location("browser_agent_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    def expert(messages, tools):
        done = sum(m["role"] == "tool" for m in messages)
        calls = [("click", {"target": "Gel"}), ("click", {"target": PEN.name}), ("click", {"target": "Add to cart"})]
        if done < len(calls):
            name, args = calls[done]
            return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'
        return "Added one pen."

    browser = BrowserEnvironment(ShopSite())
    env = AgentEnvironment(*example.langchain_browser_agent(browser), timeout_s=60)
    try:
        policy = ScriptedPolicy(expert, models.tiny_tokenizer())
        traj = HarnessAgent(policy, env).run(make_task("add", PEN, MUG, quantity=1),
                                             recorder=fb.Recorder(tmp_path / "lc.db", "browser-lc"))
    finally:
        env.close()
        browser.close()
    assert traj.status == "complete" and traj.reward == 1.0 and len(traj.transitions) == 4
    assert {t["function"]["name"] for t in traj.transitions[0].observation.tools} == {"click", "type", "goto", "read"}
    missed = traj.transitions[1].observation.messages[-1]
    assert missed["role"] == "tool" and "no element 'Gel'" in missed["content"]  # the refusal reached the agent
    assert all(t.prompt_token_ids and t.completion_token_ids for t in traj.transitions)

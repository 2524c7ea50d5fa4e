"""`forge-bridge inspect` in real headless Chromium (Debian's, driven by Playwright): over the
quick demo's run folder the curves render, the table filters to failed trajectories of one kind
and a trajectory shows, for each step, the advantage the trainer's own function computes; over
a GRPO run that is still writing, every page answers, and a two-step trajectory's token view
marks its tool-result tokens as not trained. Screenshots land in test-artifacts/inspect/."""

import json
import sys
import threading
import time
from pathlib import Path

import pytest

import forge_bridge as fb
from forge_bridge.app.inspector.data import Filters
from forge_bridge.app.inspector.server import Inspector
from forge_bridge.core.store import TrajectoryQuery, TrajectoryStore
from forge_bridge.core.types import group_trajectories
from forge_bridge.envs.browser import find_chromium
from forge_bridge.trainer.grpo import grpo_advantages

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "inspect"


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium())
        yield browser
        browser.close()


def recomputed_advantages(store_path: Path, run_id: str, iteration: int, config: fb.GRPOConfig) -> dict:
    """What `grpo_advantages` gives the groups the trainer trained on in `iteration` (those with
    credit rows), keyed (trajectory id, step)."""
    with TrajectoryStore(store_path) as store:
        trained = [t for t in store.trajectories(run_id=run_id)
                   if any(c.iteration == iteration for c in store.credit(t.id).values())]
    for t in trained:
        t.reward = 0.0 if t.reward is None else t.reward  # as the rollout collector does
    groups = group_trajectories(trained)
    advantages = grpo_advantages(groups, config)
    return {(t.id, k): float(a[k]) for g, advs in zip(groups, advantages)
            for t, a in zip(g.trajectories, advs) for k in range(len(a))}


def test_the_inspector_shows_the_demos_run_down_to_tokens_and_credit(quick_demo, chromium):
    out, proc = quick_demo
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    saved = json.loads((out / "trainer.json").read_text())
    config = fb.GRPOConfig.from_dict(saved["config"])
    with Inspector(out) as inspector:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.goto(inspector.url + "/")
        assert page.locator("#curves svg polyline.series").count() >= 4  # reward, success, KL, ... per iteration
        assert page.locator("#evaluations th", has_text="SFT+RL").count() == 1
        page.screenshot(path=str(ARTIFACTS / "runs.png"), full_page=True)

        # filter, as a person would: the run, a kind, failures only
        page.click("nav >> text=Trajectories")
        kind = next(k for k in ("lookup_multiply", "lookup", "multiply")
                    if inspector.view.list_trajectories(Filters(TrajectoryQuery(run=run_id, kind=k, outcome="failure")))[1])
        page.select_option("select[name=run]", run_id)
        page.select_option("select[name=kind]", kind)
        page.select_option("select[name=outcome]", "failure")
        page.click("#filters button")
        rows = page.locator("#trajectories tr[data-id]")
        assert rows.count() > 0
        for i in range(rows.count()):
            cells = rows.nth(i).locator("td").all_inner_texts()
            assert cells[3] == kind and (cells[5] != "complete" or float(cells[7]) < 1), cells
        page.screenshot(path=str(ARTIFACTS / "failed.png"))

        # open the first; each step's advantage is what the trainer's own function gives its groups
        chosen = rows.first.get_attribute("data-id")
        page.click(f"#trajectories tr[data-id='{chosen}'] a[href^='/trajectory/']")
        page.wait_for_url(f"**/trajectory/{chosen}")
        info, steps = inspector.view.trajectory(chosen)
        expected = recomputed_advantages(out / "trajectories.db", run_id, info.metadata["iteration"], config)
        sections = page.locator("section.step")
        assert sections.count() == len(steps) > 0
        for k in range(len(steps)):
            shown = sections.nth(k).get_attribute("data-advantage")
            assert shown != "" and float(shown) == pytest.approx(expected[(chosen, k)], abs=1e-6), k
        page.screenshot(path=str(ARTIFACTS / "step-view.png"), full_page=True)

        # two versions on one held-out task: every recorded answer, and a diff of two
        task = inspector.view.store.evaluated_tasks()[0]
        page.goto(inspector.url + "/compare")
        page.select_option("select[name=task]", task)
        page.click("main form button")
        runs = page.locator("main table").first.locator("tr td:first-child").all_inner_texts()
        assert {"eval-base", "eval-sft", "eval-rl"} <= set(runs)
        assert page.locator("#diff table.diff").count() == 1
        page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
        page.close()


def test_while_a_run_trains_the_step_view_shows_its_tool_results_untrained_and_its_credit(chromium, tmp_path):
    """A GRPO run of a LangChain agent on a tiny model that picks add or multiply at random: the
    browser reads the run's pages while it writes, then checks a two-step trajectory's tokens."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
    import training_task  # the learning tests' task: add (reward 1) or multiply (0)

    policy = fb.LocalPolicy(training_task.choice_model(tmp_path / "model"))
    rollout = training_task.make_rollout(training_task.agent_for(policy))
    out = tmp_path / "run"
    config = fb.GRPOConfig(group_size=8, concurrency=2, lr=1e-3, out_dir=str(out), run_name="live", progress=False,
                           seed=0)
    trainer = fb.GRPOTrainer(policy, config)
    done, errors = threading.Event(), []

    def train() -> None:
        try:
            trainer.train(rollout, training_task.TASKS, iterations=3)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=train, daemon=True).start()
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    seen = []
    with Inspector(out) as inspector:  # the trainer made the store before train() began
        while not done.is_set():  # a person watching the run: every page answers, the count grows
            page.goto(inspector.url + "/trajectories")
            seen.append(int(page.locator("#total").inner_text().split()[0]))
            page.goto(inspector.url + "/")
            assert page.locator("h1").inner_text() == "Runs and curves"
            time.sleep(0.2)
        assert not errors, errors
        final = inspector.view.list_trajectories(Filters())[1]
        assert final == 3 * 8 and len(seen) > 3 and seen[0] < final and seen == sorted(seen)

        run_id = json.loads((out / "run.json").read_text())["run_id"]
        store = inspector.view.store
        credit = {t.id: (c[1].iteration, c[1].advantage) for t in store.trajectories()
                  if 1 in (c := store.credit(t.id))}
        chosen = next(tid for tid, (it, adv) in credit.items() if adv)  # a step with a non-zero advantage
        iteration = credit[chosen][0]
        expected = recomputed_advantages(out / "trajectories.db", run_id, iteration, config)
        page.goto(inspector.url + f"/trajectory/{chosen}?colour=trained")
        _, steps = inspector.view.trajectory(chosen)
        sections = page.locator("section.step")
        assert sections.count() == len(steps) == 2
        for k in range(2):
            assert float(sections.nth(k).get_attribute("data-advantage")) == pytest.approx(expected[(chosen, k)], abs=1e-6)
            trained = sections.nth(k).locator(".tokens span[data-trained='1']").count()
            # nothing is cut at this length and the group was trained: every completion token
            assert trained == len(steps[k].transition.completion_token_ids) > 0
        (result,) = steps[0].transition.info["tool_results"].values()
        masked = "".join(sections.nth(1).locator(".tokens span[data-trained='0']").all_inner_texts())
        assert str(result["content"]) in masked and "tool_response" in masked  # the tool's answer: not trained
        reply = "".join(sections.nth(1).locator(".tokens span[data-trained='1']").all_inner_texts())
        assert "The answer is" in reply
        page.screenshot(path=str(ARTIFACTS / "step-view-trained.png"), full_page=True)
        page.close()
    trainer.close()
    policy.close()

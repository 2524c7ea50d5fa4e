"""The inspector's data and pages over a small hand-made store: filters and paging, the tokens a
step added (its tool result) marked not trained, the credit the trainer recorded, groups and
where they diverge, and clear errors for bad queries. (The browser tests, on a real run, are in
tests/e2e/test_inspect.py.)"""

import html
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from forge_bridge.app.inspector.data import Filters, RunView, first_divergence
from forge_bridge.core.store import TrajectoryQuery as Q
from forge_bridge.app.inspector.server import Inspector
from forge_bridge.core.errors import InvalidArgument, NotFound, StoreError
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Feedback, Observation, ToolCall, Trajectory, Transition


def step(prompt, completion, content="", call=None, result=None):
    info = {"tool_results": {"c1": {"name": call, "content": result, "status": "success", "latency_s": 0.01,
                                    "error": None}}} if call else {}
    return Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                      action=Action(content=content, tool_calls=[ToolCall(id="c1", name=call, arguments="{}")]
                                    if call else [], call_format="fenced_json" if call else ""),
                      prompt_token_ids=prompt, completion_token_ids=completion,
                      completion_logprobs=[-0.1 * (i + 1) for i in range(len(completion))], info=info)


@pytest.fixture
def run_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(json.dumps({"iteration": 1, "reward_mean": 0.5, "kl": 0.01,
                                                      "calls/fenced_json": 0.75, "calls/hermes": 0.25}) + "\n"
                                          + '{"iteration": 2, "reward_me')  # a line being written
    (folder / "run.json").write_text(json.dumps({"run_id": "r1"}))
    with TrajectoryStore(folder / "trajectories.db") as store:
        ids = []
        for i, (second, reward) in enumerate([([7, 8], 1.0), ([9], 0.0), ([7, 8], 0.0)]):
            t = Trajectory(task_id="lookup-1", group_id="g1", run_id="r1", metadata={"iteration": 1, "kind": "lookup"},
                           transitions=[step([1, 2], [3, 4], call="lookup", result="56032"),
                                        step([1, 2, 3, 4, 5, 6], second, content="done")])
            store.begin(t)
            store.finish(t.id, "terminated", reward=reward)
            ids.append(t.id)
        for i in range(120):
            t = Trajectory(task_id=f"add-{i}", run_id="r1", metadata={"iteration": 2})
            store.begin(t)
            store.finish(t.id, "terminated" if i % 3 else "policy_fault", reward=float(i % 2))
        store.record_credit(1, [(ids[0], 0, 0.5, 2), (ids[0], 1, 0.75, 2), (ids[1], 0, -0.25, 2),
                                (ids[1], 1, None, 0)])
        store.add_feedback(Feedback(ids[0], 0.0, key="user", comment="<b>wrong</b> city"))
        store.add_feedback(Feedback(ids[0], 0.8, key="judge", comment="close", source="judge:qwen"))
        store.add_event("promoted", version="demo-v1", slot="default", detail={"candidate": 0.9, "serving": 0.5})
        store.add_event("judge_failed", detail={"episodes": [ids[2]], "judge": "tiny", "key": "judge",
                                                "error": "malformed: not JSON"})
    return folder, ids


def test_filters_and_paging_query_the_store_a_page_at_a_time(run_folder):
    folder, ids = run_folder
    view = RunView(folder)
    rows, total = view.list_trajectories(Filters(), per_page=50)
    assert total == 123 and len(rows) == 50
    rows, total = view.list_trajectories(Filters(page=3), per_page=50)
    assert len(rows) == 23
    rows, total = view.list_trajectories(Filters(Q(kind="lookup", outcome="failure")))
    assert total == 2 and {r.trajectory.id for r in rows} == set(ids[1:]) and rows[0].steps == 2
    _, failed = view.list_trajectories(Filters(Q(status="failed")))
    assert failed == 40  # every third add-* ended in a policy fault
    assert view.list_trajectories(Filters(Q(kind="add")))[1] == 120  # kind from the task id
    rows, _ = view.list_trajectories(Filters(Q(sort="reward", order="asc", iteration="2")))
    assert rows[0].trajectory.reward == 0.0 and rows[0].iteration == 2
    assert view.metrics() == [{"iteration": 1, "reward_mean": 0.5, "kl": 0.01, "calls/fenced_json": 0.75,
                               "calls/hermes": 0.25}]


def test_a_step_shows_its_new_prompt_tokens_and_the_credit_the_trainer_recorded(run_folder):
    folder, ids = run_folder
    info, steps = RunView(folder).trajectory(ids[0])
    assert info.task_id == "lookup-1" and info.reward == 1.0
    assert steps[0].new_prompt_ids == [1, 2] and steps[1].new_prompt_ids == [5, 6]  # the tool result's tokens
    assert (steps[0].advantage, steps[0].trained_tokens, steps[1].advantage) == (0.5, 2, 0.75)
    _, other = RunView(folder).trajectory(ids[1])
    assert other[1].advantage is None and other[1].trained_tokens == 0
    _, untouched = RunView(folder).trajectory(ids[2])
    assert untouched[0].iteration is None  # no trainer saw it


def test_a_group_diverges_at_the_first_step_whose_completions_differ(run_folder):
    folder, ids = run_folder
    rollouts = RunView(folder).group("g1")
    assert [info.id for info, _ in rollouts] == ids
    assert first_divergence([steps for _, steps in rollouts]) == 1
    assert first_divergence([rollouts[0][1], rollouts[2][1]]) is None


def test_the_pages_render_and_bad_queries_are_clear(run_folder):
    folder, ids = run_folder
    with Inspector(folder) as inspector:
        assert inspector.url.startswith("http://127.0.0.1:")

        def get(path):
            with urllib.request.urlopen(inspector.url + path) as r:
                return r.read().decode()

        page = get(f"/trajectory/{ids[0]}?colour=trained")
        assert "data-advantage='0.5'" in page and "56032" in page
        assert "feedback (2)" in page and "&lt;b&gt;wrong&lt;/b&gt; city" in page and "judge:qwen" in page
        assert "id='feedback'" not in get(f"/trajectory/{ids[1]}")  # no feedback, no table
        failed = get(f"/trajectory/{ids[2]}")  # a judge's failure, beside the trajectory it concerns
        assert "feedback (0, 1 judge failures)" in failed and "malformed: not JSON" in failed and "judge:tiny" in failed
        assert page.count("data-trained='1'") == 4 and "class='tok obs' data-trained='0'" in page
        front = get("/")
        assert "id='events'" in front and "promoted" in front and "class=\"mark\"" in front  # on the curves too
        assert "judge_failed" not in front  # not a serving event
        assert "tool calls read, by format" in front and "fenced_json" in front  # the share of each format
        assert "calls read from: fenced_json" in page
        assert "<polyline" in get("/") and "id='divergence'>The rollouts first differ at step 1" in get("/group/g1")
        for path, status, text in [("/trajectory/nope", 404, "no trajectory 'nope'"),
                                   ("/trajectories?sort=evil", 400, "sort: expected one of"),
                                   ("/trajectories?page=x", 400, "page: expected a number"),
                                   ("/nowhere", 404, "No page /nowhere")]:
            with pytest.raises(urllib.error.HTTPError) as err:
                get(path)
            assert err.value.code == status and text in html.unescape(err.value.read().decode())


def test_reading_never_writes_and_a_missing_or_foreign_store_is_refused(run_folder, tmp_path):
    folder, _ = run_folder
    view = RunView(folder)
    with pytest.raises(Exception, match="readonly|read-only"):
        view.store.begin(Trajectory(run_id="r1"))
    assert view.list_trajectories(Filters())[1] == 123
    with pytest.raises(NotFound, match="no trajectory store"):
        RunView(tmp_path / "empty")
    (tmp_path / "junk.db").write_text("not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a forge-bridge trajectory store"):
        RunView(store=tmp_path / "junk.db")
    with pytest.raises(InvalidArgument, match="outcome"):
        Filters.from_query({"outcome": "maybe"})


def test_the_command_serves_a_run_folder_on_loopback(run_folder):
    import subprocess
    import sys

    folder, ids = run_folder
    proc = subprocess.Popen([sys.executable, "-m", "forge_bridge.app.cli", "inspect", str(folder), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split()[2]
        assert url.startswith("http://127.0.0.1:"), line
        with urllib.request.urlopen(f"{url}/trajectory/{ids[0]}") as r:
            assert r.status == 200 and "56032" in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    missing = subprocess.run([sys.executable, "-m", "forge_bridge.app.cli", "inspect", str(folder / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "no trajectory store" in missing.stderr


def test_hostile_ids_are_escaped_and_foreign_hosts_refused(tmp_path):
    import http.client

    folder = tmp_path / "run"
    folder.mkdir()
    hostile = "x'><img src=x onerror=alert(1)>"
    with TrajectoryStore(folder / "trajectories.db") as store:
        for run in ("<script>alert(2)</script>", "eval-a"):
            t = Trajectory(id=hostile + run[:3], task_id="t#1", group_id="g#1?&", run_id=run,
                           transitions=[step([1], [2], content="<b>model text</b>")])
            store.begin(t)
            store.finish(t.id, "terminated", reward=1.0)
    with Inspector(folder) as inspector:
        port = int(inspector.url.rsplit(":", 1)[1])
        for path in ("/trajectories", "/group/g%231%3F%26", "/compare?task=t%231",
                     "/trajectory/" + urllib.parse.quote(hostile + "<sc", safe="")):
            with urllib.request.urlopen(inspector.url + path) as r:
                page = r.read().decode()
                assert r.status == 200 and "default-src 'none'" in r.headers["Content-Security-Policy"]
            assert "<img" not in page and "<script>" not in page and "<b>model" not in page, path
        assert "&lt;script&gt;" in page or "&lt;b&gt;model" in page
        # a page on another site whose name was rebound to 127.0.0.1 sends its own Host: refused
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("GET", "/trajectories", headers={"Host": f"evil.example:{port}"})
        answer = conn.getresponse()
        assert answer.status == 421 and b"t#1" not in answer.read()  # nothing of the run in the answer
        conn.close()

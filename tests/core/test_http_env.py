"""HTTPToolEnvironment over a JSONService it starts on 127.0.0.1: calls map onto requests,
faults (4xx/5xx, timeouts, a server that is gone) become error observations."""

import json
import time

import pytest

from forge_bridge.core.types import Action, ToolCall
from forge_bridge.envs.http import HTTPTool, HTTPToolEnvironment, JSONService
from forge_bridge.envs.tool import ToolTask


def inventory_service() -> JSONService:
    def get_item(params, body):
        item = service.state["items"].get(params["sku"])
        return (200, item) if item else (404, {"error": f"no item {params['sku']}"})

    def restock(params, body):
        service.state["items"][params["sku"]]["count"] += int(body["amount"])
        return 200, service.state["items"][params["sku"]]

    def slow(params, body):
        time.sleep(float(params.get("seconds", 3)))
        return 200, {"ok": True}

    def crash(params, body):
        raise RuntimeError("database on fire")

    service = JSONService({("GET", "/items/{sku}"): get_item, ("POST", "/items/{sku}/restock"): restock,
                           ("GET", "/slow"): slow, ("GET", "/crash"): crash},
                          initial={"items": {"A-1": {"sku": "A-1", "count": 2}}})
    return service


TOOLS = [
    HTTPTool("get_item", "Look an item up.", "GET", "/items/{sku}", {"sku": {"type": "string"}}),
    HTTPTool("restock", "Add stock.", "POST", "/items/{sku}/restock",
             {"sku": {"type": "string"}, "amount": {"type": "integer"}}, required=("amount",)),
    HTTPTool("slow", "A slow endpoint.", "GET", "/slow", {"seconds": {"type": "number"}}),
    HTTPTool("crash", "A broken endpoint.", "GET", "/crash"),
]
RESTOCK = ToolTask("restock-a1", "Bring A-1 to 5 in stock.",
                   check=lambda answer, env: env.service.state["items"]["A-1"]["count"] == 5)


def call(name: str, **args) -> Action:
    return Action(tool_calls=[ToolCall(id=f"c-{name}", name=name, arguments=json.dumps(args))])


def outcome_of(env, action) -> dict:
    (outcome,) = env.step(action).info["tool_results"].values()
    return outcome


def test_a_task_solved_through_the_api_passes_its_checker_and_state_resets():
    with HTTPToolEnvironment(TOOLS, service=inventory_service(), timeout_s=1.0) as env:
        assert env.base_url.startswith("http://127.0.0.1:")
        assert {t["function"]["name"] for t in env.tools} == {"get_item", "restock", "slow", "crash"}
        env.reset(RESTOCK)
        looked = outcome_of(env, call("get_item", sku="A-1"))
        assert looked["http_status"] == 200 and '"count": 2' in looked["content"]
        assert outcome_of(env, call("restock", sku="A-1", amount=3))["status"] == "success"
        assert env.step(Action(content="Done")).reward == 1.0
        env.reset(RESTOCK)  # a new episode starts from the initial state
        assert env.service.state["items"]["A-1"]["count"] == 2
        assert env.step(Action(content="Done")).reward == 0.0


def test_http_faults_are_error_observations_with_the_status_recorded():
    with HTTPToolEnvironment(TOOLS, service=inventory_service(), timeout_s=1.0) as env:
        env.reset(RESTOCK)
        missing = outcome_of(env, call("get_item", sku="Z-9"))
        assert missing["status"] == "error" and missing["http_status"] == 404 and "no item Z-9" in missing["content"]
        broken = outcome_of(env, call("crash"))
        assert broken["http_status"] == 500 and "database on fire" in broken["content"]
        slow = outcome_of(env, call("slow", seconds=3))
        assert slow["status"] == "error" and "timed out after 1.0 s" in slow["content"]
        wrong = outcome_of(env, call("restock", sku="A-1", amount="three"))
        assert wrong["status"] == "error" and "must be integer" in wrong["content"]


def test_arguments_cannot_add_path_segments_or_queries():
    with HTTPToolEnvironment(TOOLS, service=inventory_service()) as env:
        env.reset(RESTOCK)
        sneaky = outcome_of(env, call("get_item", sku="../slow?seconds=9"))
        assert sneaky["http_status"] == 404 and "no item ../slow?seconds=9" in sneaky["content"]


def test_a_server_that_is_gone_is_an_error_observation():
    service = inventory_service()
    env = HTTPToolEnvironment(TOOLS, service=service, timeout_s=1.0)
    env.reset(RESTOCK)
    service.stop()
    gone = outcome_of(env, call("get_item", sku="A-1"))
    assert gone["status"] == "error" and "failed" in gone["content"] and gone["http_status"] is None
    env.close()


def test_an_api_already_running_is_used_by_base_url():
    service = inventory_service()
    service.start()
    with HTTPToolEnvironment(TOOLS[:1], base_url=service.url + "/") as env:
        env.reset(ToolTask("look", "Look A-1 up.", check=lambda a, e: "2" in a))
        assert outcome_of(env, call("get_item", sku="A-1"))["http_status"] == 200
    service.stop()


def test_bad_tool_definitions_are_refused():
    with pytest.raises(ValueError, match="HTTPTool.method"):
        HTTPTool("x", "d", "FETCH", "/x")
    with pytest.raises(ValueError, match=r"placeholder\(s\) \['sku'\]"):
        HTTPTool("x", "d", "GET", "/items/{sku}")
    with pytest.raises(ValueError, match="either base_url"):
        HTTPToolEnvironment(TOOLS)

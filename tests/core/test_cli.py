import json
import subprocess
import sys

import pytest

from forge_bridge.app.cli import main
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Observation, Trajectory, Transition


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "t.db"
    with TrajectoryStore(path) as store:
        for i in range(4):
            t = Trajectory(run_id="r", task_id=f"t{i}")
            store.begin(t)
            store.append(t.id, Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                                          action=Action(content="a"), prompt_token_ids=[1],
                                          completion_token_ids=[2], completion_logprobs=[-0.5],
                                          version="r-v1" if i == 3 else None))
            store.finish(t.id, "terminated" if i % 2 else "crashed", reward=float(i % 2))
    return path


def test_export_jsonl_with_filter(db, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    assert main(["export", str(db), str(out), "--status", "complete"]) == 0
    assert "wrote 2 trajectories" in capsys.readouterr().out
    assert all(Trajectory.from_json(l).status == "complete" for l in out.read_text().splitlines())


def test_export_parquet_from_extension(db, tmp_path, capsys):
    assert main(["export", str(db), str(tmp_path / "x.parquet")]) == 0
    assert "wrote 4 transitions" in capsys.readouterr().out


def test_export_filters_by_the_version_that_served_a_step(db, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    assert main(["export", str(db), str(out), "--version", "r-v1"]) == 0
    assert "wrote 1 trajectories" in capsys.readouterr().out
    assert [Trajectory.from_json(line).task_id for line in out.read_text().splitlines()] == ["t3"]
    assert main(["export", str(db), str(out), "--adapter", "r-v1"]) == 0  # its old name, for a release
    printed = capsys.readouterr()
    assert "wrote 1 trajectories" in printed.out and "--adapter (a version) is now --version" in printed.err


def test_export_missing_store_is_a_clear_error(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope.db"), str(tmp_path / "x.jsonl")]) == 2
    assert "no trajectory store" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [[], ["demo"], ["export"], ["serve"], ["gateway"], ["train"], ["eval"], ["merge"],
                                 ["plot"], ["fetch"]])
def test_help_is_available(cmd):
    proc = subprocess.run([sys.executable, "-m", "forge_bridge.app.cli", *cmd, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: forge-bridge" in proc.stdout


def test_the_gateway_command_records_an_openai_sdk_agent_and_prints_what_to_give_it(taught_model_dir, tmp_path):
    import os
    import re
    import signal

    import httpx
    import openai

    from forge_bridge.app import testing
    from forge_bridge.policies.vllm_server import free_port

    port, store = free_port(), tmp_path / "gw.db"
    proc = subprocess.Popen([sys.executable, "-m", "forge_bridge.app.cli", "gateway", "--model",
                             str(taught_model_dir), "--port", str(port), "--store", str(store),
                             "--token", "s3cret"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        printed = "".join(lines)
        assert f"base_url: http://127.0.0.1:{port}/v1" in printed and "export OPENAI_API_KEY=s3cret" in printed
        url = re.search(r"export OPENAI_BASE_URL=(\S+)", printed).group(1).replace("<episode-id>", "e1")
        client = openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0)
        reply = client.chat.completions.create(model="forge", messages=testing.ASK, tools=[testing.ADD_TOOL],
                                               temperature=0, max_tokens=48)
        assert reply.choices[0].message.tool_calls[0].function.name == "add"
        done = httpx.post(url.removesuffix("/v1") + "/finish", json={"reward": 1.0},
                          headers={"Authorization": "Bearer s3cret"})
        assert done.json() == {"id": "e1", "status": "complete", "reward": 1.0, "steps": 1}
    finally:
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0 and "stopped" in rest
    with TrajectoryStore(store) as db:
        (traj,) = db.trajectories()
        assert traj.id == "e1" and traj.transitions[0].has_tokens and traj.reward == 1.0


def test_serve_starts_vllm_with_the_adapter_and_prints_its_url(taught_model_dir, adapter_dirs):
    import os
    import signal

    import httpx

    from forge_bridge.app import testing
    from forge_bridge.policies.vllm_server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "forge_bridge.app.cli", "serve", str(taught_model_dir),
                             "--adapter", str(adapter_dirs["v1"]), "--adapter-name", "tuned",
                             "--port", str(port), "--max-model-len", "1024"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving at"):
                break
        assert lines and lines[-1].startswith(f"serving at http://127.0.0.1:{port}/v1"), "".join(lines)
        base = f"http://127.0.0.1:{port}/v1"
        assert "tuned" in [m["id"] for m in httpx.get(base + "/models").json()["data"]]
        # an ordinary LangChain agent pointed at the printed base_url, as the printed snippet says
        from langchain.agents import create_agent
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        def agent(model: str):
            llm = ChatOpenAI(base_url=base, api_key="unused", model=model, temperature=0, max_tokens=48)
            return create_agent(llm, [add])

        tuned = agent("tuned").invoke({"messages": testing.ASK})["messages"]
        assert tuned[-1].content == "Version one."  # the adapter's own answer
        untuned = agent("base").invoke({"messages": testing.ASK})["messages"]
        assert untuned[1].tool_calls[0]["name"] == "add" and untuned[-1].content == "The answer is 5."
    finally:
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0 and "stopped" in rest


def test_train_command_runs_a_users_rollout_module(taught_model_dir, tmp_path, monkeypatch):

    (tmp_path / "my_agent.py").write_text(
        "TASKS = [{'id': 'a', 'q': 'What is 2 plus 3?'}]\n"
        "def make_rollout(policy):\n"
        "    def rollout(task):\n"
        "        out = policy.chat([{'role': 'user', 'content': task['q']}], max_tokens=8)\n"
        "        return float(len(out.completion_token_ids) % 2)\n"
        "    return rollout\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(["train", "--rollout", "my_agent:make_rollout", "--tasks", "my_agent:TASKS",
                 "--model", str(taught_model_dir), "--iterations", "2", "--group-size", "2",
                 "--out", str(out), "--run-name", "mine"]) == 0
    assert (out / "adapters" / "mine-v2" / "adapter_model.safetensors").is_file()
    assert main(["plot", str(out)]) == 0 and (out / "reward_curve.png").is_file()
    assert main(["train", "--rollout", "my_agent:nope", "--tasks", "my_agent:TASKS"]) == 1
    again = ["train", "--rollout", "my_agent:make_rollout", "--tasks", "my_agent:TASKS",
             "--model", str(taught_model_dir), "--iterations", "1", "--group-size", "2",
             "--out", str(out), "--run-name", "mine"]
    first_run = json.loads((out / "run.json").read_text())["run_id"]
    assert main(again) == 2  # refused: the folder holds a run; nothing mixed in
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert main(again + ["--new"]) == 0  # the earlier run set aside whole, a new one started
    (earlier,) = [p for p in tmp_path.iterdir() if p.name.startswith("run-")]
    assert json.loads((earlier / "run.json").read_text())["run_id"] == first_run
    assert json.loads((out / "run.json").read_text())["run_id"] != first_run
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_config_flags_come_from_the_dataclasses():
    from forge_bridge.app.cli import DEMO_FLAGS, TRAIN_FLAGS, build_parser
    from forge_bridge.app.config_flags import config_kwargs, field_docs
    from forge_bridge.app.demo import DemoConfig
    from forge_bridge.trainer.config import TrainerConfig
    from forge_bridge.trainer.settings import RolloutConfig

    parser = build_parser()
    args = parser.parse_args(["train", "--rollout", "m:r", "--tasks", "m:t"])
    assert config_kwargs(args, TRAIN_FLAGS) == {}  # every default is the dataclass's own
    args = parser.parse_args(["train", "--rollout", "m:r", "--tasks", "m:t", "--group-size", "3",
                              "--out", "x", "--kl-beta", "0.5", "--tasks-per-iteration", "2"])
    assert config_kwargs(args, TRAIN_FLAGS) == {"group_size": 3, "out_dir": "x", "kl_beta": 0.5,
                                                "tasks_per_iteration": 2}
    args = parser.parse_args(["demo", "--seed", "4", "--rl-iterations", "0"])
    assert config_kwargs(args, DEMO_FLAGS) == {"seed": 4, "rl_iterations": 0}
    args = parser.parse_args(["demo", "--demonstrate", "multiply", "multiply_chain"])
    assert config_kwargs(args, DEMO_FLAGS) == {"demonstrate": ("multiply", "multiply_chain")}
    DemoConfig(**config_kwargs(args, DEMO_FLAGS))  # a tuple, as the dataclass wants
    docs = field_docs(TrainerConfig)
    assert field_docs(RolloutConfig)["group_size"] == "Rollouts per task per iteration (GRPO's group)."
    assert docs["gamma"].startswith("Discount over the model calls") and "seed" in field_docs(DemoConfig)
    train_help = parser._subparsers._group_actions[0].choices["train"].format_help()
    assert "Rollouts per task per iteration (GRPO's group). (default: 8)" in " ".join(train_help.split())

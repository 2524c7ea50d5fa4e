"""`forge-bridge train --config run.yaml` (or .json): the file fills the same config, nested as it
is, validated the same way; flags override it; an unknown key is named with the keys allowed."""

import json

import pytest

from forge_bridge.app.cli import main
from forge_bridge.policies import models

AGENT = ("TASKS = [{'id': 'a'}]\n"
         "def make_rollout(policy):\n"
         "    def rollout(task):\n"
         "        out = policy.chat([{'role': 'user', 'content': 'hi'}], max_tokens=4)\n"
         "        return float(len(out.completion_token_ids) % 2)\n"
         "    return rollout\n")

YAML = """\
# a run as a user writes it
rollout:
  group_size: 4
optimizer: {lr: 1e-4, epochs: 2}
lora: {rank: 4, targets: [q_proj, v_proj]}
run:
  name: fromfile
  report_to: []
gamma: 0.9
"""


@pytest.fixture
def agent(tmp_path, monkeypatch):
    (tmp_path / "my_agent.py").write_text(AGENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = models.save(*models.tiny(), tmp_path / "tiny")
    return ["train", "--rollout", "my_agent:make_rollout", "--tasks", "my_agent:TASKS", "--model", str(model),
            "--iterations", "1", "--no-probe"]


def test_train_reads_a_yaml_file_and_the_flags_override_it(agent, tmp_path):
    (tmp_path / "run.yaml").write_text(YAML)
    out = tmp_path / "run"
    assert main([*agent, "--config", str(tmp_path / "run.yaml"), "--group-size", "2", "--out", str(out)]) == 0
    config = json.loads((out / "trainer.json").read_text())["config"]
    assert config["rollout"]["group_size"] == 2  # the flag, over the file's 4
    assert config["optimizer"] == {**config["optimizer"], "lr": 1e-4, "epochs": 2}  # 1e-4 read as a number
    assert config["lora"]["rank"] == 4 and config["lora"]["targets"] == ["q_proj", "v_proj"]
    assert config["run"]["name"] == "fromfile" and config["run"]["report_to"] == [] and config["gamma"] == 0.9
    assert config["run"]["out_dir"] == str(out) and config["loss"]["kl_beta"] == 0.1  # the rest: the defaults
    assert (out / "adapters" / "fromfile-v1").is_dir() and not (out / "tb").exists()


def test_a_json_file_is_read_the_same_way_and_checked_the_same_way(agent, tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps({"run": {"name": "j", "out_dir": str(tmp_path / "j")},
                                                   "optimizer": {"lr": 2e-4}}))
    assert main([*agent, "--config", str(tmp_path / "run.json")]) == 0
    assert json.loads((tmp_path / "j" / "trainer.json").read_text())["config"]["optimizer"]["lr"] == 2e-4
    (tmp_path / "bad.json").write_text(json.dumps({"rollout": {"group_size": 0}}))
    assert main([*agent, "--config", str(tmp_path / "bad.json")]) == 1
    assert "group_size: expected an int >= 1, got 0" in capsys.readouterr().err  # the dataclass's own check


@pytest.mark.parametrize("text, named", [
    ("learning_rate: 0.1\n", "unknown key 'learning_rate'; GRPOConfig takes baseline, credit, "),
    ("optimizer: {lrr: 0.1}\n", "optimizer: unknown key 'lrr'; OptimizerConfig takes bf16, device, epochs, "),
    ("run: fast\n", "run is a section of settings (name, out_dir, seed, progress, report_to)"),
    ("- a list\n", "expected a mapping of settings, got list"),
    ("lam: 0.9\n", "unknown key 'lam'"),  # PPO's, not GRPO's
])
def test_an_unknown_key_is_named_with_the_allowed_ones(agent, tmp_path, capsys, text, named):
    (tmp_path / "run.yaml").write_text(text)
    assert main([*agent, "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "never")]) == 1
    assert named in capsys.readouterr().err
    assert not (tmp_path / "never").exists()  # refused before anything started


def test_a_missing_file_or_another_format_is_a_clear_error(agent, tmp_path, capsys):
    assert main([*agent, "--config", str(tmp_path / "nope.yaml")]) == 1
    assert "--config: no such file" in capsys.readouterr().err
    (tmp_path / "run.toml").write_text("")
    assert main([*agent, "--config", str(tmp_path / "run.toml")]) == 1
    assert "expected a .yaml, .yml or .json file" in capsys.readouterr().err

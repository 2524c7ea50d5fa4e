"""The examples run as a user would run them, on the embedded model, and record what they say they
record; the README's Python runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import forge_bridge as fb

ROOT = Path(__file__).resolve().parents[2]


def test_the_langchain_example_runs_and_records_its_episodes(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "langchain_agent.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[mul] What is 1234 times 5678?" in proc.stdout and "[pop] How many people live in Berlin?" in proc.stdout
    with fb.TrajectoryStore(tmp_path / "runs" / "examples" / "langchain.db") as store:
        stored = store.trajectories(run_id="langchain-example")
    assert sorted(t.task_id for t in stored) == ["mul", "pop"]
    assert all(t.end_reason is not None and t.transitions and t.transitions[0].completion_token_ids for t in stored)


def test_the_crewai_example_runs_and_records_one_trajectory_per_role(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "crewai_crew.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "crew answer:" in proc.stdout and "[researcher]" in proc.stdout and "[writer]" in proc.stdout
    with fb.TrajectoryStore(tmp_path / "runs" / "examples" / "crewai.db") as store:
        roles = {t.role for t in store.trajectories(run_id="crewai-example") if t.transitions}
    assert roles == {"researcher", "writer"}


def test_the_production_loop_example_serves_every_request_and_gates_each_candidate(tmp_path):
    import json

    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "production_loop.py"), "--requests", "24",
                           "--train-every", "12", "--delay", "3", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["dropped"] == 0 and len(summary["success_by_block"]) == 2
    assert [v for _, v in summary["events"]] == ["prod-v1", "prod-v2"]  # each candidate went through the gate
    assert {k for k, _ in summary["events"]} <= {"promoted", "refused", "rolled back"}
    assert "request 12: trained prod-v1 on 9 requests with feedback (3 still waiting)" in proc.stdout
    with fb.TrajectoryStore(tmp_path / "production.db") as store:
        assert store.count(run_id="production") == 24
        assert len(store.feedback()) == 21  # the last 3 users have not answered yet


def readme_python() -> str:
    """Every Python block of the README, in order: together they are one program."""
    return "\n".join(part.split("```")[0] for part in (ROOT / "README.md").read_text().split("```python\n")[1:])


def test_the_readmes_python_runs_as_written(tmp_path):
    """The README's blocks, run as a user would paste them into one file: the LangChain agent,
    two GRPO iterations on it, and a CrewAI crew on the same policy."""
    code = readme_python()
    assert "create_agent" in code and "trainer.train" in code and "crew.kickoff" in code
    (tmp_path / "readme.py").write_text(code)
    env = {**os.environ, "HOME": str(tmp_path), "CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true",
           "CREWAI_TRACING_ENABLED": "false", "CREWAI_DISABLE_VERSION_CHECK": "true",
           "XDG_DATA_HOME": str(tmp_path / "data")}
    proc = subprocess.run([sys.executable, "readme.py"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    printed = [line.split() for line in proc.stdout.splitlines() if line.startswith(("1 ", "2 "))]
    assert [row[0] for row in printed] == ["1", "2"] and [row[-1] for row in printed] == ["mine-v1", "mine-v2"]
    assert (tmp_path / "runs" / "mine" / "adapters" / "mine-v2").is_dir()
    with fb.TrajectoryStore(tmp_path / "runs" / "mine" / "trajectories.db") as store:
        episodes = store.trajectories()
    assert len(episodes) == 2 * 2 * 4  # iterations x tasks x group size, each recorded
    assert all(t.transitions and t.transitions[0].completion_token_ids for t in episodes)
    with fb.TrajectoryStore(tmp_path / "runs" / "crew" / "trajectories.db") as store:
        assert {t.role for t in store.trajectories() if t.transitions} == {"writer"}


def test_every_public_name_the_readme_uses_is_exported():
    text = (ROOT / "README.md").read_text()
    used = set(re.findall(r"\bfb\.([A-Za-z_]+)", text))
    assert {"LocalPolicy", "GRPOTrainer", "GRPOConfig", "OptimizerConfig", "episode", "Recorder"} <= used
    assert used <= set(fb.__all__), used - set(fb.__all__)
    assert len(text.splitlines()) <= 250  # a guide; the experiment logs live under docs/

"""The README's LangChain block is an excerpt of examples/langchain_agent.py: the script runs as a
user would run it, on the embedded model, and records what it says it records."""

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


def readme_blocks() -> list[tuple[str, str]]:
    """Each Python block of the README with the paragraph that follows it."""
    parts = (ROOT / "README.md").read_text().split("```python\n")[1:]
    return [(part.split("```")[0], part.split("```", 1)[1].strip().split("\n\n")[0]) for part in parts]


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_every_python_block_of_the_readme_is_an_excerpt_of_a_file_the_tests_run():
    tests = " ".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    blocks = readme_blocks()
    assert len(blocks) >= 4
    for block, after in blocks:
        named = re.match(r"\(an excerpt of `([^`]+)`", after)
        assert named, f"say which file this README block is an excerpt of:\n{block}"
        path = ROOT / named.group(1)
        source = squeeze(path.read_text())
        assert path.parent.name == "tests" or path.parent.parent.name == "tests" or path.name in tests, \
            f"{path.name}: no test runs it"
        for line in block.splitlines():
            code = line.split("  #")[0].split("   #")[0].strip()
            if not code or code.startswith("#"):
                continue
            code = re.sub(r",?\s*\.\.\.\)*$", "", code)  # "f(a, ...)": the rest of the call is elided
            assert squeeze(code) in source, f"README line not in {named.group(1)}: {line}"

"""The README's LangChain block is an excerpt of examples/langchain_agent.py: the script runs as a
user would run it, on the embedded model, and records what it says it records."""

from __future__ import annotations

import os
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


def test_the_readme_names_only_excerpts_the_tests_run():
    readme = (ROOT / "README.md").read_text()
    excerpt = readme.split("ForgeMiddleware(policy, temperature=0.7, max_tokens=96)")[1].split("```")[0]
    example = (ROOT / "examples" / "langchain_agent.py").read_text()
    for line in (l.strip() for l in excerpt.splitlines() if l.strip() and not l.strip().startswith("#")):
        assert line.rstrip(")]") in example or line in example, f"README line not in the example: {line}"

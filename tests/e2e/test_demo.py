"""`forge-bridge demo` end to end on the embedded model, as `make demo` runs it."""

import subprocess
import sys

from forge_bridge.store import TrajectoryStore


def test_demo_records_a_real_model_call(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "forge_bridge.cli", "demo", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stored trajectory" in proc.stdout
    with TrajectoryStore(tmp_path / "trajectories.db") as store:
        (traj,) = store.trajectories(run_id="demo")
    step = traj.transitions[0]
    assert step.has_tokens and len(step.completion_logprobs) == len(step.completion_token_ids)
    assert all(lp <= 0 for lp in step.completion_logprobs)
    assert (tmp_path / "trajectories.jsonl").read_text().count("\n") == 1

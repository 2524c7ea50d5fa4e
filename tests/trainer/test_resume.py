"""A training process killed with SIGKILL in the middle of an update resumes with
`resume=True`, finishes the run, and the store still holds every trajectory."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from forge_bridge.core.store import TrajectoryStore

import training_task

SCRIPT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    import training_task
    import forge_bridge as fb
    from forge_bridge.trainer.grpo import GRPOTrainer

    policy = fb.LocalPolicy({model!r})
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, lr=3e-3, out_dir={out!r},
                                                   run_name="crash", progress=False, max_staleness={staleness}))
    prepare = trainer.prepare

    def slow_prepare(groups):  # the update phase of an iteration begins here
        print(f"UPDATING {{trainer.iteration + 1}}", flush=True)
        if {kill_at} == trainer.iteration + 1:
            time.sleep(60)  # the parent kills us here, mid-update
        return prepare(groups)

    trainer.prepare = slow_prepare
    trainer.train(training_task.make_rollout(training_task.agent_for(policy)), training_task.TASKS,
                  iterations=3, resume={resume})
    print("DONE", trainer.iteration, policy.current(), flush=True)
""")


def run(tmp: Path, model: str, kill_at: int, resume: bool, staleness: int = 0) -> subprocess.Popen:
    code = SCRIPT.format(tests=str(Path(__file__).parent), model=model, out=str(tmp / "run"),
                         kill_at=kill_at, resume=resume, staleness=staleness)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


@pytest.mark.parametrize("staleness", [0, 1], ids=["synchronous", "rollouts-ahead"])
def test_sigkill_mid_update_then_resume_finishes_the_run(tmp_path, staleness):
    """With `max_staleness=1` the kill also lands while iteration 3's rollouts run ahead: those
    episodes stay stored, excluded with iteration 2's, and the resumed run collects both again."""
    model = training_task.choice_model(tmp_path / "model")
    proc = run(tmp_path, model, kill_at=2, resume=False, staleness=staleness)
    for line in proc.stdout:
        if line.startswith("UPDATING 2"):
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    run_dir = tmp_path / "run"
    assert (run_dir / "checkpoints" / "latest").read_text() == "it-00001"
    with TrajectoryStore(run_dir / "trajectories.db") as store:
        recorded_before_kill = store.count()
    # two iterations of 4 rollouts, all kept (and with rollouts ahead, whatever of iteration 3 had begun)
    assert recorded_before_kill == 8 if not staleness else 8 <= recorded_before_kill <= 12

    proc = run(tmp_path, model, kill_at=0, resume=True, staleness=staleness)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert out.splitlines()[-1] == "DONE 3 crash-v3"
    assert [l for l in out.splitlines() if l.startswith("UPDATING")] == ["UPDATING 2", "UPDATING 3"]
    metrics = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "latest").read_text() == "it-00003"
    with TrajectoryStore(run_dir / "trajectories.db") as store:
        # Nothing recorded before the kill was lost; iterations 2 (and 3) ran their rollouts again.
        assert store.count() == recorded_before_kill + 8
        ended = store.count(status="complete") + store.count(status="failed")
        assert ended == store.count() if not staleness else ended >= store.count() - (recorded_before_kill - 8)
        trained = [t for t in store.iter() if t.excluded is None]
        assert sorted(t.metadata["iteration"] for t in trained) == [1] * 4 + [2] * 4 + [3] * 4
    assert not list((run_dir / "adapters").glob(".*")), "a half-written adapter folder was left"

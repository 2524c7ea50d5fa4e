"""Training faults: SIGKILL during the rollouts and while an adapter is being written; the run
resumes with `resume=True`, a half-written adapter is never published or left behind, and a
corrupt adapter file is refused while the live version keeps serving. (SIGKILL during the
update: tests/trainer/test_resume.py.)"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import forge_bridge as fb
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.base import check_adapter_dir

TRAINER_TESTS = Path(__file__).parent.parent / "trainer"

SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import training_task
    import forge_bridge as fb

    policy = fb.LocalPolicy({model!r})
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, lr=3e-3, out_dir={out!r},
                                                   run_name="crash", progress=False, concurrency=1))
    rollout = training_task.make_rollout(training_task.agent_for(policy))
    calls = {{"n": 0}}

    def hooked_rollout(task):
        calls["n"] += 1
        if {point!r} == "rollout" and trainer.iteration == 1 and calls["n"] == 6:
            print("IN ROLLOUT", flush=True)  # iteration 2: one rollout done, the next one begun
            time.sleep(60)
        return rollout(task)

    save = trainer.model.save_pretrained

    def hooked_save(path, **kwargs):
        save(path, **kwargs)
        if {point!r} == "adapter" and "adapters" in str(path) and trainer.iteration == 1:
            print("WRITING ADAPTER", flush=True)  # files written to the temporary folder, not renamed
            time.sleep(60)

    trainer.model.save_pretrained = hooked_save
    trainer.train(hooked_rollout, training_task.TASKS, iterations=3, resume={resume})
    print("DONE", trainer.iteration, policy.current(), flush=True)
""")


@pytest.fixture(scope="module")
def choice_model(tmp_path_factory):
    sys.path.insert(0, str(TRAINER_TESTS))
    import training_task

    return training_task.choice_model(tmp_path_factory.mktemp("choice") / "model")


def start(run_dir: Path, model: str, point: str, resume: bool) -> subprocess.Popen:
    code = SCRIPT.format(tests=str(TRAINER_TESTS), model=model, out=str(run_dir), point=point, resume=resume)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def kill_at(proc: subprocess.Popen, marker: str) -> None:
    for line in proc.stdout:
        if line.startswith(marker):
            break
    else:
        raise AssertionError(f"the run ended before {marker!r}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def resume_to_the_end(run_dir: Path, model: str) -> list[str]:
    proc = start(run_dir, model, point="none", resume=True)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert out.splitlines()[-1] == "DONE 3 crash-v3"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2, 3]
    return out.splitlines()


@pytest.mark.parametrize("point, marker", [("rollout", "IN ROLLOUT"), ("adapter", "WRITING ADAPTER")])
def test_sigkill_then_resume_completes_and_never_publishes_half_an_adapter(point, marker, choice_model, tmp_path):
    run_dir = tmp_path / "run"
    kill_at(start(run_dir, choice_model, point, resume=False), marker)

    adapters = run_dir / "adapters"
    assert sorted(p.name for p in adapters.iterdir() if not p.name.startswith(".")) == ["crash-v1"]
    with TrajectoryStore(run_dir / "trajectories.db") as store:
        before = {t.id: t.status for t in store.trajectories()}
    # iteration 1's four, plus iteration 2's: one finished and one begun when killed / all four
    expected_before = 6 if point == "rollout" else 8
    assert len(before) == expected_before

    resume_to_the_end(run_dir, choice_model)
    assert sorted(p.name for p in adapters.iterdir()) == ["crash-v1", "crash-v2", "crash-v3"]  # no temp left
    for version in adapters.iterdir():
        check_adapter_dir(version)  # each published adapter is whole
    with TrajectoryStore(run_dir / "trajectories.db") as store:
        after = {t.id: t for t in store.trajectories()}
    assert set(before) <= set(after)  # nothing recorded before the kill was lost
    assert len(after) == expected_before + 8  # the interrupted iteration ran its rollouts again
    if point == "rollout":  # the episode the kill interrupted stays, marked incomplete
        assert [t.status for t in after.values()].count("incomplete") == 1


def test_a_corrupt_adapter_is_refused_and_the_live_version_keeps_serving(taught_model_dir, adapter_dirs, tmp_path):
    from forge_bridge.app import testing

    policy = fb.LocalPolicy(str(taught_model_dir))
    policy.load_adapter(adapter_dirs["v1"], "v1")
    served = policy.chat(testing.ASK, [testing.ADD_TOOL], temperature=0).text
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for f in Path(adapter_dirs["v2"]).iterdir():
        (corrupt / f.name).write_bytes(f.read_bytes())
    weights = corrupt / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # cut mid-write
    with pytest.raises(fb.AdapterError):
        policy.load_adapter(corrupt, "v2-corrupt")
    assert policy.current() == "v1" and "v2-corrupt" not in policy.versions()
    assert policy.chat(testing.ASK, [testing.ADD_TOOL], temperature=0).text == served == "Version one."
    policy.close()

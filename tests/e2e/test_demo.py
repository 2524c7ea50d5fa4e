"""The demo pipeline end to end at a tiny scale (tiny model, a few tasks), as CI can afford:
base -> demonstrations -> SFT -> GRPO -> evaluation, through a real LangChain agent."""

import json
import subprocess
import sys

from forge_bridge.core.store import TrajectoryStore


def test_demo_pipeline_runs_end_to_end(quick_demo):
    out, proc = quick_demo
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "held-out success rate, greedy (6 tasks)" in proc.stdout
    assert "lookup_multiply (2)" in proc.stdout and "wall time per phase" in proc.stdout
    summary = json.loads((out / "results.json").read_text())
    assert list(summary["results"]) == ["base", "SFT", "SFT+RL"] == list(summary["validation"])
    assert "validation tasks, where the settings were chosen: base" in proc.stdout
    assert summary["config"]["distill_beta"] == 1.0 and "teacher SFT" in summary["timings_s"]
    # demo-sft from SFT, v1-v2 from two GRPO iterations; validation (at the start and after the
    # last iteration) picks which one is served at the end, never one below the warm start
    (best,) = [e for line in (out / "events.jsonl").read_text().splitlines()
               for e in [json.loads(line)] if e["event"] == "best_on_validation"]
    assert set(best["scores"]) == {"0", "2"} and best["iteration"] in (0, 2)
    assert best["scores"][str(best["iteration"])] == max(best["scores"].values())
    assert best["scores"]["2"] > best["scores"]["0"] or best["iteration"] == 0  # a tie keeps the start
    live = {0: "demo-sft", 2: "demo-v2"}[best["iteration"]]
    assert summary["version"] == best["versions"]["default"] == live
    assert summary["sft"]["sft_loss_last"] < summary["sft"]["sft_loss_first"]
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert (out / "adapters" / "demo-v2" / "adapter_model.safetensors").is_file()
    assert list((out / "tb").iterdir())
    with TrajectoryStore(out / "trajectories.db") as store:
        assert store.count(run_id="demonstrations", status="complete") == 12
        # held-out under eval-*, where the inspector reads held-out scores; validation apart
        assert store.count(run_id="eval-base") == store.count(run_id="eval-rl") == 6
        assert store.count(run_id="validation-base") == store.count(run_id="validation-rl") == 6
        held_out = {t.task_id for t in store.trajectories(run_id="eval-rl")}
        assert held_out.isdisjoint(t.task_id for t in store.trajectories(run_id="validation-rl"))
        run_id = json.loads((out / "run.json").read_text())["run_id"]
        assert run_id.startswith("demo-")
        every = store.trajectories(run_id=run_id)
        rl = [t for t in every if t.behaviour == "policy"]
        guides = [t for t in every if t.behaviour == "guide"]  # the demo's default: guided groups, the guides
        # rolled out by the teacher adapter, which also scores every sampled token (distillation)
        iterations = [m for line in (out / "metrics.jsonl").read_text().splitlines()
                      for m in [json.loads(line)] if "time_rollout_s" in m]
        used, missing = (sum(m[key] for m in iterations) for key in ("guide_trajectories", "guides_missing"))
        assert len(iterations) == 2 and "val/success" in iterations[-1]
        assert used <= len(guides) <= used + missing  # a failed guide rollout is kept
        assert all(m["distill_unscored_steps"] == 0 and m["distill_log_ratio"] != 0 for m in iterations)
        assert {g.transitions[0].version for g in guides} <= {"teacher-sft"}
        assert len(rl) + len(guides) == len(every) and len(rl) == 2 * 3 * 4
        assert {t.transitions[0].version for t in rl} >= {"demo-sft"}
        for it in (1, 2):  # each iteration: one task of each kind, a group of 4 rollouts each
            kinds = sorted(t.task_id.rsplit("-", 1)[0] for t in rl if t.metadata["iteration"] == it)
            assert kinds == sorted(["multiply", "lookup", "lookup_multiply"] * 4)
        (final,) = store.trajectories(run_id="final")
        assert final.transitions[0].version == live
        assert store.count(run_id=f"{run_id}-val-0") == store.count(run_id=f"{run_id}-val-2") == 6
    assert f"the live agent, on {live}" in proc.stdout


def test_demo_with_no_grpo_iteration_reports_sft_alone_on_the_kinds_demonstrated(taught_model_dir, tmp_path):
    out = tmp_path / "sft-only"
    proc = subprocess.run([sys.executable, "-m", "forge_bridge.app.cli", "demo", "--quick", "--rl-iterations",
                           "0", "--sft-epochs", "2", "--model", str(taught_model_dir), "--out", str(out),
                           "--demonstrate", "multiply", "multiply_chain", "lookup_and_multiply"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "results.json").read_text())
    assert list(summary["results"]) == ["base", "SFT"] and "GRPO" not in summary["timings_s"]
    assert summary["config"]["sft_epochs"] == 2 and summary["version"] == "demo-sft"
    assert "reward curve" not in proc.stdout and not (out / "reward_curve.png").exists()
    assert "the live agent, on demo-sft" in proc.stdout
    assert summary["config"]["demonstrate"] == ["multiply", "multiply_chain", "lookup_and_multiply"]
    with TrajectoryStore(out / "trajectories.db") as store:  # 4 of each kind named, none of the others
        shown = sorted(t.task_id.rsplit("-", 1)[0] for t in store.trajectories(run_id="demonstrations"))
    assert shown == sorted(["multiply", "multiply_chain", "lookup_and_multiply"] * 4)


def test_demo_distils_from_a_teacher_adapter_trained_on_every_demonstration(taught_model_dir, tmp_path):
    out = tmp_path / "distil"
    proc = subprocess.run([sys.executable, "-m", "forge_bridge.app.cli", "demo", "--quick", "--rl-iterations", "1",
                           "--guide", "none", "--distill-beta", "0.5", "--multi-step-demos", "1",
                           "--model", str(taught_model_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with TrajectoryStore(out / "trajectories.db") as store:
        student = [t.task_id for t in store.trajectories(run_id="demonstrations")]
        extra = [t.task_id for t in store.trajectories(run_id="teacher-demonstrations")]
    # the student saw 1 of the 4 two-step tasks; the teacher is taught the other 3 too, and nothing twice
    assert sum(i.startswith("lookup_multiply") for i in student) == 1
    assert sorted(i.rsplit("-", 1)[0] for i in extra) == ["lookup_multiply"] * 3 and not set(extra) & set(student)
    assert (out / "teacher" / "adapters" / "teacher-sft" / "adapter_model.safetensors").is_file()
    (it,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert it["distill_unscored_steps"] == 0 and it["distill_log_ratio"] != 0  # every step scored by the teacher
    summary = json.loads((out / "results.json").read_text())
    assert summary["config"]["distill_beta"] == 0.5 and "teacher SFT" in summary["timings_s"]
    assert "teacher-sft scores the student's tokens" in proc.stdout


def test_a_new_run_sets_the_earlier_one_aside(tmp_path):
    from forge_bridge.core.runs import set_aside

    out = tmp_path / "demo"
    assert set_aside(out) is None
    out.mkdir()
    assert set_aside(out) is None  # empty: nothing to keep
    (out / "metrics.jsonl").write_text("{}\n")
    first = set_aside(out)
    assert not out.exists() and (first / "metrics.jsonl").read_text() == "{}\n"
    out.mkdir()
    (out / "x").write_text("y")
    second = set_aside(out)
    assert second != first and (second / "x").is_file() and first.is_dir()

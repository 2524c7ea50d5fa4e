"""The template a user copies (examples/own_agent/): demonstrations through their own agent ->
warm start with its held-out check -> probe -> GRPO -> held-out check -> serve back, run as the
user runs it, at tiny size. Also the command-line route over the same agent module: `probe`,
`sft`, then `train --resume` from the warm start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forge_bridge as fb

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own_agent"


def test_the_own_agent_template_runs_start_to_finish(taught_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--model", str(taught_model_dir),
                           "--iterations", "2", "--group-size", "2", "--tasks-per-iteration", "2", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, env={**os.environ})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["demonstrations"] == 12 and results["held_out"] == 16  # every demo plan passed the checker
    assert set(results["base"]) == set(results["sft"]) == set(results["rl"]) == {"rate", "convert"}
    assert results["version"] == "own-v2" and set(results["probe"]) == {"rate", "convert"}
    assert "held-out check of the warm start, greedy (16 tasks)" in proc.stdout
    assert "signal probe, 4 rollouts of each training task:" in proc.stdout
    assert f"forge-bridge serve {taught_model_dir} --adapter {out}/adapters/own-v2" in proc.stdout
    for version in ("own-sft", "own-v1", "own-v2"):
        assert (out / "adapters" / version / "adapter_model.safetensors").is_file()
    with fb.TrajectoryStore(out / "trajectories.db") as store:
        demos = fb.read_demonstrations(store)
        assert len(demos) == 12 and {t.metadata["kind"] for t in demos} == {"rate", "convert"}
        convert = next(t for t in demos if t.metadata["kind"] == "convert")
        assert [c.name for s in convert.transitions for c in s.action.tool_calls] == ["lookup_rate", "multiply"]
        runs = {t.run_id for t in store.trajectories()}
        assert {"demonstrations"} < runs and any(r.endswith("-check-base") for r in runs)
        assert any(r.endswith("-probe") for r in runs) and any(r.endswith("-check-rl") for r in runs)


def test_the_command_line_warm_starts_probes_and_continues_with_rl(taught_model_dir, tmp_path, monkeypatch):
    from forge_bridge.app.cli import main

    monkeypatch.syspath_prepend(str(EXAMPLE))
    out, model = tmp_path / "run", str(taught_model_dir)
    agent = ["--rollout", "agent:make_rollout", "--model", model]
    assert main(["sft", *agent, "--tasks", "agent:DEMOS", "--demos", "tasks", "--held-out", "agent:HELD_OUT",
                 "--sft-epochs", "1", "--out", str(out), "--run-name", "own"]) == 0
    assert (out / "adapters" / "own-sft" / "adapter_model.safetensors").is_file()
    # the console script, run from the agent's folder as a user would: its modules are found there
    proc = subprocess.run([str(Path(sys.executable).parent / "forge-bridge"), "probe", *agent, "--tasks", "agent:TASKS",
                           "--adapter", str(out / "adapters" / "own-sft"), "--group-size", "2",
                           "--store", str(tmp_path / "probe.db")],
                          cwd=EXAMPLE, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("signal probe (2 rollout(s) of each of the 20 tasks, on ")[1]
    assert "rate " in table and "convert " in table and "no-spread groups" in table
    assert main(["train", *agent, "--tasks", "agent:TASKS", "--resume", "--iterations", "1", "--group-size", "2",
                 "--tasks-per-iteration", "2", "--out", str(out), "--run-name", "own"]) == 0
    assert (out / "adapters" / "own-v1" / "adapter_model.safetensors").is_file()
    events = [json.loads(line)["event"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert events == ["sft"]  # a resumed run is not probed again
    assert main(["probe", *agent, "--tasks", "agent:TASKS", "--kind-key", "level", "--store",
                 str(tmp_path / "p2.db")]) == 1  # no task has a 'level': a clear error, exit 1

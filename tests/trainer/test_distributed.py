"""The update on two processes (gloo on this CPU): DDP and FSDP2 under torchrun, DDP under Ray
Train, against one process on the same samples; an uneven split; a rank killed mid-update, and
resuming with another world size than the one that saved."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument, InvalidState, Unsupported
from forge_bridge.trainer import distributed

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import training_task  # noqa: E402

JOB = HERE / "distributed_job.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # what torchrun gives each rank; the lone run too, for like numbers


def job(model, out, *flags, nproc: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    """distributed_job.py alone (nproc 1) or on `nproc` ranks under torchrun."""
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                 f"--nproc-per-node={nproc}"]
    proc = subprocess.run([*launch, str(JOB), "--model", str(model), "--out", str(out), *flags], env=ENV,
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def adapter(out, version: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(out) / "adapters" / f"dist-{version}" / "adapter_model.safetensors"))


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(alone, spread, versions=("v1", "v2")) -> None:
    """The same adapters (within 1e-5) and the same logged loss and KL, iteration by iteration."""
    for version in versions:
        a, b = adapter(alone, version), adapter(spread, version)
        assert a.keys() == b.keys()
        assert max(float(t.abs().max()) for t in a.values()) > 1e-3  # the update moved something
        for name in a:
            torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=0)
    for x, y in zip(metrics(alone), metrics(spread)):
        assert x["batch_trained_tokens"] == y["batch_trained_tokens"] > 0  # the same samples
        for key in ("loss", "kl", "grad_norm"):
            assert y[key] == pytest.approx(x[key], rel=1e-4, abs=1e-7), key


@pytest.fixture(scope="module")
def choice_dir(tmp_path_factory):
    return training_task.choice_model(tmp_path_factory.mktemp("choice") / "model")


@pytest.fixture(scope="module")
def alone(choice_dir, tmp_path_factory):
    """Two iterations in one process: what every spread run must equal."""
    out = tmp_path_factory.mktemp("alone") / "run"
    job(choice_dir, out)
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_publish_the_weights_one_process_does(choice_dir, alone, tmp_path, strategy):
    job(choice_dir, tmp_path / "run", "--strategy", strategy, nproc=2)
    assert_same_run(alone, tmp_path / "run")
    last = metrics(tmp_path / "run")[-1]
    assert last["world_size"] == 2 and last["rank_tokens_min"] > 0  # both ranks took a share
    assert "world_size" not in metrics(alone)[-1]


def test_an_uneven_split_gives_the_same_weights(choice_dir, tmp_path):
    job(choice_dir, tmp_path / "alone", "--microbatch", "3")  # 8 samples: microbatches of 3, 3 and 2
    job(choice_dir, tmp_path / "run", "--strategy", "ddp", "--microbatch", "3", nproc=2)
    assert_same_run(tmp_path / "alone", tmp_path / "run")
    last = metrics(tmp_path / "run")[-1]
    assert last["rank_tokens_max"] > 1.3 * last["rank_tokens_min"] > 0  # one rank ran two of the three


def test_a_rank_killed_mid_update_fails_the_iteration_and_the_run_resumes_alone(choice_dir, alone, tmp_path):
    out = tmp_path / "run"
    proc = job(choice_dir, out, "--strategy", "fsdp", "--kill-at", "2", nproc=2, check=False)
    assert proc.returncode != 0
    assert sorted(p.name for p in (out / "adapters").iterdir()) == ["dist-v1"]  # no half-written v2
    assert (out / "checkpoints" / "latest").read_text().strip() == "it-00001"
    assert [m["iteration"] for m in metrics(out)] == [1]
    job(choice_dir, out, "--resume")  # one process resumes what two saved (a sharded run's checkpoint)
    assert [m["iteration"] for m in metrics(out)] == [1, 2]
    assert_same_run(alone, out)


def test_two_processes_resume_what_one_saved(choice_dir, alone, tmp_path):
    out = tmp_path / "run"
    job(choice_dir, out, "--iterations", "1")
    job(choice_dir, out, "--strategy", "ddp", "--resume", nproc=2)
    assert [m["iteration"] for m in metrics(out)] == [1, 2]
    assert metrics(out)[-1]["world_size"] == 2
    assert_same_run(alone, out)


def test_rollouts_run_ahead_while_two_processes_update(choice_dir, tmp_path):
    job(choice_dir, tmp_path / "run", "--strategy", "ddp", "--iterations", "3", "--staleness", "1", nproc=2)
    runs = metrics(tmp_path / "run")
    assert [m["iteration"] for m in runs] == [1, 2, 3] and runs[-1]["world_size"] == 2
    assert all(m["stale_dropped"] == 0 and m["staleness_max"] <= 1 and m["batch_trained_tokens"] > 0 for m in runs)


def test_ray_train_runs_the_same_update(choice_dir, alone, tmp_path):
    import ray  # installed by make test (the [ray] extra): missing, this test fails rather than skips
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    import distributed_job

    ray.init(num_cpus=3, include_dashboard=False, runtime_env={"env_vars": {
        "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": "1"}})
    try:
        TorchTrainer(distributed_job.ray_loop,
                     train_loop_config={"model": str(choice_dir), "out": str(tmp_path / "run"), "strategy": "ddp"},
                     scaling_config=ScalingConfig(num_workers=2, use_gpu=False), torch_config=TorchConfig(backend="gloo"),
                     run_config=RunConfig(storage_path=str(tmp_path / "ray"), name="update")).fit()
    finally:
        ray.shutdown()
    assert metrics(tmp_path / "run")[-1]["world_size"] == 2
    assert_same_run(alone, tmp_path / "run")


# ------------------------------------------------------------------ by hand, in one process
def test_assign_shares_microbatches_by_tokens():
    assert distributed.assign([5, 9, 2, 7], 2) == [[1, 2], [0, 3]]  # 9+2 = 11 against 7+5 = 12
    assert distributed.assign([4, 4, 4], 2) == [[0, 2], [1]]
    assert distributed.assign([3], 2) == [[0], []]  # a rank with nothing runs a filler


def test_the_config_is_checked_and_a_lone_process_runs_as_usual(monkeypatch):
    with pytest.raises(InvalidArgument, match="strategy"):
        fb.Distributed(strategy="zero3")
    with pytest.raises(InvalidArgument, match="offload"):
        fb.Distributed(offload=True)  # DDP has nothing to offload
    with pytest.raises(InvalidArgument, match="distributed"):
        fb.GRPOConfig(distributed="ddp")
    with pytest.raises(InvalidArgument, match="value head"):
        fb.PPOConfig(distributed=fb.Distributed())
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert isinstance(distributed.join(fb.Distributed()), distributed.Alone)
    assert isinstance(distributed.join(None), distributed.Alone)
    assert distributed.leader()


def test_what_would_change_the_leader_alone_is_refused_once_spread(tmp_path):
    from forge_bridge.policies import models

    model = models.save(*models.tiny(), tmp_path / "tiny")
    policy = fb.ScriptedPolicy([], models.load_tokenizer(model))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(out_dir=str(tmp_path / "run"), progress=False), model=str(model))
    ranks = object.__new__(distributed.Ranks)  # a job's leader past its first update, without the job
    ranks.spread, ranks.leader, ranks.failed = True, True, None
    trainer.ranks = ranks
    for call in (trainer.resume, trainer.freeze_reference, lambda: fb.sft(trainer, [])):
        with pytest.raises(Unsupported, match="first distributed update"):
            call()
    ranks.failed = "Connection closed by peer"
    with pytest.raises(InvalidState, match="restart the job"):
        ranks.check_usable()


def test_the_command_line_spreads_the_update_with_nproc(choice_dir, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([str(Path(sys.executable).parent / "forge-bridge"), "train", "--rollout",
                           "training_task:rollout_for", "--tasks", "training_task:TASKS", "--model", str(choice_dir),
                           "--iterations", "1", "--group-size", "4", "--no-probe", "--nproc", "2", "--strategy", "fsdp",
                           "--out", str(out), "--run-name", "cli"],
                          cwd=HERE, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "terminate called" not in proc.stderr  # every rank left its process group before exiting
    assert (out / "adapters" / "cli-v1" / "adapter_model.safetensors").is_file()
    assert metrics(out)[-1]["world_size"] == 2 and metrics(out)[-1]["rank_tokens_min"] > 0
    assert "done: 1 iterations, live adapter cli-v1" in proc.stdout


def test_a_following_rank_of_the_command_line_closes_its_trainer_even_when_the_update_fails(monkeypatch):
    """`train --nproc`'s other ranks leave the process group on the way out (closing the trainer):
    a gloo group left to the interpreter's exit can abort the rank after its work is done."""
    from forge_bridge.app import training

    seen = []

    class Following:  # a stand-in for the trainer a rank other than 0 makes
        def __init__(self, policy, config, model):
            seen.append(("made", policy, model))

        def train(self, rollout, tasks, iterations, resume):
            raise InvalidState("the leader failed mid-update")

        def close(self):
            seen.append(("closed",))

    monkeypatch.setattr(fb, "GRPOTrainer", Following)
    args = SimpleNamespace(algo="grpo", model="m", iterations=2, resume=False)
    with pytest.raises(InvalidState, match="mid-update"):
        training._follow(args, config=None)
    assert seen == [("made", None, "m"), ("closed",)]

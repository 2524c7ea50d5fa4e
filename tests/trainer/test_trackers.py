"""Every tracker of `report_to` gets what metrics.jsonl gets, step by step, and the run's config;
W&B offline and MLflow on a local file store, both read back with their own readers. What needs
the user's attention goes through logging, so it shows with progress bars off too."""

import json
import logging
import struct
import sys

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import MissingExtra
from forge_bridge.core.recording import transition_of
from forge_bridge.policies import models
from forge_bridge.trainer.trackers import flat_config, open_trackers, scalars


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(models.save(*models.tiny(), tmp_path_factory.mktemp("tiny") / "model"))


def chat_rollout(policy, reward):
    """One model call per episode; `reward(task)` scores it (and may cut it short)."""
    def rollout(task) -> float:
        messages = [{"role": "user", "content": task["id"]}]
        fb.current_episode().record(transition_of(policy.chat(messages, max_tokens=4), messages))
        return reward(task)
    return rollout


def test_report_to_takes_the_three_trackers_and_names_them_when_refusing():
    assert fb.GRPOConfig().run.report_to == ("tensorboard",)  # the default, as before
    assert fb.GRPOConfig(report_to="wandb").report_to == ("wandb",)  # one name, as Hugging Face takes it
    assert fb.RunConfig(report_to=["mlflow", "tensorboard"]).report_to == ("mlflow", "tensorboard")
    assert fb.GRPOConfig(report_to=()).report_to == ()  # metrics.jsonl alone
    for bad in (("tensorboard", "comet"), ("wandb", "wandb"), 3):
        with pytest.raises(ValueError, match="report_to: expected a tuple of distinct names from 'tensorboard', "
                                             "'wandb', 'mlflow'"):
            fb.GRPOConfig(report_to=bad)
    config = fb.GRPOConfig(report_to=("wandb", "mlflow"))
    assert fb.GRPOConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert flat_config(config.to_dict())["run.report_to"] == ["wandb", "mlflow"]
    assert flat_config(config.to_dict())["optimizer.lr"] == 3e-4


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_tracker_without_its_extra_names_the_install(tracker, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, tracker, None)  # what an environment without the extra sees
    with pytest.raises(MissingExtra, match=rf"pip install 'forge-bridge\[{tracker}\]'"):
        open_trackers((tracker,), tmp_path, "run-1", "run", {})


def wandb_records(path):
    """The records of a .wandb file: W&B's header (':W&B', magic, version: 7 bytes), then LevelDB's
    log format (32 KiB blocks of chunks: crc32c, length, type FULL/FIRST/MIDDLE/LAST), each record
    one protobuf `Record` (W&B's own message, from wandb.proto). wandb 0.31 reads it in Go only."""
    from wandb.proto import wandb_internal_pb2

    data, pos, parts = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def wandb_history(root) -> tuple[dict[int, dict], dict]:
    """The offline run's logged rows by iteration, and its config, as its .wandb file holds them."""
    (log,) = (root / "wandb").glob("offline-run-*/*.wandb")
    rows: dict[int, dict] = {}
    config: dict = {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.setdefault(int(row["iteration"]), {}).update(row)
        elif kind in ("config", "run"):
            items = record.config.update if kind == "config" else record.run.config.update
            config |= {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
    return rows, config


@pytest.mark.parametrize("store", ["sqlite", "file"])  # MLflow's default store, and the folder one it keeps
def test_every_tracker_gets_the_metrics_and_config_of_metrics_jsonl(store, tiny_dir, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    if store == "file":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # in maintenance since MLflow 3.7: an opt-in
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}" if store == "sqlite"
                       else f"file:{tmp_path / 'mlruns'}")
    policy = fb.LocalPolicy(tiny_dir)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
        group_size=2, concurrency=1, out_dir=str(tmp_path / "run"), run_name="tracked", progress=False,
        report_to=("tensorboard", "wandb", "mlflow")))
    calls = iter(range(100))
    try:
        trainer.run.log.log_event("probe", {"success_rate": 0.25, "kinds": 1})
        trainer.train(chat_rollout(policy, lambda task: float(next(calls) % 2)), [{"id": "a"}], iterations=2)
    finally:
        trainer.close()
        policy.close()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = {line["iteration"]: scalars(line) for line in lines}
    assert sorted(expected) == [1, 2] and {"reward_mean", "loss", "time_update_s"} <= set(expected[1])
    keys = set(expected[1]) & set(expected[2])

    def want(key: str):
        return pytest.approx({step: expected[step][key] for step in (1, 2)}, nan_ok=True)  # float32 in TensorBoard

    tb = EventAccumulator(str(tmp_path / "run" / "tb"))
    tb.Reload()
    assert keys <= set(tb.Tags()["scalars"])
    for key in keys:
        assert {e.step: e.value for e in tb.Scalars(key)} == want(key), key
    assert [e.value for e in tb.Scalars("probe/success_rate")] == [0.25]

    rows, config = wandb_history(tmp_path / "wb")
    for key in keys:
        assert {step: rows[step][key] for step in (1, 2)} == want(key), key
    assert rows[0]["probe/success_rate"] == 0.25  # an event at step 0
    assert config["optimizer.lr"] == 3e-4 and config["run.name"] == "tracked" and config["trainer"] == "GRPOTrainer"

    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("forge-bridge").experiment_id])
    assert run.data.tags["forge_bridge_run_id"] == trainer.run_id and run.info.status == "FINISHED"
    for key in keys:
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert history == want(key), key
    assert run.data.params["optimizer.lr"] == "0.0003" and run.data.params["trainer"] == "GRPOTrainer"


def test_a_flat_reward_run_warns_with_progress_bars_off(tiny_dir, tmp_path, caplog):
    def reward(task) -> float:
        if task["id"] == "cut":
            fb.current_episode().truncate("the test's step limit")
        return 1.0  # every rollout alike: no group has anything to compare

    policy = fb.LocalPolicy(tiny_dir)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, concurrency=1, out_dir=str(tmp_path / "run"),
                                                   progress=False, report_to=()))
    try:
        with caplog.at_level(logging.WARNING, logger="forge_bridge"):
            trainer.train(chat_rollout(policy, reward), [{"id": "a"}, {"id": "cut"}], iterations=1)
    finally:
        trainer.close()
        policy.close()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("iteration 1: no group had any reward spread") for m in said), said
    assert any("2 of 4 episode(s) truncated, cut by the test's step limit" in m for m in said), said
    assert not (tmp_path / "run" / "tb").exists()  # report_to=(): metrics.jsonl alone

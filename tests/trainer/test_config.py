"""Trainer configs nest their settings by concern and still read and take the flat names."""

import json
import pickle
from dataclasses import FrozenInstanceError, replace

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.trainer.config import FLAT_NAMES, PARTS


def test_merged_calls_need_the_token_average():
    assert fb.GRPOConfig().merge_steps and fb.GRPOConfig(merge_steps=False, loss_aggregation="sequence")
    with pytest.raises(ValueError, match="merge_steps.*aggregation='sequence'"):
        fb.GRPOConfig(loss_aggregation="sequence")


def test_flat_names_and_nested_parts_make_the_same_config():
    flat = fb.GRPOConfig(lr=3e-4, group_size=4, lora_rank=8, loss_aggregation="sequence", run_name="r", kl_beta=0.1,
                         merge_steps=False)
    nested = fb.GRPOConfig(optimizer=fb.OptimizerConfig(lr=3e-4), rollout=fb.RolloutConfig(group_size=4),
                           lora=fb.LoRAConfig(rank=8), loss=fb.LossConfig(aggregation="sequence", kl_beta=0.1),
                           run=fb.RunConfig(name="r"), merge_steps=False)
    assert flat == nested and hash(flat) == hash(nested)
    assert flat.lr == flat.optimizer.lr == 3e-4 and flat.lora_rank == flat.lora.rank == 8
    assert flat.loss_aggregation == "sequence" and flat.run_name == "r"
    # a flat name given beside its part overrides that one field of it; replace() takes flat names
    both = fb.GRPOConfig(optimizer=fb.OptimizerConfig(lr=1e-3, epochs=2), lr=5e-4)
    assert (both.lr, both.epochs) == (5e-4, 2)
    assert replace(flat, lr=1e-5).optimizer == fb.OptimizerConfig(lr=1e-5)
    # every flat name reads its part's field
    config = fb.PPOConfig()
    for name, (part, field) in FLAT_NAMES.items():
        assert getattr(config, name) == getattr(getattr(config, part), field), name
        assert isinstance(getattr(config, part), PARTS[part])


def test_a_config_round_trips_through_json_and_pickle():
    config = fb.GRPOConfig(lr=2e-4, role_slots={"writer": "w"}, lora_targets=("q_proj",),
                           guidance=fb.Guidance(k=3), distributed=fb.Distributed(strategy="fsdp"))
    data = json.loads(json.dumps(config.to_dict()))
    assert data["optimizer"]["lr"] == 2e-4 and data["lora"]["role_slots"] == {"writer": "w"}
    assert fb.GRPOConfig.from_dict(data) == config
    assert pickle.loads(pickle.dumps(config)) == config
    # a part given as a plain dict, as to_dict writes it, with a flat name on top
    again = fb.GRPOConfig(**{**config.to_dict(), "role_slots": {"editor": "e"}})
    assert again.role_slots == {"editor": "e"} and again.lora_targets == ("q_proj",)


def test_configs_hold_nothing_mutable():
    mapping = {"writer": "w"}
    config = fb.GRPOConfig(role_slots=mapping)
    mapping["writer"] = "changed"  # the caller's dict is copied
    assert config.role_slots == {"writer": "w"}
    with pytest.raises(TypeError):
        config.role_slots["writer"] = "x"  # read-only
    with pytest.raises(FrozenInstanceError):
        config.optimizer.lr = 1.0
    offline = fb.OfflineConfig(where={"task_id": "t"})
    with pytest.raises(TypeError):
        offline.where["task_id"] = "u"
    hash(config), hash(offline)  # hashable all the way down


def test_the_old_where_key_adapter_is_read_as_version_for_a_release():
    with pytest.warns(DeprecationWarning, match="adapter= is now version=") as caught:
        offline = fb.OfflineConfig(where={"adapter": "prod-v3", "task_id": "t"})
    assert offline.where == {"version": "prod-v3", "task_id": "t"} and caught[0].filename == __file__
    assert fb.OfflineConfig(where={"version": "prod-v3"}).where == {"version": "prod-v3"}


def test_a_bool_is_not_a_count_and_bad_parts_are_named():
    for name in ("group_size", "concurrency", "tasks_per_iteration", "epochs", "minibatch_size", "microbatch_size",
                 "warmup_steps", "lora_rank", "lora_alpha", "max_seq_len", "seed"):
        with pytest.raises(InvalidArgument, match=f"^{name}: expected"):
            fb.GRPOConfig(**{name: True})
    with pytest.raises(InvalidArgument, match="rollout: expected a RolloutConfig"):
        fb.GRPOConfig(rollout=4)
    with pytest.raises(InvalidArgument, match="optimizer: expected an OptimizerConfig"):
        fb.GRPOConfig(optimizer="fast", lr=1e-3)
    with pytest.raises(AttributeError, match="no setting 'learning_rate'"):
        fb.GRPOConfig().learning_rate
    with pytest.raises(TypeError, match="learning_rate"):
        fb.GRPOConfig(learning_rate=1e-3)


def test_the_command_line_flags_read_their_help_from_the_parts():
    import argparse

    from forge_bridge.app.config_flags import add_config_flags, config_kwargs

    parser = argparse.ArgumentParser()
    add_config_flags(parser, fb.GRPOConfig, ["lr", "lora_rank", "gamma", "gradient_checkpointing"])
    text = parser.format_help()
    assert "AdamW learning rate" in text and "(default: 0.0003)" in text and "LoRA rank. (default: 16)" in text
    args = parser.parse_args(["--lr", "0.001", "--lora-rank", "4", "--gradient-checkpointing"])
    config = fb.GRPOConfig(**config_kwargs(args, ["lr", "lora_rank", "gamma", "gradient_checkpointing"]))
    assert (config.optimizer.lr, config.lora.rank, config.optimizer.gradient_checkpointing) == (1e-3, 4, True)

"""One LoRA per crew role: a real two-role CrewAI crew (researcher, writer) on the embedded
policy, each role served from its own slot; the trainer trains each role's LoRA from that role's
trajectories only and publishes it to that slot, and the next iteration's steps of each role
are recorded with its own new version."""

from __future__ import annotations

import pytest
import torch

import forge_bridge as fb
from forge_bridge.adapters.crewai import ForgeLLM
from forge_bridge.core.episode import current_episode
from forge_bridge.core.errors import InvalidArgument, InvalidState, Unsupported
from forge_bridge.trainer.lora import adapter_parameters

import crew_demos

SLOTS = {"researcher": "researcher", "writer": "writer"}


def digits_share(trajectory) -> float:
    """A score that differs between different replies: the share of digits in the role's text."""
    text = "".join(s.action.content + "".join(c.arguments for c in s.action.tool_calls)
                   for s in trajectory.transitions)
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def crew_rollout(policy, slots=SLOTS):
    # Sampling hot enough that the rollouts of a group differ: each role gets a signal.
    llm = ForgeLLM(policy, role_slot=slots, temperature=2.0, max_tokens=24, max_model_calls=None)

    def rollout(task) -> float:
        ep = current_episode()
        crew_demos.research_crew(llm).kickoff()
        for role, child in ep.children.items():
            ep.reward(digits_share(child.trajectory), role=role)
        return 0.0
    return rollout


def lora_B(trainer, slot):
    return torch.cat([p.detach().flatten() for n, p in trainer.model.named_parameters()
                      if f".lora_B.{slot}." in n])


def test_each_role_trains_its_own_lora_and_the_live_crew_serves_each_role_its_new_version(taught_model_dir, tmp_path):
    policy = fb.LocalPolicy(str(taught_model_dir))
    config = fb.GRPOConfig(group_size=3, lr=5e-3, role_slots=SLOTS, out_dir=str(tmp_path / "run"),
                           run_name="crew", progress=False, seed=0)
    trainer = fb.GRPOTrainer(policy, config, model=str(taught_model_dir))
    assert trainer.learner.slots == ["default", "researcher", "writer"]
    # the optimizers hold disjoint parameters: one role's step cannot move another's LoRA
    owned = {slot: {id(p) for g in opt.param_groups for p in g["params"]} for slot, opt in trainer.learner.optimizers.items()}
    assert not (owned["researcher"] & owned["writer"]) and not (owned["default"] & owned["writer"])
    try:
        history = trainer.train(crew_rollout(policy), [{"id": "paris"}], iterations=2)
    finally:
        trainer.close()
    # each role's groups trained its own LoRA (in some iteration: a group whose three replies score
    # alike, e.g. the writer saying '</tool_call>' three times, is skipped); the shared one had no
    # trajectories and stays at init
    assert all(sum(h[f"{role}/batch_samples"] for h in history) > 0 for role in ("researcher", "writer"))
    assert float(lora_B(trainer, "default").abs().max()) == 0.0
    researcher, writer = lora_B(trainer, "researcher"), lora_B(trainer, "writer")
    assert float(researcher.abs().max()) > 0 and float(writer.abs().max()) > 0
    assert not torch.allclose(researcher, writer)
    # published to their own slots on the live policy
    assert policy.current("researcher") == "crew-researcher-v2" and policy.current("writer") == "crew-writer-v2"
    assert history[-1]["version_researcher"] == "crew-researcher-v2"
    # the recorded adapter of every step: iteration 1 on the base, iteration 2 on the role's v1
    trajectories = [t for t in trainer.recorder.store.trajectories(run_id=trainer.run_id)
                    if t.role is not None]  # the crew episodes' own records hold no steps
    assert {t.role for t in trajectories} == {"researcher", "writer"} and len(trajectories) == 2 * 3 * 2
    for t in trajectories:
        it = t.metadata["iteration"]
        assert {s.version for s in t.transitions} == {None if it == 1 else f"crew-{t.role}-v1"}, (t.role, it)
    # the adapter files hold the role's weights, and the policy serves exactly them
    saved = fb.LocalPolicy(str(taught_model_dir))
    try:
        saved.load_adapter(tmp_path / "run" / "adapters" / "crew-writer-v2", "w2", slot="writer")
        messages = trajectories[-1].transitions[0].observation.messages
        a = policy.chat(messages, slot="writer", temperature=0, max_tokens=12)
        b = saved.chat(messages, slot="writer", temperature=0, max_tokens=12)
        assert a.completion_token_ids == b.completion_token_ids
    finally:
        saved.close()

    # resume restores every LoRA and its optimizer
    again = fb.GRPOTrainer(policy, config, model=str(taught_model_dir))
    try:
        again.resume()
        torch.testing.assert_close(lora_B(again, "writer"), writer)
        torch.testing.assert_close(lora_B(again, "researcher"), researcher)
        assert again.learner.optimizers["writer"].state and again.learner.optimizers["researcher"].state
        assert not again.learner.optimizers["default"].state  # never stepped
    finally:
        again.close()
    fresh = fb.LocalPolicy(str(taught_model_dir))  # declares no role slots: the config's alone count
    mismatch = fb.GRPOTrainer(fresh, fb.GRPOConfig(**{**config.to_dict(), "role_slots": {"writer": "writer"}}),
                              model=str(taught_model_dir))
    with pytest.raises(InvalidState, match="role_slots"):
        mismatch.resume()
    fresh.close()
    policy.close()


def test_role_slot_settings_are_checked(taught_model_dir, tmp_path):
    for bad in ({}, {"writer": "has space"}, {"writer": ""}, ["writer"]):
        with pytest.raises(InvalidArgument, match="role_slots"):
            fb.GRPOConfig(role_slots=bad)
    with pytest.raises(InvalidArgument, match="role_slots"):
        fb.PPOConfig(role_slots=SLOTS)
    policy = fb.LocalPolicy(str(taught_model_dir))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(role_slots={"writer": "writer"}, out_dir=str(tmp_path / "r"),
                                                   progress=False), model=str(taught_model_dir))
    try:
        with pytest.raises(Unsupported, match="freeze_reference"):
            trainer.freeze_reference()
        # the shared LoRA alone is what a crew without per-role slots trains, as before
        assert len(adapter_parameters(trainer.model, "default")) == len(adapter_parameters(trainer.model, "writer")) > 0
    finally:
        trainer.close()
        policy.close()


def test_sft_trains_each_roles_lora_on_that_roles_demonstrations(taught_model_dir, tmp_path):
    from forge_bridge.trainer.sft import SFTConfig, sft

    policy = fb.LocalPolicy(str(taught_model_dir))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(role_slots={"researcher": "researcher"}, lr=5e-3,
                                                   out_dir=str(tmp_path / "run"), run_name="crew",
                                                   progress=False, seed=0), model=str(taught_model_dir))
    try:
        rollout = crew_rollout(policy, {"researcher": "researcher"})
        for k in range(2):  # recorded crews: a researcher's and a writer's trajectory each
            with fb.episode("paris", recorder=trainer.recorder, seed=k):
                rollout({"id": "paris"})
        demos = [t for t in trainer.recorder.store.trajectories() if t.role is not None]
        assert {t.role for t in demos} == {"researcher", "writer"}
        result = sft(trainer, demos, SFTConfig(epochs=3, lr=5e-3, batch_size=64))  # one batch: comparable losses
    finally:
        trainer.close()
    # the researcher's slot learned from its own trajectories, the writer (no slot of its own)
    # trained the shared LoRA; each was published to its slot
    assert float(lora_B(trainer, "researcher").abs().max()) > 0
    assert float(lora_B(trainer, "default").abs().max()) > 0
    assert result["sft_loss_last/researcher"] < result["sft_loss_first/researcher"]
    assert result["sft_loss_last/default"] < result["sft_loss_first/default"]
    assert policy.current("researcher") == "crew-researcher-sft" and policy.current() == "crew-sft"
    policy.close()


def test_the_mapping_given_once_to_the_crew_is_the_one_the_trainer_trains_and_publishes(taught_model_dir, tmp_path):
    policy = fb.LocalPolicy(str(taught_model_dir))
    rollout = crew_rollout(policy)  # ForgeLLM(role_slot=SLOTS): the only place the mapping is given
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, lr=5e-3, out_dir=str(tmp_path / "run"),
                                                   run_name="crew", progress=False, seed=0),
                             model=str(taught_model_dir))
    try:
        assert trainer.learner.slots == ["default", "researcher", "writer"] and trainer.role_slots == SLOTS
        trainer.train(rollout, [{"id": "paris"}], iterations=1)
    finally:
        trainer.close()
    assert policy.current("researcher") == "crew-researcher-v1" and policy.current("writer") == "crew-writer-v1"
    steps = [(t.role, s.slot) for t in trainer.recorder.store.trajectories(run_id=trainer.run_id) for s in t.transitions]
    assert steps and all(role == slot for role, slot in steps)  # each step records the slot that served it
    policy.close()


def test_a_crew_served_from_slots_the_trainer_does_not_train_is_refused_naming_both(taught_model_dir, tmp_path):
    policy = fb.LocalPolicy(str(taught_model_dir))
    config = fb.GRPOConfig(group_size=2, out_dir=str(tmp_path / "run"), run_name="crew", progress=False, seed=0)
    trainer = fb.GRPOTrainer(policy, config, model=str(taught_model_dir))  # made before the crew's LLM
    assert trainer.learner.slots == ["default"]
    rollout = crew_rollout(policy)
    before = lora_B(trainer, "default").clone()
    try:
        with pytest.raises(InvalidState, match=r"served from slot researcher.*would train slot 'default'.*none"):
            trainer.train(rollout, [{"id": "paris"}], iterations=1)
    finally:
        trainer.close()
    torch.testing.assert_close(lora_B(trainer, "default"), before)  # nothing trained
    assert policy.current("researcher") is None and policy.current() is None  # nothing published
    # a config that puts a role in another slot than the crew serves it from: refused up front
    with pytest.raises(InvalidArgument, match=r"role 'writer' is in slot 'other' here but the policy serves it from 'writer'"):
        fb.GRPOTrainer(policy, fb.GRPOConfig(**{**config.to_dict(), "role_slots": {"writer": "other"}}),
                       model=str(taught_model_dir))
    with pytest.raises(Unsupported, match="per-role LoRAs with GRPO"):
        fb.PPOTrainer(policy, fb.PPOConfig(out_dir=str(tmp_path / "ppo"), progress=False), model=str(taught_model_dir))
    with pytest.raises(InvalidArgument, match="served from slot 'writer' already"):
        ForgeLLM(policy, role_slot={"writer": "elsewhere"})
    policy.close()

"""A teacher for what the policy cannot find alone, end to end on a real agent and a real model:
guide trajectories from demonstrations or from the teacher's rollouts through the same agent,
on-policy distillation with the teacher's per-token log-probabilities, DAgger relabelling; the
teacher's `score` on both backends; and every bad teacher a clear error or a recorded fault."""

import json

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument, PolicyUnavailable, Unsupported
from forge_bridge.policies import models
from forge_bridge.app import testing
from forge_bridge.app.inspector import pages
from forge_bridge.app.inspector.data import RunView
from forge_bridge.trainer.teacher import shares_vocabulary, teacher_logprobs

import training_task

PLAN = [{"tool": "add", "args": {"a": 2, "b": 3}}, "Done: 5."]
TASKS = [{"id": "add-0", "kind": "add", "question": training_task.QUESTION, "demo": PLAN}]


def checker_rollout(policy):
    """The agent on `policy`; the checker wants 'Done', which the taught model never says."""
    agent = training_task.agent_for(policy)

    def rollout(task) -> float:
        result = agent.invoke({"messages": [{"role": "user", "content": task["question"]}]})
        return 1.0 if "Done" in str(result["messages"][-1].content) else 0.0
    return rollout


def expert(tokenizer):
    """A scripted expert that answers any state: the call first, then the answer."""
    def script(messages, tools):
        return PLAN[0] if messages[-1]["role"] == "user" else PLAN[1]
    return fb.ScriptedPolicy(script, tokenizer)


class Unreachable(fb.ScriptedPolicy):
    """A teacher whose every call times out."""

    def generate(self, messages, tools, sampling, adapter):
        raise PolicyUnavailable("the teacher timed out after 1 s")

    def _logprobs(self, prompt, completion, adapter):
        raise PolicyUnavailable("the teacher timed out after 1 s")


def trainer_for(taught_model_dir, tmp_path, teacher, **config):
    policy = fb.LocalPolicy(str(taught_model_dir))
    return policy, fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, lr=1e-3, out_dir=str(tmp_path / "run"),
                                                        progress=False, **config), teacher=teacher)


def guide_logprob(policy, guide):
    step = guide.transitions[-1]
    return sum(policy.logprobs(step.prompt_token_ids, step.completion_token_ids))


def test_demonstrations_guide_a_group_the_policy_fails_and_are_learned(taught_model_dir, tmp_path, learning):
    tokenizer = models.load_tokenizer(taught_model_dir)
    demos = fb.record_demonstrations(checker_rollout, TASKS, tokenizer,
                                     fb.Recorder(fb.TrajectoryStore(tmp_path / "demos.db")), progress=False)
    assert demos[0].behaviour == "demonstration"
    policy, trainer = trainer_for(taught_model_dir, tmp_path, fb.Teacher(demonstrations=demos),
                                  guidance=fb.Guidance(k=1), seed=learning.seed)
    try:
        before = guide_logprob(policy, demos[0])
        (m,) = trainer.train(checker_rollout(policy), TASKS, 1)
        # the metrics are the policy's own: two rollouts, none passed; the guide is counted apart
        assert m["episodes"] == 2 and m["success_rate"] == 0.0
        assert (m["guided_groups"], m["guide_trajectories"], m["guide_success"], m["guides_missing"]) == (1, 1, 1.0, 0)
        assert m["groups_trained"] == 1  # the group had no spread of its own: the guide gave it one
        store = trainer.recorder.store
        stored = store.trajectories(run_id=trainer.run_id)
        (guide,) = [t for t in stored if t.behaviour == "guide"]
        assert guide.group_id == stored[0].group_id and guide.metadata["guide_of"] == demos[0].id
        assert all(c.trained_tokens > 0 and c.advantage > 0 for c in store.credit(guide.id).values())
        assert store.success_by_kind(trainer.run_id) == {"add": {1: 0.0}}  # the curve is the policy's
        # How far the published adapter moved towards the guide's answer, against the policy's own
        # answers at the same state (the guide's answer alone fell 0.40 on seed 4): over 20 seeds
        # +0.19 to +4.18, every seed towards the guide, but too spread (0.93 ± 0.92) for a sound
        # threshold above 0 (bench/margins.py); measured, not asserted. What is asserted: the
        # guide's tokens were trained with a positive advantage (above).
        own = [t.transitions[-1] for t in stored if t.behaviour == "policy"]
        own_moved = sum(sum(policy.logprobs(s.prompt_token_ids, s.completion_token_ids)) - sum(s.completion_logprobs)
                        for s in own) / len(own)
        learning.note(0.0, guide_logprob(policy, demos[0]) - before - own_moved, float("-inf"))
        view = RunView(trainer.out)
        try:  # the inspector shows the guide in its group, and marks it
            assert "data-behaviour='guide'" in pages.group(view, guide.group_id)
            assert "not sampled by the policy" in pages.trajectory(view, guide.id)
        finally:
            view.close()
    finally:
        trainer.close()


def test_the_teacher_acts_through_the_same_agent_and_relabels_failed_states(taught_model_dir, tmp_path):
    tokenizer = models.load_tokenizer(taught_model_dir)
    teacher = fb.Teacher(policy=expert(tokenizer), make_rollout=checker_rollout)
    policy, trainer = trainer_for(taught_model_dir, tmp_path, teacher,
                                  guidance=fb.Guidance(source="teacher", k=2), relabel_weight=1.0)
    try:
        (m,) = trainer.train(checker_rollout(policy), TASKS, 1)
        assert m["success_rate"] == 0.0 and m["guide_trajectories"] == 2 and m["guide_success"] == 1.0
        guides = [t for t in trainer.recorder.store.trajectories(run_id=trainer.run_id) if t.behaviour == "guide"]
        assert len(guides) == 2 and all(t.reward == 1.0 and len(t.transitions) == 2 for t in guides)
        # each distinct state the failed rollouts reached (the question first) relabelled
        assert m["relabel_states"] >= 1 and m["relabel_samples"] == m["relabel_states"] and m["relabel_faults"] == 0
    finally:
        trainer.close()


def test_distillation_scores_every_sampled_token_with_the_teacher(taught_model_dir, tmp_path):
    teacher = fb.LocalPolicy(str(taught_model_dir))  # the same weights: the reverse KL starts at 0
    policy, trainer = trainer_for(taught_model_dir, tmp_path, fb.Teacher(policy=teacher), distill_beta=0.5)
    try:
        (m,) = trainer.train(checker_rollout(policy), TASKS, 1)
        assert m["distill_unscored_steps"] == 0 and abs(m["distill_log_ratio"]) < 1e-3
        store = trainer.recorder.store
        for t in store.trajectories(run_id=trainer.run_id):
            for k, step in enumerate(t.transitions):
                scored = store.credit(t.id)[k].teacher_logprobs  # kept for the inspector
                assert scored == pytest.approx(step.completion_logprobs, abs=1e-3)
        view = RunView(trainer.out)
        try:  # the teacher's log-probabilities next to the student's, token by token
            assert "teacher logprob" in pages.trajectory(view, t.id, "teacher")
        finally:
            view.close()
    finally:
        trainer.close()
        teacher.close()


def test_a_teacher_that_cannot_give_what_is_asked_is_refused_before_anything_runs(taught_model_dir, tmp_path):
    tokenizer = models.load_tokenizer(taught_model_dir)
    policy, trainer = trainer_for(taught_model_dir, tmp_path, None, guidance=fb.Guidance())
    try:
        with pytest.raises(InvalidArgument, match="needs a teacher"):
            trainer.train(checker_rollout(policy), TASKS, 1)
        assert trainer.recorder.store.count() == 0  # refused before any rollout
    finally:
        trainer.close()
    with pytest.raises(InvalidArgument, match="needs Teacher.demonstrations"):
        trainer_for(taught_model_dir, tmp_path, fb.Teacher(), guidance=fb.Guidance())
    with pytest.raises(InvalidArgument, match="make_rollout"):
        trainer_for(taught_model_dir, tmp_path, fb.Teacher(policy=expert(tokenizer)),
                    guidance=fb.Guidance(source="teacher"))

    class OtherVocabulary(fb.ScriptedPolicy):
        def tokenize(self, text):
            return [t + 1 for t in super().tokenize(text)]

    class TextOnly(fb.ScriptedPolicy):
        def tokenize(self, text):
            raise Unsupported("a hosted model's API does not say")

    for other in (OtherVocabulary(lambda m, t: "x", tokenizer), TextOnly(lambda m, t: "x", tokenizer)):
        assert not shares_vocabulary(other, tokenizer)
        with pytest.raises(InvalidArgument, match="does not tokenize text as the student does"):
            trainer_for(taught_model_dir, tmp_path, fb.Teacher(policy=other), distill_beta=0.1)
    with pytest.raises(Unsupported, match="gives no token log-probabilities"):
        expert(tokenizer).logprobs([1, 2], [3])


def test_a_teacher_that_times_out_is_a_recorded_fault_never_a_silent_zero(taught_model_dir, tmp_path):
    tokenizer = models.load_tokenizer(taught_model_dir)
    down = Unreachable(lambda m, t: "x", tokenizer)
    policy, trainer = trainer_for(taught_model_dir, tmp_path, fb.Teacher(policy=down, make_rollout=checker_rollout),
                                  guidance=fb.Guidance(source="teacher", k=2), relabel_weight=1.0)
    try:
        (m,) = trainer.train(checker_rollout(policy), TASKS, 1)
        assert m["guide_trajectories"] == 0 and m["guides_missing"] == 2 and m["relabel_samples"] == 0
        assert m["relabel_faults"] == m["relabel_states"] > 0
        failed = [t for t in trainer.recorder.store.trajectories(run_id=trainer.run_id) if t.behaviour == "guide"]
        assert len(failed) == 2 and {t.end_reason for t in failed} == {"outage"}  # recorded with how they failed
        scored, unscored = teacher_logprobs(down, trainer.recorder.store.trajectories(run_id=trainer.run_id))
        assert scored == {} and unscored > 0
    finally:
        trainer.close()


def test_local_logprobs_are_the_log_probabilities_the_policy_samples_with(taught_model_dir):
    policy = fb.LocalPolicy(str(taught_model_dir))
    try:
        out = policy.chat(testing.ASK, [testing.ADD_TOOL], temperature=1.0, seed=3)
        assert policy.logprobs(out.prompt_token_ids, out.completion_token_ids) == pytest.approx(
            out.completion_logprobs, abs=1e-4)
        with pytest.raises(InvalidArgument, match="non-empty lists of token ids"):
            policy.logprobs(out.prompt_token_ids, [])
        with pytest.warns(DeprecationWarning, match="Policy.score is now Policy.logprobs"):  # the old name still works
            assert policy.score(out.prompt_token_ids, out.completion_token_ids) == pytest.approx(
                out.completion_logprobs, abs=1e-4)
    finally:
        policy.close()


def test_local_logprobs_of_sequences_that_start_alike_reuse_the_kv_and_equal_whole_passes(taught_model_dir):
    cached, whole = fb.LocalPolicy(str(taught_model_dir)), fb.LocalPolicy(str(taught_model_dir), prefix_cache_tokens=0)
    try:  # a group's first steps (one prompt, three completions), then one's next step extending it
        outs = [cached.chat(testing.ASK, [testing.ADD_TOOL], temperature=1.0, seed=s) for s in (1, 2, 3)]
        first = outs[0]
        later = list(first.prompt_token_ids) + list(first.completion_token_ids) + list(outs[1].prompt_token_ids[-5:])
        pairs = [(o.prompt_token_ids, o.completion_token_ids) for o in outs] + [(later, outs[2].completion_token_ids)]
        for prompt, completion in pairs:
            reuse = cached._scored.match(None, list(prompt))
            assert cached.logprobs(prompt, completion) == pytest.approx(whole.logprobs(prompt, completion), abs=1e-4)
            if prompt is not first.prompt_token_ids:  # every later one starts from an earlier one's KV
                assert reuse is not None and reuse[0] >= len(first.prompt_token_ids) - 1
        assert len(cached._scored) == 4 and whole._scored is None
    finally:
        cached.close()
        whole.close()


def test_vllm_score_equals_local_score_on_the_same_weights(taught_model_dir, vllm_server):
    local, remote = fb.LocalPolicy(str(taught_model_dir)), fb.VLLMPolicy(vllm_server.base_url)
    try:
        out = local.chat(testing.ASK, [testing.ADD_TOOL], temperature=1.0, seed=5)
        mine = local.logprobs(out.prompt_token_ids, out.completion_token_ids)
        theirs = remote.logprobs(out.prompt_token_ids, out.completion_token_ids)
        assert len(theirs) == len(mine)
        assert theirs == pytest.approx(mine, abs=0.05)  # bf16 on the server, fp32 here
        assert shares_vocabulary(remote, models.load_tokenizer(taught_model_dir))
    finally:
        local.close()
        remote.close()


def test_train_from_the_command_line_with_a_teacher_adapter(taught_model_dir, adapter_dirs, tmp_path, capsys):
    from forge_bridge.app.cli import main

    out = tmp_path / "cli"
    agent = ["--rollout", "test_teacher:checker_rollout", "--tasks", "test_teacher:TASKS", "--model",
             str(taught_model_dir), "--group-size", "2", "--out", str(out), "--no-probe", "--iterations", "1"]
    assert main(["train", *agent, "--distill-beta", "0.1"]) == 1
    assert "need --teacher" in capsys.readouterr().err
    assert main(["train", *agent, "--algo", "ppo", "--teacher", str(adapter_dirs["v1"])]) == 1  # before anything runs
    assert "--teacher, --guide, --distill-beta and --relabel-weight are GRPO's" in capsys.readouterr().err
    assert main(["train", *agent, "--teacher", str(adapter_dirs["v1"]), "--guide", "teacher", "--guide-k", "1",
                 "--distill-beta", "0.1", "--relabel-weight", "1"]) == 0
    (m,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"iteration"' in line]
    # the same base with the v1 LoRA: it acts through the agent (a guide), scores, and relabels
    assert m["guide_trajectories"] == 1 and m["distill_unscored_steps"] == 0 and "distill_log_ratio" in m
    assert m["relabel_samples"] >= 1 and m["relabel_faults"] == 0


def test_a_model_with_sliding_window_layers_is_scored_whole_and_its_kv_not_kept():
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from forge_bridge.policies.decoding import PrefixCache
    from forge_bridge.policies.scoring import completion_logprobs

    torch.manual_seed(0)  # a tiny random Gemma 3: one sliding-window layer of 4 tokens, one full
    config = Gemma3TextConfig(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                              hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=8, vocab_size=64)
    model = Gemma3ForCausalLM(config).eval()
    prompt, completion = list(range(3, 23)), [7, 9, 11, 13]
    prefixes = PrefixCache(1024)
    with torch.no_grad():
        scores, reusable = completion_logprobs(model, prompt, completion, device="cpu", adapter=None, prefixes=prefixes)
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1]
    whole = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()
    assert not reusable and len(prefixes) == 0  # the policy then stops keeping scored KV
    assert scores == pytest.approx(whole, abs=1e-5)

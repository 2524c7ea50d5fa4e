"""Bad user input is a clear error naming the problem before any work is lost; servers bind to
127.0.0.1, the gateway wants its token, weights load through safetensors only, adapter paths
outside the allowed folders are refused. (The confined command tool: tests/core/test_terminal_env.py.)"""

import math
import re
from pathlib import Path

import pytest

import forge_bridge as fb
from forge_bridge.app.demo import DemoConfig
from forge_bridge.envs.http import JSONService
from forge_bridge.trainer.rollouts import RolloutError

PACKAGE_DIRS = [Path(fb.__file__).parent, Path(fb.__file__).parent.parent / "adapters",
                Path(fb.__file__).parent.parent / "trainer"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from forge_bridge.policies import models

    return str(models.save(*models.tiny(), tmp_path_factory.mktemp("tiny") / "m"))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("make, field", [
    (lambda: fb.GRPOConfig(lr="fast"), "lr"),
    (lambda: fb.GRPOConfig(group_size=0), "group_size"),
    (lambda: fb.PPOConfig(lam=2.0), "lam"),
    (lambda: fb.GRPOConfig(lora_targets="q_proj"), "lora_targets"),
    (lambda: DemoConfig(rl_iterations=-1), "DemoConfig.rl_iterations"),
    (lambda: DemoConfig(temperature="hot"), "DemoConfig.temperature"),
    (lambda: DemoConfig(demonstrate=("multiply", "lookup_twice")), "DemoConfig.demonstrate"),
    (lambda: DemoConfig(demonstrate=()), "DemoConfig.demonstrate"),
    (lambda: DemoConfig(multi_step_demos=25), "DemoConfig.multi_step_demos"),
    (lambda: DemoConfig(sft_epochs=0), "is trained by SFT: with sft_epochs=0 set distill_beta=0"),
    (lambda: DemoConfig(sft_epochs=-1), "DemoConfig.sft_epochs"),
    (lambda: DemoConfig(multi_step_demos=True), "DemoConfig.multi_step_demos"),
    (lambda: DemoConfig(demonstrate=(["multiply"],)), "DemoConfig.demonstrate"),
    (lambda: DemoConfig(demonstrate=("lookup_multiply",), multi_step_demos=0), "nothing to demonstrate"),
])
def test_wrong_types_in_configs_name_the_field(make, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        make()


@pytest.mark.parametrize("agent", [object(), "gpt-4o", {"messages": []}])
def test_an_agent_that_is_not_langchain_or_crewai_is_a_clear_error(agent, tiny_dir):
    with pytest.raises(TypeError, match=type(agent).__name__):
        fb.wrap(agent, fb.LocalPolicy(tiny_dir))


@pytest.mark.parametrize("reward, message", [
    (lambda task: 1 / 0, "every rollout raised, e.g. task 'a': the rollout raised ZeroDivisionError"),
    (lambda task: math.nan, "task 'a': the rollout function must return a finite number (the reward), got nan"),
    (lambda task: "1.0", "got '1.0'"),
])
def test_a_reward_function_that_raises_or_returns_nan_stops_the_run_before_training(reward, message, tiny_dir, tmp_path):
    policy = fb.LocalPolicy(tiny_dir)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, out_dir=str(tmp_path / "run"), progress=False))

    def rollout(task):
        policy.chat([{"role": "user", "content": "hi"}], max_tokens=4)  # some recorded work first
        return reward(task)

    with pytest.raises(RolloutError, match=re.escape(message)):
        trainer.train(rollout, [{"id": "a"}], iterations=1)
    assert trainer.iteration == 0 and policy.current() is None  # nothing trained or published
    stored = trainer.recorder.store.trajectories()
    assert len(stored) == 2 and all(t.status == "failed" for t in stored)  # the work is kept, marked
    policy.close()


# ----------------------------------------------------------------------------- security
def test_servers_bind_to_loopback_unless_told_otherwise(tiny_dir, tmp_path):
    from forge_bridge.policies.vllm_server import VLLMServer

    with fb.Gateway(fb.LocalPolicy(tiny_dir), fb.Recorder(tmp_path / "g.db")) as gateway:
        assert gateway.base_url.startswith("http://127.0.0.1:")
    service = JSONService({})
    service.start()
    assert service.url.startswith("http://127.0.0.1:")
    service.stop()
    argv = VLLMServer(tiny_dir).command()
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_the_gateway_refuses_requests_without_its_token(tiny_dir, tmp_path):
    import httpx

    gateway = fb.Gateway(fb.LocalPolicy(tiny_dir), fb.Recorder(tmp_path / "g.db"), token="s3cret")
    gateway.start()
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(gateway.base_url + "/chat/completions", json=body).status_code == 401
    assert httpx.post(gateway.base_url + "/chat/completions", json=body,
                      headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(gateway.base_url + "/chat/completions", json=body,
                      headers={"Authorization": "Bearer s3cret"}).status_code == 200
    gateway.stop()


def test_weights_and_checkpoints_never_go_through_pickle():
    forbidden = re.compile(r"torch\.load\(|pickle\.loads?\(|trust_remote_code\s*=\s*True|weights_only\s*=\s*False")
    hits = [f"{path}:{n}" for d in PACKAGE_DIRS for path in d.rglob("*.py")
            for n, line in enumerate(path.read_text().splitlines(), 1) if forbidden.search(line)]
    assert hits == []


def test_a_pickled_adapter_is_refused(adapter_dirs, tmp_path, tiny_dir):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((Path(adapter_dirs["v1"]) / "adapter_config.json").read_text())
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle
    with pytest.raises(fb.AdapterError, match="pickle, which is refused"):
        fb.LocalPolicy(tiny_dir).load_adapter(pickled, "evil-v1")


def test_an_adapter_outside_the_allowed_folders_is_refused(adapter_dirs, taught_model_dir, tmp_path):
    allowed = Path(adapter_dirs["v1"]).parent
    policy = fb.LocalPolicy(str(taught_model_dir), adapter_roots=[allowed])
    policy.load_adapter(adapter_dirs["v1"], "ok-v1")  # inside: loads
    outside = tmp_path / "elsewhere"
    outside.symlink_to(adapter_dirs["v2"])  # a link does not help: the resolved path counts...
    sneaky = allowed / "link-out"
    sneaky.symlink_to(tmp_path)  # ...and neither does a link inside pointing out
    (tmp_path / "copy").mkdir()
    for f in Path(adapter_dirs["v2"]).iterdir():
        (tmp_path / "copy" / f.name).write_bytes(f.read_bytes())
    for path in (tmp_path / "copy", sneaky / "copy", allowed / ".." / "outside"):
        with pytest.raises(fb.AdapterError, match="outside the allowed folders"):
            policy.load_adapter(path, "bad-v1")
    assert policy.current() == "ok-v1"
    sneaky.unlink()
    policy.close()

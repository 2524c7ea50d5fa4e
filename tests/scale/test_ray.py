"""forge_bridge.scale on a real local Ray cluster: GRPO with rollouts on two worker actors, a
worker killed mid-episode, and three policy servers (a real vLLM server by URL, one started in a
Ray actor, and a Ray-hosted embedded model) behind one pool."""

import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "trainer"))

import forge_bridge as fb  # noqa: E402
from forge_bridge.app import testing  # noqa: E402
from forge_bridge.core.episode import Recorder  # noqa: E402
from forge_bridge.policies.local import LocalPolicy  # noqa: E402
from forge_bridge.policies.pool import PolicyPool  # noqa: E402
from forge_bridge.policies.vllm import VLLMPolicy  # noqa: E402
from forge_bridge.scale import RayPolicy, RayRollouts, serve_vllm  # noqa: E402
from forge_bridge.trainer import rollouts as threaded  # noqa: E402

import ray_tasks  # noqa: E402
import training_task  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")  # installed by make test: a skip here is a broken set-up
    # 4 logical CPUs on this 2-core machine: the policy host and two workers ask for one each.
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": ":".join(
        str(p) for p in (HERE, HERE.parent / "trainer", HERE.parent))}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def choice_dir(tmp_path_factory):
    return training_task.choice_model(tmp_path_factory.mktemp("choice") / "model")


@pytest.fixture(scope="module")
def host(cluster, choice_dir):
    """The embedded model in a Ray actor: what every worker's agent calls."""
    host = RayPolicy.start(lambda: LocalPolicy(choice_dir))
    yield host
    host.close()


def success_rate(rollout, n: int = 96) -> float:
    return sum(rollout(training_task.TASKS[0]) for _ in range(n)) / n


def test_grpo_on_two_ray_workers_fills_every_group_records_versions_and_learns(host, choice_dir, tmp_path, learning):
    in_driver = ray_tasks.choice_rollout(host)  # the same agent, built here on the host's client
    before = success_rate(in_driver)
    config = fb.GRPOConfig(group_size=8, lr=1e-3, epochs=2, lora_rank=8, lora_alpha=16, out_dir=str(tmp_path / "run"),
                           run_name="ray", progress=False, seed=learning.seed)
    trainer = fb.GRPOTrainer(host, config, model=choice_dir)
    with RayRollouts(ray_tasks.choice_rollout, num_workers=2) as rollouts:
        history = trainer.train(rollouts, ray_tasks.TASKS, iterations=16)
        assert len(rollouts.workers) == 2 and rollouts.lost_workers == 0
    after = success_rate(in_driver)
    print(f"ray: success {before:.2f} -> {after:.2f}; rewards {[round(h['reward_mean'], 2) for h in history]}")
    learning.note(before, after, 0.15)
    assert after >= before + 0.15, (before, after)

    trajectories = trainer.recorder.store.trajectories(run_id=trainer.run_id)
    assert len(trajectories) == 16 * 8
    # every episode ended as the agent ended it (a malformed call at T=1 is the model's own fault)
    assert {t.end_reason for t in trajectories} <= {"terminated", "policy_fault"}
    by_group: dict[str, int] = {}
    for t in trajectories:
        by_group[t.group_id] = by_group.get(t.group_id, 0) + 1
        # each step names the adapter that produced it: the one published before its iteration
        it = t.metadata["iteration"]
        assert {s.version for s in t.transitions} == {None if it == 1 else f"ray-v{it - 1}"}
        assert t.transitions and all(s.completion_token_ids for s in t.transitions)
    assert len({t.metadata["worker"] for t in trajectories}) == 2  # both workers ran episodes
    # the threaded loop, same tasks and group size: the same number of trajectories per group
    groups, _ = threaded.collect(in_driver, threaded.tasks_for(0, ray_tasks.TASKS, None, 0), 0,
                                 recorder=Recorder(tmp_path / "threaded.db"), run_id="threaded", group_size=8,
                                 concurrency=2, progress=False)
    assert sorted(by_group.values()) == [len(g) for g in groups] * 16 == [8] * 16
    assert history[-1]["episodes_lost"] == 0 and host.current() == "ray-v16"
    trainer.close()


def test_a_worker_killed_mid_episode_loses_nothing_recorded_and_the_run_goes_on(cluster, host, choice_dir, tmp_path):
    marker = tmp_path / "hung"
    tasks = [{"id": "plain", "question": training_task.QUESTION},
             {"id": "hang", "question": training_task.QUESTION, "hang": True}]
    config = fb.GRPOConfig(group_size=4, lr=1e-3, lora_rank=8, lora_alpha=16, out_dir=str(tmp_path / "run"),
                           run_name="kill", progress=False, seed=0)
    trainer = fb.GRPOTrainer(host, config, model=choice_dir)
    rollouts = RayRollouts(ray_tasks.HangOnce(str(marker)), num_workers=2)
    killed: list[tuple[str, int]] = []

    def kill_the_hung_worker() -> None:
        actor_id, steps = ray_tasks.hung_worker(marker)
        (worker,) = [w for w in rollouts.workers if w._actor_id.hex() == actor_id]
        killed.append((actor_id, steps))
        cluster.kill(worker)

    killer = threading.Thread(target=kill_the_hung_worker, daemon=True)
    killer.start()
    history = trainer.train(rollouts, tasks, iterations=2)
    killer.join(timeout=5)
    assert killed and rollouts.lost_workers == 1 and len(rollouts.workers) == 2
    assert [h["episodes_lost"] for h in history] == [1, 0] and [h["episodes"] for h in history] == [8, 8]

    trajectories = trainer.recorder.store.trajectories(run_id=trainer.run_id)
    assert len(trajectories) == 16
    (hung,) = [t for t in trajectories if t.end_reason is None]  # the others ended, as the agent ended them
    assert hung.status == "incomplete" and hung.task_id == "hang"
    # every step it recorded before its worker died is there (usually the tool call, its result, the answer)
    assert len(hung.transitions) == killed[0][1] >= 1 and all(s.completion_token_ids for s in hung.transitions)
    if len(hung.transitions) == 2:  # the tool's result came back into the step that called it
        assert hung.transitions[0].info["tool_results"]
    first = {t.metadata["worker"] for t in trajectories if t.metadata["iteration"] == 1}
    second = {t.metadata["worker"] for t in trajectories if t.metadata["iteration"] == 2}
    assert hung.metadata["worker"] in first and hung.metadata["worker"] not in second
    assert len(second) == 2 and len(first | second) == 3  # the replacement took over the dead one's jobs
    rollouts.shutdown()
    trainer.close()


def test_three_policy_servers_behind_a_pool_all_serve_and_all_get_every_adapter(
        cluster, vllm_server, taught_model_dir, adapter_dirs, tmp_path):
    """A vLLM server given by URL, a vLLM server started inside a Ray actor, and the embedded
    model in a Ray actor (the two actors get each adapter as bytes, written on their node)."""
    taught = str(taught_model_dir)
    in_actor = RayPolicy.start(serve_vllm(taught, log_path=str(tmp_path / "actor-vllm.log")))
    hosted = RayPolicy.start(lambda: LocalPolicy(taught))
    pool = PolicyPool([VLLMPolicy(vllm_server.base_url), in_actor, hosted])

    def ask(policy, n: int) -> list:
        return [policy.chat(testing.ASK, [testing.ADD_TOOL], temperature=0, max_tokens=32) for _ in range(n)]

    try:
        assert sorted(o.info["pool_member"] for o in ask(pool, 6)) == [0, 0, 1, 1, 2, 2]
        for name, reply in (("v1", "Version one."), ("v2", "Version two.")):
            version = f"pool-{name}"
            pool.load_adapter(adapter_dirs[name], version)
            outs = ask(pool, 6)
            assert sorted(o.info["pool_member"] for o in outs) == [0, 0, 1, 1, 2, 2]
            assert [(o.text, o.version) for o in outs] == [(reply, version)] * 6
            assert version in VLLMPolicy(vllm_server.base_url).served_models()
        # a worker's copy of the pool reaches the same servers and serves the same version
        clone = pool.client_spec().connect()
        clone.mirror(pool.serving_state())
        assert [(o.text, o.version) for o in ask(clone, 3)] == [("Version two.", "pool-v2")] * 3
        # one server dies: it is taken out, calls go on on the others, nothing is raised
        cluster.kill(hosted.handle)
        outs = ask(pool, 4)
        assert [o.text for o in outs] == ["Version two."] * 4 and {o.info["pool_member"] for o in outs} == {0, 1}
        assert list(pool.out) == [2] and "gone" in pool.out[2]
    finally:
        pool.close()

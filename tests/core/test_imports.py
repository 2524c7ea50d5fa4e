"""The core package must stay light, and the install must not leak top-level modules."""

import subprocess
import sys
import textwrap

import forge_bridge


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_import_loads_no_heavy_framework(tmp_path):
    proc = _run("""
        import sys
        import forge_bridge, forge_bridge.core.store, forge_bridge.envs.base, forge_bridge.core.types, forge_bridge.policies.models
        import forge_bridge.envs.harness, forge_bridge.envs.tool, forge_bridge.envs.terminal, forge_bridge.envs.http
        import forge_bridge.envs.agent, forge_bridge.envs.confined, forge_bridge.envs.miniwob
        heavy = sorted(m for m in sys.modules
                       if m.split('.')[0] in {'torch', 'langchain', 'langchain_core', 'langgraph',
                                              'crewai', 'transformers', 'peft', 'playwright', 'miniwob',
                                              'gymnasium', 'selenium', 'wandb', 'mlflow'})
        print(heavy)
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_everything_but_the_ray_workers_works_without_ray(tmp_path):
    """Ray is an extra: with it uninstalled (hidden here), every module imports, the pool works,
    and starting Ray workers says which extra to install."""
    proc = _run("""
        import sys
        sys.modules['ray'] = None  # what an environment without the extra sees: ImportError
        import forge_bridge, forge_bridge.scale, forge_bridge.scale.workers, forge_bridge.scale.policy_host
        import forge_bridge.policies.pool, forge_bridge.app.cli
        from forge_bridge.scale import RayRollouts
        rollouts = RayRollouts(lambda policy: (lambda task: 1.0))
        try:
            rollouts.run_episodes([], policy=forge_bridge.policies.pool.PolicyPool.__mro__[1].__new__(
                forge_bridge.policies.pool.PolicyPool), recorder=None, run_id='x')
        except forge_bridge.ForgeBridgeError as exc:
            print(type(exc).__name__, exc)
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("MissingExtra") and "pip install 'forge-bridge[ray]'" in proc.stdout


def test_adapters_and_trainer_live_only_under_forge_bridge(tmp_path):
    # Run from an empty folder so the repository root is not on sys.path.
    proc = _run("""
        import importlib.util
        print(importlib.util.find_spec('adapters'), importlib.util.find_spec('trainer'))
        import forge_bridge.adapters, forge_bridge.trainer
        print('ok')
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "None", "ok"]


PUBLIC_API = [
    "Action", "AdapterError", "AgentError", "CommandRollout", "ContextLengthExceeded", "Distributed", "Environment",
    "Episode", "EpisodeClosed", "Feedback", "ForgeBridgeError", "GRPOConfig", "GRPOTrainer", "Gate", "Gateway",
    "Guidance", "HarnessAgent", "InvalidArgument", "InvalidState", "LoRAConfig", "LocalPolicy", "LossConfig",
    "MissingExtra", "NotFound", "Observation", "OfflineConfig", "OptimizerConfig", "PPOConfig", "PPOTrainer", "Policy",
    "PolicyError", "PolicyOutput", "PolicyResponseError", "PolicyUnavailable", "Promotion", "Recorder",
    "RolloutConfig", "RolloutError", "RunConfig", "RunExistsError", "SFTConfig", "SandboxUnavailable", "SchemaError", "ScriptedPolicy", "StepResult", "StepRewards", "StoreError",
    "Teacher", "ToolCall", "TrainerConfig", "Trajectory", "TrajectoryGroup", "TrajectoryStore", "Transition",
    "Unsupported", "UpstreamPolicy", "VLLMPolicy", "VLLMServer", "WrongType", "__version__", "current_episode",
    "episode", "feedback", "import_demonstrations", "read_demonstrations", "record_demonstrations", "sampling", "sft",
    "wrap",
]
"""The public API, pinned: a name added or removed is a decision, made here."""

SUBPACKAGE_APIS = {
    "forge_bridge.adapters.langchain": ["ForgeChatModel", "ForgeMiddleware", "to_ai_message", "to_openai_messages"],
    "forge_bridge.adapters.crewai": ["CrewAIUpstream", "ForgeLLM", "wrap_crewai"],
    "forge_bridge.core.errors": [
        "AdapterError", "AgentError", "ContextLengthExceeded", "EpisodeClosed", "ForgeBridgeError", "InvalidArgument",
        "InvalidState", "MissingExtra", "NotFound", "PolicyError", "PolicyResponseError", "PolicyUnavailable",
        "RunExistsError", "SandboxUnavailable", "SchemaError", "StoreError", "Unsupported", "WrongType"],
    "forge_bridge.core.recording": [
        "DEFAULT_MAX_MODEL_CALLS", "DEFAULT_MAX_TOOL_OUTPUT_CHARS", "DEFAULT_TOOL_TIMEOUT_S", "Limits",
        "StepRewards", "ToolOutcome", "acall_policy", "give_step_reward", "arun_tool", "bound_output", "call_policy", "check_behaviour", "check_steps_of", "over_step_limit",
        "record_call", "record_outage", "record_tool_result", "run_tool", "transition_of"],
    "forge_bridge.rewards.feedback": ["Combine", "feedback", "feedback_reward", "latest_by_key", "mean"],
    "forge_bridge.rewards.judges": ["Ask", "Judge", "Malformed", "RelativeJudge", "RubricJudge", "asker", "parse_json",
                                    "transcript"],
    "forge_bridge.trainer.config": ["FLAT_NAMES", "PARTS", "Distributed", "GRPOConfig", "Guidance", "OfflineConfig",
                                    "PPOConfig", "SFTConfig", "TrainerConfig"],
    "forge_bridge.trainer.settings": ["Frozen", "LoRAConfig", "LossConfig", "OptimizerConfig", "RolloutConfig",
                                      "RunConfig", "TRACKERS", "check", "count", "number"],
}


def test_the_public_api_is_exactly_the_pinned_list():
    assert sorted(forge_bridge.__all__) == sorted(PUBLIC_API)
    for name in PUBLIC_API:
        assert hasattr(forge_bridge, name), name
    assert set(PUBLIC_API) <= set(dir(forge_bridge))  # lazy names too, for completion


def test_each_public_module_exports_exactly_its_pinned_names():
    import importlib

    for module, names in SUBPACKAGE_APIS.items():
        exported = importlib.import_module(module).__all__
        assert sorted(exported) == sorted(names), module

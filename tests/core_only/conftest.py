"""The core-only suite runs in a venv made with `pip install .` and no extras (`make test` builds
it as .venv-core), so it loads none of the main suite's fixtures: they need the integrations."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("FORGE_BRIDGE_CACHE", os.path.join(tempfile.gettempdir(), "forge-bridge-core-test-cache"))

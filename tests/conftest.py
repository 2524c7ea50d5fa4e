"""Test-wide settings: no network, no hub, no telemetry, nothing written outside tmp folders."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
for _k, _v in (("CREWAI_DISABLE_TELEMETRY", "true"), ("OTEL_SDK_DISABLED", "true"),
               ("CREWAI_TRACING_ENABLED", "false"), ("CREWAI_DISABLE_VERSION_CHECK", "true")):
    os.environ.setdefault(_k, _v)
# The embedded model's converted copy is shared by the whole run (converted once, ~16 s).
os.environ.setdefault("FORGE_BRIDGE_CACHE",
                      os.path.join(tempfile.gettempdir(), "forge-bridge-test-cache"))

"""The optional integrations (extras, as langchain-core has them): the core installs without
LangChain, CrewAI, Ray, Playwright, MiniWoB++, matplotlib, pyarrow, wandb, MLflow, OpenVINO or
ONNX Runtime GenAI, and a module that needs one of them imports it through `require` (or finds its
data files through `locate`), which names the `pip install` that brings it."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from forge_bridge.core.errors import InvalidArgument, MissingExtra

EXTRAS = {
    "langchain": "the LangChain integration (forge_bridge.adapters.langchain) and the demo",
    "crewai": "the CrewAI integration (forge_bridge.adapters.crewai)",
    "ray": "rollouts and policies on Ray workers (forge_bridge.scale)",
    "browser": "the browser environment (Playwright driving the system's Chromium)",
    "miniwob": "the MiniWoB++ environment (its task pages, served to the browser environment's Chromium)",
    "plot": "the reward-curve pictures (matplotlib)",
    "parquet": "Parquet export (pyarrow)",
    "wandb": "reporting a run to Weights & Biases (report_to=('wandb',))",
    "mlflow": "reporting a run to MLflow (report_to=('mlflow',))",
    "openvino": "the OpenVINO GenAI policy (forge_bridge.policies.openvino)",
    "ortgenai": "ONNX Runtime GenAI and its model builder, for bench/rollouts.py's ortgenai engine",
}
"""Each extra and what it enables; `[all]` installs every one."""


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or raise `MissingExtra` naming the extra that installs it."""
    if extra not in EXTRAS:
        raise InvalidArgument(f"no extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and not module.startswith(exc.name.split(".")[0]):
            raise  # the package is there and broken: its own error says more
        raise MissingExtra(f"{module} is not installed; {EXTRAS[extra]} needs it: "
                           f"pip install 'forge-bridge[{extra}]'") from None


def locate(module: str, extra: str) -> Path:
    """The folder of installed package `module`, found without importing it (for a package whose
    data files are what is used), or `MissingExtra` naming the extra that installs it."""
    if extra not in EXTRAS:
        raise InvalidArgument(f"no extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra(f"{module} is not installed; {EXTRAS[extra]} needs it: "
                           f"pip install 'forge-bridge[{extra}]'")
    return Path(list(spec.submodule_search_locations)[0])


__all__ = ["EXTRAS", "locate", "require"]

"""`fb.wrap(obj, policy)`: pick the integration for whatever framework object the user has."""

from __future__ import annotations

from typing import Any

from forge_bridge.core.errors import WrongType
from forge_bridge.policies.base import Policy


def _from_module(obj: Any, prefix: str) -> bool:
    return any(cls.__module__.split(".")[0] == prefix for cls in type(obj).__mro__)


def wrap(obj: Any, policy: Policy) -> Any:
    """A drop-in replacement for `obj` that runs on `policy` and records inside episodes.

    - a LangChain chat model -> `ForgeChatModel`; one bound to tools (`model.bind_tools(...)`)
      -> a `ForgeChatModel` bound to the same tools and settings;
    - a CrewAI object (Agent, Crew, LLM) -> the CrewAI integration's wrapper.
    """
    if not isinstance(policy, Policy):
        raise WrongType(f"wrap(obj, policy): policy must be a forge_bridge Policy (LocalPolicy, "
                        f"VLLMPolicy), got {type(policy).__name__}")
    if _from_module(obj, "langchain_core"):
        from langchain_core.language_models import BaseChatModel
        from langchain_core.runnables import RunnableBinding

        from forge_bridge.adapters.langchain import ForgeChatModel

        if isinstance(obj, BaseChatModel):
            return ForgeChatModel(policy)
        if isinstance(obj, RunnableBinding) and isinstance(obj.bound, BaseChatModel):
            return ForgeChatModel(policy).bind(**obj.kwargs)
    if _from_module(obj, "crewai"):
        from forge_bridge.adapters.crewai import wrap_crewai

        return wrap_crewai(obj, policy)
    raise WrongType(
        f"wrap() accepts a LangChain chat model (optionally bound to tools) or a CrewAI Agent, "
        f"Crew or LLM; got {type(obj).__module__}.{type(obj).__name__}. For a LangChain agent "
        "built with create_agent, add middleware=[ForgeMiddleware(policy)] instead; for any "
        "OpenAI-compatible client, point its base_url at fb.Gateway.")

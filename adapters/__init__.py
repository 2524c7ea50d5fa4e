"""Framework integrations (installed as `forge_bridge.adapters`): the LangChain middleware and
chat model (`langchain`), the CrewAI LLM (`crewai`), and `wrap`, which picks one for whatever
framework object it is given. Each only translates its framework's objects into the core's
recording protocol.

May import: `forge_bridge.core`, `forge_bridge.policies`, and its own framework.
"""

"""Policies: where every model call goes. The interface and hot-swap contract (`base`), the
embedded transformers policy (`local`), the vLLM client (`vllm`) and its launcher
(`vllm_server`), a scripted policy for demonstrations, chat-template rendering and tool-call
parsing (`messages`, `toolcalls`), model loading (`models`).

May import: `forge_bridge.core`. torch and transformers load only inside the embedded policy
and `models`, when used.
"""

"""The learning half: batches from recorded tokens, per-step advantages, clipped losses, and
GRPO/PPO/SFT updates of a LoRA that is published to the live policy (imports torch)."""

"""Rewards beyond pass/fail: feedback that arrives after an episode, combined into its reward."""

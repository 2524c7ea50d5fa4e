"""The application on top of the library: the `forge-bridge` command line (`cli`), the main job
(`demo`) and its task suite (`tasks`), reward-curve pictures (`plot`), and tiny taught models for
tests and benchmarks (`testing`).

May import: everything (core, policies, envs, serving, adapters, trainer).
"""

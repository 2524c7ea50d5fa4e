"""The core: the data model (`types`), the errors every layer raises (`errors`), the trajectory
store, episodes and the one recording protocol every front end calls (`recording`), run
folders and atomic folder writes.

May import: the standard library only (no torch, no framework, and nothing from the other
layers of forge_bridge). Everything else builds on it.
"""

"""Environments behind one `reset`/`step` interface (`base`): tool environments (`tool`), the
terminal with its command confinement (`terminal`, `confined`), HTTP APIs (`http`), the browser
(`browser`) and MiniWoB++'s web tasks in it (`miniwob`, the page as text in `miniwob_dom`), a framework
agent as an environment (`agent`), and the framework-free agent loop over any of them
(`harness`).

May import: `forge_bridge.core` and `forge_bridge.policies` (the harness calls a policy).
"""

"""One GRPO iteration reads as a recipe: traced call by call (every thread), the calls from one
file of trainer/ into another stay few. `python tests/trainer/test_recipe.py` prints the trace
(docs/architecture.md shows it)."""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forge_bridge as fb  # noqa: E402
import forge_bridge.trainer  # noqa: E402

import training_task  # noqa: E402

TRAINER = Path(forge_bridge.trainer.__file__).parent
MOST_PAIRS = 18
"""The distinct caller file -> callee file pairs of one iteration, at most: 18 across 14 files (24 across 16
before the trainer was split into parts and recipes, 18 before the token-signal stage moved into the recipe,
17 before the trackers got a module of their own: run.py -> trackers.py; the aim is 12)."""


def trace_iteration(folder: Path) -> list[tuple[str, str]]:
    """The (caller file, callee file) of every call from one trainer/ file into another during
    one GRPO iteration of the tool-choice task, in order."""
    model = training_task.choice_model(folder / "model")
    policy = fb.LocalPolicy(model)
    rollout = training_task.make_rollout(training_task.agent_for(policy))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, out_dir=str(folder / "run"), progress=False,
                                                   seed=0, concurrency=2, kl_beta=0.1, epochs=2, minibatch_size=4))
    calls: list[tuple[str, str]] = []

    def tracer(frame, event, arg):
        if event == "call":
            callee, caller = Path(frame.f_code.co_filename), frame.f_back and Path(frame.f_back.f_code.co_filename)
            if caller and callee != caller and callee.parent == TRAINER and caller.parent == TRAINER:
                calls.append((caller.name, callee.name))
        return None

    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        trainer.train(rollout, training_task.TASKS, iterations=1)
    finally:
        sys.settrace(None)
        threading.settrace(None)
        trainer.close()
        policy.close()
    return calls


def test_one_iteration_calls_across_few_files(tmp_path):
    calls = trace_iteration(tmp_path)
    pairs = sorted(set(calls))
    assert calls and ("grpo.py", "advantages.py") in pairs  # the trace sees the recipe's parts
    assert len(pairs) <= MOST_PAIRS, pairs


def test_no_module_of_trainer_imports_one_that_imports_it_back():
    import ast

    graph = {}
    for path in TRAINER.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):  # every import, TYPE_CHECKING ones too
            if isinstance(node, ast.ImportFrom) and node.module == "forge_bridge.trainer":
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forge_bridge.trainer."):
                names.add(node.module.split(".")[2])
        graph[path.stem] = names - {path.stem}
    seen: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for dep in sorted(graph.get(module, ())):
            assert seen.get(dep) != 1, f"circular import: {' -> '.join(path + [dep])}"
            if dep not in seen:
                visit(dep, path + [dep])
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [module])


if __name__ == "__main__":
    traced = trace_iteration(Path(tempfile.mkdtemp()))
    unique = sorted(set(traced))
    files = {f for pair in unique for f in pair}
    print(f"{len(traced)} calls across files; {len(unique)} distinct pairs across {len(files)} files")
    for caller, callee in unique:
        print(f"  {caller} -> {callee}  ({traced.count((caller, callee))})")

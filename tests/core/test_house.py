"""The house rules a reviewer would check by hand, checked on every run: modules of one or two
screens, short functions, no reaching into another module's private names, and no SQL outside
the store (the store owns its data)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = [p for folder in ("forge_bridge", "adapters", "trainer") for p in sorted((ROOT / folder).rglob("*.py"))]
BENCH = sorted((ROOT / "bench").glob("*.py"))
MAX_MODULE_LINES = 500
"""A guard against a module holding several jobs, not a size to squeeze to: a module is as long as
its one job needs (at 400, two modules sat at exactly 400 lines, written to fit)."""
MAX_FUNCTION_LINES = 60
CLI_ARGUMENT_TABLE = {("forge_bridge/app/cli.py", "build_parser")}
"""The one function allowed to be long: the command line's argument table."""
SQL_OWNERS = {"forge_bridge/core/store.py", "forge_bridge/core/store_views.py", "forge_bridge/core/migrations.py"}
_SQL = re.compile(r"\bSELECT\b.*\bFROM\b|\bINSERT (OR \w+ )?INTO\b|\bUPDATE \w+ SET\b|\bDELETE FROM\b|"
                  r"\bCREATE (TABLE|INDEX)\b|\bALTER TABLE\b|\bPRAGMA \w+", re.DOTALL)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_module_is_over_the_line_limit():
    long = {rel(p): n for p in SOURCE if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules by job (over {MAX_MODULE_LINES} lines): {long}"


def test_no_function_is_over_60_lines():
    long = []
    for path in SOURCE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and (rel(path), node.name) not in CLI_ARGUMENT_TABLE:
                    long.append(f"{rel(path)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("adapters", "trainer"):
        parts = ["forge_bridge", *parts]
    return ".".join(p for p in parts if p != "__init__")


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in SOURCE + BENCH:
        tree = ast.parse(path.read_text())
        modules = set()  # names bound to forge_bridge modules: `from forge_bridge.x import y` may be one
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forge_bridge"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{rel(path)}:{node.lineno} imports {node.module}.{alias.name}")
                    modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name.startswith("forge_bridge")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{rel(path)}:{node.lineno} reads {node.value.id}.{node.attr}")
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_no_sql_outside_the_store():
    found = []
    for path in SOURCE + BENCH:
        if rel(path) in SQL_OWNERS:
            continue
        text = path.read_text()
        if re.search(r"^\s*(import sqlite3|from sqlite3 )", text, re.MULTILINE):
            found.append(f"{rel(path)}: imports sqlite3")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value):
                found.append(f"{rel(path)}:{node.lineno} {node.value[:60]!r}")
    assert not found, "SQL belongs in core/store.py and core/migrations.py:\n" + "\n".join(found)


def test_the_sql_check_catches_what_it_is_for():
    assert _SQL.search("SELECT id FROM trajectories") and _SQL.search("INSERT OR REPLACE INTO credit")
    assert not _SQL.search("select the best adapter") and not _SQL.search("update the policy")


RETIRED = {
    r"\bgamma\b": ({"trainer/losses.py", "trainer/teacher.py"}, "the discount only; LUFFY's constant is `shaping`"),
    r"(stats|sample)\.truncated\b|batch_truncated": ({"trainer/batch.py", "trainer/grpo.py", "trainer/ppo.py"},
                                                     "a sequence over max_seq_len is `cut`; truncated is an episode's"),
    r"^def success_rate\(|>= *(config\.)?(rollout\.)?success_threshold\b|>= *config\.threshold\b": (
        {str(p.relative_to(ROOT)) for p in SOURCE} - {"forge_bridge/core/types.py"},
        "one definition of success: core.types.succeeded / success_rate"),
    r"(?<!process )(?<!param_)\bgroups?\b": ({"trainer/learner.py"},
                                                      "a group is a task's rollouts; torch's param_groups are parameter sets"),
    r"\.score\(|def score\(|score_old": ({str(p.relative_to(ROOT)) for p in SOURCE if p.parent.name in ("trainer", "policies")}
                                        - {"forge_bridge/policies/base.py"},
                                        "a score is a judge's; a model's token log-probabilities are logprobs"),
    r"\.std\(": ({str(p.relative_to(ROOT)) for p in SOURCE if p.parent.name == "trainer"} - {"trainer/advantages.py"},
                 "one standardisation: advantages.standardise"),
    r"(?<!args)(?<!self)(?<!forge_bridge)\.adapters?\b|\badapter=|[\"']adapter[\"']\s*[:\]]": (
        {str(p.relative_to(ROOT)) for p in SOURCE}
        - {"forge_bridge/core/migrations.py", "forge_bridge/policies/decoding.py", "forge_bridge/policies/local.py",
           "forge_bridge/policies/openvino.py", "trainer/run.py"},
        "the version that served a step is its `version` (Transition.version, Trajectory.versions, the store's "
        "version=, metrics['version']); an adapter is the LoRA files (migrations.py reads the old layout; the "
        "decoder, the embedded and OpenVINO policies and the run folder name peft's and OpenVINO's adapters)"),
}
"""Senses of a word retired for one meaning per word (docs/architecture.md's glossary): pattern ->
(files it may no longer appear in, what to say instead)."""


def test_retired_senses_stay_retired():
    found = []
    for pattern, (files, instead) in RETIRED.items():
        for name in sorted(files):
            for n, line in enumerate((ROOT / name).read_text().splitlines(), 1):
                if re.search(pattern, line.split("#")[0]):
                    found.append(f"{name}:{n}: {line.strip()}  ({instead})")
    assert not found, "\n".join(found)


def test_the_retired_senses_check_catches_the_old_forms():
    old = ["return p / (p + gamma)", "stats.truncated += 1", "sample.truncated = True",
           "def success_rate(group, success_threshold):", "sum((t.reward or 0.0) >= success_threshold for t in own)",
           "good = [t for t, r in scored if r >= config.threshold]", "if flat.std() > 1e-6:",
           "for group, base in zip(optimizer.param_groups, base_lrs):",
           "scored[key] = teacher.score(step.prompt_token_ids, step.completion_token_ids)",
           "return {t.adapter for t in self.transitions}", "store.count(adapter=version)",
           'metrics = {"iteration": n, "adapter": trainer.version_name(n)}', "print(metrics['adapter'])",
           "assert traj.adapters == {None}"]
    for line in old:
        assert any(re.search(pattern, line) for pattern in RETIRED), line
    assert not any(re.search(p, "config.gamma  # the discount") for p in list(RETIRED)[1:])
    lora = ["policy.load_adapter(args.adapter, 'probed')", "from forge_bridge.adapters.langchain import ForgeMiddleware",
            "shutil.rmtree(self.adapters / version)", 'p.add_argument("adapter", help="the LoRA adapter directory")',
            '"adapter_path": str(path)', "@renamed(\"adapter\", \"version\")"]
    assert not any(re.search(list(RETIRED)[-1], line) for line in lora)  # an adapter's files keep their word

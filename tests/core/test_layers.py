"""The folders are layers, and imports between them go one way (TYPE_CHECKING imports, which
never run, excepted): core imports no other layer; policies only core; environments, serving,
adapters and the trainer only core and policies (environments and the harness also their own; the trainer also rewards);
scale (Ray) core, policies and the trainer; rewards core and policies; the app anything. And every error the library raises is a ForgeBridgeError."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"core": ROOT / "forge_bridge" / "core", "policies": ROOT / "forge_bridge" / "policies",
           "envs": ROOT / "forge_bridge" / "envs", "serving": ROOT / "forge_bridge" / "serving",
           "app": ROOT / "forge_bridge" / "app", "scale": ROOT / "forge_bridge" / "scale", "adapters": ROOT / "adapters", "trainer": ROOT / "trainer",
           "rewards": ROOT / "forge_bridge" / "rewards"}
ALLOWED = {
    "core": {"core"},
    "policies": {"core", "policies"},
    "envs": {"core", "policies", "envs"},
    "serving": {"core", "policies", "serving"},
    "adapters": {"core", "policies", "adapters"},
    "trainer": {"core", "policies", "rewards", "trainer"},
    "scale": {"core", "policies", "trainer", "scale"},
    "rewards": {"core", "policies", "rewards"},
    "app": {"core", "policies", "envs", "serving", "adapters", "trainer", "scale", "rewards", "app", "api"},
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "forge_bridge":
        return ""
    return parts[1] if len(parts) > 1 and parts[1] in SOURCES else "api"


def parse(path) -> ast.AST:
    """`ast.parse`, retried once: CPython 3.11 keeps the AST converter's recursion depth in shared
    state, so a parse that overlaps one on another thread (LangChain parses function sources with
    `ast` on agent threads) can fail with a spurious SystemError (gh-106905); seen once in a
    full run."""
    try:
        return ast.parse(path.read_text())
    except SystemError:
        return ast.parse(path.read_text())


def runtime_imports(tree: ast.AST):
    """Imports that run: everything except what sits under `if TYPE_CHECKING:`."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "forge_bridge":  # from forge_bridge import x: x is the module
                yield from ((f"forge_bridge.{a.name}", node.lineno) for a in node.names)
            else:
                yield node.module, node.lineno


def test_imports_between_layers_go_one_way():
    wrong = []
    for layer, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            for module, line in runtime_imports(parse(path)):
                target = layer_of(module)
                if target and target not in ALLOWED[layer]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} ({layer}) imports {module} ({target})")
    assert not wrong, "\n".join(wrong)


BUILTIN_ERRORS = {"Exception", "ValueError", "TypeError", "RuntimeError", "KeyError", "LookupError",
                  "NotImplementedError", "OSError", "IndexError", "AttributeError"}
RAISED_AND_CAUGHT_INSIDE = {("adapters/crewai.py", "KeyError"), ("forge_bridge/core/atomic.py", "OSError"),
                            ("forge_bridge/scale/__init__.py", "AttributeError"),
                            ("trainer/config.py", "AttributeError"),
                            ("forge_bridge/policies/call_spans.py", "ValueError")}
"""Raised and handled where they are raised (a tool run's error result; the fallback when the
file system has no atomic exchange; a malformed call whose argument spans are not found), never
out of the library; and the AttributeError a module's lazy `__getattr__`, or a trainer config's
`__getattr__` for the flat names, must raise for a name it does not have (Python's protocol)."""


def test_every_error_the_library_raises_is_a_forge_bridge_error():
    raised = []
    for folder in SOURCES.values():
        for path in sorted(folder.rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(parse(path)):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    name = getattr(node.exc.func, "id", None)
                    if name in BUILTIN_ERRORS and (rel, name) not in RAISED_AND_CAUGHT_INSIDE:
                        raised.append(f"{rel}:{node.lineno} raises {name}")
    assert not raised, "\n".join(raised)


def test_the_error_classes_keep_their_builtin_meaning():
    import forge_bridge as fb
    from forge_bridge.core import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), fb.ForgeBridgeError), name
    assert issubclass(errors.InvalidArgument, ValueError) and issubclass(errors.WrongType, TypeError)
    assert issubclass(fb.SchemaError, ValueError) and issubclass(fb.PolicyError, RuntimeError)
    assert str(errors.NotFound("no trajectory x")) == "no trajectory x"

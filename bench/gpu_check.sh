#!/usr/bin/env bash
# The trainer on a bare CUDA machine (torch, transformers, peft, accelerate; no vLLM, no
# LangChain, no network), in about 10 minutes: update tokens/s on a random Qwen2-0.5B on the GPU
# against the CPU, then a short learning run with the policy and the trainer on the GPU.
#   bash bench/gpu_check.sh [--config qwen2-1.5b] [--json out.json]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY - <<'PY'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "peft", "safetensors", "tqdm") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check needs {', '.join(missing)} installed")
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA GPU (try: python bench/gpu_check.py --device cpu --quick)")
PY
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export FORGE_BRIDGE_CACHE=${FORGE_BRIDGE_CACHE:-$(mktemp -d)}
exec timeout 900 $PY bench/gpu_check.py --device cuda "$@"

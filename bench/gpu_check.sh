#!/usr/bin/env bash
# The trainer on a bare CUDA machine (torch, transformers, peft, accelerate; no vLLM, no
# LangChain, no network), in about 10 minutes: update tokens/s on a random Qwen2-0.5B on the GPU
# against the CPU, then a short learning run with the policy and the trainer on the GPU; with
# --nproc N, then the update on 1 GPU against N (DDP and FSDP2 over nccl, bench/distributed.py).
#   bash bench/gpu_check.sh [--config qwen2-1.5b] [--json out.json] [--nproc N]
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
ARGS=() NPROC=1 CONFIG=qwen2-0.5b
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) NPROC=$2; shift 2 ;;
    --config) CONFIG=$2; ARGS+=("$1" "$2"); shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
timeout 900 $PY bench/gpu_check.py --device cuda "${ARGS[@]}"
if [ "$NPROC" -gt 1 ]; then
  timeout 1800 $PY bench/distributed.py --device cuda --nproc "$NPROC" --config "$CONFIG" --prompt-len 384 --completion-len 128
fi

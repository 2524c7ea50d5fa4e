#!/usr/bin/env bash
# The demo on Qwen2.5-Coder-0.5B-Instruct from its base, three seeds (docs/real-models.md).
# The rule, fixed before the run: the demo's settings, except
#   - no warm start and no teacher adapter (--sft-epochs 0 --distill-beta 0): the model calls tools
#     from its base; the scripted expert guides the groups it fails;
#   - max_tokens: the base model's greedy success on seed 0's validation split with 48, 96 and 160
#     tokens a call; the highest wins, a tie goes to the smaller;
#   - 4 GRPO iterations, not 8: what three seeds of a 0.5B fit in a session on 2 cores.
# Each seed runs under /usr/bin/time -v (peak memory); a finished step is not run again.
set -euo pipefail
cd "$(dirname "$0")/.."
FB=${FB:-.venv/bin/forge-bridge}
OUT=${OUT:-runs/demo-qwen}
COMMON=(--model qwen2.5-coder-0.5b-instruct --sft-epochs 0 --distill-beta 0)
mkdir -p "$OUT"
for mt in 48 96 160; do
  [ -f "$OUT/select-$mt/results.json" ] || "$FB" demo "${COMMON[@]}" --rl-iterations 0 --max-tokens "$mt" \
    --out "$OUT/select-$mt"
done
pick=$(.venv/bin/python - "$OUT" <<'PY'
import json, sys
rates = {mt: json.load(open(f"{sys.argv[1]}/select-{mt}/results.json"))["validation"]["base"]["all"]
         for mt in (48, 96, 160)}
print(max(rates, key=lambda mt: (rates[mt], -mt)))
PY
)
echo "max_tokens chosen on validation: $pick" | tee "$OUT/chosen.txt"
for seed in 0 1 2; do
  [ -f "$OUT/seed$seed/results.json" ] || /usr/bin/time -v -o "$OUT/seed$seed.time" "$FB" demo "${COMMON[@]}" \
    --rl-iterations 4 --max-tokens "$pick" --seed "$seed" --out "$OUT/seed$seed"
done

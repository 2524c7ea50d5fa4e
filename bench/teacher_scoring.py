"""How long a teacher takes to score an iteration's steps for on-policy distillation, with and
without the KV of earlier scored sequences (`LocalPolicy.score`, forge_bridge/policies/scoring.py).

Takes the policy's own steps of one GRPO iteration of a run folder (`make demo`'s, or any
`forge-bridge train` run's), and scores every one of them twice in one process on the same
weights: with a `LocalPolicy` that keeps the KV of what it scored (the default) and with one
that runs every step whole (`prefix_cache_tokens=0`), alternating, `--repeats` times each.
Prints seconds per pass, the ratio, and the largest difference between the two's
log-probabilities.

    .venv/bin/python bench/teacher_scoring.py [--run runs/demo] [--iteration 3] [--repeats 2]
        [--adapter runs/demo/teacher/adapters/teacher-sft]

The teacher is the base model (`--model`), with `--adapter` if given (peft's per-row adapter
path, as the demo's teacher scores). What it does not cover: a vLLM teacher (the server keeps its own prefix
cache), bf16 (this machine computes fp32; padded bf16 passes moved log-probabilities by up to
0.31 in docs/teacher.md, KV reuse is what the policy's own decoding does), and batching several
steps in one pass (no gain on 2 CPU cores, docs/teacher.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/demo", help="a run folder with trajectories.db")
    p.add_argument("--iteration", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--adapter", help="a LoRA adapter folder the teacher scores with (the demo's: RUN/teacher/adapters/teacher-sft)")
    args = p.parse_args()

    import forge_bridge as fb
    from forge_bridge.trainer.teacher import teacher_logprobs

    store = fb.TrajectoryStore(Path(args.run) / "trajectories.db")
    steps = [t for t in store.trajectories() if t.behaviour == "policy" and t.metadata.get("iteration") == args.iteration]
    if not steps:
        raise SystemExit(f"no policy trajectory of iteration {args.iteration} in {args.run}")
    prompts = [len(s.prompt_token_ids) for t in steps for s in t.transitions if s.has_tokens]
    completions = [len(s.completion_token_ids) for t in steps for s in t.transitions if s.has_tokens]
    print(f"{len(steps)} trajectories, {len(prompts)} steps: prompt {sum(prompts) / len(prompts):.0f} tokens, "
          f"completion {sum(completions) / len(completions):.0f} on average")
    settings = {"kept KV": {}, "whole": {"prefix_cache_tokens": 0}}
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    scores: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, options in settings.items():  # a fresh teacher each pass: nothing kept from the last
            teacher = fb.LocalPolicy(args.model, **options)
            try:
                if args.adapter:
                    teacher.load_adapter(args.adapter, "teacher")
                t0 = time.perf_counter()
                scores[name], failed = teacher_logprobs(teacher, steps)
                seconds[name].append(time.perf_counter() - t0)
            finally:
                teacher.close()
            if failed:
                raise SystemExit(f"{failed} steps could not be scored ({name})")
    diff = max(abs(a - b) for key in scores["whole"] for a, b in zip(scores["whole"][key], scores["kept KV"][key]))
    kept, whole = min(seconds["kept KV"]), min(seconds["whole"])
    print("| scoring | seconds (best of {}) | ratio |".format(args.repeats))
    print("| --- | --- | --- |")
    print(f"| every step whole | {whole:.1f} | 1.00 |")
    print(f"| KV of earlier scored sequences kept | {kept:.1f} | {kept / whole:.2f} |")
    print(f"largest difference of a token's log-probability: {diff:.1e}")


if __name__ == "__main__":
    main()

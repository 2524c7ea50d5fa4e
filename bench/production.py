"""Learning from production, measured (issue 40): held-out success of the agent before and after
learning from 500 simulated production episodes with delayed, 15 %-noisy feedback, for rewards
from (a) the users' feedback only, (b) a judge only, (c) both; 3 seeds.

Production: `examples/production_loop.py`'s agent -- a LangChain agent (ChatOpenAI pointed at the
gateway; tools `add` and `multiply`) on a tiny model taught to pick either tool (a coin flip) for
nine phrasings of "2 plus 3". Simulated users ask with six of the phrasings, drawn at random (no
task list: a request is whatever a user asks), in 5 blocks of 100 requests, each block recorded as
its own run. A user's thumb (1: the answer was 5) arrives 5 requests later and is wrong 15 % of
the time; the last users' thumbs have not arrived when learning starts (left out, counted).

Judge: the embedded SmolLM2-135M as a `RubricJudge` (greedy, 64 tokens, 1 retry), every episode
judged; its verdicts are cached by transcript, so equal transcripts cost one call over all seeds.

Learning, per arm: a new trainer from the starting model runs one `train_offline` per block, in
order (policy gradient on the student's own recorded steps against the block's mean reward; the
truncated importance weight corrects for the trainer's drift from the version that served them).
Its settings are the example's, fixed before any run: lr 3e-3, LoRA rank 8, `imitate=False`. While
it trains, a live user keeps sending requests to the serving gateway: its failed requests and p99
latency are the "served during training" figures.

Held-out: the three phrasings no user asked, 20 requests each, through the same agent on each
arm's adapter (loaded into a slot of the serving policy: no restart), with the same sampling seeds
for every arm; success: the agent's final answer says 5.

    .venv/bin/python bench/production.py [--seeds 0 1 2] [--episodes 500] [--out DIR]

What it does not cover: a real hosted model upstream (the student serves production here, as in
the example; `--upstream` is measured by bench/passthrough.py), tasks other than one sum in varied
words, a judge larger than 135M (any OpenAI-compatible URL works as one), and the gate (tested in
tests/serving/test_promotion.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import forge_bridge as fb  # noqa: E402
from forge_bridge.core.errors import InvalidArgument  # noqa: E402
from forge_bridge.rewards.feedback import mean  # noqa: E402
from forge_bridge.rewards.judges import RubricJudge  # noqa: E402
from forge_bridge.serving.gateway import Gateway  # noqa: E402
from production_loop import coin_flip_model, serve  # noqa: E402

PRODUCTION = ("What is 2 plus 3?", "What's 2 plus 3?", "Please compute 2 plus 3.", "How much is 2 plus 3?",
              "Tell me 2 plus 3.", "Quick: 2 plus 3?")
HELD_OUT = ("What does 2 plus 3 make?", "Can you work out 2 plus 3?", "2 plus 3 is what?")
RUBRIC = "The user asked for 2 plus 3. Score 1 if the assistant's final answer is 5, and 0 if it is anything else."
ARMS = {"feedback": lambda v: v.get("user"), "judge": lambda v: v.get("judge"), "both": mean}
"""Each arm's reward from an episode's feedback keys (None: no reward, the episode left out)."""


def collect(policy: fb.Policy, store: fb.TrajectoryStore, rng: random.Random, args) -> dict:
    """Serve `args.episodes` users in blocks; their thumbs arrive `args.delay` requests later."""
    pending: deque = deque()
    right, sent = [], 0
    size = args.episodes // args.blocks
    for block in range(args.blocks):
        with Gateway(policy, fb.Recorder(store, run_id=f"block-{block}")) as gateway:
            for k in range(block * size, (block + 1) * size):
                ok, _, status = serve(gateway, f"req-{k}", rng.choice(PRODUCTION))
                right.append(ok and status == 200)
                thumb = float(right[-1]) if rng.random() >= args.noise else float(not right[-1])
                pending.append((k + args.delay, f"req-{k}", thumb))
                while pending and pending[0][0] <= k:
                    _, episode, value = pending.popleft()
                    fb.feedback(episode, value, store=store)
                    sent += 1
    return {"production_success": statistics.mean(right), "feedback_sent": sent,
            "feedback_not_arrived": len(pending)}


class LiveUser(threading.Thread):
    """Keeps sending requests to the serving gateway until stopped: (seconds, status) of each."""

    def __init__(self, gateway: Gateway, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.gateway, self.rng, self.stop, self.calls = gateway, rng, threading.Event(), []

    def run(self) -> None:
        while not self.stop.is_set():
            _, seconds, status = serve(self.gateway, f"live-{len(self.calls)}-{time.time_ns()}",
                                       self.rng.choice(PRODUCTION))
            self.calls.append((seconds, status))


def learn(policy: fb.Policy, store: fb.TrajectoryStore, arm: str, seed: int, out: Path, args) -> tuple[str | None, dict]:
    """One trainer per arm, a `train_offline` per block; returns the last adapter's path (None: no job had
    anything to learn from) and what the jobs said."""
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(out_dir=str(out / arm), run_name=f"s{seed}-{arm}", lr=3e-3,
                                                   lora_rank=8, lora_alpha=16, progress=False, seed=seed,
                                                   minibatch_size=8, microbatch_size=None, warmup_steps=0, kl_beta=0.0))
    path, jobs = None, {"trained_on": 0, "missing_reward": 0, "skipped_blocks": 0}
    try:
        for block in range(args.blocks):
            try:
                job = trainer.train_offline(store, fb.OfflineConfig(run_id=f"block-{block}", imitate=False,
                                                                    publish=False), combine=ARMS[arm])
            except InvalidArgument as exc:  # nothing to learn from in this block (the judge failed on it all)
                print(f"  {arm}: block {block}: {exc}", flush=True)
                jobs["skipped_blocks"] += 1
                continue
            path = job["adapter_path"]
            jobs["trained_on"] += job["offline_own"]
            jobs["missing_reward"] += job["offline_missing_reward"]
    finally:
        trainer.close()
    return path, jobs


def held_out(policy: fb.Policy, slot: str, seed: int, n: int) -> float:
    """The agent's success on the held-out phrasings, served from `slot` (the same seeds for every slot)."""
    with tempfile.TemporaryDirectory() as tmp, fb.TrajectoryStore(Path(tmp) / "eval.db") as store, \
            Gateway(policy, fb.Recorder(store, run_id="held-out")) as gateway:
        results = [serve(gateway, f"eval-{q}-{k}", question, model=slot, seed=seed * 1000 + k)
                   for q, question in enumerate(HELD_OUT) for k in range(n)]
    return statistics.mean(ok and status == 200 for ok, _, status in results)


def one_seed(seed: int, model: str, judge: RubricJudge, out: Path, args) -> dict:
    rng = random.Random(seed)
    policy = fb.LocalPolicy(model, adapter_roots=[out])
    row: dict = {"seed": seed, "start": held_out(policy, "default", seed, args.eval_n)}
    with fb.TrajectoryStore(out / f"seed{seed}.db") as store:
        t0 = time.time()
        row.update(collect(policy, store, rng, args))
        judge.store, judge.recorded = store, set()
        episodes = [t for t in store.iter() if t.run_id.startswith("block-")]
        calls, failures = judge.calls, len(judge.failures)
        scores = judge.score_many(episodes, concurrency=2)
        row.update(collect_s=round(time.time() - t0), judge_calls=judge.calls - calls,
                   judge_failed=len(judge.failures) - failures, judged=sum(s is not None for s in scores),
                   judge_agrees=statistics.mean(
                       (s >= 0.5) == ("5" in (t.transitions[-1].action.content or "")) for t, s in zip(episodes, scores)
                       if s is not None) if any(s is not None for s in scores) else None)
        with Gateway(policy, fb.Recorder(store, run_id="live")) as live_gateway:
            live = LiveUser(live_gateway, random.Random(seed + 100))
            live.start()
            for arm in ARMS:
                path, jobs = learn(policy, store, arm, seed, out / f"seed{seed}", args)
                row[f"{arm}_jobs"] = jobs
                if path is not None:
                    policy.load_adapter(path, f"s{seed}-{arm}-final", slot=arm)
                row[arm] = held_out(policy, arm if path is not None else "default", seed, args.eval_n)
                print(f"seed {seed}: {arm}: {row['start']:.2f} -> {row[arm]:.2f} ({jobs})", flush=True)
            live.stop.set()
            live.join()
        latencies = sorted(s for s, _ in live.calls)
        row.update(live_requests=len(live.calls), live_failed=sum(st != 200 for _, st in live.calls),
                   live_p50_s=statistics.median(latencies), live_p99_s=latencies[int(0.99 * (len(latencies) - 1))])
    policy.close()
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    def cell(key: str) -> str:
        values = [100 * r[key] for r in rows]
        return f"{statistics.mean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0:.1f}"

    def gain(key: str) -> str:
        values = [100 * (r[key] - r["start"]) for r in rows]
        return f"{statistics.mean(values):+.1f} ± {statistics.stdev(values) if len(values) > 1 else 0:.1f}"

    lines = ["| rewards from | held-out success, % | vs the start, points |", "|---|---|---|",
             f"| (the starting adapter) | {cell('start')} | |"]
    lines += [f"| {name} | {cell(arm)} | {gain(arm)} |" for arm, name in
              (("feedback", "(a) users' feedback"), ("judge", "(b) judge (SmolLM2-135M)"), ("both", "(c) both"))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--episodes", type=int, default=500)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--delay", type=int, default=5)
    p.add_argument("--noise", type=float, default=0.15)
    p.add_argument("--eval-n", type=int, default=20, help="held-out requests per held-out phrasing")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="forge-bench-production-"))
    model = coin_flip_model(out / "model", PRODUCTION + HELD_OUT)
    judge_policy = fb.LocalPolicy()
    judge = RubricJudge(judge_policy, RUBRIC, retries=1, max_tokens=64, name="SmolLM2-135M")
    rows = [one_seed(seed, model, judge, out, args) for seed in args.seeds]
    judge_policy.close()
    print(table(rows))
    print(f"served during training: {sum(r['live_requests'] for r in rows)} live requests, "
          f"{sum(r['live_failed'] for r in rows)} failed, p99 {max(r['live_p99_s'] for r in rows):.2f} s")
    (out / "production.json").write_text(json.dumps(rows, indent=1))
    print(f"rows: {out / 'production.json'}")
    return rows


if __name__ == "__main__":
    main()

"""What `forge-bridge demo` runs until the training pipeline lands: one real model call of the
embedded model on a tool-calling prompt, recorded as a transition with its exact tokens,
stored, read back and exported."""

from __future__ import annotations

import time
from pathlib import Path

from forge_bridge import models
from forge_bridge.store import TrajectoryStore
from forge_bridge.types import Action, Observation, Trajectory, Transition

CALCULATOR = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers exactly.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def sample_once(model, tokenizer, messages: list[dict], tools: list[dict] | None,
                max_new_tokens: int = 48) -> tuple[list[int], list[int], list[float], str]:
    """Greedy completion cut at the first end-of-turn, with each token's logprob."""
    import torch

    enc = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                        return_dict=True, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             output_scores=True, return_dict_in_generate=True,
                             eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    prompt = enc["input_ids"][0].tolist()
    completion = out.sequences[0, len(prompt):].tolist()
    logprobs = [min(0.0, float(x)) for x in scores[0]]
    if tokenizer.eos_token_id in completion:
        cut = completion.index(tokenizer.eos_token_id) + 1
        completion, logprobs = completion[:cut], logprobs[:cut]
    text = tokenizer.decode(completion, skip_special_tokens=True)
    return prompt, completion, logprobs, text


def run(out_dir: str | Path = "runs/demo") -> Trajectory:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    print("loading the embedded model smollm2-135m-instruct (converted once, then cached) ...")
    model, tokenizer = models.load("smollm2-135m-instruct")
    print(f"  loaded in {time.time() - t0:.1f}s")
    messages = [{"role": "user", "content": "What is 1234 times 5678? Use the multiply tool."}]
    t1 = time.time()
    prompt, completion, logprobs, text = sample_once(model, tokenizer, messages, [CALCULATOR])
    finish = "stop" if completion and completion[-1] == tokenizer.eos_token_id else "length"
    step = Transition(observation=Observation(messages=messages, tools=[CALCULATOR]),
                      action=Action(content=text, finish_reason=finish),
                      prompt_token_ids=prompt, completion_token_ids=completion,
                      completion_logprobs=logprobs, adapter=None, terminated=True,
                      info={"latency_s": round(time.time() - t1, 3)})
    with TrajectoryStore(out / "trajectories.db") as store:
        traj = Trajectory(task_id="multiply-1234-5678", run_id="demo")
        store.begin(traj)
        store.append(traj.id, step)
        # The base model answers in prose: no tool call yet, so the task is failed (reward 0).
        store.finish(traj.id, "complete", reward=0.0)
        stored = store.get(traj.id)
        n = store.export_jsonl(out / "trajectories.jsonl", run_id="demo")
    print(f"  model call: {len(prompt)} prompt tokens, {len(completion)} completion tokens, "
          f"{time.time() - t1:.1f}s, finish={finish}")
    print(f"  reply: {text!r}")
    print(f"  stored trajectory {stored.id} ({len(stored)} step, status {stored.status}); "
          f"{n} trajectories of run 'demo' exported to {out / 'trajectories.jsonl'}")
    return stored

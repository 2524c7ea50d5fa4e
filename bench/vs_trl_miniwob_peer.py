"""TRL's side of `bench/vs_trl_miniwob.py`: multi-turn GRPO on MiniWoB++ with TRL's own `GRPOTrainer`
and its `environment_factory` (TRL's tool-calling loop), run in TRL's venv (`.venv-trl`, pinned by
`bench/vs_trl.py`, with Playwright and the `miniwob` pages added by `bench/vs_trl_miniwob.py`), never
in forge-bridge's.

    .venv-trl/bin/python bench/vs_trl_miniwob_peer.py JOB.json

JOB.json (written by `bench/vs_trl_miniwob.py`): the model folder (the weights forge-bridge resolves),
the system prompt, the training problems in the order forge-bridge's run drew them (MiniWoB task
name and seed, `tasks_per_iteration` per step, each with the token ids of forge-bridge's first
prompt for it), the settings, and `out` (a folder).

How TRL runs it, with nothing of forge-bridge's trainer: `MiniWoBTools` (below) is the class TRL's
`environment_factory` makes, one instance per rollout. Its `reset(**row)` opens a fresh
`MiniWoBEnvironment` (forge-bridge's core: the same pages, seeds and page text the forge-bridge
agent gets) on the row's problem and returns the page, which TRL appends to the prompt's empty user
turn; its public methods `click`, `type`, `press`, `select` are the tools TRL renders into the prompt
(from their signatures and docstrings) and calls with the model's arguments, each running the
environment's own tool call (its argument checks, its page text, its error texts); `get_reward()`
is the page's reward (MiniWoB's raw reward, a failure as 0), TRL's only reward. A fresh LoRA of
forge-bridge's shape (rank, alpha, target modules; TRL wraps the model itself, so its KL reference
is the base with the adapter off, as forge-bridge's is) is trained with forge-bridge's optimiser and
schedule (torch's AdamW at its defaults, linear warm-up over `warmup_steps`), clip, KL weight,
temperature, tokens per reply (`generation_kwargs.max_new_tokens`) and tool rounds per episode
(`max_tool_calling_iterations`). Writes `out/adapter` (peft's safetensors) and `out/result.json`
(the RL phase's wall time, split into TRL's generate calls and the environment; TRL's reward and
tool metrics per step; how many first prompts differed from forge-bridge's).

`parser`: 'forge-bridge' (the default) reads the model's replies with forge-bridge's own reader
(`forge_bridge.policies.toolcalls.parse`, what `LocalPolicy` and so the evaluation use: Hermes tags,
fenced JSON, bare JSON), set as the tokenizer's `parse_response`, the hook TRL reads every reply
through; 'native' leaves TRL's own (the Qwen response template: `<tool_call>` tags only).
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path


def forge_reader(tokenizer, tool_schemas: list[dict]):
    """A `parse_response` for the tokenizer that reads calls as `LocalPolicy` does."""
    from forge_bridge.policies.toolcalls import formats, parse

    _, reading = formats("auto", tokenizer.chat_template)
    eos = set(filter(lambda t: t is not None, [tokenizer.eos_token_id, tokenizer.pad_token_id]))

    def parse_response(self, ids, prefix=None, tools=None, **_):
        ids = list(ids)
        ended = bool(ids) and ids[-1] in eos
        text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
        action = parse(text, "stop" if ended else "length", reading, tool_schemas)
        calls = []
        if not action.malformed:  # forge-bridge's agent stops on a malformed reply; so does TRL without calls
            for call in action.tool_calls:
                try:
                    args = json.loads(call.arguments or "{}")
                except json.JSONDecodeError:
                    args = None
                if isinstance(args, dict):
                    calls.append({"type": "function", "function": {"name": call.name, "arguments": args}})
        message = {"role": "assistant", "content": action.content or ""}
        if calls:
            message["tool_calls"] = calls
        return message

    return parse_response


REF = "an element's ref, the N of [N] on the page"
TOOLS = {
    "click": ("Click an element; returns the page after it.", {"ref": (int, REF)}),
    "type": ("Replace the text of a field with `text`, typed as keystrokes.",
             {"ref": (int, REF), "text": (str, "the text to type")}),
    "press": ("Press a key on the focused element: Enter, Tab, Backspace, ArrowDown, Control+a, ...",
              {"key": (str, "the key's name")}),
    "select": ("Choose an option of a select element by its text.",
               {"ref": (int, REF), "option": (str, "the option's text")}),
}
"""MiniWoBEnvironment's tools as TRL's environment methods: its descriptions (transformers' schema
also wants one per argument, so `text`, `key` and `option` get one)."""


def tool_method(name: str, doc: str, params: dict):
    """A method TRL renders as the tool `name` (its signature and Google-style docstring: typed
    `params`, no return type, as forge-bridge's schemas have none) and calls with the model's
    arguments as keywords. It takes any keywords, so a missing, unknown or mistyped argument reaches
    the environment's own check and the model reads forge-bridge's error text (not Python's)."""
    import inspect

    def method(self, **arguments):
        return self._call(name, arguments)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc + "\n\nArgs:\n" + "".join(f"    {p}: {d}\n" for p, (_, d) in params.items())
    method.__annotations__ = {p: t for p, (t, _) in params.items()}
    method.__signature__ = inspect.Signature(
        [inspect.Parameter("self", kind)] + [inspect.Parameter(p, kind, annotation=t) for p, (t, _) in params.items()])
    return method


def make_tools_class(env_config: dict):
    """The environment class TRL's `environment_factory` instantiates (one per rollout)."""
    from forge_bridge.core.actions import ToolCall
    from forge_bridge.envs.miniwob import MiniWoBConfig, MiniWoBEnvironment, MiniWoBTask

    class MiniWoBTools:
        """One rollout's MiniWoB++ page; its public methods are the tools."""

        seconds = 0.0
        """Time in the environment (browsers, pages, tool calls), all instances together."""

        def __init__(self) -> None:
            self.env: MiniWoBEnvironment | None = None
            self.final = 0.0

        def reset(self, name: str, seed: int, **_) -> str:
            """A fresh page (and browser) on the row's problem; its text is the prompt's user turn."""
            t0 = time.perf_counter()
            self._close()
            self.env = MiniWoBEnvironment(MiniWoBConfig(**env_config))
            self.final = 0.0
            page = self.env.reset(MiniWoBTask(name, int(seed)))[0]["content"]
            MiniWoBTools.seconds += time.perf_counter() - t0
            return page

        def _call(self, name: str, arguments: dict) -> str:
            """The environment's own tool call: its argument checks, its page text, its error texts."""
            assert self.env is not None, "a tool called before reset"
            t0 = time.perf_counter()
            result = self.env.call_tool(ToolCall(id="call", name=name, arguments=json.dumps(arguments)))
            MiniWoBTools.seconds += time.perf_counter() - t0
            return result["content"]

        def get_reward(self) -> float:
            """The page's reward; the rollout is over, so its browser is closed."""
            t0 = time.perf_counter()
            self.final = self.env.reward if self.env is not None else 0.0
            self._close()
            MiniWoBTools.seconds += time.perf_counter() - t0
            return self.final

        def _close(self) -> None:
            if self.env is not None:
                self.env.close()
                self.env = None

    for name, (doc, params) in TOOLS.items():
        setattr(MiniWoBTools, name, tool_method(name, doc, params))
    return MiniWoBTools


def check_prompts(trainer, tools_class, job: dict) -> int:
    """How many of the rows' first prompts, as TRL renders them (its tools, its chat template), differ
    from the token ids forge-bridge's agent gave the model for the same problem (each row's
    `prompt_ids`); printed, and kept in result.json."""
    mismatched, seen = 0, set()
    for row in job["rows"]:
        if "prompt_ids" not in row or (row["name"], row["seed"]) in seen:
            continue
        seen.add((row["name"], row["seed"]))
        env = tools_class()
        try:
            page = env.reset(row["name"], row["seed"])
        finally:
            env.get_reward()  # closes its browser
        ids = trainer.processing_class.apply_chat_template(
            [{"role": "system", "content": job["system"]}, {"role": "user", "content": page}], tools=trainer.tools,
            add_generation_prompt=True, tokenize=True, return_dict=False, chat_template=trainer.chat_template)
        mismatched += list(ids) != row["prompt_ids"]
    print(f"prompts: {len(seen) - mismatched} of {len(seen)} problems render to forge-bridge's first prompt",
          flush=True)
    return mismatched


def tool_schemas(tools_class) -> dict[str, dict]:
    """The tools as TRL renders them into the prompt (transformers' `get_json_schema` of each public
    method, in TRL's order: by name), name -> OpenAI schema. `bench/vs_trl_miniwob.py` gives forge-bridge's
    agent these same schemas, so both trainers' prompts are the same tokens."""
    import inspect

    from transformers.utils import get_json_schema

    instance = tools_class()
    return {name: get_json_schema(getattr(instance, name))
            for name, _ in inspect.getmembers(tools_class, predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")}


def main(job_path: str) -> int:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from forge_bridge.policies.models import load_tokenizer

    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    s = job["settings"]
    torch.manual_seed(job["seed"])
    torch.set_num_threads(job["threads"])
    tools_class = make_tools_class(job.get("env_config", {}))
    # the tokenizer LocalPolicy uses: the model's own chat template where it renders tool calls, else Hermes
    tokenizer = load_tokenizer(job["model"])
    tokenizer.padding_side = "left"
    if job.get("parser", "forge-bridge") == "forge-bridge":
        from trl.chat_template_utils import add_response_schema, qwen3_template

        try:  # TRL reads every turn through the tokenizer's parse_response once a response template is set
            add_response_schema(tokenizer)
        except ValueError:  # a template TRL does not know (the Hermes one forge-bridge gives SmolLM2)
            tokenizer.response_template = qwen3_template
        schemas = list(tool_schemas(tools_class).values())
        tokenizer.parse_response = types.MethodType(forge_reader(tokenizer, schemas), tokenizer)

    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32, local_files_only=True)
    lora = s["lora"]
    # a fresh LoRA TRL wraps itself, so its KL reference is the base with the adapter off, as forge-bridge's is
    peft_config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                             target_modules=list(lora["targets"]), bias="none", task_type="CAUSAL_LM")
    config = GRPOConfig(
        output_dir=str(out / "trainer"), use_cpu=True, bf16=False, seed=job["seed"],
        # one optimiser step per iteration's rollouts, generated together (TRL's generation batch is
        # per_device_train_batch_size x gradient_accumulation_steps), in forward/backward passes of
        # `microbatch` sequences (a whole episode each: the logits of 2048 tokens of a 152k vocabulary
        # are 1.2 GB in float32); DAPO's loss divides by the generation batch's tokens, so the step is
        # the same whatever the microbatch
        num_generations=s["group_size"], per_device_train_batch_size=s.get("microbatch", 1),
        gradient_accumulation_steps=s["group_size"] * s["tasks_per_iteration"] // s.get("microbatch", 1),
        max_steps=s["iterations"], num_iterations=1, shuffle_dataset=False,
        learning_rate=s["lr"], max_grad_norm=s["grad_clip"], epsilon=s["clip"],
        beta=s["kl_beta"], temperature=s["temperature"], top_p=1.0, top_k=0,
        # each reply cut at max_tokens, as forge-bridge's agent cuts it; TRL's budget for the whole
        # episode (its replies and the tool results between them: forge-bridge's agent has none) set
        # where it rarely binds
        max_completion_length=s["max_completion"], generation_kwargs={"max_new_tokens": s["max_tokens"]},
        # the tools of up to max_calls replies run, as in forge-bridge's agent (TRL's loop then samples
        # one more reply, whose calls it does not run)
        max_tool_calling_iterations=s["max_calls"],
        loss_type="dapo", scale_rewards="group", mask_truncated_completions=False,
        gradient_checkpointing=False,  # TRL's default is on; forge-bridge's run has it off
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=False)
    rows = [{"prompt": [{"role": "system", "content": job["system"]}, {"role": "user", "content": ""}],
             "name": r["name"], "seed": r["seed"]} for r in job["rows"]]
    dataset = Dataset.from_list(rows)
    trainer = GRPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                          peft_config=peft_config, environment_factory=tools_class)
    mismatched = check_prompts(trainer, tools_class, job)
    # forge-bridge's optimiser and schedule on the LoRA TRL made: torch's AdamW at its defaults, the
    # rate ramped over the first `warmup_steps` steps ((step + 1) / warmup_steps), then constant
    trainer.optimizer = torch.optim.AdamW([p for p in trainer.model.parameters() if p.requires_grad], lr=s["lr"])
    trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        trainer.optimizer, lambda step: min(1.0, (step + 1) / s["warmup_steps"]) if s["warmup_steps"] else 1.0)
    generating = [0.0]  # where TRL's time goes: its generate calls (every turn), timed from outside
    generate = trainer._generate_single_turn

    def timed_generate(*a, **k):
        t = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            generating[0] += time.perf_counter() - t

    trainer._generate_single_turn = timed_generate
    tools_class.seconds = 0.0
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    trainer.model.save_pretrained(out / "adapter", safe_serialization=True, selected_adapters=["default"])
    keys = ("reward", "tools/call_frequency", "tools/failure_frequency", "completions/mean_length")
    steps = [{k: round(e[k], 4) for k in keys if k in e} for e in trainer.state.log_history if "reward" in e]
    result = {"rl_s": wall, "generate_s": generating[0], "environment_s": tools_class.seconds,
              "prompts_mismatched": mismatched, "training_reward": [x["reward"] for x in steps], "steps": steps}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"TRL GRPO (environment_factory): {wall:.0f} s (generating {generating[0]:.0f} s, environment "
          f"{tools_class.seconds:.0f} s), reward per step {[x['reward'] for x in steps]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

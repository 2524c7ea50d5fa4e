"""Can ONNX Runtime GenAI serve the trainer's LoRA at runtime, and give the sampled tokens' logprobs?

A probe, not a policy (docs/engines.md holds what it found). On SmolLM2-135M in float32:

1. Two peft LoRA folders as the trainer saves them (rank 16, alpha 32 on q/k/v/o, seeded random
   weights: bench/openvino_mismatch.py's `random_adapter`).
2. The model builder's own LoRA path (`--extra_options adapter_path=<peft folder>`) bakes the first
   adapter into the graph (MatMul lora_A / lora_B beside each projection, B scaled by alpha / r,
   the weights as initializers). `og.Adapters` feeds an adapter's tensors as graph inputs, so the
   LoRA initializers are turned into optional inputs here (the graph keeps them as defaults), and
   each peft folder is written as an `.onnx_adapter` (onnxruntime's AdapterFormat) under the same
   names, mapped from peft's names by this script (A and B transposed, B scaled).
3. `og.Adapters.load` both, then per generator `set_active_adapter`: the first step's logprobs
   against transformers + peft in float32 (max |diff| over the vocabulary), for the base (no
   adapter active), adapter 1 and adapter 2, without reloading the model.
4. Per-token logprobs: `get_logits` before each `generate_next_token` is the distribution the token
   is drawn from (checked: greedy picks its argmax); sampled at T=1 and scored by transformers.

    .venv/bin/python bench/ortgenai_probe.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openvino_mismatch import random_adapter  # noqa: E402
from rollouts import TOOLS, load  # noqa: E402


def build(model_dir: Path, adapter: Path, out: Path) -> None:
    """The builder's fp32 CPU model with `adapter` baked in (its LoRA path), offline."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(out),
               "-p", "fp32", "-e", "cpu", "-c", str(out.parent / "cache"), "--extra_options", f"adapter_path={adapter}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"builder failed ({done.returncode}):\n{(done.stderr or done.stdout)[-4000:]}")


def lora_initializers_to_inputs(folder: Path) -> dict:
    """Turn the graph's LoRA initializers into graph inputs (ORT lets a fed input override an
    initializer of the same name); returns the baked values by name."""
    import onnx
    from onnx import numpy_helper

    config = json.loads((folder / "genai_config.json").read_text())
    name = config["model"]["decoder"]["filename"]
    model = onnx.load(str(folder / name), load_external_data=True)
    baked = {}
    for init in model.graph.initializer:
        if "lora" in init.name.lower():
            baked[init.name] = numpy_helper.to_array(init)
            model.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    for data in folder.glob(f"{name}.data"):
        data.unlink()
    onnx.save(model, str(folder / name), save_as_external_data=True, location=f"{name}.data")
    return baked


def peft_to_ort(adapter: Path, baked_names: list[str]) -> dict:
    """A peft folder's tensors under the graph's LoRA names: A as [in, r], B as [r, out] scaled by
    alpha / r (as the builder bakes them)."""
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((adapter / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    out = {}
    for key, value in tensors.items():
        # base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
        parts = key.split(".")
        layer, module, which = int(parts[parts.index("layers") + 1]), parts[-3], parts[-2]
        matches = [n for n in baked_names if f"layers.{layer}/" in n.replace("layers.", "layers.", 1) or
                   f"layers.{layer}." in n]
        matches = [n for n in matches if module in n and which in n]
        if len(matches) != 1:
            raise KeyError(f"{key}: {matches} of {baked_names[:6]}...")
        array = value.T.astype(np.float32)
        out[matches[0]] = array * scale if which == "lora_B" else array
    return out


def write_adapter(tensors: dict, path: Path) -> Path:
    import onnxruntime as ort

    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(1)
    fmt.set_model_version(1)
    fmt.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in tensors.items()})
    fmt.export_adapter(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lora-std", type=float, default=0.04)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()

    import numpy as np
    import onnxruntime_genai as og
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from forge_bridge.policies import models
    from forge_bridge.policies.messages import prompt_ids

    model_dir = models.model_path(args.model)
    root = Path(tempfile.mkdtemp(prefix="ortgenai-probe-"))
    adapters = [random_adapter(str(model_dir), root / f"peft{i}", args.lora_std, seed=i) for i in (1, 2)]
    folder = root / "onnx"
    build(model_dir, adapters[0], folder)
    baked = lora_initializers_to_inputs(folder)
    print(f"{len(baked)} LoRA tensors in the graph, e.g. {sorted(baked)[:2]}", flush=True)
    mapped = [peft_to_ort(a, sorted(baked)) for a in adapters]
    gap = max(float(np.abs(mapped[0][k] - v).max()) for k, v in baked.items())
    print(f"peft -> graph names: adapter 1 mapped equals the builder's baked values within {gap:.2e}", flush=True)
    files = [write_adapter(m, root / f"v{i}.onnx_adapter") for i, m in enumerate(mapped, 1)]

    tokenizer = models.load_tokenizer(model_dir)
    prompt = prompt_ids(tokenizer, load(8, cell=3)[0][0], TOOLS)
    model = og.Model(str(folder))
    ort_adapters = og.Adapters(model)
    for i, f in enumerate(files, 1):
        ort_adapters.load(str(f), f"v{i}")
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]

    def log_softmax(x):
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    def ort_steps(adapter, greedy, steps, seed=7):
        params = og.GeneratorParams(model)
        options = {"max_length": len(prompt) + steps, "batch_size": 1}
        options |= ({"do_sample": False} if greedy else
                    {"do_sample": True, "temperature": 1.0, "top_k": vocab, "top_p": 1.0, "random_seed": seed})
        params.set_search_options(**options)
        generator = og.Generator(model, params)
        if adapter:
            generator.set_active_adapter(ort_adapters, adapter)
        generator.append_tokens(np.array([prompt], dtype=np.int32))
        tokens, lps, first = [], [], None
        while not generator.is_done() and len(tokens) < steps:
            logits = generator.get_logits().reshape(-1, vocab)[-1]
            lp = log_softmax(logits.astype(np.float64))
            first = lp if first is None else first
            generator.generate_next_token()
            t = int(generator.get_next_tokens()[0])
            if greedy and t != int(lp.argmax()):
                print(f"  greedy token {t} is not get_logits' argmax {int(lp.argmax())}", flush=True)
            tokens.append(t)
            lps.append(float(lp[t]))
        return tokens, lps, first

    def hf_logprobs(peft_dir, tokens):
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
        m = PeftModel.from_pretrained(base, str(peft_dir)) if peft_dir else base
        with torch.no_grad():
            ids = torch.tensor([prompt + tokens])
            lp = torch.log_softmax(m(ids).logits[0].double(), -1).numpy()
        n = len(prompt)
        return lp[n - 1], [float(lp[n - 1 + j, t]) for j, t in enumerate(tokens)]

    report = {}
    for label, adapter, peft_dir in (("base", None, None), ("v1", "v1", adapters[0]), ("v2", "v2", adapters[1]),
                                     ("v1 again", "v1", adapters[0])):
        tokens, lps, first = ort_steps(adapter, greedy=True, steps=args.steps)
        hf_first, hf_lps = hf_logprobs(peft_dir, tokens)
        s_tokens, s_lps, _ = ort_steps(adapter, greedy=False, steps=args.steps)
        _, s_hf = hf_logprobs(peft_dir, s_tokens)
        report[label] = {
            "first_step_max_abs_diff_over_vocab": float(np.abs(first - hf_first).max()),
            "greedy_tokens": len(tokens), "greedy_logprob_max_abs_diff": float(np.abs(np.subtract(lps, hf_lps)).max()),
            "sampled_tokens": len(s_tokens), "sampled_logprob_max_abs_diff": float(np.abs(np.subtract(s_lps, s_hf)).max()),
            "sampled_logprob_mean_abs_diff": float(np.abs(np.subtract(s_lps, s_hf)).mean())}
        print(label, json.dumps(report[label]), flush=True)
    effect = float(np.abs(ort_steps("v1", True, 1)[2] - ort_steps(None, True, 1)[2]).max())
    print(f"the adapter's own effect on the first step (max over vocab): {effect:.3f}", flush=True)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

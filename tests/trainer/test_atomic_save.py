"""An adapter version is replaced atomically: a process killed in the middle of a save, before
or after the swap, leaves a complete, loadable version (the old one or the new one), never a
missing or half-written folder."""

import signal
import subprocess
import sys
import textwrap

import pytest
from safetensors.torch import load_file

from forge_bridge.policies.base import check_adapter_dir

SCRIPT = textwrap.dedent("""
    import os, signal
    from forge_bridge.core import atomic
    from forge_bridge.policies import models
    from forge_bridge.trainer.lora import attach_lora, save_adapter

    model = attach_lora(models.tiny()[0], 4, 8, ("q_proj",))

    def version(value):
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.fill_(value)

    version(1.0)
    save_adapter(model, {path!r})  # the old version, complete
    swap = atomic._swap_in

    def dying_swap(new, final):
        if {when!r} == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        swap(new, final)
        if {when!r} == "after":
            os.kill(os.getpid(), signal.SIGKILL)

    atomic._swap_in = dying_swap
    version(2.0)
    save_adapter(model, {path!r})
""")


def lora_b_value(path) -> float:
    tensors = load_file(str(path / "adapter_model.safetensors"))
    (value,) = {float(t.flatten()[0]) for k, t in tensors.items() if "lora_B" in k}
    return value


@pytest.mark.parametrize("when, expected", [("before", 1.0), ("after", 2.0)])
def test_a_kill_in_the_middle_of_an_adapter_save_leaves_a_loadable_version(when, expected, tmp_path):
    path = tmp_path / "adapters" / "run-v3"
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(path=str(path), when=when)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    check_adapter_dir(path)  # complete: config and every tensor readable
    assert lora_b_value(path) == expected
    leftovers = [p.name for p in path.parent.iterdir() if p.name != "run-v3"]
    assert leftovers and all(name.startswith(".run-v3-tmp") for name in leftovers)

    # the next save clears what the killed one left behind
    from forge_bridge.policies import models
    from forge_bridge.trainer.lora import attach_lora, save_adapter

    model = attach_lora(models.tiny()[0], 4, 8, ("q_proj",))
    save_adapter(model, path)
    assert [p.name for p in path.parent.iterdir()] == ["run-v3"]
    check_adapter_dir(path)

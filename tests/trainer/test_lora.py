"""attach_lora: a seeded start is the same whatever else drew from torch's global generator; peft's
deprecated call into transformers warns no user, and only that warning is silenced."""

import math
import warnings

import torch

from forge_bridge.policies import models
from forge_bridge.trainer.lora import attach_lora


def lora_state(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}


def test_a_seeded_lora_starts_the_same_whatever_drew_from_the_global_generator():
    torch.manual_seed(0)
    first = lora_state(attach_lora(models.tiny(seed=3)[0], 4, 8, ("q_proj", "v_proj"), extra_adapters=["role"], seed=7))
    torch.manual_seed(0)
    torch.rand(1000)  # a policy sampling in another thread, say
    second = lora_state(attach_lora(models.tiny(seed=3)[0], 4, 8, ("q_proj", "v_proj"), extra_adapters=["role"], seed=7))
    other = lora_state(attach_lora(models.tiny(seed=3)[0], 4, 8, ("q_proj", "v_proj"), seed=8))
    assert first.keys() == second.keys() and any(".role." in n for n in first)
    assert all(torch.equal(first[n], second[n]) for n in first)
    a = [n for n in first if ".lora_A." in n and ".default." in n]
    assert a and not all(torch.equal(first[n], other[n]) for n in a)  # another seed, another start
    for n, p in first.items():
        if ".lora_B." in n:
            assert not p.any()  # B = 0: the LoRA starts as no change
        else:  # peft's init, Kaiming-uniform with a = sqrt(5): |w| <= 1 / sqrt(fan_in)
            assert p.abs().max() <= 1 / math.sqrt(p.shape[1]) + 1e-6 and p.std() > 0


def test_wrapping_with_peft_does_not_warn_of_the_libraries_own_deprecated_call():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attach_lora(models.tiny(seed=3)[0], 4, 8, ("q_proj", "v_proj"))
        with models.peft_wrapping():  # any other FutureWarning still reaches the user
            warnings.warn("something else is deprecated", FutureWarning)
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "is_gradient_checkpointing" in m]
    assert "something else is deprecated" in said
    with warnings.catch_warnings(record=True) as caught:  # outside the wrap, the filter is gone
        warnings.simplefilter("always")
        models.tiny(seed=3)[0].is_gradient_checkpointing
    assert any("is_gradient_checkpointing" in str(w.message) for w in caught)

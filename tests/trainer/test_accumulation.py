"""A step accumulated over microbatches is the step taken on the whole minibatch at once."""

import pytest
import torch

import forge_bridge as fb
from forge_bridge.policies import models
from forge_bridge.trainer.batch import Sample


def samples(vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for n, completion in ((9, 3), (14, 6), (7, 2), (11, 5), (12, 1)):  # uneven: the weights matter
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * (n - completion) + [1] * completion
        out.append(Sample(input_ids=ids, loss_mask=mask,
                          sampler_logprobs=[-2.0 * m for m in mask],
                          advantages=[float(torch.randn(1, generator=g)) * m for m in mask]))
    return out


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_microbatches_give_the_same_step_as_one_pass(tmp_path, aggregation):
    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")))
    after = []
    for micro in (None, 2):
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
            lr=1e-2, minibatch_size=8, grad_clip=1e9, microbatch_size=micro, loss_aggregation=aggregation, merge_steps=False,
            out_dir=str(tmp_path / f"run-{micro}"), progress=False, seed=0, bf16=False))
        stats = trainer.update(samples(trainer.tokenizer.vocab_size))
        assert stats["optimizer_steps"] == 1
        # The accumulated gradient (Adam's step would hide its scale, and turn rounding-level
        # differences of near-zero entries into full-size steps).
        after.append({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
        after[-1]["_loss"] = torch.tensor(stats["loss"])
        after[-1]["_grad_norm"] = torch.tensor(stats["grad_norm"])
    whole, accumulated = after
    assert float(whole["_grad_norm"]) > 0
    for name, value in whole.items():
        torch.testing.assert_close(accumulated[name], value, atol=1e-5, rtol=1e-3)
    policy.close()
    with pytest.raises(ValueError, match="microbatch_size"):
        fb.GRPOConfig(microbatch_size=0)

"""PPO's value head: it reads the policy's hidden states detached and scaled to unit L1 norm, so
its loss never reaches the LoRA and one Adam step moves a value by a bounded amount."""

import pytest
import torch

from forge_bridge.trainer.ppo import read_values


def zero_head(width: int) -> torch.nn.Linear:
    head = torch.nn.Linear(width, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


def test_values_are_read_at_the_positions_and_do_not_reach_the_hidden_states():
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    head = torch.nn.Linear(8, 1)
    positions = torch.tensor([[1, 3], [0, 4]])
    values = read_values(head, hidden, positions)  # [B, S]
    assert values.shape == (2, 2)
    x = hidden.detach()[1, 4]
    assert values[1, 1].item() == pytest.approx(head(x / x.abs().sum()).item(), abs=1e-6)
    values.sum().backward()
    assert hidden.grad is None and head.weight.grad is not None


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_one_adam_step_moves_a_value_by_twice_the_rate_whatever_the_width_and_scale(scale):
    # Adam's first step moves every parameter by exactly lr * sign(grad). With the input at unit
    # L1 norm the weights move the value by lr * sum|x| / |x|_1 = lr, and the bias by lr: 2 lr.
    torch.manual_seed(0)
    for width in (64, 576):
        hidden = torch.randn(1, 3, width) * scale
        head = zero_head(width)
        optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
        positions = torch.tensor([[2]])
        before = read_values(head, hidden, positions)
        (0.5 * (before - 1.0) ** 2).sum().backward()
        optimizer.step()
        moved = (read_values(head, hidden, positions) - before).item()
        assert moved == pytest.approx(2 * 0.05, rel=1e-4)


def test_a_checkpoint_whose_head_read_another_input_is_refused_on_resume(tmp_path):
    import json
    import random

    import forge_bridge as fb
    from forge_bridge.core.errors import InvalidState
    from forge_bridge.policies import models

    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")))
    try:
        config = fb.PPOConfig(out_dir=str(tmp_path / "run"), progress=False)
        trainer = fb.PPOTrainer(policy, config)
        assert trainer.learner.param_names["default"] == ["0", "value_head"]
        trainer.run.iteration = 1
        path = trainer.save_checkpoint()
        fb.PPOTrainer(policy, config).resume()  # its own checkpoint: fine
        state = json.loads((path / "state.json").read_text())
        del state["value_head_input"]  # as saved before the head read unit-L1 inputs
        (path / "state.json").write_text(json.dumps(state))
        random.random()  # away from the random state the checkpoint holds
        before = random.getstate()
        refused = fb.PPOTrainer(policy, config)
        with pytest.raises(InvalidState, match="value head trained on another input"):
            refused.resume()
        assert random.getstate() == before and refused.iteration == 0  # refused before restoring
    finally:
        policy.close()

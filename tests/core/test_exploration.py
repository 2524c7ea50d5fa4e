"""Exploration by a forced tool-call opening: the mixture's log-probabilities, by hand, and the
importance weight that corrects for it."""

import math

import pytest
import torch

from forge_bridge.policies.next_token import ForcedOpening
from forge_bridge.trainer.losses import tis_weights

# p = [0.5, 0.2, 0.3] at T = 1 at every position; the opening is tokens [0, 1]
LOGITS = torch.log(torch.tensor([0.5, 0.2, 0.3]))


def run(opening: ForcedOpening, n: int, seed: int = 0) -> list[tuple[int, float]]:
    g = torch.Generator().manual_seed(seed)
    return [opening.next(LOGITS, 1.0, 1.0, g) for _ in range(n)]


def test_the_forced_branch_records_the_mixtures_probability_of_each_opening_token():
    # M_1 = 0.5 + 0.5 * 0.5 = 0.75; M_2 = 0.5 + 0.5 * (0.5 * 0.2) = 0.55; mu(F_2 | F_1) = 0.55 / 0.75
    (t1, lp1), (t2, lp2) = run(ForcedOpening([0, 1], 0.5, forced=True), 2)
    assert (t1, t2) == (0, 1)
    assert lp1 == pytest.approx(math.log(0.75)) and lp2 == pytest.approx(math.log(0.55 / 0.75))
    assert lp1 + lp2 == pytest.approx(math.log(0.5 + 0.5 * 0.1))  # the whole opening: eps + (1 - eps) p(F)


def test_after_the_opening_every_token_is_the_policys_own():
    tokens = run(ForcedOpening([0, 1], 0.5, forced=True), 40)[2:]
    assert all(lp == pytest.approx(math.log([0.5, 0.2, 0.3][t])) for t, lp in tokens)


def test_the_free_branch_records_the_mixture_too_on_and_off_the_opening():
    seen = set()
    for seed in range(40):
        (t1, lp1), (t2, lp2) = run(ForcedOpening([0, 1], 0.5, forced=False), 2, seed)
        if t1 != 0:  # left at once: (1 - eps) p(t), then the policy's own
            assert lp1 == pytest.approx(math.log(0.5 * [0.5, 0.2, 0.3][t1]))
            assert lp2 == pytest.approx(math.log([0.5, 0.2, 0.3][t2]))
        elif t2 != 1:  # followed F_1 (0.75, as if forced), then left: (1 - eps) p(F_1) p(t) / M_1
            assert lp1 == pytest.approx(math.log(0.75))
            assert lp2 == pytest.approx(math.log(0.5 * 0.5 * [0.5, 0.2, 0.3][t2] / 0.75))
        else:  # sampled the whole opening: the same numbers as the forced branch
            assert (lp1, lp2) == (pytest.approx(math.log(0.75)), pytest.approx(math.log(0.55 / 0.75)))
        seen.add((t1 == 0) + (t1 == 0 and t2 == 1))
    assert seen == {0, 1, 2}  # every case above was met


def test_the_recorded_distribution_sums_to_one_at_each_position():
    """The log-probabilities the code records for every token it can emit, at the first
    position and at the second after F_1, add up to one (both branches, 60 seeds each)."""
    first, second = {}, {}
    for seed in range(60):
        for forced in (True, False):
            (t1, lp1), (t2, lp2) = run(ForcedOpening([0, 1], 0.5, forced), 2, seed)
            first[t1] = lp1
            if t1 == 0:
                second[t2] = lp2
    assert set(first) == set(second) == {0, 1, 2}
    assert sum(math.exp(lp) for lp in first.values()) == pytest.approx(1.0)
    assert sum(math.exp(lp) for lp in second.values()) == pytest.approx(1.0)


def test_the_draws_follow_the_mixture():
    """20,000 openings with eps drawn as the decoder draws it: the first token is F_1 with
    probability 0.75 and the opening comes whole with probability 0.55 (within 0.015)."""
    g = torch.Generator().manual_seed(3)
    first = whole = 0
    for _ in range(20000):
        forced = bool(torch.rand(1, generator=g).item() < 0.5)
        opening = ForcedOpening([0, 1], 0.5, forced)
        t1, _ = opening.next(LOGITS, 1.0, 1.0, g)
        t2, _ = opening.next(LOGITS, 1.0, 1.0, g)
        first += t1 == 0
        whole += (t1, t2) == (0, 1)
    assert abs(first / 20000 - 0.75) < 0.015 and abs(whole / 20000 - 0.55) < 0.015


def test_the_importance_weight_re_weights_the_opening():
    # eps = 0.25. The trainer's pi_old(F_1) = 0.5 against the recorded mu(F_1) = 0.25 + 0.75 * 0.5
    # = 0.625: weight 0.8. A first token the free branch drew off the opening, p(t) against
    # 0.75 p(t): weight 4/3.
    (_, forced_lp), = run(ForcedOpening([0, 1], 0.25, forced=True), 1)
    off = next(r for seed in range(40) if (r := run(ForcedOpening([0, 1], 0.25, forced=False), 1, seed)[0])[0] != 0)
    old = torch.log(torch.tensor([[0.5, [0.5, 0.2, 0.3][off[0]]]]))
    w = tis_weights(old, torch.tensor([[forced_lp, off[1]]]), cap=2.0)
    assert w.tolist()[0] == pytest.approx([0.8, 4 / 3])


def test_top_p_cutting_the_forced_token_leaves_the_forced_branch_alone():
    # top-p 0.6 keeps tokens 0 and 2 (0.5, then 0.3 since 0.5 < 0.6) and cuts token 1:
    # F = [1] is forced anyway, p(F) = 0, so mu = eps
    opening = ForcedOpening([1], 0.25, forced=True)
    t, lp = opening.next(LOGITS, 1.0, 0.6, torch.Generator().manual_seed(0))
    assert t == 1 and lp == pytest.approx(math.log(0.25))

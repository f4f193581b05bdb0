"""The adaptive speculation length (``oasis_core.speculation``): the chain's expected tokens, ``best_k`` on
hand-worked cases, the acceptance estimate, γ's running mean and the ``speculative_k`` values."""

import argparse

import pytest

from oasis_core import speculation as S


def test_expected_tokens_and_speedup_by_hand():
    assert S.expected_tokens(0.5, 0) == 1.0
    assert S.expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert S.expected_tokens(1.0, 3) == 4.0 and S.expected_tokens(0.0, 5) == 1.0
    # S(k) = E(k) / (k γ + 1)
    assert S.speedup(0.8, 2, 0.1) == pytest.approx((1 + 0.8 + 0.64) / 1.2)


@pytest.mark.parametrize(
    "alpha,gamma,k_max,want",
    [
        (1.0, 0.1, 4, 4),  # every draft accepted, cheap draft: the longest
        (0.95, 0.05, 6, 6),  # S(5) = 5.30 / 1.25 = 4.24 < S(6) = 6.03 / 1.3 = 4.64: still growing
        (0.0, 0.1, 4, 0),  # nothing accepted: no draft
        (0.09, 0.1, 4, 0),  # α < γ: S(1) = 1.09 / 1.1 < 1
        (0.11, 0.1, 4, 1),  # α > γ: S(1) = 1.11 / 1.1 > 1; S(2) = 1.1221 / 1.2 < S(1)
        (0.6, 0.1, 8, 3),  # S = 1, 1.4545, 1.6333, 1.6738, 1.6469: the interior optimum
        (0.6, 0.1, 2, 2),  # the same, clipped
        (0.5, 0.5, 4, 0),  # α = γ: S(1) = 1 ties k = 0, the smaller wins
        (0.99, 1.0, 4, 0),  # a draft as dear as the target never pays
    ],
)
def test_best_k_hand_worked(alpha, gamma, k_max, want):
    assert S.best_k(alpha, gamma, k_max) == want


def test_first_draft_pays_exactly_when_alpha_exceeds_gamma():
    for g in (0.02, 0.1, 0.3):
        assert S.best_k(g * 0.99, g, 4) == 0 and S.best_k(min(1.0, g * 1.01), g, 4) >= 1


def test_acceptance_estimate():
    a = S.Acceptance(prior=0.6, weight=2.0, decay=1.0)
    assert a.alpha == 0.6
    a.observe(4, 4)  # 4 tried, 4 accepted
    a.observe(4, 1)  # 2 tried (the rejected one too), 1 accepted
    assert (a.tried, a.accepted) == (6, 5) and a.alpha == pytest.approx((1.2 + 5) / 8)
    with pytest.raises(ValueError, match="accepted must be in"):
        a.observe(2, 3)
    d = S.Acceptance(decay=0.5)
    d.observe(3, 0)
    d.observe(0, 0)  # an ordinary step: the evidence decays toward the prior
    assert d.tried == 0.5 and d.alpha > S.Acceptance(decay=0.5, pos_tried=[1.0]).alpha


def test_per_position_estimate_and_choice():
    a = S.Acceptance(prior=0.6, weight=2.0, decay=1.0)
    a.observe(3, 1)  # position 0 tried and accepted, position 1 tried and rejected, position 2 not reached
    a.observe(3, 0)  # position 0 tried and rejected
    assert a.pos_tried == [2.0, 1.0, 0.0] and a.pos_accepted == [1.0, 0.0, 0.0]
    assert a.rate(0) == pytest.approx((1.2 + 1) / 4) and a.rate(1) == pytest.approx(1.2 / 3)
    assert a.rate(2) == 0.6 == a.rate(9)  # never reached: the prior
    assert a.expected_tokens(2) == pytest.approx(1 + a.rate(0) + a.rate(0) * a.rate(1))
    alike = S.Acceptance(decay=1.0)
    for _ in range(50):
        alike.observe(4, 4)
        alike.observe(4, 1)
    # every position alike (a chain with one alpha): the per-position E(k) is near the pooled formula's
    assert abs(alike.expected_tokens(1) - S.expected_tokens(alike.alpha, 1)) < 0.2
    # a head whose first draft is accepted 90% and later ones never (as SmolLM2's trained head): k = 1, where the
    # pooled estimate (about 0.5) would draft 2
    pol = S.AdaptiveK(4, gamma=0.1)
    for i in range(200):
        pol.observe("h", 4, 1 if i % 10 else 0)
    st = pol.state("h")
    assert st.rate(0) > 0.85 and st.rate(1) < 0.1  # the prior still weighs 2 of ~20 decayed steps
    assert pol.choose("h") == 1 and S.best_k(st.alpha, 0.1, 4) >= 2


def test_adaptive_k_per_key_and_gamma():
    pol = S.AdaptiveK(4)
    assert pol.gamma == S.DEFAULT_GAMMA and pol.choose("a") == S.best_k(S.PRIOR_ALPHA, S.DEFAULT_GAMMA, 4)
    for _ in range(60):
        pol.observe("a", 4, 4)
        pol.observe("b", 4, 0)
    assert pol.choose("a") == 4 and pol.choose("b") == 0
    pol.drop("b")
    assert pol.choose("b") == pol.choose("new")  # the prior again
    pol.observe_cost(0.002, 0.01)
    assert pol.gamma == pytest.approx(0.2)
    pol.observe_cost(0.001, 0.01)
    assert pol.gamma == pytest.approx(0.8 * 0.2 + 0.2 * 0.1)
    fixed = S.AdaptiveK(4, gamma=0.5)
    fixed.observe_cost(0.001, 0.01)
    assert fixed.gamma == 0.5
    with pytest.raises(ValueError, match="k_max"):
        S.AdaptiveK(-1)


def test_spec_values():
    assert S.parse_spec(0) == (0, False) and S.parse_spec(3) == (3, False)
    assert S.parse_spec("auto") == (S.DEFAULT_MAX_K, True) and S.parse_spec("auto", block_size=4) == (3, True)
    assert S.parse_spec("auto:7") == (7, True)
    for bad in (-1, True, 1.5, "x", "auto:0", "auto:x", "auto:", "3"):
        with pytest.raises(ValueError, match="must be"):
            S.parse_spec(bad)
    assert S.cli_value("3") == 3 and S.cli_value("auto") == "auto" and S.cli_value("auto:2") == "auto:2"
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer >= 0, auto or auto:N, got 'junk'"):
        S.cli_value("junk")


def _acc_pattern(rates, steps=200):
    """An ``AdaptiveK`` key fed ``steps`` 3-draft steps, draft ``j`` accepted (given the ones before) at rate
    ``rates[j]``: a deterministic low-discrepancy pattern, independent across positions."""
    ad = S.AdaptiveK(3)
    for i in range(steps):
        n = 0
        for j, r in enumerate(rates):
            if (i * 0.6180339887 + j * 0.4142135623) % 1.0 >= r:
                break
            n += 1
        ad.observe("r", 3, n)
    return ad


def test_measured_step_costs_replace_the_gamma_model_once_both_are_known():
    ad = S.AdaptiveK(3)
    assert ad.cost(2) == pytest.approx(2 * S.DEFAULT_GAMMA + 1)
    for _ in range(S.STEP_SKIP):  # compile / capture steps: not kept
        ad.observe_step(0, 1.0)
        ad.observe_step(2, 9.0)
    assert ad.step_s == {} and ad.cost(2) == pytest.approx(2 * S.DEFAULT_GAMMA + 1)
    ad.observe_step(0, 2.0)
    assert ad.cost(2) == pytest.approx(2 * S.DEFAULT_GAMMA + 1)  # T(2) not measured yet
    ad.observe_step(2, 3.2)
    assert ad.cost(2) == pytest.approx(1.6) and ad.cost(0) == 1.0
    ad.observe_step(2, 0.0)  # ignored
    ad.observe_step(2, 4.2)  # weighted mean
    assert ad.step_s[2] == pytest.approx((1 - S.STEP_EWMA) * 3.2 + S.STEP_EWMA * 4.2)
    fixed = S.AdaptiveK(3, 0.05)
    for _ in range(S.STEP_SKIP + 1):
        fixed.observe_step(0, 1.0)
        fixed.observe_step(1, 5.0)
    assert fixed.cost(1) == pytest.approx(1.05)  # a configured γ keeps its model


def test_measured_costs_pick_the_draft_length_the_h200_measured_best():
    """Acceptance 0.7 / 0.3 / 0.3 by position: under kγ + 1 (γ = 0.05) two drafts look best; at the step times dense
    measured on the H200 (SmolLM2 × 16, 4K: 2.0 / 2.5 / 3.2 / 3.6 ms for k = 0 .. 3) one is, and at lookahead's
    (3.0 / 5.6 / 6.2 / 6.4 ms) none."""
    ad = _acc_pattern([0.7, 0.3, 0.3])
    ad.gamma = 0.05
    assert ad.choose("r") == 2
    for k, t in enumerate((2.0, 2.5, 3.2, 3.6)):
        for _ in range(S.STEP_SKIP + 1):
            ad.observe_step(k, t)
    assert ad.choose("r") == 1
    for k, t in enumerate((3.0, 5.6, 6.2, 6.4)):  # lookahead's: no draft length pays
        for _ in range(8):
            ad.observe_step(k, t)
    assert ad.choose("r") == 0


def test_probe_due_asks_for_ordinary_steps_to_time():
    ad = S.AdaptiveK(3)
    assert ad.probe_due()
    for _ in range(S.STEP_SKIP + 1):
        ad.observe_step(0, 1.0)
    assert not ad.probe_due()
    for _ in range(S.PROBE_EVERY - 1):
        ad.observe_step(2, 1.5)
    assert not ad.probe_due()
    ad.observe_step(1, 1.2)
    assert ad.probe_due()
    ad.observe_step(0, 1.0)
    assert not ad.probe_due()
    assert not S.AdaptiveK(3, 0.1).probe_due()  # a configured γ: nothing to measure


def test_choose_batch_weighs_every_key_at_one_length():
    """A key that accepts everything and one that accepts nothing, γ = 0.1: alone they pick 3 and 0; the step's one
    length maximises their mean E(k) / (kγ + 1): (1 + (k + 1)) / 2 / (kγ + 1) grows with k here, so 3."""
    ad = S.AdaptiveK(3, 0.1)
    for _ in range(100):
        ad.observe("good", 3, 3)
        ad.observe("bad", 3, 0)
    assert ad.choose("good") == 3 and ad.choose("bad") == 0
    mean = lambda k: (ad.state("good").expected_tokens(k) + ad.state("bad").expected_tokens(k)) / 2  # noqa: E731
    want = max(range(4), key=lambda k: (mean(k) / (k * 0.1 + 1), -k))
    assert ad.choose_batch(["good", "bad"]) == want == 3
    assert ad.choose_batch([]) == 0
    ad3 = S.AdaptiveK(3, 0.6)  # a dear draft: the mean no longer pays for it
    for _ in range(100):
        ad3.observe("good", 3, 3)
        ad3.observe("bad", 3, 0)
    assert ad3.choose("good") > 0 and ad3.choose_batch(["good", "bad", "bad", "bad"]) == 0

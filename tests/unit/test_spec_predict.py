"""oasis_core.spec_predict: the beside prediction's query choice and its exact repair; numpy == torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasis_core import spec_predict as sp
from oasis_core.scoring import topk_blocks
from oasis_core.selection import plan_step


def _both(fn, *arrays):
    """fn on numpy arrays and on torch tensors; the results as numpy (asserting they are equal)."""
    a = fn(*arrays)
    b = fn(*[torch.as_tensor(x) for x in arrays])
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), y.numpy())
    return a if len(a) > 1 else a[0]


def test_query_index_and_probs():
    n = np.array([0, 1, 2, 3])
    np.testing.assert_array_equal(_both(lambda x: sp.query_index(x, 3), n), [1, 2, 3, 3])
    rates = np.array([[0.7, 0.1, 0.5], [0.2, 0.9, 0.9], [1.0, 1.0, 1.0]])
    p = _both(lambda r: sp.query_probs(r, 3), rates)
    # index 1: n = 0; index 2: n = 1; index 3: n in {2, 3}
    np.testing.assert_allclose(p[0], [0.3, 0.7 * 0.9, 0.7 * 0.1])
    np.testing.assert_allclose(p.sum(1), 1.0)
    np.testing.assert_array_equal(_both(lambda r: sp.choose_query(r, 3), rates), [2, 1, 3])
    np.testing.assert_array_equal(_both(lambda r: sp.choose_query(r, 1), rates), [1, 1, 1])  # k = 1: always 1
    # a tie goes to the lower index
    np.testing.assert_array_equal(_both(lambda r: sp.choose_query(r, 2), np.array([[0.5, 0.3]])), [1])


def test_fills_and_needs_repair():
    bs = 4
    pos = np.array([0, 2, 2, 3, 5, 6])
    n = np.array([2, 0, 1, 0, 2, 1])
    # next position p + n + 1 against (p + 1): block 0 -> 0; 0 -> 0; 1 (pos 4) vs 0 (pos 3): fill; 1 vs 1; 2 vs 1
    np.testing.assert_array_equal(
        _both(lambda a, b: sp.fills(a, b, bs), pos, n), [False, False, True, False, True, True]
    )
    s_hat = np.array([3, 1, 2, 1, 2, 2])
    got = _both(lambda a, b, c: sp.needs_repair(a, b, c, 3, bs), pos, n, s_hat)
    np.testing.assert_array_equal(got, [False, False, True, False, True, True])
    got = _both(lambda a, b, c: sp.needs_repair(a, b, c, 3, bs), pos, n, np.array([1, 1, 2, 2, 3, 2]))
    np.testing.assert_array_equal(got, [True, False, True, True, True, True])


@pytest.mark.parametrize("seed", range(6))
def test_merge_block_is_the_rescored_top_k(seed):
    """The top-K of blocks 0 .. m-1 merged with block m's score equals topk_blocks over blocks 0 .. m (ties included:
    scores drawn from a few values)."""
    rng = np.random.default_rng(seed)
    R, N, K = 40, 12, 5
    scores = rng.integers(-3, 4, size=(R, N)).astype(np.float32)
    nb = rng.integers(1, N, size=R)  # blocks eligible before: 0 .. nb-2; the new block is nb - 1
    ids = topk_blocks(scores, K, nb)
    vals = np.where(ids >= 0, np.take_along_axis(scores, np.maximum(ids, 0), 1), -np.inf).astype(np.float32)
    add = rng.random(R) < 0.7
    new_id = nb - 1
    new_val = scores[np.arange(R), new_id]
    got_i, got_v = _both(sp.merge_block, ids, vals, new_id, new_val, add)
    want = np.where(add[:, None], topk_blocks(scores, K, nb + 1), ids)
    np.testing.assert_array_equal(got_i, want)
    np.testing.assert_array_equal(got_v[got_i >= 0], np.take_along_axis(scores, np.maximum(got_i, 0), 1)[got_i >= 0])


def test_repair_pred_exact():
    p_true = np.array([[5, 1, 7, 3], [2, 4, -1, -1]])
    p_hat = np.array([[5, 7, 9, 3], [2, 4, -1, -1]])
    resident = np.array([[5, 9, 3, 0], [2, 8, 1, -1]])  # 7 (row 0) and 4 (row 1) of p_hat left out by the cap
    got = _both(sp.repair_pred, p_true, p_hat, resident)
    np.testing.assert_array_equal(got, [[5, 1, 3, -1], [2, -1, -1, -1]])


@pytest.mark.parametrize("seed", range(5))
def test_beside_then_repair_holds_the_true_prediction(seed):
    """Invariant on random rows: after the beside plan (P_hat) and the repair plan (repair_pred, the same cap), a
    block of P_true is missing only if the beside cap left it out (it is in P_hat) or the repair's cap did; with an
    unlimited cap the working set is P_true exactly, as after the after variant's one plan; rows with P_true ==
    P_hat end with the after variant's table slot for slot."""
    rng = np.random.default_rng(seed)
    R, S, K, NB = 30, 6, 6, 20
    res0 = np.stack([rng.permutation(NB)[:S] for _ in range(R)])
    ls0 = -rng.integers(1, 9, size=(R, S))
    p_hat = np.stack([rng.permutation(NB)[:K] for _ in range(R)])
    same = rng.random(R) < 0.4
    p_true = np.where(same[:, None], p_hat, np.stack([rng.permutation(NB)[:K] for _ in range(R)]))
    for cap in (2, K):
        b = plan_step(res0, ls0 - 1, p_hat, cap, 0, K)
        rp = sp.repair_pred(p_true, p_hat, b.resident)
        r2 = plan_step(b.resident, b.last_sel - 1, rp, cap, 0, K)
        after = plan_step(res0, ls0 - 1, p_true, cap, 0, K)
        for i in range(R):
            held = set(r2.resident[i].tolist())
            lost = [x for x in p_true[i] if x not in held]
            for x in lost:
                assert x in p_hat[i] or r2.n_fetch[i] == cap, (i, x)
            if cap == K:
                assert held == set(after.resident[i].tolist()) == set(p_true[i].tolist())
            if same[i]:
                np.testing.assert_array_equal(r2.resident[i], after.resident[i])
                assert r2.n_fetch[i] == 0
                # recency reordered monotonically: the same order of last_sel
                np.testing.assert_array_equal(
                    np.argsort(r2.last_sel[i], kind="stable"), np.argsort(after.last_sel[i], kind="stable")
                )


def test_repair_probability():
    # k = 1: the query never moves, only a fill (n = 1 from one offset of 16) repairs
    assert sp.repair_probability([0.4], 1, 16) == pytest.approx(0.4 / 16)
    # k = 2, rates (0.7, 0.1): s* = 2 (n >= 1, P 0.7); repair when n = 0 (0.3) or the run fills
    want = 1 - (0.7 * 0.9 * (1 - 1 / 16) + 0.07 * (1 - 2 / 16))
    assert sp.repair_probability([0.7, 0.1], 2, 16) == pytest.approx(want)
    # Monte Carlo over positions and draws agrees with the closed form
    rng = np.random.default_rng(1)
    rates, k, bs, m = [0.6, 0.5, 0.3], 3, 8, 200_000
    u = rng.random((m, k))
    n = np.cumprod(u < np.array(rates), 1).sum(1)
    pos = rng.integers(0, 10_000, m)
    s_hat = sp.choose_query(np.array([rates]), k)[0]
    rate = sp.needs_repair(pos, n, np.full(m, s_hat), k, bs).mean()
    assert rate == pytest.approx(sp.repair_probability(rates, k, bs), abs=0.005)


def test_a_lane_drafting_less_than_the_pass_chooses_within_its_length():
    """A lane of draft length 1 in a k = 3 pass (adaptive k): rates past its length are 0, so its accepted n is 0
    or 1 and its likeliest index is 1 or 2, never 3."""
    rates = np.array([[0.9, 0.0, 0.0], [0.2, 0.0, 0.0]])
    np.testing.assert_array_equal(_both(lambda r: sp.choose_query(r, 3), rates), [2, 1])
    np.testing.assert_allclose(sp.query_probs(rates, 3)[0], [0.1, 0.9, 0.0])


def test_repair_possible_exact_and_never_misses_a_repair():
    bs, k = 16, 3
    pos = np.array([0, 13, 14, 5, 5, 100])
    ks = np.array([1, 1, 1, 0, 3, 2])
    s_hat = np.array([1, 1, 1, 1, 3, 2])
    # k = 1 lanes: only a lane one token short of its block's end (pos + 2 = 16) can fill; a lane drafting 0 never;
    # k_i >= 1 in a k = 3 pass moves the query (n = 0 gives 1, n = 1 gives 2)
    got = _both(lambda a, b, c: sp.repair_possible(a, b, c, k, bs), pos, ks, s_hat)
    np.testing.assert_array_equal(got, [True, True, True, False, True, True])
    got = _both(lambda a, b, c: sp.repair_possible(a, b, c, 1, bs), pos[:4], np.array([1, 1, 1, 0]), s_hat[:4])
    np.testing.assert_array_equal(got, [False, False, True, False])
    rng = np.random.default_rng(0)
    for _ in range(200):
        kk = int(rng.integers(1, 4))
        p = rng.integers(0, 200, 50)
        ki = rng.integers(0, kk + 1, 50)
        sh = rng.integers(1, kk + 1, 50)
        possible = sp.repair_possible(p, ki, sh, kk, bs)
        for n in range(kk + 1):
            rep = sp.needs_repair(p, np.minimum(n, ki), sh, kk, bs)
            assert not (rep & ~possible).any()

"""Block summaries, the Quest upper-bound score with GQA, and top-K block selection."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oasis_core.scoring import (
    blocks_of,
    build_summaries,
    empty_summaries,
    num_blocks,
    score_blocks,
    topk_blocks,
    update_summary,
)

torch = pytest.importorskip("torch")

fast = settings(max_examples=40, deadline=None)


def brute_score(q, kmin, kmax):
    """The definition, term by term: max over a group's query heads of sum_i max(q_i max_i, q_i min_i)."""
    b, hq, d = q.shape
    hkv, n = kmin.shape[1], kmin.shape[2]
    g = hq // hkv
    out = np.full((b, hkv, n), -np.inf)
    for bi in range(b):
        for h in range(hq):
            kv = h // g
            for j in range(n):
                s = sum(max(q[bi, h, i] * kmax[bi, kv, j, i], q[bi, h, i] * kmin[bi, kv, j, i]) for i in range(d))
                out[bi, kv, j] = max(out[bi, kv, j], s)
    return out


# ---------------------------------------------------------------- summaries


def test_build_summaries_partial_last_block_uses_valid_tokens_only():
    keys = np.array([[1, -5], [3, 2], [0, 7], [-2, 4], [9, -1]], dtype=np.float32)  # T=5, D=2
    kmin, kmax = build_summaries(keys, block_size=2)
    assert kmin.tolist() == [[1, -5], [-2, 4], [9, -1]]
    assert kmax.tolist() == [[3, 2], [0, 7], [9, -1]]
    assert num_blocks(5, 2) == 3 and num_blocks(4, 2) == 2


def test_build_summaries_rejects_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        build_summaries(np.zeros((4, 2)), 0)


@pytest.mark.parametrize("t, pad", [(37, 11), (32, 0), (1, 15)])
def test_blocks_of_pads_the_last_block_with_fill(t, pad):
    keys = np.random.default_rng(1).standard_normal((2, 3, t, 4)).astype(np.float32)  # [B, Hkv, T, D]
    blocks, got_pad = blocks_of(keys, 16, -7.5)
    assert got_pad == pad and blocks.shape == (2, 3, num_blocks(t, 16), 16, 4)
    flat = blocks.reshape(2, 3, -1, 4)
    assert np.array_equal(flat[..., :t, :], keys) and np.all(flat[..., t:, :] == -7.5)
    tb, tpad = blocks_of(torch.from_numpy(keys), 16, -7.5)
    assert tpad == pad and np.array_equal(tb.numpy(), blocks)
    with pytest.raises(ValueError, match="block_size"):
        blocks_of(keys, 0, 0.0)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_token_by_token_updates_equal_build(lib):
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((2, 3, 37, 4)).astype(np.float32)  # [B, Hkv, T, D]
    ref_min, ref_max = build_summaries(keys, 16)
    k = keys if lib == "numpy" else torch.from_numpy(keys)
    kmin, kmax = empty_summaries((2, 3), 0, 4, np.float32 if lib == "numpy" else torch.float32, like=k)
    for t in range(37):
        kmin, kmax = update_summary(kmin, kmax, k[..., t : t + 1, :], t // 16)  # grows at t = 0, 16, 32
    np.testing.assert_array_equal(np.asarray(kmin), ref_min)
    np.testing.assert_array_equal(np.asarray(kmax), ref_max)


def test_update_summary_per_request_block_index_and_whole_block_fold():
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((2, 1, 48, 3))
    kmin, kmax = build_summaries(keys[..., :32, :], 16)
    kmin, kmax = (
        np.concatenate([a, e], axis=-2)
        for a, e in zip((kmin, kmax), empty_summaries((2, 1), 1, 3, np.float64, like=keys))
    )
    # Request 0 folds its whole third block; request 1 re-folds its first block (idempotent).
    new = np.stack([keys[0, :, 32:48], keys[1, :, 0:16]])
    m2, x2 = update_summary(kmin, kmax, new, np.array([2, 0]))
    full_min, full_max = build_summaries(keys, 16)
    np.testing.assert_array_equal(m2[0], full_min[0])
    np.testing.assert_array_equal(x2[1, :, :2], full_max[1, :, :2])
    assert np.isinf(x2[1, :, 2]).all()  # untouched empty block
    assert np.isinf(kmax[0, :, 2]).all()  # inputs not modified
    with pytest.raises(ValueError, match="block_idx"):
        update_summary(kmin, kmax, new, 5)


# ---------------------------------------------------------------- score


@fast
@given(
    b=st.integers(1, 2),
    hkv=st.integers(1, 3),
    g=st.integers(1, 3),
    n=st.integers(1, 4),
    d=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_score_equals_definition(b, hkv, g, n, d, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hkv * g, d))
    a, c = rng.standard_normal((2, b, hkv, n, d))
    kmin, kmax = np.minimum(a, c), np.maximum(a, c)
    np.testing.assert_allclose(score_blocks(q, kmin, kmax), brute_score(q, kmin, kmax), rtol=1e-12, atol=1e-12)


@fast
@given(
    block=st.integers(1, 8),
    t=st.integers(1, 40),
    d=st.integers(1, 6),
    g=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_score_bounds_every_token_of_its_block(block, t, d, g, seed):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((1, 2, t, d))
    q = rng.standard_normal((1, 2 * g, d))
    kmin, kmax = build_summaries(keys, block)
    s = score_blocks(q, kmin, kmax)  # [1, 2, N]
    for h in range(2):
        dots = q[0, h * g : (h + 1) * g] @ keys[0, h].T  # [G, T]
        for j in range(kmin.shape[2]):
            true_max = dots[:, j * block : (j + 1) * block].max()
            assert s[0, h, j] >= true_max - 1e-9
            if block == 1:  # one token per block: the bound is exact
                assert s[0, h, j] == pytest.approx(true_max, abs=1e-9)


def test_gqa_takes_the_max_over_consecutive_query_heads():
    # 4 query heads, 2 KV heads: q heads 0, 1 -> KV 0; q heads 2, 3 -> KV 1 (repeat_kv order).
    kmin = np.zeros((1, 2, 1, 1))
    kmax = np.ones((1, 2, 1, 1))  # score of a query head = max(q, 0)
    q = np.array([[[1.0], [5.0], [2.0], [3.0]]])
    assert score_blocks(q, kmin, kmax).tolist() == [[[5.0], [3.0]]]  # interleaved grouping would give 2 and 5
    with pytest.raises(ValueError, match="multiple"):
        score_blocks(np.zeros((1, 3, 1)), kmin, kmax)


def test_score_numpy_and_torch_identical_on_integer_valued_inputs():
    rng = np.random.default_rng(5)
    q = rng.integers(-3, 4, (2, 8, 16)).astype(np.float32)
    a, c = rng.integers(-3, 4, (2, 2, 4, 30, 16)).astype(np.float32)
    kmin, kmax = np.minimum(a, c), np.maximum(a, c)
    s_np = score_blocks(q, kmin, kmax)
    s_t = score_blocks(*(torch.from_numpy(x) for x in (q, kmin, kmax)))
    np.testing.assert_array_equal(s_t.numpy(), s_np)
    ids_np = topk_blocks(s_np.reshape(8, 30), 6, np.full(8, 30))
    ids_t = topk_blocks(s_t.reshape(8, 30), 6, torch.full((8,), 30))
    np.testing.assert_array_equal(ids_t.numpy(), ids_np)


# ---------------------------------------------------------------- top-K


def test_topk_excludes_local_and_padding_and_breaks_ties_by_lower_id():
    scores = np.array([[5, 9, 9, 1, 7, 100.0]] * 4)
    ids = topk_blocks(scores, 3, np.array([6, 5, 3, 1]))
    assert ids.tolist() == [
        [1, 2, 4],  # block 5 is local: its 100 is ignored; 9 ties -> 1 before 2
        [1, 2, 0],  # n_blocks 5: block 4 is local, block 5 beyond the context
        [1, 0, -1],  # n_blocks 3: only blocks 0, 1 eligible
        [-1, -1, -1],  # a single (local) block: nothing to choose
    ]
    assert ids.dtype == np.int64


def test_topk_k_larger_than_context_pads_and_accepts_int_n_blocks():
    scores = np.array([[-np.inf, 2.0, 2.0]])
    assert topk_blocks(scores, 5, 3).tolist() == [[1, 0, -1, -1, -1]]  # an eligible -inf still beats padding
    assert topk_blocks(scores, 0, 3).shape == (1, 0)


@fast
@given(r=st.integers(1, 5), n=st.integers(1, 12), k=st.integers(0, 14), seed=st.integers(0, 2**31 - 1))
def test_topk_numpy_torch_identical_with_ties_and_matches_reference(r, n, k, seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, (r, n)).astype(np.float32)  # many ties
    nb = rng.integers(0, n + 1, r)
    ids = topk_blocks(scores, k, nb)
    ids_t = topk_blocks(torch.from_numpy(scores), k, torch.from_numpy(nb))
    np.testing.assert_array_equal(ids_t.numpy(), ids)
    for i in range(r):
        eligible = sorted(range(max(0, nb[i] - 1)), key=lambda j: (-scores[i, j], j))[:k]
        assert ids[i].tolist() == eligible + [-1] * (k - len(eligible))


def test_scoring_torch_path_never_syncs(monkeypatch):
    rng = np.random.default_rng(2)
    keys = torch.from_numpy(rng.standard_normal((2, 2, 40, 8)).astype(np.float32))
    q = torch.from_numpy(rng.standard_normal((2, 4, 8)).astype(np.float32))

    def boom(*_a, **_k):
        raise AssertionError("host synchronisation on the scoring path")

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    kmin, kmax = build_summaries(keys, 16)
    kmin, kmax = update_summary(kmin, kmax, keys[..., 32:34, :], torch.tensor([2, 1]))
    s = score_blocks(q, kmin, kmax)
    ids = topk_blocks(s.reshape(4, 3), 2, torch.tensor([3, 3, 2, 1]))
    assert ids.shape == (4, 2)

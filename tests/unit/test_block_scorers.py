"""oasis_core.block_scorers: numpy == torch on random inputs, each formula against its definition, bytes."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oasis_core.block_scorers import SCORERS, build, get_scorer, score, summary_bytes_per_token
from oasis_core.scoring import build_summaries, score_blocks

torch = pytest.importorskip("torch")


def brute(q, keys, bs, scorer, scale):
    """Each score from the keys themselves, block by block and query head by query head (float64)."""
    b, hq, d = q.shape
    hkv, t = keys.shape[1], keys.shape[2]
    g = hq // hkv
    n = -(-t // bs)
    out = np.zeros((b, hkv, n))
    info = get_scorer(scorer)
    for bi in range(b):
        for h in range(hkv):
            for j in range(n):
                kb = keys[bi, h, j * bs : (j + 1) * bs].astype(np.float64)
                per = []
                for gi in range(g):
                    qq = q[bi, h * g + gi].astype(np.float64)
                    if info.summary == "minmax":
                        per.append(sum(max(qq[i] * kb[:, i].max(), qq[i] * kb[:, i].min()) for i in range(d)))
                    elif info.summary == "mean":
                        per.append(float(qq @ kb.mean(0)))
                    else:
                        per.append(scale * float(qq @ kb.mean(0)) + 0.5 * scale**2 * float(qq**2 @ kb.var(0)))
                per = np.array(per)
                out[bi, h, j] = {"max": per.max(), "sum": per.sum(), "lse": np.log(np.exp(per).sum())}[info.combine]
                if info.sink and j == 0:
                    out[bi, h, j] = math.inf
    return out


@settings(max_examples=25, deadline=None)
@given(
    scorer=st.sampled_from(SCORERS),
    b=st.integers(1, 2),
    hkv=st.integers(1, 3),
    g=st.integers(1, 3),
    t=st.integers(1, 40),
    bs=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_numpy_equals_torch_and_the_definition(scorer, b, hkv, g, t, bs, seed):
    rng = np.random.default_rng(seed)
    d = 8
    keys = (rng.standard_normal((b, hkv, t, d)) * rng.uniform(0.5, 3, d)).astype(np.float32)
    q = rng.standard_normal((b, hkv * g, d)).astype(np.float32)
    a, bb = build(keys, bs, scorer)
    s_np = score(q, a, bb, scorer)
    at, bt = build(torch.tensor(keys), bs, scorer)
    s_t = score(torch.tensor(q), at, bt, scorer)
    np.testing.assert_allclose(at.numpy(), a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bt.numpy(), bb, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s_t.numpy(), s_np, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s_np, brute(q, keys, bs, scorer, 1 / math.sqrt(d)), rtol=1e-4, atol=1e-3)


def test_minmax_is_todays_score():
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((2, 2, 50, 8)).astype(np.float32)
    q = rng.standard_normal((2, 6, 8)).astype(np.float32)
    kmin, kmax = build_summaries(keys, 16)
    np.testing.assert_array_equal(score(q, *build(keys, 16, "minmax"), "minmax"), score_blocks(q, kmin, kmax))


def test_sum_prefers_the_block_the_whole_group_wants():
    """Two query heads: block 0 has one key the first head loves; block 1 suits both heads. max picks 0, sum 1."""
    q = np.array([[[4.0, 0.0], [0.0, 1.0]]], np.float32)  # [B=1, Hq=2, D=2], one KV head
    keys = np.array([[[[2.0, -1.0], [2.0, -1.0], [1.8, 1.0], [1.8, 1.0]]]], np.float32)  # block size 2
    a, b = build(keys, 2, "minmax")
    assert score(q, a, b, "minmax").argmax(-1).item() == 0
    assert score(q, a, b, "minmax_sum").argmax(-1).item() == 1


def test_mean_ranks_typical_over_one_outlier():
    q = np.array([[[1.0, 0.0]]], np.float32)
    keys = np.array([[[[5.0, 0], [-3.0, 0], [-3.0, 0], [2.0, 0], [2.0, 0], [2.0, 0]]]], np.float32)  # block 3
    a, b = build(keys, 3, "minmax")
    assert score(q, a, b, "minmax").argmax(-1).item() == 0  # the outlier 5 wins the bound
    a, b = build(keys, 3, "mean")
    assert score(q, a, b, "mean").argmax(-1).item() == 1  # mean -1/3 vs 2


def test_sink_scores_block_zero_first_and_unknown_names_are_refused():
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((1, 1, 64, 4)).astype(np.float32)
    q = rng.standard_normal((1, 2, 4)).astype(np.float32)
    s = score(q, *build(keys, 16, "gauss"), "gauss+sink")
    assert s[0, 0, 0] == math.inf and np.isfinite(s[0, 0, 1:]).all()
    with pytest.raises(ValueError, match="unknown scorer 'bogus'"):
        get_scorer("bogus")


def test_bytes_per_token():
    # Qwen3-8B head: D 128 bf16, block 16: K + V = 512 B a token and head; min/max 32 B = 1/16
    mm = summary_bytes_per_token("minmax", 128, 16)
    assert mm["needed"] == 32 and mm["needed_frac_kv"] == 1 / 16
    assert summary_bytes_per_token("mean+sink", 128, 16)["needed"] == 16
    assert summary_bytes_per_token("gauss", 128, 16)["allocated_frac_kv"] == 1 / 16

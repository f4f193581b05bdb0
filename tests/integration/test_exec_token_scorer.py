"""The executor with ``block_score=tokens`` on the CPU, tiny random model, float32: the stored per-token channels are
the engine's own keys' kept channels (prefill and decode; paged pages and the host copy), every selecting mode runs,
a K covering every block still equals dense, the lane bytes count the storage, and a basis file is read."""

import numpy as np
import pytest
import torch
from exec_cases import cfg, host_copy_blocks, prompts, run_logits

from oasis_core import lanes
from oasis_core.geometry import KVGeometry
from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.kv.store import SparseStore

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _kept(keys, chan):
    """keys [H, T, D] -> [H, T, r] (each head's channels)."""
    return keys.gather(-1, chan.long()[:, None, :].expand(-1, keys.shape[1], -1))


def test_quest_stores_every_tokens_channels():
    c = cfg("quest", top_k=2, block_score="tokens")
    eng = Engine(c)
    for p in prompts(lens=(70, 100)):
        eng.add_request(p, SamplingParams(max_tokens=30))
    for _ in range(25):  # prefill, then decode across block boundaries
        eng.step()
    st, bs = eng.runner.store, c.block_size
    assert st.kmin is None and st.kmax is None  # the per-token storage replaces them
    checked = 0
    for r in eng.scheduler.running.values():
        n_tok = r.n_tokens - 1  # tokens whose key is written (the last sampled one is not yet in the cache)
        nb = -(-n_tok // bs)
        for layer in range(eng.runner.L):
            pages = st.k[layer][r.lane * st.P : r.lane * st.P + nb]  # [n, H, bs, D]
            keys = pages.permute(1, 0, 2, 3).reshape(pages.shape[1], -1, pages.shape[-1])[:, :n_tok]
            kp = st.tok.kp[layer, r.lane, :, :nb].reshape(keys.shape[0], -1, st.tok.r)[:, :n_tok]
            assert torch.equal(kp, _kept(keys, st.tok.chan[layer]))  # the local block's written tokens too
            checked += n_tok
    eng.close()
    assert checked > 2 * 6 * 16


def test_lookahead_stores_the_host_copys_channels():
    checked = 0
    for st, lane, layer, n_full, keys in host_copy_blocks("tokens"):
        kp = st.tok.kp[layer, lane, :, :n_full].reshape(keys.shape[0], -1, st.tok.r)
        assert torch.equal(kp, _kept(keys, st.tok.chan[layer]))
        checked += n_full
    assert checked > 2 * 6


@pytest.mark.parametrize("mode", ["quest", "retrieval", "proxy", "lookahead", "hisparse"])
def test_sparse_equals_dense_when_top_k_covers_every_block(mode):
    ps = prompts(lens=(70, 33))
    ref, out_ref = run_logits(cfg("dense"), ps, 12)
    got, out = run_logits(cfg(mode, top_k=32, fetch_ratio=1.0, block_score="tokens"), ps, 12)
    assert out == out_ref
    for rid in ref:
        for x, y in zip(ref[rid], got[rid]):
            assert torch.allclose(x, y, atol=2e-4, rtol=2e-4), (mode, (x - y).abs().max())


def test_tokens_changes_a_small_selection():
    ps = prompts(lens=(150,))
    base, _ = run_logits(cfg("retrieval", top_k=2), ps, 6)
    other, _ = run_logits(cfg("retrieval", top_k=2, block_score="tokens"), ps, 6)
    assert any(not torch.equal(x, y) for x, y in zip(base[0], other[0]))


def test_lane_bytes_count_the_channels():
    c = cfg("lookahead", block_score="tokens", token_rank=4)
    eng = Engine(c)
    st, lay = eng.runner.store, eng.runner.kv
    shape = eng.runner.model.dec.shape
    geo = KVGeometry(shape, c.block_size, 4, token_rank=4)
    assert lay.geometry == geo
    assert geo.summary_bytes_per_block_head == c.block_size * 4 * 4  # bs * r * fp32
    kp_bytes = st.tok.kp.numel() * st.tok.kp.element_size()
    assert kp_bytes == lay.max_lanes * geo.summary_bytes(c.max_blocks * c.block_size)
    two_vec = KVGeometry(shape, c.block_size, 4)
    diff = lanes.sparse_lane_bytes(geo, st.S, c.max_blocks) - lanes.sparse_lane_bytes(two_vec, st.S, c.max_blocks)
    assert diff == c.max_blocks * geo.rows_per_request * (c.block_size * 4 - 2 * shape.head_dim) * 4
    assert lay.lane_bytes == SparseStore.bytes_per_lane(geo, st.S, c.max_blocks)
    eng.close()


def test_a_basis_file_picks_the_channels(tmp_path):
    c0 = cfg("quest", top_k=2, block_score="tokens")
    eng = Engine(c0)
    L, H, D = eng.runner.L, eng.runner.H, eng.runner.model.dec.shape.head_dim
    r = eng.runner.store.tok.r
    eng.close()
    rng = np.random.default_rng(0)
    chans = {f"L{l}_pairs{r}": np.stack([rng.choice(D, r, replace=False) for _ in range(H)]) for l in range(L)}
    np.savez(tmp_path / "b.npz", **chans)
    eng = Engine(cfg("quest", top_k=2, block_score="tokens", token_basis=str(tmp_path / "b.npz")))
    for l in range(L):
        assert eng.runner.store.tok.chan[l].tolist() == chans[f"L{l}_pairs{r}"].tolist()
    eng.close()
    np.savez(tmp_path / "short.npz", L0_pairs2=np.zeros((H, 2)))
    with pytest.raises(ValueError, match="token_basis"):
        Engine(cfg("quest", top_k=2, block_score="tokens", token_basis=str(tmp_path / "short.npz")))


def test_config_rejects_what_tokens_does_not_support():
    with pytest.raises(ValueError, match="ExecConfig.token_basis"):
        ExecConfig(model="tiny", device="cpu", mode="quest", token_basis="x.npz")
    with pytest.raises(ValueError, match="ExecConfig.token_rank"):
        ExecConfig(model="tiny", device="cpu", mode="quest", block_score="tokens", token_rank=3)
    with pytest.raises(ValueError, match="ExecConfig.spec_predict"):
        ExecConfig(model="tiny", device="cpu", mode="lookahead", block_score="tokens", spec_predict="beside")


def test_the_committed_bases_load_for_their_models():
    """Gemma 3 270M (full layers 5, 11, 17; 1 KV head of 256: r = 64) and SmolLM2-135M (30 layers, 3 KV heads of 64:
    r = 16) at the engine's default rank: RoPE pairs (i, i + D / 2) of distinct channels."""
    import os

    from oasis_exec.kv.token_summaries import load_channels

    calib = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "block_scorers", "calib")
    for name, layers, H, D in (
        ("gemma3_270m_basis.npz", (5, 11, 17), 1, 256),
        ("smollm2_135m_basis.npz", range(30), 3, 64),
    ):
        ch = load_channels(os.path.join(calib, name), layers, D // 4, H, D)
        assert sorted(ch) == list(layers)
        for c in ch.values():
            assert c.shape == (H, D // 4)
            for row in c:
                assert len(set(row.tolist())) == D // 4
                assert sorted((row[row >= D // 2] - D // 2).tolist()) == sorted(row[row < D // 2].tolist())


@pytest.mark.parametrize("mode", ["quest", "lookahead"])
def test_hybrid_model_keeps_channels_of_its_full_layers_only(mode):
    """A Gemma-shaped hybrid (sliding layers 0 and 2, full 1 and 3): the per-token storage exists for the full layers
    only, a K covering every block still gives the plain forward's greedy tokens, and a small K runs."""
    from gemma_cases import TINY_GEMMA, greedy_ref, tiny_decoder
    from gemma_cases import cfg as gcfg
    from gemma_cases import prompts as gprompts

    from oasis_exec.kv.layer_table import FullLayers
    from oasis_exec.runner.runner import Runner

    dec = tiny_decoder()
    ps = gprompts(lens=(70, 100))
    c = gcfg(mode, top_k=10, fetch_ratio=1.0, short_context=False, block_score="tokens")
    eng = Engine(c, Runner(c, decoder=dec))
    tok = eng.runner.store.tok
    assert isinstance(tok.kp, FullLayers) and tok.kp.held == TINY_GEMMA.full_layers == (1, 3)
    assert tok.kp.shape[0] == 2 and tok.r == TINY_GEMMA.head_dim // 4
    got = eng.generate(ps, SamplingParams(max_tokens=24))
    for p, g in zip(ps, got):
        assert g == greedy_ref(dec, p, 24)
    c = gcfg(mode, top_k=2, fetch_ratio=0.5, short_context=False, block_score="tokens")
    out = Engine(c, Runner(c, decoder=dec)).generate(ps, SamplingParams(max_tokens=24))
    assert all(len(o) == 24 for o in out)

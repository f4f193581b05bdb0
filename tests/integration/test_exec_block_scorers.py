"""The executor with each block scorer (ExecConfig.block_score) on the CPU, tiny random model, float32: the stored
summaries are oasis_core.block_scorers.build of the engine's own keys (prefill and decode), every selecting mode runs,
a K covering every block still equals dense, and the scorer changes what a small K selects."""

import pytest
import torch
from exec_cases import cfg, host_copy_blocks, prompts, run_logits

from oasis_core.block_scorers import build
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("scorer", ["minmax_sum", "mean", "gauss+sink"])
def test_summaries_are_the_scorers_of_the_engines_keys(scorer):
    c = cfg("quest", top_k=2, block_score=scorer)
    eng = Engine(c)
    ps = prompts(lens=(70, 100))
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=30))
    for _ in range(25):  # prefill, then decode across block boundaries
        eng.step()
    st, bs = eng.runner.store, c.block_size
    checked = 0
    for r in eng.scheduler.running.values():
        n_full = (r.n_tokens - 1) // bs  # blocks whose every key is written
        for layer in range(eng.runner.L):
            pages = st.k[layer][r.lane * st.P : r.lane * st.P + n_full]  # [n, H, bs, D]
            keys = pages.permute(1, 0, 2, 3).reshape(pages.shape[1], -1, pages.shape[-1])
            a, b = build(keys.float(), bs, scorer)
            torch.testing.assert_close(st.kmin[layer, r.lane, :, :n_full].float(), a, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(st.kmax[layer, r.lane, :, :n_full].float(), b, atol=1e-5, rtol=1e-5)
            checked += n_full
    eng.close()
    assert checked > 2 * 6  # blocks of several layers and both requests were compared


@pytest.mark.parametrize("scorer", ["minmax_sum", "gauss"])
def test_sparse_mode_summaries_match_the_host_copy(scorer):
    """lookahead keeps the KV on the host: the summaries of its whole blocks are the scorer's of the host copy."""
    checked = 0
    for st, lane, layer, n_full, keys in host_copy_blocks(scorer):
        a, b = build(keys.float(), st.bs, scorer)
        torch.testing.assert_close(st.kmin[layer, lane, :, :n_full].float(), a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(st.kmax[layer, lane, :, :n_full].float(), b, atol=1e-5, rtol=1e-5)
        checked += n_full
    assert checked > 2 * 6


@pytest.mark.parametrize("mode", ["quest", "retrieval", "proxy", "lookahead"])
@pytest.mark.parametrize("scorer", ["mean", "gauss"])
def test_sparse_equals_dense_when_top_k_covers_every_block(mode, scorer):
    ps = prompts(lens=(70, 33))
    ref, out_ref = run_logits(cfg("dense"), ps, 12)
    got, out = run_logits(cfg(mode, top_k=32, fetch_ratio=1.0, block_score=scorer), ps, 12)
    assert out == out_ref
    for rid in ref:
        for x, y in zip(ref[rid], got[rid]):
            assert torch.allclose(x, y, atol=2e-4, rtol=2e-4), (mode, scorer, (x - y).abs().max())


def test_the_scorer_changes_a_small_selection():
    ps = prompts(lens=(150,))
    base, _ = run_logits(cfg("quest", top_k=2), ps, 6)
    other, _ = run_logits(cfg("quest", top_k=2, block_score="mean"), ps, 6)
    assert max((x - y).abs().max() for x, y in zip(base[0], other[0])) > 1e-4  # the option reaches the selection


def test_unknown_scorer_is_refused():
    with pytest.raises(ValueError, match="block_score"):
        cfg("quest", block_score="median")

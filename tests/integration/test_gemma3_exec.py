"""Gemma 3's hybrid attention in the executor (CPU, fp32, a tiny random Gemma-shaped model): the sliding layers'
rings give the plain forward's greedy output and logits in ``dense`` (prompts longer than the window, chunked
prefill, several lanes), speculative steps included; the loader of a Hugging Face directory equals transformers'
``Gemma3ForCausalLM`` on the same weights; every sparse mode with K covering every block equals it too (the full
layers run the mode, the sliding layers their rings)."""

from __future__ import annotations

import pytest
import torch
from gemma_cases import TINY_GEMMA, WINDOW, cfg, greedy_ref, prompts, tiny_decoder

from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.runner.runner import Runner

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def dec():
    return tiny_decoder()


def test_plain_forward_applies_the_window():
    """One sliding layer: the last position's logits ignore a token older than the window, not one inside it."""
    from dataclasses import replace

    from gemma_cases import ARCH

    from oasis_exec.model.gemma3 import Gemma3Decoder, random_weights

    one = replace(TINY_GEMMA, n_layers=1, layer_windows=(WINDOW,))
    d = Gemma3Decoder(one, ARCH, random_weights(one, 0, torch.float32), torch.float32)
    for n, seen in ((WINDOW + 1, False), (WINDOW, True)):
        ids = prompts(lens=(n,))[0]
        other = [ids[0] % 200 + 1] + ids[1:]
        with torch.no_grad():
            a, b = d.forward_dense(ids)[-1], d.forward_dense(other)[-1]
        assert torch.equal(a, b) != seen


def test_dense_engine_greedy_equals_plain_forward(dec):
    ps = prompts()
    c = cfg("dense")
    got = Engine(c, Runner(c, decoder=dec)).generate(ps, SamplingParams(max_tokens=40))
    for p, g in zip(ps, got):
        assert g == greedy_ref(dec, p, 40)


def test_dense_speculative_steps_equal_plain_forward(dec):
    """Speculative steps write every drafted position into the ring; rejected drafts never reach an attended key."""
    ps = prompts(seed=1)
    c = cfg("dense", speculative_k=3)
    eng = Engine(c, Runner(c, decoder=dec))
    got = eng.generate(ps, SamplingParams(max_tokens=30))
    assert eng.runner.spec.steps > 0
    assert eng.runner.model.ring.R[0] == WINDOW + 3
    for p, g in zip(ps, got):
        assert g == greedy_ref(dec, p, 30)


def test_dense_engine_ring_is_smaller_than_pages(dec):
    c = cfg("dense")
    r = Runner(c, decoder=dec)
    assert r.store.k[0].shape[0] == 0 and r.store.k[1].shape[0] > 0  # layer 0 sliding: no pages
    assert r.model.ring.k[0].shape == (r.max_lanes, 2, WINDOW, 32)


@pytest.mark.parametrize("mode", ["quest", "lookahead", "proxy", "retrieval", "hisparse"])
@pytest.mark.parametrize("kw", [{"short_context": False}, {}, {"speculative_k": 3, "short_context": False}])
def test_sparse_modes_with_top_k_covering_every_block_equal_dense(dec, mode, kw):
    """The full layers run the mode (host copies, summaries, selection, transfers, a lookahead step's draft row);
    the sliding layers their rings. With K covering every block the output is the plain forward's."""
    if "speculative_k" in kw and mode != "lookahead":
        pytest.skip("speculative steps: dense and lookahead only")
    ps = prompts()
    c = cfg(mode, top_k=10, fetch_ratio=1.0, **kw)
    eng = Engine(c, Runner(c, decoder=dec))
    assert eng.runner.model.ring.R[0] == WINDOW + max(kw.get("speculative_k", 0), int(c.mode_spec.drafts))
    got = eng.generate(ps, SamplingParams(max_tokens=40))
    for p, g in zip(ps, got):
        assert g == greedy_ref(dec, p, 40)


def test_hf_directory_loads_and_equals_transformers(tmp_path):
    """A ``gemma3_text`` directory written by transformers (random weights, norms perturbed) loads through the
    architecture registry and gives transformers' logits over a prompt longer than the window (sdpa, fp32)."""
    transformers = pytest.importorskip("transformers")
    from gemma_cases import ARCH

    from oasis_exec.model.decoder import Decoder, family_of
    from oasis_exec.model.gemma3 import Gemma3Decoder, hf_config

    cfg_d = hf_config(TINY_GEMMA, ARCH)
    cfg_d.pop("architectures"), cfg_d.pop("model_type")
    conf = transformers.Gemma3TextConfig(**cfg_d)
    torch.manual_seed(0)
    ref = transformers.Gemma3ForCausalLM(conf).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.copy_(0.2 * torch.randn_like(p))
    ref.save_pretrained(tmp_path)
    assert family_of(str(tmp_path)) == "gemma3_text"
    dec = Decoder.from_path(str(tmp_path), torch.float32)
    assert isinstance(dec, Gemma3Decoder) and dec.shape.layer_windows == TINY_GEMMA.layer_windows
    assert dec.q_scale != 1.0  # query_pre_attn_scalar 24, head_dim 32
    ids = prompts(lens=(100,))[0]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
        got = dec.forward_dense(ids)
    assert (got - want).abs().max().item() < 1e-4

"""``block_score=tokens`` on the GPU (Triton kernels, bf16, CUDA graphs): the stored channels are the engine's own
keys' (the ``token_update`` kernel at every decode step), captured steps equal eager ones, and the GPU scores equal
the plain-torch reference's on the engine's own storage."""

import pytest
import torch
from exec_cases import cfg, prompts, run_logits

from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_kernels.token_scorer import token_score, token_score_ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["quest", "retrieval", "lookahead"])
def test_cuda_graph_steps_equal_eager_steps(mode):
    kw = dict(top_k=2, fetch_ratio=0.5, block_score="tokens")
    ps = prompts(lens=(70, 100))
    ref, out_ref = run_logits(cfg(mode, "cuda", cuda_graph=False, **kw), ps, 24)
    got, out = run_logits(cfg(mode, "cuda", cuda_graph=True, **kw), ps, 24)
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    assert out == out_ref


def test_stored_channels_and_scores_on_the_gpu():
    c = cfg("quest", "cuda", top_k=2, block_score="tokens")
    eng = Engine(c)
    for p in prompts(lens=(70, 100)):
        eng.add_request(p, SamplingParams(max_tokens=30))
    for _ in range(25):
        eng.step()
    st, bs = eng.runner.store, c.block_size
    lanes, nbs = [], []
    for r in eng.scheduler.running.values():
        n_tok = r.n_tokens - 1
        nb = -(-n_tok // bs)
        for layer in range(eng.runner.L):
            pages = st.k[layer][r.lane * st.P : r.lane * st.P + nb]
            keys = pages.permute(1, 0, 2, 3).reshape(pages.shape[1], -1, pages.shape[-1])[:, :n_tok]
            kept = keys.gather(-1, st.tok.chan[layer].long()[:, None, :].expand(-1, keys.shape[1], -1))
            kp = st.tok.kp[layer, r.lane, :, :nb].reshape(keys.shape[0], -1, st.tok.r)[:, :n_tok]
            assert torch.equal(kp, kept)
        lanes.append(r.lane)
        nbs.append(nb)
    seat = torch.tensor(lanes, dtype=torch.int32, device="cuda")
    nb32 = torch.tensor(nbs, dtype=torch.int32, device="cuda")
    shape = eng.runner.model.dec.shape
    q = torch.randn(len(lanes), shape.n_q_heads, shape.head_dim, device="cuda", dtype=torch.bfloat16)
    for layer in range(eng.runner.L):
        got = token_score(q, st.tok.kp[layer], st.tok.chan[layer], nb32, seat)
        want = token_score_ref(q, st.tok.kp[layer], st.tok.chan[layer], nb32, seat)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        fin = torch.isfinite(want)
        torch.testing.assert_close(got[fin], want[fin], atol=2e-3, rtol=2e-3)
    eng.close()

"""``ExecConfig.topk_kernel="fused"``: the prediction's top-K from ``kernels.topk_select`` (run here by the Triton
interpreter, in place of ``ops``' CPU reference) gives the run of the torch sort: same tokens, mappings and fetches
(tiny random model, selection=model, CPU). The GPU twin is in ``tests/gpu/test_exec_gpu.py``."""

import pytest
import torch
from exec_cases import cfg, prompts

import kernels.topk_select
import oasis_exec.ops as ops
from oasis_exec.config import ExecConfig
from oasis_exec.engine import Engine
from oasis_exec.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(c, ps, steps):
    eng = Engine(c)
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=steps))
    toks = []
    while eng.has_work():
        toks += [(o.request_id, o.new_token_ids) for o in eng.step()]
    st = eng.runner.store  # quest keeps every block on the GPU (no slot tables): its tokens say what it chose
    held = [t.clone() for t in (getattr(st, "resident", None), getattr(st, "last_sel", None)) if t is not None]
    out = (toks, held, eng.runner.counters()["units_fetched"])
    eng.close()
    return out


@pytest.mark.parametrize("mode", ["lookahead", "quest"])
def test_fused_topk_gives_the_run_of_the_sort(mode, monkeypatch):
    calls = []

    def kernel(s, k, nb, heads):
        calls.append(s.shape)
        return kernels.topk_select.topk_select(s, k, nb, heads)

    monkeypatch.setattr(ops, "topk_select", kernel)
    ps = prompts(2, (90, 60, 120))
    kw = dict(top_k=3, fetch_ratio=0.67)
    ref = _run(cfg(mode, **kw), ps, 12)
    assert not calls
    got = _run(cfg(mode, **kw, topk_kernel="fused"), ps, 12)
    assert calls  # the kernel chose the blocks
    assert got[0] == ref[0]
    assert len(got[1]) == len(ref[1]) == (2 if mode == "lookahead" else 0)
    assert all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))
    assert got[2] == ref[2]
    if mode == "lookahead":
        assert ref[2] > 0


def test_topk_kernel_is_checked():
    with pytest.raises(ValueError, match="topk_kernel"):
        ExecConfig(model="tiny", device="cpu", topk_kernel="bitonic")

"""``ExecConfig.topk_kernel="fused"`` (the default): the prediction's top-K from ``oasis_kernels.topk_select`` (run here by the Triton
interpreter, in place of ``ops``' CPU reference) gives the run of the torch sort: same tokens, mappings and fetches
(tiny random model, selection=model, CPU). The GPU twin is in ``tests/gpu/test_exec_gpu.py``."""

import pytest
from exec_cases import assert_same_run, cfg, prompts, run_state

import oasis_exec.ops as ops
import oasis_kernels.topk_select
from oasis_exec.config import ExecConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.slow  # ~15 s: the kernel under the Triton interpreter, a launch a layer a step
def test_fused_topk_gives_the_run_of_the_sort(monkeypatch):
    calls = []

    def kernel(s, k, nb, heads):
        calls.append(s.shape)
        return oasis_kernels.topk_select.topk_select(s, k, nb, heads)

    monkeypatch.setattr(ops, "topk_select", kernel)
    ps = prompts(2, (90, 60, 120))
    kw = dict(top_k=3, fetch_ratio=0.67)
    ref = run_state(cfg("lookahead", **kw, topk_kernel="sort"), ps, 12)
    assert not calls
    got = run_state(cfg("lookahead", **kw, topk_kernel="fused"), ps, 12)
    assert calls  # the kernel chose the blocks
    assert_same_run(got, ref)
    assert len(ref[1]) == 2 and ref[2] > 0  # the slot tables compared, and blocks were fetched


def test_topk_kernel_is_checked():
    with pytest.raises(ValueError, match="topk_kernel"):
        ExecConfig(model="tiny", device="cpu", topk_kernel="bitonic")

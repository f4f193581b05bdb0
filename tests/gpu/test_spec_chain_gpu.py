"""Chains of speculative steps (``ExecConfig.spec_chain``) on CUDA under graphs: a chain's steps replay the same
graphs, whose outputs the next replay overwrites, so ``SpecStep.run_chain`` keeps each step's accepted counts,
emitted tokens and logits apart. With drawn acceptance (dummy weights: the draws are the same sequence chained or
not) the chained run emits exactly the unchained run's tokens, in dense and in lookahead, at k = 1 and 3.

``OASIS_GPU_TESTS_DEVICE=cpu`` runs the file on the CPU as a dry run (no graphs there)."""

import os

import pytest
from exec_cases import cfg, prompts

from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("OASIS_GPU_TESTS_DEVICE", "cuda")


def _run(c, ps):
    eng = Engine(c)
    n_chains, keys = [], []
    inner = eng.runner.spec.run_chain
    eng.runner.spec.run_chain = lambda items, ks, n, sr: (n_chains.append(n), inner(items, ks, n, sr))[1]
    run = eng.runner.cuda_graphs.run
    eng.runner.cuda_graphs.run = lambda key, *a, **kk: (keys.append(key), run(key, *a, **kk))[1]
    out = eng.generate(ps, SamplingParams(max_tokens=40))
    eng.close()
    return out, n_chains, keys


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
@pytest.mark.parametrize("k", [1, 3])
def test_chained_speculative_graphs_equal_unchained(mode, k):
    ps = prompts()
    acc = {"1": [1, 3]} if k == 1 else {"3": [1, 1, 1, 2]}
    kw = dict(speculative_k=k, synthetic_accept=acc)
    if mode == "lookahead":
        kw["short_context"] = False  # every step speculative (a short lane's steps are the ordinary ones)
    ref, _, _ = _run(cfg(mode, DEVICE, **kw), ps)
    out, n_chains, keys = _run(cfg(mode, DEVICE, spec_chain=8, **kw), ps)
    assert out == ref
    assert any(n > 1 for n in n_chains)
    if DEVICE.startswith("cuda"):
        assert {key[0] for key in keys} >= {"chain", "spec"}  # the chained steps ran through graphs

"""Chains of speculative steps (``ExecConfig.spec_chain``, ``SpecStep.run_chain``), on the CPU in fp32: a chain's
later steps take their inputs (the token emitted last, the position after the accepted run) from the step before on
the device, and the host reads the chain's tokens once.

- Greedy output equals the non-speculative greedy output and the unchained speculative one, with an oracle draft
  that accepts 0 .. k drafts a step, in dense and in lookahead with top-K covering every block; chains of more than
  one step ran and filled blocks in their middle.
- Lookahead with a small top-K: the KV kept is exact (layer 0's host copies, summaries and local block).
- The chain's length: ``spec_chain_max`` (at most block_size // (k + 1)), the least ``max_new``, and none where a
  row samples or k is adaptive.
"""

import pytest
from exec_cases import cfg, layer0_kv_exact, oracle_chain, prompts

from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 40


def _wrong(p):
    return p % 5 == 2  # rejections at varying places


def _run(c, ps, refd=None):
    eng = Engine(c)
    if refd is not None:
        eng.runner.drafts.chain = oracle_chain(eng, refd, _wrong)
    chains = []
    inner = eng.runner.spec.run_chain

    def run_chain(items, ks, n_chain, synth_ready):
        got = inner(items, ks, n_chain, synth_ready)
        chains.append((n_chain, got[3]))
        return got

    eng.runner.spec.run_chain = run_chain
    out = eng.generate(ps, SamplingParams(max_tokens=N))
    return eng, out, chains


@pytest.mark.parametrize(
    "mode,kw",
    [("dense", {}), ("lookahead", {"top_k": 20, "fetch_ratio": 1.0, "short_context": False})],
)
@pytest.mark.parametrize("k", [1, 3])
def test_chained_speculation_equals_greedy(mode, kw, k):
    ps = prompts()
    eng, ref, _ = _run(cfg(mode, **kw), ps)
    refd = dict(enumerate(ref))
    eng.close()
    eng, unchained, _ = _run(cfg(mode, speculative_k=k, **kw), ps, refd)
    eng.close()
    eng, out, chains = _run(cfg(mode, speculative_k=k, spec_chain=8, **kw), ps, refd)
    assert out == ref and unchained == ref
    bs = eng.cfg.block_size
    assert eng.cfg.spec_chain_max == min(8, bs // (k + 1))
    assert any(n > 1 for n, _ in chains)
    r = eng.runner
    assert r.spec.tokens / r.spec.lanes > 1.2  # drafts accepted
    # a block filled inside a chain: a lane's later step began in a block after its first step's
    assert any(step[b] // bs > ps_[0][b] // bs for _, ps_ in chains for step in ps_[1:] for b in range(len(ps_[0])))
    eng.close()


def test_chained_speculation_keeps_only_accepted_kv():
    ps = prompts()
    kw = {"short_context": False}  # top_k 4: the resident set is a selection
    eng, ref, _ = _run(cfg("lookahead", **kw), ps)
    refd = dict(enumerate(ref))
    eng.close()
    eng, out, chains = _run(cfg("lookahead", speculative_k=1, spec_chain=8, **kw), ps, refd)
    assert [len(o) for o in out] == [N] * 3 and any(n > 1 for n, _ in chains)
    layer0_kv_exact(eng, ps, out)
    eng.close()


def test_chain_length_rules():
    c = cfg("lookahead", speculative_k=3, spec_chain=8)
    assert c.spec_chain_max == 4 and c.step_tokens_max == 16  # 16 // (3 + 1) steps of 4 tokens
    assert cfg("lookahead", speculative_k=1, spec_chain=8).spec_chain_max == 8
    assert cfg("lookahead", speculative_k=1, spec_chain=1).spec_chain_max == 1  # off
    assert ExecConfig(mode="lookahead", speculative_k=1).spec_chain_max == 8  # the default chains 8
    assert cfg("lookahead", speculative_k="auto:2", spec_chain=8).spec_chain_max == 1  # adaptive k: each step's own
    assert cfg("lookahead", spec_chain=8).spec_chain_max == 1  # no speculation
    with pytest.raises(ValueError, match="spec_chain"):
        cfg("lookahead", speculative_k=1, spec_chain=0)
    eng = Engine(cfg("dense", speculative_k=1, spec_chain=8))
    ps = prompts()
    eng.generate(ps, SamplingParams(max_tokens=3))  # warm the engine: three running requests
    spec = eng.runner.spec

    class It:
        def __init__(self, max_new):
            self.max_new = max_new

    greedy, hot = SamplingParams(), SamplingParams(temperature=0.7)
    items = [It(40), It(9), It(30)]
    assert spec.chain_len(items, [greedy] * 3, [1, 1, 1], 8, None, None) == 4  # 9 // 2: no lane past its max_new
    assert spec.chain_len(items, [greedy] * 3, [1, 1, 1], 1, None, None) == 1  # the engine gave no chain
    assert spec.chain_len(items, [greedy, hot, greedy], [1, 1, 1], 8, None, None) == 1  # a sampled row
    assert spec.chain_len(items, [greedy] * 3, [1, 0, 1], 8, None, None) == 1  # lanes drafting differently
    eng.close()
    assert isinstance(ExecConfig.help()["spec_chain"], str)

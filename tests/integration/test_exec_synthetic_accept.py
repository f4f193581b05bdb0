"""``ExecConfig.synthetic_accept`` (benchmark only, dummy weights) and ``bench.run_bench_phases``, on the CPU with the
tiny preset.

- The accepted drafts of every speculative step are drawn from the given acceptance, not decided by the target: a
  histogram that always accepts all k (the random head alone would accept almost nothing), one that never
  accepts, and the chain model's frequencies at alpha 0.5; a real run's ``accepted_hist`` is reproduced.
- What is committed is exact for the tokens emitted: layer 0's host copies, summaries and local block (lookahead)
  and pages (dense) are those of the emitted sequence.
- Refused with real weights (a clear error), bad values refused; records and recordings say ``acceptance``.
- ``run_bench_phases``: one record a draft length over one prefill; ``Runner.set_speculative_k`` refuses a k
  longer than the runner's buffers.
"""

import pytest
import torch
from exec_cases import cfg, layer0_kv_exact, prompts

from oasis_core.speculation import ChainAcceptance, synthetic_acceptance
from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 40
LOOK = {"short_context": False}  # top_k 4 of up to 9 blocks: a real selection


def _run(mode, accept, k=3, n=N, **kw):
    eng = Engine(cfg(mode, speculative_k=k, synthetic_accept=accept, **kw))
    ps = prompts()
    out = eng.generate(ps, SamplingParams(max_tokens=n))
    return eng, ps, out


def _dense_pages_exact(eng, ps, outs):
    """Dense: layer 0's pages over every position of prompt + output (but the last token) hold that sequence's KV."""
    r = eng.runner
    st, dec = r.store, r.dec
    for lane, (p, o) in enumerate(zip(ps, outs)):
        seq = p + o[:-1]
        T = len(seq)
        _, k, v = dec.qkv(0, dec.embed[torch.tensor(seq)], torch.arange(T))
        npg = -(-T // r.bs)
        pages = slice(lane * st.P, lane * st.P + npg)
        H, D = k.shape[1], k.shape[2]
        torch.testing.assert_close(st.k[0][pages].permute(1, 0, 2, 3).reshape(H, -1, D)[:, :T], k.transpose(0, 1))
        torch.testing.assert_close(st.v[0][pages].permute(1, 0, 2, 3).reshape(H, -1, D)[:, :T], v.transpose(0, 1))


@pytest.mark.parametrize("mode,kw", [("dense", {}), ("lookahead", LOOK)])
def test_always_accept_emits_k_plus_one_and_commits_exactly(mode, kw):
    eng, ps, out = _run(mode, {"3": [0, 0, 0, 5]}, **kw)
    r = eng.runner
    assert [len(o) for o in out] == [N] * 3
    assert r.spec.steps > 0 and set(r.spec.accepts) <= {(3, 3), (2, 2), (1, 1)}  # the last steps: max_new clips k
    assert r.spec.accepts[3, 3] >= 3 * 8  # 4 tokens a step, where the random head accepts ~nothing
    (layer0_kv_exact if mode == "lookahead" else _dense_pages_exact)(eng, ps, out)
    eng.close()


def test_never_accept_is_one_token_a_step():
    eng, ps, out = _run("lookahead", {"alpha": 0.0}, **LOOK)
    r = eng.runner
    assert r.spec.tokens == r.spec.lanes and set(n for _, n in r.spec.accepts) == {0}
    layer0_kv_exact(eng, ps, out)
    eng.close()


def test_chain_frequencies_follow_alpha():
    eng, ps, out = _run("dense", {"alpha": 0.5}, n=60, max_context=400)
    counts = [eng.runner.spec.accepts[3, m] for m in range(4)]
    total = sum(counts)
    expect = [0.5, 0.25, 0.125, 0.125]  # leading successes of 3 draws at 0.5
    assert total > 80
    for c, p in zip(counts, expect):
        sd = (p * (1 - p) / total) ** 0.5
        assert abs(c / total - p) < 4 * sd + 0.02, (counts, expect)
    _dense_pages_exact(eng, ps, out)
    eng.close()


def test_measured_histogram_is_reproduced():
    hist = {"2": [30, 20, 50]}  # P(0) .3, P(1) .2, P(2) .5: not a constant-alpha chain
    acc = synthetic_acceptance(hist)
    assert acc.rates == pytest.approx((0.7, 50 / 70))
    eng, _, _ = _run("dense", {"hist": hist}, k=2, n=60, max_context=400)
    counts = [eng.runner.spec.accepts[2, m] for m in range(3)]
    total = sum(counts)
    for c, p in zip(counts, (0.3, 0.2, 0.5)):
        assert abs(c / total - p) < 4 * (p * (1 - p) / total) ** 0.5 + 0.02, counts
    eng.close()


def test_refused_with_real_weights_and_bad_values(tmp_path):
    with pytest.raises(ValueError, match="synthetic_accept: benchmark-only, for dummy weights"):
        ExecConfig(model_path=str(tmp_path), mode="dense", speculative_k=2, synthetic_accept={"alpha": 0.5})
    for bad in ({"alpha": 1.5}, {"alpha": 0.5, "x": 1}, {"3": [1, 2]}, {"0": [1]}, {"2": [0, 0, 0]}, {}, {"hist": 3}):
        with pytest.raises(ValueError, match="ExecConfig.synthetic_accept"):
            cfg("dense", speculative_k=2, synthetic_accept=bad)
    assert isinstance(synthetic_acceptance({"alpha": 0.25}), ChainAcceptance)


def test_cli_refuses_it_with_a_model_path(tmp_path, capsys):
    from oasis_exec.__main__ import main

    rc = main(["bench", "--model-path", str(tmp_path), "--mode", "dense", "--speculative-k", "2",
               "--synthetic-accept", '{"alpha": 0.6}', "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "synthetic-accept" in err and "dummy weights" in err and "Traceback" not in err


def test_bench_records_say_synthetic_and_phases_share_one_prefill():
    from oasis_exec.tools.bench import run_bench_phases
    from oasis_exec.tools.recorder import recording_from_bench

    c = cfg("lookahead", speculative_k=2, max_context=640, max_lanes=2, synthetic_accept={"2": [0, 0, 4]}, **LOOK)
    recs = run_bench_phases(c, context=100, concurrency=2, steps=3, warmup=1, phases=[0, 2, "auto:2"])
    assert [r["speculative_k"] for r in recs] == [0, 2, "auto:2"] and [r["phase"] for r in recs] == [0, 1, 2]
    assert [r["acceptance"] for r in recs] == [None, "synthetic", "synthetic"]
    assert recs[0]["accepted_tokens_per_step"] == 1.0 and recs[1]["accepted_tokens_per_step"] == 3.0
    assert recs[1]["accepted_hist"] == {"2": [0, 0, 6]} and all(r["prefill_shared"] for r in recs)
    rec = recording_from_bench(recs[1], c, hardware="h200", model="tiny")
    assert rec.config["acceptance"] == "synthetic" and rec.config["synthetic_accept"] == {"2": [0, 0, 4]}
    with pytest.raises(ValueError, match="longest"):
        run_bench_phases(c, context=100, concurrency=2, steps=1, warmup=0, phases=[0, 1])


def test_set_speculative_k_refuses_more_than_built():
    eng = Engine(cfg("dense", speculative_k=2))
    with pytest.raises(ValueError, match="more than the 2"):
        eng.runner.set_speculative_k(3)
    eng.runner.set_speculative_k("auto:2")
    assert eng.runner.spec.adaptive is not None and eng.runner.cfg.spec_max_k == 2
    eng.runner.set_speculative_k(0)
    assert eng.runner.spec.adaptive is None and not eng.runner.cfg.spec_max_k
    eng.close()

"""``spec_predict = "beside"`` (``oasis_exec.workingset.spec_pipeline``, ``oasis_core.spec_predict``) on the CPU in fp32:
the next step's prediction launched during the verify pass, then the exact repair after the acceptance.

- With the top-K covering every block, greedy speculative output equals non-speculative greedy output (an oracle
  draft accepting runs of every length, across block boundaries: repairs happen).
- With a small top-K and an unlimited cap, every step ends with the blocks attention will read (per layer and row)
  equal to the after variant's, in lockstep with it, and the same tokens (acceptance drawn, every length).
- With the paper's cap the step runs and keeps only accepted KV; an adaptive fetch policy falls back to after.
"""

import dataclasses

import pytest
import torch
from exec_cases import cfg, layer0_kv_exact, oracle_chain, prompts

from oasis_core.selection import attended_blocks
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 40


def _wrong(p):
    return p % 7 == 3


def _attended(eng):
    """Per layer, each lane's rows' attended block sets (sorted), of the lanes in use."""
    r = eng.runner
    st, K = r.store, r.cfg.top_k
    lanes = sorted(x.lane for x in eng.scheduler.running.values())
    out = []
    for l in st.layers:  # the layers with a working set (a hybrid model's full ones)
        a = attended_blocks(st.resident[l], st.last_sel[l], K)
        rows = [lane * r.H + h for lane in lanes for h in range(r.H)]
        out.append(torch.sort(a[rows], dim=1).values)
    return out


@pytest.mark.parametrize("k", [2, 4])
def test_top_k_covering_every_block_equals_greedy(k):
    kw = {"top_k": 20, "fetch_ratio": 1.0, "short_context": False}
    ps = prompts()
    eng0 = Engine(cfg("lookahead", **kw))
    ref = eng0.generate(ps, SamplingParams(max_tokens=N))
    eng0.close()
    eng = Engine(cfg("lookahead", speculative_k=k, spec_predict="beside", **kw))
    assert eng.runner.spec.predict_used == "beside"
    eng.runner.drafts.chain = oracle_chain(eng, dict(enumerate(ref)), _wrong)
    out = eng.generate(ps, SamplingParams(max_tokens=N))
    sp = eng.runner.spec.beside.stats()
    assert out == ref
    assert eng.runner.spec.tokens / eng.runner.spec.lanes > 1.8
    assert 0 < sp["spec_predict_repairs"] < sp["spec_predict_lane_steps"]
    eng.close()


@pytest.mark.parametrize("hot", [None, 4])
@pytest.mark.parametrize("k,alpha", [(1, 0.9), (3, 0.6)])
@pytest.mark.parametrize("scorer", ["minmax", "minmax_sum+sink"])
def test_small_top_k_unlimited_cap_attends_what_after_attends(k, alpha, hot, scorer):
    """Drawn acceptance (dummy weights, model selection: top-K 4 of up to 9 blocks); the two engines in lockstep.
    With a +sink scorer the repair's one-block rescoring must not take the sink rule (its view's block 0 is the filled
    block): it did until 2026-12-06, and beside attended a filled block where after did not."""
    kw = dict(short_context=False, fetch_ratio=1.0, speculative_k=k, synthetic_accept={"alpha": alpha}, hot_slots=hot)
    kw["block_score"] = scorer
    stats = _lockstep_attended_equal(lambda v: Engine(cfg("lookahead", spec_predict=v, **kw)))
    assert stats["spec_predict_repairs"] > 0 and stats["spec_predict_lane_steps"] > 30


@pytest.mark.parametrize("k,alpha,hot,scorer", [(1, 0.9, None, "minmax"), (3, 0.6, 4, "minmax_sum+sink")])
def test_the_fused_repair_attends_what_after_attends(k, alpha, hot, scorer, monkeypatch):
    """The repair's prediction in one oasis_kernels.spec_repair launch a layer (what CUDA runs), here in Triton's
    interpreter: beside still attends what after attends at every step (a hot cache: S > K)."""
    import oasis_kernels.spec_repair as kernel

    kw = dict(short_context=False, fetch_ratio=1.0, speculative_k=k, synthetic_accept={"alpha": alpha}, hot_slots=hot)
    calls, launch = [], kernel.spec_repair
    monkeypatch.setattr(kernel, "spec_repair", lambda *a, **kw: (calls.append(1), launch(*a, **kw))[1])

    def make(v):
        eng = Engine(cfg("lookahead", spec_predict=v, block_score=scorer, **kw))
        if v == "beside":
            pipe = eng.runner.spec.beside
            assert not pipe.fused  # CPU: the torch path unless told
            pipe.fused = True
        return eng

    stats = _lockstep_attended_equal(make)
    assert stats["spec_predict_repairs"] > 0 and stats["spec_predict_lane_steps"] > 30
    assert calls  # the kernel ran


def test_a_forced_repair_changes_nothing():
    """The bench's warm-up runs the repair where it cannot fetch (``force_repairs``, to capture its graph early): the
    repair then plans nothing, so beside still attends what after attends at every step."""

    def make(v):
        eng = Engine(cfg("lookahead", spec_predict=v, short_context=False, fetch_ratio=1.0, speculative_k=3,
                         synthetic_accept={"alpha": 0.6}))  # fmt: skip
        if v == "beside":
            eng.runner.spec.beside.force_repairs = 10**9  # every speculative step
        return eng

    stats = _lockstep_attended_equal(make)
    assert stats["spec_predict_repairs"] > 0 and stats["spec_predict_lane_steps"] > 30


def _lockstep_attended_equal(make):
    """Run the after and beside engines ``make(variant)`` in lockstep over prompts(); every step's attended blocks
    and the tokens equal. Returns the beside engine's repair stats."""
    engs = [make(v) for v in ("after", "beside")]
    assert [e.runner.spec.predict_used for e in engs] == ["after", "beside"]
    outs = [{}, {}]
    for i, e in enumerate(engs):
        for p in prompts():
            outs[i][e.add_request(p, SamplingParams(max_tokens=N))] = []
    while engs[0].has_work():
        for i, e in enumerate(engs):
            for o in e.step():
                outs[i][o.request_id].extend(o.new_token_ids)
        assert engs[1].has_work() == engs[0].has_work()
        if engs[0].has_work() and engs[0].runner.spec.steps:
            for a, b in zip(_attended(engs[0]), _attended(engs[1])):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert list(outs[0].values()) == list(outs[1].values())
    stats = engs[1].runner.spec.beside.stats()
    for e in engs:
        e.close()
    return stats


def test_hybrid_model_unlimited_cap_attends_what_after_attends():
    """A tiny Gemma-shaped model (sliding layers in rings, full layers sparse): beside runs on the full layers."""
    from gemma_cases import cfg as gcfg
    from gemma_cases import tiny_decoder

    from oasis_exec.runner.runner import Runner

    dec = tiny_decoder()
    kw = dict(top_k=4, fetch_ratio=1.0, short_context=False, speculative_k=2, synthetic_accept={"alpha": 0.8})

    def make(v):
        c = gcfg("lookahead", spec_predict=v, **kw)
        return Engine(c, Runner(c, decoder=dec))

    stats = _lockstep_attended_equal(make)
    assert stats["spec_predict_repairs"] > 0


def test_paper_cap_keeps_only_accepted_kv():
    ps = prompts()
    kw = {"short_context": False}
    eng0 = Engine(cfg("lookahead", **kw))
    refd = dict(enumerate(eng0.generate(ps, SamplingParams(max_tokens=N))))
    eng0.close()
    eng = Engine(cfg("lookahead", speculative_k=3, spec_predict="beside", **kw))
    eng.runner.drafts.chain = oracle_chain(eng, refd, _wrong)
    out = eng.generate(ps, SamplingParams(max_tokens=N))
    assert [len(o) for o in out] == [N] * 3
    assert eng.runner.spec.beside.stats()["spec_predict_lane_steps"] > 0
    layer0_kv_exact(eng, ps, out)
    eng.close()


def test_falls_back_to_after_where_beside_cannot_run():
    eng = Engine(cfg("lookahead", speculative_k=2, spec_predict="beside", fetch_policy="budget"))
    r = eng.runner
    assert (r.spec.predict_used, r.spec.beside) == ("after", None)
    assert "adaptive fetch policy" in r.spec.predict_reason
    eng.close()
    eng = Engine(cfg("dense", speculative_k=2, spec_predict="beside"))
    assert eng.runner.spec.predict_used == "after"
    eng.close()


def test_random_draft_small_top_k_equals_greedy():
    """The random head's drafts are all rejected: the beside query (index 1, the likeliest under the prior too) is
    the true one and no run fills a block, so no repair fetches and the output is non-speculative greedy's with a
    top-K of 4 and the paper's cap (the after variant's equality, test_exec_speculative)."""
    # draft_gate 0: the ordinary steps predict from the draft's query, as the beside query does (no gate there);
    # draft_ngram 0: the head alone in both (the ordinary lookahead's default runs prompt lookup beside it)
    kw = {"short_context": False, "draft_gate": 0, "draft_ngram": 0}
    ps = prompts(6)  # never right by chance under the default scorer (test_exec_speculative's seed)
    eng0 = Engine(cfg("lookahead", **kw))
    ref = eng0.generate(ps, SamplingParams(max_tokens=N))
    eng0.close()
    eng = Engine(cfg("lookahead", speculative_k=3, spec_predict="beside", **kw))
    out = eng.generate(ps, SamplingParams(max_tokens=N))
    sp = eng.runner.spec.beside.stats()
    assert out == ref and eng.runner.spec.tokens == eng.runner.spec.lanes
    assert sp["spec_predict_lane_steps"] > 0 and sp["spec_predict_repairs"] == 0
    eng.close()


def test_bench_record_and_recording_say_beside_and_the_replay_takes_it():
    from oasis_exec.tools.bench import run_bench
    from oasis_exec.tools.recorder import recording_from_bench
    from oasis_sim.replay import sim_config

    c = cfg(
        "lookahead",
        speculative_k=2,
        spec_predict="beside",
        synthetic_accept={"alpha": 0.7},
        short_context=False,
        max_context=512,
        max_lanes=2,
    )
    rec = run_bench(c, context=300, concurrency=2, steps=6, warmup=1)
    assert rec["spec_predict"] == "beside" and rec["spec_predict_reason"] is None
    assert rec["spec_predict_lane_steps"] == 2 * 6 and 0 <= rec["spec_predict_repairs"] <= 12
    r = recording_from_bench(rec, c, hardware="h200", model="qwen3-8b")
    assert r.config["spec_predict"] == "beside"
    assert sim_config(r).spec_predict == "beside"
    after = run_bench(dataclasses.replace(c, spec_predict="after"), context=300, concurrency=2, steps=2, warmup=1)
    assert (
        after["spec_predict"] == "after"
        and "spec_predict" not in recording_from_bench(after, c, hardware="h200", model="qwen3-8b").config
    )


def test_auto_k_beside_equals_greedy():
    """speculative_k auto:3 (one length a step, lanes limited by their max_new) with beside: the oracle draft's
    output equals non-speculative greedy with the top-K covering every block."""
    kw = {"top_k": 20, "fetch_ratio": 1.0, "short_context": False}
    ps = prompts()
    eng0 = Engine(cfg("lookahead", **kw))
    ref = eng0.generate(ps, SamplingParams(max_tokens=N))
    eng0.close()
    eng = Engine(cfg("lookahead", speculative_k="auto:3", spec_predict="beside", **kw))
    eng.runner.drafts.chain = oracle_chain(eng, dict(enumerate(ref)), _wrong)
    out = eng.generate(ps, SamplingParams(max_tokens=N))
    assert out == ref and eng.runner.spec.steps > 0
    assert eng.runner.spec.beside.stats()["spec_predict_lane_steps"] > 0
    eng.close()

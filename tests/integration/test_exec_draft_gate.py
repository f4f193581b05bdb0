"""``ExecConfig.draft_gate``: a lookahead step predicts from the draft's query only where the head was sure of its draft,
elsewhere from the current query (proxy's). Tiny model, fp32, CPU, model selection."""

from __future__ import annotations

import pytest
import torch
from exec_cases import cfg, prompts, run_logits

from oasis_exec.config import DRAFT_GATE, ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.runner.ngram_drafts import NgramDrafts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# draft_ngram 0: the head alone (prompt lookup, on by default in lookahead, makes its matched lanes certain)
KW = dict(top_k=3, fetch_ratio=1.0, short_context=False, draft_ngram=0)


def _gap(a, b):
    """The largest logit difference of two runs (the same requests, the same steps)."""
    return max(float((x - y).abs().max()) for rid in a for x, y in zip(a[rid], b[rid]))


def test_gate_one_predicts_as_proxy_and_a_tiny_gate_as_lookahead():
    """A random head is never sure (its probability < 1), so at gate 1 every lane predicts from its current query and
    lookahead computes what proxy computes; at a gate below every probability it is lookahead's."""
    ps, n = prompts(), 20
    proxy, _ = run_logits(cfg("proxy", **KW), ps, n)
    look, _ = run_logits(cfg("lookahead", draft_gate=0, **KW), ps, n)  # ungated (the default gates at 0.5)
    gated1, _ = run_logits(cfg("lookahead", draft_gate=1.0, **KW), ps, n)
    tiny, _ = run_logits(cfg("lookahead", draft_gate=1e-30, **KW), ps, n)
    # equal but for float rounding (lookahead's pass carries a second row per lane)
    assert _gap(gated1, proxy) < 1e-5 and _gap(tiny, look) < 1e-5
    assert _gap(look, proxy) > 1e-3  # the two predictions attend different blocks here (else no test)


def test_the_default_gate_makes_a_random_heads_lookahead_proxy():
    """The default (0.5 in lookahead): a random head's drafts (probability ~1 / its vocabulary) are all unsure, so
    every lane predicts from its current query, as proxy; an explicit 0 turns the gate off (the draft's query)."""
    ps, n = prompts(), 20
    c = cfg("lookahead", **KW)
    assert c.draft_gate == DRAFT_GATE == 0.5
    proxy, _ = run_logits(cfg("proxy", **KW), ps, n)
    default, _ = run_logits(c, ps, n)
    off, _ = run_logits(cfg("lookahead", draft_gate=0, **KW), ps, n)
    assert _gap(default, proxy) < 1e-5
    assert _gap(off, proxy) > 1e-3


@pytest.mark.parametrize("mode", ["dense", "quest", "retrieval", "proxy", "lookahead", "hisparse"])
def test_the_default_gate_is_on_where_a_step_drafts(mode):
    """None (not given) resolves to 0.5 in a mode with a draft row, 0 (off) elsewhere; an explicit value wins."""
    c = ExecConfig(model="tiny", device="cpu", dtype="float32", mode=mode)
    drafts = c.mode_spec.drafts
    assert drafts == (mode == "lookahead")
    assert c.draft_gate == (DRAFT_GATE if drafts else 0.0)
    assert ExecConfig(model="tiny", device="cpu", dtype="float32", mode=mode, draft_gate=0).draft_gate == 0
    if drafts:
        assert ExecConfig(model="tiny", device="cpu", dtype="float32", mode=mode, draft_gate=0.3).draft_gate == 0.3


def test_the_command_line_default_and_an_explicit_zero():
    from oasis_exec.config import add_engine_options, engine_config

    def built(*argv):
        import argparse

        p = argparse.ArgumentParser()
        add_engine_options(p)
        return engine_config(p.parse_args(["--model", "tiny", "--device", "cpu", *argv]))

    assert built("--mode", "lookahead").draft_gate == DRAFT_GATE
    assert built("--mode", "lookahead", "--draft-gate", "0").draft_gate == 0
    assert built("--mode", "proxy").draft_gate == 0
    with pytest.raises(ValueError, match="no draft row"):
        built("--mode", "proxy", "--draft-gate", "0.5")


def test_each_lane_takes_its_own_query():
    """Half the lanes sure, half not (a threshold between their probabilities): each lane's prediction is the draft's
    or the current query's by its own probability (checked through the query the working set hands the predictor)."""
    eng = Engine(cfg("lookahead", draft_gate=0.5, **KW))
    ws = eng.runner.model.ws
    got = []
    real = ws._prediction_query

    def probe(q, s):
        conf = eng.runner.drafts.conf
        conf[s.lanes] = torch.tensor([0.9, 0.1, 0.6][: len(s.lanes)], dtype=conf.dtype)  # lanes 0 and 2 sure
        out = real(q, s)
        want = torch.stack([q[i, 1] if conf[s.lanes[i]] >= 0.5 else q[i, 0] for i in range(q.shape[0])])
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        got.append("checked")
        return out

    ws._prediction_query = probe
    eng.generate(prompts(), SamplingParams(max_tokens=4))
    assert got.count("checked") > 0


def test_the_head_keeps_its_drafts_probability():
    """``want_conf``: the probability the head gives the draft it proposes (exp(logit - logsumexp)), per lane."""
    eng = Engine(cfg("lookahead", draft_gate=0.3, **KW))
    head = eng.runner.drafts.head
    assert head.want_conf
    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, head.shape.hidden, generator=g)
    ids = head._ids(h)
    from oasis_exec.model.draft import rms_norm

    logits = (rms_norm(h, head.w["norm.weight"], head.shape.rms_eps) @ head.lm_head.t()).double()
    top, d = torch.softmax(logits, -1).max(-1)  # over the head's own vocabulary (d2t maps it to the target's)
    assert torch.equal(ids, d + head.d2t[d] if head.own_head else d)
    torch.testing.assert_close(head.conf.double(), top, rtol=1e-5, atol=1e-6)
    assert torch.all(head.conf < 1)


def test_prompt_lookup_drafts_count_as_certain():
    tok, conf = torch.zeros(3, dtype=torch.int64), torch.full((3,), 0.2)
    ng = NgramDrafts(2, max_lanes=3, max_context=16, tok=tok, conf=conf)

    class Ch:
        lane, start, tokens, last = 1, 0, [5, 6, 7, 5, 6], True

    ng.prefill(Ch)
    ng.step(torch.tensor([1]), torch.tensor([7]), torch.tensor([5]))  # 5 6 7 5 6 7: "6 7" occurred, then 5
    assert tok.tolist() == [0, 5, 0] and conf.tolist() == pytest.approx([0.2, 1.0, 0.2])


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(mode="lookahead", draft_gate=1.5), "probability"),
        (dict(mode="lookahead", draft_gate=True), "probability"),
        (dict(mode="proxy", draft_gate=0.5), "no draft row"),
    ],
)
def test_bad_gate_is_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ExecConfig(model="tiny", device="cpu", dtype="float32", **kw)


def test_a_synthesized_prefill_starts_without_a_draft_probability():
    """A lane's synthesized prefill (the bench's) has no draft: its gate probability is 0 (the first step predicts from
    the current query), not what the lane's last occupant left."""
    eng = Engine(cfg("lookahead", draft_gate=0.5, **KW))
    conf = eng.runner.drafts.conf
    conf.fill_(1.0)  # as a sure draft of an earlier request would leave it
    seen = []
    reset = eng.runner.drafts.reset

    def spy(a):
        reset(a)
        seen.append((a.lane, float(conf[a.lane])))

    eng.runner.drafts.reset = spy
    eng.add_request(prompts()[0], SamplingParams(max_tokens=2), synthetic_prefill=True)
    eng.step()
    assert seen and all(c == 0.0 for _, c in seen)

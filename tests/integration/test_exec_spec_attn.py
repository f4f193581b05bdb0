"""Speculative decoding with the attention draft head (``draft_head="attn"``, ``oasis_exec.model.draft_attn``) at
k = 1, on the CPU in fp32 with the tiny model (no CUDA graphs).

- Greedy speculative output equals greedy ordinary output: the head's own drafts (random weights: nearly all
  rejected) and an oracle draft (the reference continuation, some positions wrong: accepted and rejected steps), in
  dense and in lookahead with top-K covering every block (spec_predict after and beside), and with ``auto``
  (capped at ``auto:1``).
- The head's K/V after a speculative run is that of the teacher-forced full-sequence forward over the generated
  text (the target's features at every position, the next token): each accepted position written once, in order;
  after every engine step nothing lies past a lane's length (a rejected draft's position never stays); its
  proposals after each step are the full-sequence forward's; the same with rows above temperature 0 (the
  acceptance drawn on the host).
- k >= 2 (and ``auto:N``, N >= 2) stay refused with the reason; ``auto`` becomes ``auto:1``, also at run time.
"""

import pytest
import torch
from exec_cases import cfg, oracle_chain, prompts

from oasis_core.specs import get_model
from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.model.decoder import Decoder
from oasis_exec.model.draft_attn import hidden_seq, layer_input, project_qkv

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 24  # output tokens a request
COVER = {"top_k": 20, "fetch_ratio": 1.0, "short_context": False}  # lookahead attending every block: dense's output


def _wrong(p):
    return p % 5 == 3  # some oracle drafts wrong: rejected steps between accepted ones


def _generate(c, ps, sampling, oracle=None, every_step=None):
    """A run of ``c`` over ``ps``; ``oracle``: {request index: reference output} drafted instead of the head's
    drafts (the head still proposes and extends its K/V every step); ``every_step(eng)`` after each engine step.
    Returns (engine (open), outputs)."""
    eng = Engine(c)
    if oracle is not None:
        eng.runner.drafts.chain = oracle_chain(eng, oracle, _wrong)
    ids = [eng.add_request(p, sampling) for p in ps]
    outs = {i: [] for i in ids}
    while eng.has_work():
        for o in eng.step():
            outs[o.request_id].extend(o.new_token_ids)
        if every_step is not None:
            every_step(eng)
    return eng, [outs[i] for i in ids]


def _reference(mode, ps, **kw):
    eng, out = _generate(cfg(mode, draft_head="attn", **kw), ps, SamplingParams(max_tokens=N))
    eng.close()
    return out


@pytest.mark.parametrize(
    "mode,kw,oracle",
    [
        ("dense", {}, False),  # the head's own drafts
        ("dense", {}, True),
        ("dense", {"speculative_k": "auto"}, True),  # auto:1
        ("lookahead", COVER, True),
        ("lookahead", dict(COVER, spec_predict="beside"), True),
    ],
)
def test_speculative_k1_equals_greedy(mode, kw, oracle):
    ps = prompts()
    ref = _reference(mode, ps, **{k: v for k, v in kw.items() if k not in ("spec_predict", "speculative_k")})
    kw = {"speculative_k": 1, **kw}
    c = cfg(mode, draft_head="attn", **kw)
    eng, out = _generate(c, ps, SamplingParams(max_tokens=N), dict(enumerate(ref)) if oracle else None)
    r = eng.runner
    assert out == ref and r.spec.steps > 0
    assert {k for k, _ in r.spec.accepts} <= {0, 1}  # at most one draft a step
    if oracle:  # accepted and rejected steps
        assert r.spec.accepts[1, 1] > 0 and r.spec.accepts[1, 0] > 0
    if kw.get("spec_predict") == "beside":
        assert r.spec.predict_used == "beside" and r.spec.beside.stats()["spec_predict_lane_steps"] > 0
    if kw["speculative_k"] == "auto":
        assert c.speculative_k == "auto:1" and r.spec.adaptive.k_max == 1
    eng.close()


def _record_proposals(store):
    """Wraps the head's ``propose_accepted``: (lanes, positions of the proposal, proposed ids) of every call."""

    def hook(eng):
        head = eng.runner.drafts.head
        inner = head.propose_accepted

        def rec(lanes, aux, tok, acc):
            pos = (head.kv.n[lanes] + acc).tolist()  # the last position the call writes
            ids = inner(lanes, aux, tok, acc)
            store.append((torch.as_tensor(lanes).tolist(), pos, ids.tolist()))
            return ids

        head.propose_accepted = rec

    return hook


def _nothing_past_the_lengths(eng):
    kv = eng.runner.drafts.head.kv
    for lane in range(kv.k.shape[0]):
        n = int(kv.n[lane])
        assert not kv.k[lane, n:].any() and not kv.v[lane, n:].any(), f"lane {lane}: K/V written past its {n}"


@pytest.mark.parametrize(
    "mode,kw,sampling",
    [
        ("dense", {}, SamplingParams(max_tokens=N)),
        ("lookahead", COVER, SamplingParams(max_tokens=N)),
        ("dense", {}, SamplingParams(max_tokens=N, temperature=0.3, seed=5)),  # accept() on the host
    ],
)
def test_head_kv_is_the_teacher_forced_sequence(mode, kw, sampling):
    ps = prompts()
    ref = _reference(mode, ps, **kw)
    calls = []
    eng = Engine(cfg(mode, draft_head="attn", speculative_k=1, **kw))
    eng.runner.drafts.chain = oracle_chain(eng, dict(enumerate(ref)), _wrong)
    _record_proposals(calls)(eng)
    ids = [eng.add_request(p, sampling) for p in ps]
    outs = {i: [] for i in ids}
    while eng.has_work():
        for o in eng.step():
            outs[o.request_id].extend(o.new_token_ids)
        _nothing_past_the_lengths(eng)
    out = [outs[i] for i in ids]
    r = eng.runner
    assert r.spec.accepts[1, 1] > 0 and r.spec.accepts[1, 0] > 0
    if sampling.temperature == 0:
        assert out == ref
    head, s = r.drafts.head, r.shape
    dec = Decoder.build(get_model("tiny"), None, seed=0, dtype=torch.float32, device="cpu")  # the engine's target
    lens = {int(head.kv.n[ln]): ln for ln in range(3)}
    assert sorted(lens) == sorted(len(p) + len(o) - 1 for p, o in zip(ps, out))  # each position written once
    by_lane = {}
    for lanes, pos, got in calls:
        for ln, p, d in zip(lanes, pos, got):
            by_lane.setdefault(ln, []).append((p, d))
    for p, o in zip(ps, out):
        lane = lens[len(p) + len(o) - 1]
        full = torch.tensor(p + o)
        feats = {}

        def hook(i, q, k, v, x, feats=feats):
            if i in head.layers:
                feats[i] = x

        dec.forward_dense(full[:-1], hook)
        aux = torch.cat([feats[i] for i in head.layers], -1)  # [T, 3h]: the target's features at 0 .. T - 1
        T = aux.shape[0]
        emb = dec.embed[full[1:]]
        fused = aux @ head.w["fc.weight"].t()
        _, k, v = project_qkv(head.w, head.attn, layer_input(head.w, s.rms_eps, fused, emb), torch.arange(T))
        torch.testing.assert_close(head.kv.k[lane, :T], k, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(head.kv.v[lane, :T], v, atol=2e-4, rtol=2e-4)
        # every proposal after a speculative step: the full-sequence forward's draft at its last written position
        want = head._ids(hidden_seq(head.w, head.attn, s.rms_eps, aux[None], emb[None])[0])
        steps = by_lane[lane]
        assert len(steps) > 5 and [d for _, d in steps] == want[[q for q, _ in steps]].tolist()
        assert len({q for q, _ in steps}) == len(steps)  # one proposal a position
    eng.close()


def test_chains_refused_and_auto_capped():
    with pytest.raises(ValueError, match=r"speculative_k: draft_head=attn speculates at k = 1 only.*got 2"):
        ExecConfig(model="tiny", device="cpu", draft_head="attn", speculative_k=2)
    with pytest.raises(ValueError, match=r"trained on the target's features only, got 'auto:3'"):
        ExecConfig(model="tiny", device="cpu", draft_head="attn", speculative_k="auto:3")
    assert ExecConfig(model="tiny", device="cpu", draft_head="attn", speculative_k="auto").speculative_k == "auto:1"
    assert ExecConfig(model="tiny", device="cpu", draft_head="attn", speculative_k="auto:1").spec_max_k == 1
    assert ExecConfig(model="tiny", device="cpu", speculative_k="auto").spec_max_k == 4  # the single-key head's
    eng = Engine(cfg("dense", draft_head="attn", speculative_k=1))
    r = eng.runner
    r.set_speculative_k("auto")
    assert r.cfg.speculative_k == "auto:1" and r.spec.adaptive.k_max == 1
    with pytest.raises(ValueError, match="k = 1 only"):
        r.set_speculative_k(2)
    with pytest.raises(ValueError, match="no chains"):
        r.drafts.chain(torch.tensor([0]), torch.tensor([1]), torch.tensor([5]), 2)
    eng.close()


@pytest.mark.parametrize("mode,kw", [("dense", {}), ("lookahead", {"top_k": 10, "fetch_ratio": 1.0})])
def test_gemma_shaped_hybrid_model(mode, kw):
    """Issue 40's Gemma row at a tiny Gemma-shaped model (sliding layers in rings, full layers in the mode): k = 1
    with the attention head gives the plain forward's greedy output; every position written once, none past."""
    import gemma_cases as gc

    from oasis_exec.runner.runner import Runner

    dec = gc.tiny_decoder()
    ps = gc.prompts(seed=1)
    ref = [gc.greedy_ref(dec, p, N) for p in ps]
    c = gc.cfg(mode, draft_head="attn", speculative_k=1, short_context=False, **kw)
    eng = Engine(c, Runner(c, decoder=dec))
    eng.runner.drafts.chain = oracle_chain(eng, dict(enumerate(ref)), _wrong)
    ids = [eng.add_request(p, SamplingParams(max_tokens=N)) for p in ps]
    outs = {i: [] for i in ids}
    while eng.has_work():
        for o in eng.step():
            outs[o.request_id].extend(o.new_token_ids)
        _nothing_past_the_lengths(eng)
    r = eng.runner
    assert [outs[i] for i in ids] == ref
    assert r.spec.accepts[1, 1] > 0 and r.spec.accepts[1, 0] > 0
    head = r.drafts.head
    assert sorted(int(head.kv.n[ln]) for ln in range(3)) == sorted(len(p) + N - 1 for p in ps)
    eng.close()

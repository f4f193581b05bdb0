"""Prompt lookup beside the draft head (``ExecConfig.draft_ngram``, ``oasis_exec.runner.ngram_drafts``: on the
device, in every decode step), on the CPU.

- Every step drafts, for each lane whose context's last ``draft_ngram``+ tokens occurred before, the token that
  prompt lookup over the request's own tokens (prompt + outputs up to the step's input) proposes; the other lanes
  keep the head's draft. Checked for every step of every request, with and without decode chains: a chain's inner
  steps (no host read between them) look up too, so a chained run drafts exactly what an unchained run drafts.
- Lookahead with K covering every block: the outputs equal those without it (a draft only chooses blocks).
- Speculative decoding: greedy outputs equal the ordinary greedy outputs, and the lookup's drafts are accepted.
- The default: ``DRAFT_NGRAM`` (2) in a mode with a draft row (lookahead) and with ``speculative_k``, 0 (off)
  elsewhere; an explicit value, 0 included, wins; the command line resolves and shows it;
  the runner keeps the history (``NgramDrafts``) only where it resolves above 0, sized as its help says.
- Bad values are refused with the field's name.
"""

import pytest
import torch
from exec_cases import cfg

from oasis_core.prompt_lookup import PromptLookup
from oasis_exec.config import DRAFT_NGRAM, ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALL = {"top_k": 20, "fetch_ratio": 1.0, "short_context": False}  # K covering every block of max_context 320


def _repeating(seed, n_unit, reps):
    g = torch.Generator().manual_seed(seed)
    unit = torch.randint(1, 250, (n_unit,), generator=g).tolist()
    return (unit * reps)[: n_unit * reps - seed]


PROMPTS = [_repeating(0, 23, 3), _repeating(1, 31, 2), _repeating(2, 17, 4)]


def _run(c, n=40, record=False):
    """Greedy generation of PROMPTS. Returns (engine, outputs, drafts, engine steps): with ``record``, every
    lookup's {(request index, position of the step's input): (the head's draft, the step's draft, its probability)}."""
    eng = Engine(c)
    drafts = {}
    if record:
        ng, d, sch = eng.runner.drafts.ngram, eng.runner.drafts, eng.scheduler
        inner = ng.step

        def step(lanes, toks, pos, look=True):
            head = d.tok.clone()
            inner(lanes, toks, pos, look)
            if look:
                req = {r.lane: ids.index(rid) for rid, r in sch.running.items()}
                for lane, p in zip(lanes.tolist(), pos.tolist()):
                    conf = None if d.conf is None else float(d.conf[lane])
                    key = (req[lane], p)
                    assert key not in drafts  # one lookup a step
                    drafts[key] = (int(head[lane]), int(d.tok[lane]), conf)

        ng.step = step
    ids = [eng.add_request(p, SamplingParams(max_tokens=n)) for p in PROMPTS]
    outs = {i: [] for i in ids}
    steps = 0
    while eng.has_work():
        steps += 1
        for o in eng.step():
            outs[o.request_id].extend(o.new_token_ids)
    return eng, [outs[i] for i in ids], drafts, steps


def _check_reference(out, drafts, min_match):
    """Each recorded draft is prompt lookup's over the request's tokens up to the step's input, else the head's.
    Returns how many lookups matched."""
    matched = 0
    for (i, p), (head, got, conf) in drafts.items():
        toks = list(PROMPTS[i]) + list(out[i])
        m = PromptLookup(max_n=max(3, min_match), min_n=min_match).extend(toks[: p + 1]).match()
        assert got == (toks[m[1]] if m is not None else head), (i, p)
        if m is not None:
            assert conf in (None, 1.0)
        matched += m is not None
    return matched


@pytest.mark.parametrize("chain", [1, 4])
def test_drafts_are_prompt_lookup_and_outputs_unchanged_with_every_block(chain):
    _, ref, _, _ = _run(cfg("lookahead", draft_ngram=0, decode_chain=chain, **ALL))  # the head alone (default: 2)
    eng, out, drafts, _ = _run(cfg("lookahead", draft_ngram=2, decode_chain=chain, **ALL), record=True)
    assert out == ref
    # every decode step of every request looked up: positions prompt .. prompt + n - 2 (the last token is not input)
    assert sorted(drafts) == sorted((i, len(p) + t) for i, p in enumerate(PROMPTS) for t in range(len(ref[i]) - 1))
    matched = _check_reference(out, drafts, 2)
    assert 0 < matched < len(drafts)  # some steps matched (the prompts repeat), some did not
    assert eng.runner.drafts.ngram.used == matched
    eng.close()


def test_a_chained_run_drafts_what_an_unchained_run_drafts():
    """The same tokens (greedy; the tiny model's own selection, K < the context), decode_chain 8 against 1: every
    step's draft and its probability under the gate are the same, inner chain steps included."""
    kw = dict(draft_ngram=2, top_k=3, fetch_ratio=0.67, short_context=False)
    eng1, out1, d1, steps1 = _run(cfg("lookahead", decode_chain=1, **kw), record=True)
    eng8, out8, d8, steps8 = _run(cfg("lookahead", decode_chain=8, **kw), record=True)
    assert out8 == out1
    assert eng8.runner.decode_steps == eng1.runner.decode_steps and steps8 < steps1 / 3  # chained indeed
    assert d8 == d1
    assert 0 < _check_reference(out1, d1, 2) < len(d1)
    # the lookup changed drafts inside chains (a step whose input the host had not read)
    assert any(head != got for head, got, _ in d8.values())
    eng1.close()
    eng8.close()


@pytest.mark.parametrize("spec_chain", [1, 4])
def test_speculative_greedy_equal_and_lookup_drafts_accepted(spec_chain):
    base = dict(mode="dense", speculative_k=3, spec_chain=spec_chain)
    _, ref, _, _ = _run(cfg("dense"))
    eng_h, out_h, _, _ = _run(cfg(**base, draft_ngram=0))  # the random head alone: its drafts right only by chance
    eng, out, drafts, steps = _run(cfg(**base, draft_ngram=2), record=True)
    assert out == ref and out_h == ref
    if spec_chain > 1:  # chained indeed: fewer scheduler steps than speculative steps
        assert steps < eng.runner.spec.steps
    s, s_h = eng.runner.spec, eng_h.runner.spec
    # accepted drafts (tokens beyond one a lane-step): the random head's few by chance, the lookup's many more
    assert s.tokens - s.lanes > 3 * max(1, s_h.tokens - s_h.lanes), (s.tokens, s.lanes, s_h.tokens, s_h.lanes)
    # a speculative step's first draft is the lookup's over the tokens so far, accepted drafts included
    assert _check_reference(out, drafts, 2) > 0
    eng.close()
    eng_h.close()


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_bad_values_are_refused(bad):
    with pytest.raises(ValueError, match="draft_ngram"):
        ExecConfig(model="tiny", device="cpu", dtype="float32", draft_ngram=bad)


@pytest.mark.parametrize("mode", ["dense", "quest", "retrieval", "proxy", "lookahead", "hisparse"])
def test_the_default_is_on_where_a_step_drafts(mode):
    """None (not given) resolves to DRAFT_NGRAM in a mode with a draft row, 0 (off) elsewhere; an explicit value,
    0 included, wins (a mode without a head ignores it: the runner builds no lookup there)."""
    base = dict(model="tiny", device="cpu", dtype="float32", mode=mode)
    c = ExecConfig(**base)
    drafts = c.mode_spec.drafts
    assert drafts == (mode == "lookahead")
    assert c.draft_ngram == (DRAFT_NGRAM if drafts else 0) and DRAFT_NGRAM == 2
    assert ExecConfig(**base, draft_ngram=0).draft_ngram == 0
    assert ExecConfig(**base, draft_ngram=3).draft_ngram == 3


@pytest.mark.parametrize("spec", [1, 2, "auto", "auto:2"])
def test_the_default_is_on_with_speculative_decoding(spec):
    """A speculative run drafts (dense's too: its head proposes the chain), so the lookup is on unless given;
    speculative_k 0 leaves dense without it (no draft row)."""
    base = dict(model="tiny", device="cpu", dtype="float32", speculative_k=spec)
    assert ExecConfig(**base, mode="lookahead").draft_ngram == DRAFT_NGRAM
    assert ExecConfig(**base, mode="dense").draft_ngram == DRAFT_NGRAM
    assert ExecConfig(**base, mode="lookahead", draft_ngram=0).draft_ngram == 0
    assert ExecConfig(**base, mode="dense", draft_ngram=3).draft_ngram == 3
    ordinary = dict(base, speculative_k=0)
    assert ExecConfig(**ordinary, mode="lookahead").draft_ngram == DRAFT_NGRAM
    assert ExecConfig(**ordinary, mode="dense").draft_ngram == 0


def test_a_bad_speculative_k_is_named_not_the_default():
    with pytest.raises(ValueError, match="speculative_k"):
        ExecConfig(model="tiny", device="cpu", dtype="float32", mode="lookahead", speculative_k="bad")


def test_the_default_runs_the_lookup_where_a_step_drafts():
    """The runner keeps the device history (max_lanes x (max_context + 1) int32) only where draft_ngram resolved
    above 0, sized as ExecConfig.draft_ngram's help says; a small configuration (one lane, one block) builds."""
    eng = Engine(cfg("lookahead", **ALL))
    ng = eng.runner.drafts.ngram
    assert ng is not None and ng.min_n == DRAFT_NGRAM
    c = eng.runner.cfg
    assert ng.nbytes == eng.runner.max_lanes * (c.max_context + 1) * 4
    eng.close()
    for c in (
        cfg("lookahead", draft_ngram=0, **ALL),
        cfg("lookahead", speculative_k=2, draft_ngram=0, **ALL),
        cfg("proxy", **ALL),
        cfg("dense"),
    ):
        eng = Engine(c)
        assert eng.runner.drafts.ngram is None, c
        eng.close()
    small = ExecConfig(model="tiny", device="cpu", dtype="float32", mode="lookahead", max_context=16, max_lanes=1)
    assert small.draft_ngram == DRAFT_NGRAM and small.max_context == small.block_size
    eng = Engine(small)
    assert eng.runner.drafts.ngram.nbytes == 1 * (16 + 1) * 4
    eng.close()


def test_the_command_line_default_an_explicit_zero_and_the_help():
    import argparse

    from oasis_exec.config import add_engine_options, engine_config

    p = argparse.ArgumentParser()
    add_engine_options(p)

    def built(*argv):
        return engine_config(p.parse_args(["--model", "tiny", "--device", "cpu", *argv]))

    assert built("--mode", "lookahead").draft_ngram == DRAFT_NGRAM
    assert built("--mode", "lookahead", "--draft-ngram", "0").draft_ngram == 0
    assert built("--mode", "lookahead", "--speculative-k", "2").draft_ngram == DRAFT_NGRAM
    assert built("--mode", "lookahead", "--speculative-k", "2", "--draft-ngram", "0").draft_ngram == 0
    assert built("--mode", "proxy").draft_ngram == 0
    text = " ".join(p.format_help().split())
    assert "--draft-ngram" in text and f"(default: {DRAFT_NGRAM} in a mode with a draft row, lookahead" in text

"""Prompt lookup beside the draft head (``ExecConfig.draft_ngram``, ``oasis_exec.runner.ngram_drafts``), on the CPU.

- Every override writes, for each lane whose context's last ``draft_ngram``+ tokens occurred before, the token that
  prompt lookup over the request's own tokens (prompt + outputs so far, from the scheduler) proposes; the other lanes
  keep the head's draft. Checked step by step, also with decode chains (the chain's inner steps keep the head's).
- Lookahead with K covering every block: the outputs equal those without it (a draft only chooses blocks).
- Speculative decoding: greedy outputs equal the ordinary greedy outputs, and the lookup's drafts are accepted.
- Bad values are refused with the field's name.
"""

import pytest
import torch
from exec_cases import cfg

from oasis_core.prompt_lookup import PromptLookup
from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALL = {"top_k": 20, "fetch_ratio": 1.0, "short_context": False}  # K covering every block of max_context 320


def _repeating(seed, n_unit, reps):
    g = torch.Generator().manual_seed(seed)
    unit = torch.randint(1, 250, (n_unit,), generator=g).tolist()
    return (unit * reps)[: n_unit * reps - seed]


PROMPTS = [_repeating(0, 23, 3), _repeating(1, 31, 2), _repeating(2, 17, 4)]


def _run(c, n=40, check=None):
    eng = Engine(c)
    if check is not None:
        check(eng)
    out = eng.generate(PROMPTS, SamplingParams(max_tokens=n))
    return eng, out


def _checker(min_match, seen):
    """Wraps the override: after it, each item's draft equals the reference lookup's where that one matches."""

    def install(eng):
        ng, sch, drafts = eng.runner.drafts.ngram, eng.scheduler, eng.runner.drafts
        inner = ng.override

        def override(items):
            before = drafts.tok.clone()
            inner(items)
            for it in items:
                assert it.lane in ng.lookups  # never out of step (a dropped lookup would stop guessing silently)
                r = sch.running[it.req_id]
                ref = PromptLookup(max_n=3, min_n=min_match).extend(list(r.prompt) + list(r.output))
                assert ref.tokens[-1] == it.token and len(ref.tokens) == it.position + 1
                m = ref.match()
                want = ref.tokens[m[1]] if m is not None else int(before[it.lane])
                assert int(drafts.tok[it.lane]) == want
                seen.append(m is not None)

        ng.override = override

    return install


@pytest.mark.parametrize("chain", [1, 4])
def test_overrides_are_prompt_lookup_and_outputs_unchanged_with_every_block(chain):
    _, ref = _run(cfg("lookahead", decode_chain=chain, **ALL))
    seen = []
    eng, out = _run(cfg("lookahead", draft_ngram=2, decode_chain=chain, **ALL), check=_checker(2, seen))
    assert out == ref
    assert any(seen) and not all(seen)  # some steps matched (the prompts repeat), some did not
    assert eng.runner.drafts.ngram.used == sum(seen)
    eng.close()


def test_speculative_greedy_equal_and_lookup_drafts_accepted():
    base = dict(mode="dense", speculative_k=3)
    _, ref = _run(cfg("dense"))
    eng_h, out_h = _run(cfg(**base))  # the random head alone: its drafts right only by chance
    seen = []
    eng, out = _run(cfg(**base, draft_ngram=2), check=_checker(2, seen))
    assert out == ref and out_h == ref
    s, s_h = eng.runner.spec, eng_h.runner.spec
    # accepted drafts (tokens beyond one a lane-step): the random head's few by chance, the lookup's many more
    assert s.tokens - s.lanes > 3 * max(1, s_h.tokens - s_h.lanes), (s.tokens, s.lanes, s_h.tokens, s_h.lanes)
    assert any(seen)
    eng.close()
    eng_h.close()


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_bad_values_are_refused(bad):
    with pytest.raises(ValueError, match="draft_ngram"):
        ExecConfig(model="tiny", device="cpu", dtype="float32", draft_ngram=bad)

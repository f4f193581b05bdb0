"""Teacher forcing in the engine (``SamplingParams.forced``, issue 41): the first outputs are the forced tokens, each
from a decode step of the mode, a stop id among them does not stop the request, no decode chain runs while one is
due, and in ``dense`` each step's logits are the dense forward's over the forced text."""

import pytest
import torch
from exec_cases import cfg, prompts

from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams


def _run(eng, rid):
    out, logits, per_step = [], [], []
    while eng.has_work():
        for o in eng.step():
            if o.request_id == rid:
                out.extend(o.new_token_ids)
                per_step.append(len(o.new_token_ids))
                logits.append(eng.runner.last_logits[rid].float().clone())
    return out, logits, per_step


@pytest.mark.parametrize("mode", ("dense", "lookahead"))
def test_forced_outputs_stop_ids_and_one_token_a_step(mode):
    eng = Engine(cfg(mode, decode_chain=4))
    p = prompts(seed=2, lens=(40,))[0]
    forced = tuple(prompts(seed=9, lens=(20,))[0])
    sp = SamplingParams(max_tokens=len(forced) + 5, forced=forced, stop_ids=(forced[3], 255))
    rid = eng.add_request(p, sp)
    out, logits, per_step = _run(eng, rid)
    eng.close()
    assert tuple(out[: len(forced)]) == forced  # the stop id forced[3] did not stop it
    assert per_step[: len(forced)] == [1] * len(forced)  # one token a step while forcing
    assert len(out) == len(forced) + 5
    if mode == "dense":
        assert max(per_step) > 1  # then the free tail chains: forcing did not turn the chain off for good
    if mode == "dense":  # step k's logits: the dense forward over the prompt and the first k forced tokens
        ref = eng.runner.dec.forward_dense(p + list(forced)).float()
        for k in range(len(forced)):
            torch.testing.assert_close(logits[k], ref[len(p) - 1 + k], atol=2e-4, rtol=0)


def test_forced_tokens_need_no_speculation():
    eng = Engine(cfg("lookahead", speculative_k=2))
    with pytest.raises(ValueError, match="speculative_k 0"):
        eng.add_request([1, 2, 3], SamplingParams(max_tokens=4, forced=(5, 6)))
    with pytest.raises(ValueError, match="exceed max_tokens"):
        SamplingParams(max_tokens=1, forced=(5, 6))
    eng.close()

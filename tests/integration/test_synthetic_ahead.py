"""Synthetic selection drawn ahead (``ExecConfig.synthetic_ahead``) and the model selection's top-K run beside it
(``synthetic_topk``): the same selections, mappings, fetches and tokens as drawing each step's sets beside the step
before it (tiny random model, CPU). The GPU twin is ``tests/gpu/test_exec_gpu.py``."""

import pytest
from exec_cases import assert_same_run, cfg, prompts, run_state

from oasis_exec.config import ExecConfig
from oasis_exec.workingset.selector import Selector

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("ahead, topk", [(5, False), (5, True), (200, False)])
def test_sets_drawn_ahead_give_the_run_of_sets_drawn_each_step(ahead, topk, monkeypatch):
    """5 steps ahead: used up within a lane set, then drawn each step; 200: more than the run takes. The lane set
    changes as requests join and finish, and each new one draws its own."""
    ps = prompts(1, (90, 60, 120))
    kw = dict(top_k=3, fetch_ratio=0.67, selection="synthetic")
    calls = []
    real = Selector.topk
    monkeypatch.setattr(Selector, "topk", lambda *a: calls.append(1) or real(*a))
    ref = run_state(cfg("lookahead", **kw), ps, 30)
    n_ref = len(calls)  # the top-Ks a synthetic run runs anyway (steps without sets)
    got = run_state(cfg("lookahead", **kw, synthetic_ahead=ahead, synthetic_topk=topk), ps, 30)
    assert_same_run(got, ref)
    assert len(ref[1]) == 2 and ref[2] > 0
    extra = len(calls) - 2 * n_ref
    assert extra > 0 if topk else extra == 0  # a top-K a layer of each step with sets, only when asked


def test_synthetic_ahead_and_topk_are_checked():
    base = dict(model="tiny", device="cpu", mode="lookahead")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="synthetic_ahead"):
            ExecConfig(**base, selection="synthetic", synthetic_ahead=bad)
    with pytest.raises(ValueError, match="synthetic_ahead"):
        ExecConfig(**base, synthetic_ahead=4)  # selection=model
    with pytest.raises(ValueError, match="synthetic_topk"):
        ExecConfig(**base, synthetic_topk=True)

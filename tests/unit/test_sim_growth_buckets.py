"""``SimScheduler._grow_all`` visits only the requests whose block count can change at the step (crossing buckets);
it must give exactly what visiting every decoding request gives: the same summary and per-request figures, the
same preemptions, on traces that preempt (a tight KV budget), admit already decoding (``decode_only``), finish
inside fast-forwarded stretches and mix prefill chunks with decodes."""

import random

import pytest

from oasis_core.trace import Trace, TraceRequest
from oasis_sim import scheduler as sched_mod
from oasis_sim.config import SimConfig
from oasis_sim.sim import simulate

FAST = dict(top_k=16, policy_layers=1, profile_steps=8, timeline_steps=0)


def trace(n: int, seed: int) -> Trace:
    rnd = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += rnd.expovariate(300.0)
        reqs.append(
            TraceRequest(id=i, arrival_s=t, prompt_tokens=rnd.randint(50, 2500), output_tokens=rnd.randint(1, 400))
        )
    return Trace(requests=tuple(reqs))


def run(monkeypatch, bucketed: bool, **kw):
    init = sched_mod.SimScheduler.__init__

    def patched(self, *a, **k):
        init(self, *a, **k)
        if not bucketed:
            self._bucketed = False

    monkeypatch.setattr(sched_mod.SimScheduler, "__init__", patched)
    res = simulate(SimConfig(**{**FAST, **kw}), trace(80, seed=11))
    monkeypatch.setattr(sched_mod.SimScheduler, "__init__", init)
    return res


@pytest.mark.parametrize(
    "kw",
    [
        dict(mode="dense", hbm_bytes=(SimConfig().model_spec.weight_bytes + 3e9) / 0.9),
        dict(mode="lookahead", hbm_bytes=(SimConfig().model_spec.weight_bytes + 3e9) / 0.9),
        dict(mode="dense", decode_only=True, hbm_bytes=(SimConfig().model_spec.weight_bytes + 3e9) / 0.9),
        dict(mode="dense", model="gemma3-270m", block_size=32, kv_budget_gb=0.3),
    ],
)
def test_bucketed_growth_equals_visiting_every_request(monkeypatch, kw):
    fast, every = run(monkeypatch, True, **kw), run(monkeypatch, False, **kw)
    s = {k: v for k, v in fast.summary.items() if k != "wall_s"}
    assert s == {k: v for k, v in every.summary.items() if k != "wall_s"}
    assert fast.requests == every.requests
    assert fast.memory == every.memory  # the pools' series: the same growths at the same times, in the same order

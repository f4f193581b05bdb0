"""The engine's steady requests (``SimEngine._settle``: a request on its profile's tail adds its figures when it leaves
the batch) against every request's figures added at every step: every output file byte for byte, on traces that
preempt (a small host pool), cross the short context and fast-forward (settled before each stretch)."""

import pytest

from oasis_sim import engine as engine_mod
from oasis_sim.config import SimConfig
from oasis_sim.sim import simulate
from tests.unit.test_sim_fast_forward import FAST, random_trace


def run(monkeypatch, lazy: bool, **kw):
    settled = []
    orig_init, orig_settle = engine_mod.SimEngine.__init__, engine_mod.SimEngine._settle

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        self._lazy_ok = self._lazy_ok and lazy

    def settle(self, r):
        settled.append(self._plain_steps - r.steady[3])
        orig_settle(self, r)

    monkeypatch.setattr(engine_mod.SimEngine, "__init__", init)
    monkeypatch.setattr(engine_mod.SimEngine, "_settle", settle)
    res = simulate(SimConfig(**{**FAST, **kw}), random_trace(60, 400.0, seed=11))
    monkeypatch.setattr(engine_mod.SimEngine, "__init__", orig_init)
    monkeypatch.setattr(engine_mod.SimEngine, "_settle", orig_settle)
    return res, settled


@pytest.mark.parametrize(
    "kw",
    [
        dict(mode="lookahead", fast_forward=0),
        dict(mode="lookahead", fast_forward=256),
        dict(mode="lookahead", fast_forward=0, host_bytes=3e9),  # preemptions (the host pool)
        dict(mode="proxy", fast_forward=256, hbm_bytes=20e9),
    ],
)
def test_steady_requests_match_every_step(monkeypatch, kw):
    lazy, settled = run(monkeypatch, True, **kw)
    exact, none = run(monkeypatch, False, **kw)
    # (a fast-forward settles every steady request first: fewer steady steps there)
    assert not none and sum(settled) > 0.1 * sum(exact.steps.decode), (sum(settled), sum(exact.steps.decode))
    if "host_bytes" in kw:
        assert exact.summary["preemptions"] > 0
    assert lazy.files() == exact.files()

"""The fast-forward (``SimConfig.fast_forward``, ``oasis_sim.engine``) against every step simulated, on small random
traces: one a light load (arrivals end stretches), one overloaded (a blocked queue head, arrivals inside stretches),
both with short contexts (resident-dense requests in lookahead). Every summary figure must stay within the stated
tolerance, and the fast-forward must actually have taken steps (a test of nothing would pass too)."""

import random

import pytest

from oasis_core.trace import Trace, TraceRequest
from oasis_sim import engine as engine_mod
from oasis_sim import stretch as stretch_mod
from oasis_sim.config import SimConfig
from oasis_sim.sim import simulate

FAST = dict(top_k=16, policy_layers=1, profile_steps=8, timeline_steps=0)
# dense: the stretch's steps are the exact steps' (attention linear in its bytes): only float summation order.
# lookahead: a stretch leaves out the summaries of the blocks it crosses (engine docstring): bounded at 0.1 %.
TOL = {"dense": 1e-9, "lookahead": 1e-3}


def random_trace(n: int, rate_rps: float, seed: int) -> Trace:
    rnd = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += rnd.expovariate(rate_rps)
        reqs.append(
            TraceRequest(id=i, arrival_s=t, prompt_tokens=rnd.randint(100, 3000), output_tokens=rnd.randint(2, 300))
        )
    return Trace(requests=tuple(reqs))


def run_counting(monkeypatch, trace, **kw):
    """Simulate, counting the steps either fast path took (``SimEngine._fast_forward``, ``WholeKVStretch.run``)."""
    taken = []
    orig_ff, orig_run = engine_mod.SimEngine._fast_forward, stretch_mod.WholeKVStretch.run

    def counted(self, plan, k, timing):
        taken.append(k)
        return (yield from orig_ff(self, plan, k, timing))

    def counted_run(self, plan):
        k = yield from orig_run(self, plan)
        taken.append(k)
        return k

    monkeypatch.setattr(engine_mod.SimEngine, "_fast_forward", counted)
    monkeypatch.setattr(stretch_mod.WholeKVStretch, "run", counted_run)
    res = simulate(SimConfig(**{**FAST, **kw}), trace)
    monkeypatch.setattr(engine_mod.SimEngine, "_fast_forward", orig_ff)
    monkeypatch.setattr(stretch_mod.WholeKVStretch, "run", orig_run)
    return res, sum(taken)


def numeric(summary: dict) -> dict:
    return {
        k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "wall_s"
    }


CASES = [
    ("qwen3-8b", "dense", "light"),
    ("qwen3-8b", "dense", "overloaded"),
    ("qwen3-8b", "lookahead", "light"),
    ("qwen3-8b", "lookahead", "overloaded"),
    # a hybrid model (15 of 18 layers attend a 512-token window): prompts of 100-3,000 tokens cross the window
    # inside stretches, where a windowed layer's attention stops growing; a fetch counts the full layers' rows
    ("gemma3-270m", "dense", "light"),
    ("gemma3-270m", "dense", "overloaded"),
    ("gemma3-270m", "lookahead", "light"),
]


@pytest.mark.parametrize("model,mode,load", CASES)
def test_fast_forward_matches_every_step_simulated(monkeypatch, model, mode, load):
    trace = random_trace(60, 20.0 if load == "light" else 400.0, seed=3)
    kw = dict(mode=mode, model=model)
    if load == "overloaded":  # room for a few requests only: the queue's head waits on memory
        kw["kv_budget_gb"] = 4.0 if model == "qwen3-8b" else 0.5
    fast, taken = run_counting(monkeypatch, trace, fast_forward=256, **kw)
    exact, none = run_counting(monkeypatch, trace, fast_forward=0, **kw)
    assert none == 0 and taken > 0.2 * fast.summary["steps"], (taken, fast.summary["steps"])
    a, b = numeric(exact.summary), numeric(fast.summary)
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert b[k] == pytest.approx(v, rel=TOL[mode], abs=1e-9), k
    assert len(fast.requests) == len(exact.requests)
    for x, y in zip(exact.requests, fast.requests):
        for k, v in x.items():
            if isinstance(v, float):
                assert y[k] == pytest.approx(v, rel=TOL[mode], abs=1e-6), (x["id"], k)


# The whole-KV stretch (oasis_sim.stretch: dense) through prefill chunks, admissions and ends, against every step:
# a small KV pool (the head blocked on memory, preemptions, the pools' levels at each end), a batch limit (the head
# blocked by the batch), prefills of several chunks shared by several requests, vLLM's engine, decode chains with
# tensor parallelism, a closed loop (a request submitted at each end) with preemptions.
STRETCH_CASES = {
    "small-pool": dict(hbm_bytes=20e9),
    "batch-limit": dict(max_batch=4),
    "small-chunks": dict(chunk_tokens=512),
    "vllm": dict(engine="vllm"),
    "vllm-waves": dict(engine="vllm", calibration="WAVES"),  # its attention set by waves of CTAs (below)
    "chain-tp2": dict(decode_chain=8, tensor_parallel=2),
    "closed-loop": dict(arrival="closed", concurrency=20, hbm_bytes=20e9),
}


@pytest.fixture(scope="module")
def waves_calibration(tmp_path_factory):
    """The shipped calibration with an SM rate at which vLLM's wave term (calibrated.vllm_attn_waves) sets the
    attention of every batch: its factor changes with the batch inside a stretch."""
    from dataclasses import replace

    from oasis_sim.calibrated import load_calibration

    cal = load_calibration()
    path = tmp_path_factory.mktemp("cal") / "waves.json"
    path.write_text(replace(cal, params=replace(cal.params, vllm_sm_bytes_per_s=15e9)).to_json())
    return str(path)


@pytest.mark.parametrize("case", sorted(STRETCH_CASES))
def test_whole_kv_stretch_matches_every_step(monkeypatch, request, case):
    trace = random_trace(80, 400.0, seed=5)
    kw = dict(mode="dense", model="qwen3-8b", **STRETCH_CASES[case])
    if kw.get("calibration") == "WAVES":
        kw["calibration"] = request.getfixturevalue("waves_calibration")
    executed = []
    orig_execute = engine_mod.SimEngine.execute

    def counted_execute(self, plan):
        executed.append(plan.step)
        return (yield from orig_execute(self, plan))

    monkeypatch.setattr(engine_mod.SimEngine, "execute", counted_execute)
    fast, taken = run_counting(monkeypatch, trace, fast_forward=256, **kw)
    n_exec = len(executed)
    exact, none = run_counting(monkeypatch, trace, fast_forward=0, **kw)
    steps = exact.summary["steps"]
    assert none == 0 and len(executed) - n_exec == steps  # every step of the exact run through execute
    # the stretch ran the steps, prefill ones included (those it could not: the timeline's first steps)
    prefill_steps = sum(1 for x in exact.steps.prefill if x)
    assert taken > 0.5 * steps and n_exec < 0.5 * prefill_steps, (taken, n_exec, prefill_steps, steps)
    if case in ("small-pool", "closed-loop"):
        assert exact.summary["preemptions"] > 0
    if case == "batch-limit":
        assert max(exact.steps.decode) == 4
    a, b = numeric(exact.summary), numeric(fast.summary)
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert b[k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
    assert [x["id"] for x in exact.requests] == [x["id"] for x in fast.requests]
    for x, y in zip(exact.requests, fast.requests):
        for k, v in x.items():
            if isinstance(v, float):
                assert y[k] == pytest.approx(v, rel=1e-6, abs=1e-6), (x["id"], k)
            else:
                assert y[k] == v, (x["id"], k)
    # the step log row by row (steps.csv): starts, durations, batch sizes, prefill tokens
    for name in ("decode", "prefill", "emitted"):
        assert getattr(fast.steps, name) == getattr(exact.steps, name), name
    for name in ("t", "dur"):
        assert getattr(fast.steps, name) == pytest.approx(getattr(exact.steps, name), rel=1e-9, abs=1e-12), name


def test_whole_kv_stretch_admits_inside(monkeypatch):
    """Arrivals that fit are admitted inside a stretch (its own schedule), not at a new one: far fewer stretches
    than admissions, every figure as with every step simulated (the memory series aside: the pools move once)."""
    trace = random_trace(80, 20.0, seed=7)
    runs = []
    orig_run = stretch_mod.WholeKVStretch.run

    def counted_run(self, plan):
        k = yield from orig_run(self, plan)
        runs.append(k)
        return k

    monkeypatch.setattr(stretch_mod.WholeKVStretch, "run", counted_run)
    fast = simulate(SimConfig(**{**FAST, "mode": "dense", "fast_forward": 256}), trace)
    monkeypatch.setattr(stretch_mod.WholeKVStretch, "run", orig_run)
    exact = simulate(SimConfig(**{**FAST, "mode": "dense", "fast_forward": 0}), trace)
    stretches = sum(1 for k in runs if k)
    assert fast.summary["requests_completed"] == 80 and stretches < 80 / 4, stretches
    assert numeric(fast.summary) == pytest.approx(numeric(exact.summary), rel=1e-9, abs=1e-9)
    assert [x["admit_s"] for x in fast.requests] == pytest.approx([x["admit_s"] for x in exact.requests], abs=1e-6)

"""The simulator's pipelined speculative lookahead step (``SimConfig.spec_predict``, ``oasis_sim.spec_pipeline``): the
side work and copies beside the verify pass, the repair after the acceptance. The two variants draw the same
acceptance, so their steps hold the same requests and tokens and compare step by step."""

import pytest

from oasis_sim import engine as sim_engine
from oasis_sim.bench import bench_trace
from oasis_sim.config import SimConfig
from oasis_sim.sim import simulate

BASE = dict(
    mode="lookahead",
    selection="synthetic",
    decode_only=True,
    policy_layers=1,
    profile_steps=8,
    timeline_steps=0,
    seed=1,
)


def _run(monkeypatch, variant, k, alpha, lanes=16, context=16384, steps=40, **kw):
    """(steps.csv's log, the requests repaired in each step, the engine)."""
    seen, engines = [], []
    draw = sim_engine.SimEngine._spec_draw

    def spy(self, plan, ks, K, beside):
        out = draw(self, plan, ks, K, beside)
        seen.append((len(self.log.dur), len(out)))
        if not engines:
            engines.append(self)
        return out

    monkeypatch.setattr(sim_engine.SimEngine, "_spec_draw", spy)
    cfg = SimConfig(speculative_k=k, speculative_alpha=alpha, spec_predict=variant, **{**BASE, **kw})
    res = simulate(cfg, bench_trace(context, lanes, steps))
    repaired = dict(seen)
    return res.steps, [repaired.get(i, 0) for i in range(len(res.steps.dur))], engines[0], res.summary


@pytest.mark.parametrize(
    "kw,gain",
    [
        ({}, 0.98),  # paper's fetch ratio: copies hide beside the pass
        ({"fetch_ratio": 0.5}, 0.98),  # copy-bound: the copies spill past the pass
        # 4 lanes: after's prediction and selection of a layer (~60 µs) is shorter than its masked commit (68.8 µs),
        # so both variants' tails after the pass are nearly the commits alone: beside gains only a stage's fill
        ({"lanes": 4, "context": 4096}, 1.0),
    ],
)
def test_beside_never_slower_than_after_without_repairs(monkeypatch, kw, gain):
    """k = 1 with every draft rejected: the query never moves and no run fills a block (repair rate 0). The
    pipeline alone: beside's launches beyond an ordinary step's side stage (op ``spec_beside``, charged to the pass)
    are set to 0 here; with them, beside can be the slower variant, as the executor's was at 16K x 44
    (``test_the_beside_stage_is_charged_to_beside_passes_only`` prices them)."""
    from oasis_sim.predictor import RooflinePredictor

    monkeypatch.setattr(RooflinePredictor, "_spec_beside", lambda self, s: 0.0)
    a_log, a_rep, _, a_sum = _run(monkeypatch, "after", 1, 0.0, **kw)
    b_log, b_rep, _, b_sum = _run(monkeypatch, "beside", 1, 0.0, **kw)
    assert b_sum["spec_predict_repairs"] == 0 and not any(b_rep)
    assert b_log.emitted == a_log.emitted and b_log.h2d == a_log.h2d  # same requests, tokens and copies
    # every step: the beside step ends no later, its stalls (the copies spilling into the next) included
    assert len(b_log.dur) == len(a_log.dur)
    t_a = t_b = 0.0
    for i, (da, db) in enumerate(zip(a_log.dur, b_log.dur)):
        t_a, t_b = t_a + da, t_b + db
        assert t_b <= t_a * (1 + 1e-12), i  # never behind, at every step
    assert t_b < gain * t_a and b_sum["throughput_tok_s"] > a_sum["throughput_tok_s"]


@pytest.mark.parametrize("k,alpha", [(1, 0.8), (2, 0.7), (3, 0.5)])
def test_repairs_cost_at_most_their_copies_after_the_pass(monkeypatch, k, alpha):
    """With repairs: a step without one is no slower than after's; a step with ``m`` repaired requests costs at
    most the after step plus the repair's copies run after the pass (its bytes on the copy path, one latency a
    layer), and its extra bytes are those requests' fetches again."""
    a_log, _, eng, _ = _run(monkeypatch, "after", k, alpha)
    b_log, b_rep, _, b_sum = _run(monkeypatch, "beside", k, alpha)
    assert b_log.emitted == a_log.emitted
    assert 0 < b_sum["spec_predict_repairs"] < sum(a_log.decode)
    lf, lat, bps = eng.Lf, eng.h2d_lat, eng.h2d_Bps
    t_a = t_b = allowed = 0.0
    for i, (da, db, m) in enumerate(zip(a_log.dur, b_log.dur, b_rep)):
        extra = b_log.h2d[i] - a_log.h2d[i]  # the repaired requests' fetches, again
        assert (extra > 0) == (m > 0), i
        if m:  # the repair copies after the pass: a latency and its share of the bytes a layer, serially
            allowed += (lf + 1) * (lat + extra / lf / bps)
        t_a, t_b = t_a + da, t_b + db
        assert t_b <= t_a + allowed + 1e-12, i  # never behind by more than the repairs' copies so far
    assert any(b_rep) and not all(b_rep)


def test_adaptive_k_takes_the_pipelined_step_cost(monkeypatch):
    """speculative_k auto prices a draft length by the measured step times of the step as it runs (observe_step):
    where copies dominate, the after variant's k = 1 step costs about twice the ordinary one and auto stops drafting
    at this acceptance, while the beside variant's costs little more and auto drafts."""
    kw = dict(fetch_ratio=0.5, steps=200)
    _, _, ea, sa = _run(monkeypatch, "after", "auto:1", 0.45, **kw)
    _, _, eb, sb = _run(monkeypatch, "beside", "auto:1", 0.45, **kw)
    ca, cb = ea.spec_policy.cost(1), eb.spec_policy.cost(1)
    assert cb < ca  # the measured T(1) / T(0) of each variant's own step
    assert ea.spec_policy.step_s[1] > eb.spec_policy.step_s[1]
    assert sb["speculative_steps"] > 2 * sa["speculative_steps"]
    assert sb["throughput_tok_s"] > sa["throughput_tok_s"]


@pytest.mark.parametrize("no_transfer", [True, False])
def test_the_repair_prediction_costs_a_layer_only_in_steps_that_run_it(monkeypatch, no_transfer):
    """The repair's prediction (op ``spec_repair``, a fixed cost a layer) lengthens exactly the steps that launch the
    repair (``repair_on``: at k = 1, a request one token short of its block's end), by that cost a full layer (with
    copies: by at most that, the repair's copies of a layer overlapping the next layer's prediction); the other steps
    keep their time (to rounding: durations are differences of absolute times). The masked commit is set to 0
    here: it is the first stage of the repair's pipeline and would hide part of the repair's cost
    (``test_the_masked_commit_sets_the_tail_after_the_pass`` prices them together)."""
    from oasis_sim.predictor import RooflinePredictor

    monkeypatch.setattr(RooflinePredictor, "_spec_commit", lambda self, s: 0.0)
    runs = []
    for cost in (0.0, 1e-3):
        monkeypatch.setattr(RooflinePredictor, "_spec_repair", lambda self, s, c=cost: c)
        on = {}
        draw = sim_engine.SimEngine._spec_draw

        def spy(self, plan, ks, K, beside, on=on, draw=draw):
            out = draw(self, plan, ks, K, beside)
            on[len(self.log.dur)] = self._repair_on
            on["Lf"] = self.Lf
            return out

        monkeypatch.setattr(sim_engine.SimEngine, "_spec_draw", spy)
        cfg = SimConfig(speculative_k=1, speculative_alpha=0.8, spec_predict="beside", no_transfer=no_transfer, **BASE)
        res = simulate(cfg, bench_trace(4096, 4, 60))
        monkeypatch.setattr(sim_engine.SimEngine, "_spec_draw", draw)
        runs.append((res.steps.dur, on))
    (d0, on), (d1, _) = runs
    lf = on.pop("Lf")
    assert len(d0) == len(d1) and any(on.values()) and not all(on.values())
    for i, (a, b) in enumerate(zip(d0, d1)):
        if on.get(i) and no_transfer:
            assert b - a == pytest.approx(lf * 1e-3, rel=1e-6), i
        elif on.get(i):
            assert 0.9 * lf * 1e-3 < b - a <= lf * 1e-3 * (1 + 1e-9), i
        else:
            assert b == pytest.approx(a, rel=1e-12, abs=1e-15), i


def test_pipelined_tail_by_hand():
    """The work after the pass as a pipeline of stages over the layers, ``(n - 1) · max + sum``, on numbers worked
    by hand (µs): the Qwen3-8B shape's commit 68.8, after's prediction and selection 134, its copy 60, beside's
    repair 28.7."""
    from oasis_sim import spec_pipeline as sp

    us = 1e-6
    # after: 35 x 134 + (68.8 + 134 + 60) = 4690 + 262.8
    assert sp.after_tail_s(36, 134 * us, 60 * us, 68.8 * us) == pytest.approx(4952.8 * us, rel=1e-12)
    # without the commit: the two-stage form, 36 x 134 + 60
    assert sp.after_tail_s(36, 134 * us, 60 * us) == pytest.approx(4884.0 * us, rel=1e-12)
    # beside with its repair and no repair copies: the commit is the slowest stage, 35 x 68.8 + 68.8 + 28.7
    assert sp.repair_tail_s(36, 28.7 * us, 0.0, 68.8 * us) == pytest.approx(2505.5 * us, rel=1e-12)
    # a repair copy longer than the commit sets the pace: 35 x 100 + 68.8 + 28.7 + 100
    assert sp.repair_tail_s(36, 28.7 * us, 100 * us, 68.8 * us) == pytest.approx(3697.5 * us, rel=1e-12)
    # before the commit was modelled: the repair alone, 36 x 28.7
    assert sp.repair_tail_s(36, 28.7 * us, 0.0) == pytest.approx(1033.2 * us, rel=1e-12)
    assert sp.commit_tail_s(36, 68.8 * us) == pytest.approx(2476.8 * us, rel=1e-12)
    assert sp.pipelined_s(36) == 0.0 and sp.pipelined_s(0, 1.0) == 0.0


@pytest.mark.parametrize("variant", ["after", "beside"])
def test_the_masked_commit_sets_the_tail_after_the_pass(monkeypatch, variant):
    """Op ``spec_commit`` (a fixed cost a full layer on the compute stream after the acceptance, each layer's side
    stage waiting for it): with the commit at 1 ms a layer, longer than any side stage here, a speculative step's
    tail after the pass grows from ``n · side`` to ``(n - 1) · C + C + side`` (after: its prediction and selection;
    beside: its repair's, or ``n · C`` in a step that launches no repair), ``n`` the full layers; no transfer, so no
    copies. The side stage times are the engine's own (captured); the rest is worked by hand, so a commit charged in
    the wrong place, per step, or not at all fails it. Ordinary steps keep their time."""
    from oasis_sim import spec_pipeline as sp
    from oasis_sim.predictor import RooflinePredictor

    runs = []
    for cost in (0.0, 1e-3):
        monkeypatch.setattr(RooflinePredictor, "_spec_commit", lambda self, s, c=cost: c)
        seen = {}  # step index -> (which tail, the side stage a layer, full layers)
        eng = []

        def spy(name, fn, seen=seen, eng=eng):
            def wrapped(n, side, *rest):
                seen[len(eng[0].log.dur)] = (name, side, n)
                return fn(n, side, *rest)

            return wrapped

        draw = sim_engine.SimEngine._spec_draw

        def keep(self, plan, ks, K, beside, draw=draw, eng=eng):
            eng[:] = [self]
            return draw(self, plan, ks, K, beside)

        monkeypatch.setattr(sim_engine.SimEngine, "_spec_draw", keep)
        for name in ("after_tail_s", "repair_tail_s", "commit_tail_s"):
            monkeypatch.setattr(sp, name, spy(name, getattr(sp, name)))
        cfg = SimConfig(speculative_k=1, speculative_alpha=0.8, spec_predict=variant, no_transfer=True, **BASE)
        res = simulate(cfg, bench_trace(4096, 4, 60))
        monkeypatch.undo()
        runs.append((res.steps.dur, seen))
    (d0, s0), (d1, s1) = runs
    C = 1e-3
    kinds = set()
    for i, (a, b) in enumerate(zip(d0, d1)):
        if i not in s1:
            assert i not in s0 and b == pytest.approx(a, rel=1e-12, abs=1e-15), i  # an ordinary step
            continue
        name, side, n = s1[i]
        kinds.add(name)
        if name == "commit_tail_s":  # beside, no repair launched: nothing after the pass before, n commits now
            assert s0[i] == (name, 0.0, n) and side == C, i
            want = n * C
        else:
            assert s0[i] == (name, side, n), i
            assert side < C
            want = (n - 1) * C + C + side - n * side
        assert b - a == pytest.approx(want, rel=1e-9), i
    assert kinds == ({"after_tail_s"} if variant == "after" else {"repair_tail_s", "commit_tail_s"})


@pytest.mark.parametrize("mode,k,heads", [("lookahead", 1, 0), ("lookahead", 2, 1), ("dense", 1, 1), ("dense", 2, 2)])
def test_speculative_step_charges_the_draft_head_steps_a_plain_step_does_not_run(monkeypatch, mode, k, heads):
    """The executor's head runs k times a speculative step (k - 1 chain steps, the proposal after the acceptance); a
    lookahead step without speculation makes that proposal too (in the fitted ordinary step), dense runs no head. So
    one more millisecond a draft step lengthens a speculative step by k - 1 ms in lookahead and k ms in dense, and
    an ordinary step not at all (no transfer: the head's time is on the compute stream, nothing hides it)."""
    from oasis_sim.predictor import RooflinePredictor

    step = RooflinePredictor._draft_step
    runs = []
    for extra in (0.0, 1e-3):
        monkeypatch.setattr(RooflinePredictor, "_draft_step", lambda self, s, e=extra: step(self, s) + e)
        kw = {**BASE, "mode": mode}
        cfg = SimConfig(speculative_k=k, speculative_alpha=0.8, no_transfer=True, **kw)
        runs.append(simulate(cfg, bench_trace(4096, 4, 30)).steps.dur)
        monkeypatch.undo()
    d0, d1 = runs
    assert len(d0) == len(d1) and len(d0) > 5
    grew = [b - a for a, b in zip(d0, d1)]
    assert max(grew) == pytest.approx(heads * 1e-3, abs=1e-9)  # every speculative step
    assert min(grew) == pytest.approx(0.0, abs=1e-9) or min(grew) == pytest.approx(heads * 1e-3, abs=1e-9)


def test_beside_prices_by_hand():
    """The H100 profile's prices (experiments/decode_step_profile/results/spec_beside_h100_6ec514d/), worked by hand
    (µs): beside's stage beyond an ordinary step's, its kernels at their means alone, 2 x 1.71 + 4.15 + 1.62 + 7.65
    + 2.69 + 3 x 1.47 + 1.38 + 1.49 + 2.48 + 0.98 + 1.68 + 1.04 + 2 x 4.44 = 41.87; the masked commit's 15 kernels
    the commit's kernels at k = 1 (two scatters, a summary, a write-back) and the 3 gaps between them at 0.42,
    18.22; the repair kernel alone 25.94."""
    from oasis_core.specs import get_hardware, get_model
    from oasis_sim.predictor import RooflinePredictor

    pred = RooflinePredictor(get_model("qwen3-8b"), get_hardware("h100-sxm"))
    us = 1e-6
    beside = 2 * 1.71 + 4.15 + 1.62 + 7.65 + 2.69 + 3 * 1.47 + 1.38 + 1.49 + 2.48 + 0.98 + 1.68 + 1.04 + 2 * 4.44
    assert beside == pytest.approx(41.87, abs=1e-9)
    assert pred.time("spec_beside", {}) == pytest.approx(41.87 * us, rel=1e-12)
    # the commit (since c604300 / 04c9539): k = 1 two scatters at 5.14, a summary 3.00, a write-back 3.68 and 3 gaps;
    # k >= 2 four scatters, two summaries, a write-back and 6 gaps
    assert pred.time("spec_commit", {"k": 1}) == pytest.approx((2 * 5.14 + 3.00 + 3.68 + 3 * 0.42) * us, rel=1e-12)
    assert pred.time("spec_commit", {"k": 1}) == pytest.approx(18.22 * us, rel=1e-12)
    assert pred.time("spec_commit", {"k": 3}) == pytest.approx((4 * 5.14 + 2 * 3.00 + 3.68 + 6 * 0.42) * us, rel=1e-12)
    assert pred.time("spec_repair", {}) == pytest.approx(25.94 * us, rel=1e-12)


@pytest.mark.parametrize("variant", ["after", "beside"])
def test_the_beside_stage_is_charged_to_beside_passes_only(monkeypatch, variant):
    """Op ``spec_beside`` (beside's launches beyond an ordinary step's side stage, taken from each full layer's
    pass): at 1 ms a layer, every beside speculative step grows by exactly ``L`` ms (no transfer: nothing else
    moves; the side stage stays shorter than a layer), every other step keeps its time, and the after variant is
    unchanged step for step. Removing the term, or charging it per step or in after, fails it."""
    from oasis_sim.predictor import RooflinePredictor

    runs = []
    for cost in (0.0, 1e-3):
        monkeypatch.setattr(RooflinePredictor, "_spec_beside", lambda self, s, c=cost: c)
        spec = {}
        eng = []
        draw = sim_engine.SimEngine._spec_draw

        def keep(self, plan, ks, K, beside, draw=draw, eng=eng, spec=spec):
            eng[:] = [self]
            spec[len(self.log.dur)] = K > 0
            return draw(self, plan, ks, K, beside)

        monkeypatch.setattr(sim_engine.SimEngine, "_spec_draw", keep)
        cfg = SimConfig(speculative_k=1, speculative_alpha=0.8, spec_predict=variant, no_transfer=True, **BASE)
        res = simulate(cfg, bench_trace(4096, 4, 40))
        monkeypatch.undo()
        runs.append((res.steps.dur, spec, eng[0].L))
    (d0, s0, L), (d1, _, _) = runs
    assert len(d0) == len(d1) and any(s0.values())
    for i, (a, b) in enumerate(zip(d0, d1)):
        want = L * 1e-3 if variant == "beside" and s0.get(i) else 0.0
        assert b - a == pytest.approx(want, rel=1e-9, abs=1e-12), i

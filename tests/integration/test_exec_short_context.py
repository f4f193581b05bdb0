"""Short contexts in the executor (issue 15, oasis_core.short_context): a sparse-mode lane whose context fits its
resident set runs dense on the GPU with no host blocks, fetches or write-backs, and crosses to the host once."""

import random

import pytest
import torch

from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

BS, K = 16, 4  # window: (K + 1) * BS = 80 tokens


def _engine(mode, **kw):
    torch.set_num_threads(1)
    return Engine(
        ExecConfig(
            model="tiny",
            device="cpu",
            dtype="float32",
            mode=mode,
            **{
                "top_k": K,
                "block_size": BS,
                "max_context": 320,
                "max_lanes": 2,
                "draft_vocab": 64,
                "prefill_chunk": 48,
                "short_context": True,
                **kw,
            },
        )
    )


def _prompts(*lens, seed=3):
    rng = random.Random(seed)
    return [[rng.randrange(1, 250) for _ in range(n)] for n in lens]


def _run(eng, prompts, max_tokens, watch=None):
    ids = [eng.add_request(p, SamplingParams(max_tokens=max_tokens)) for p in prompts]
    outs = {i: [] for i in ids}
    while eng.has_work():
        for o in eng.step():
            outs[o.request_id].extend(o.new_token_ids)
        if watch is not None:
            watch(eng)
    return [outs[i] for i in ids]


@pytest.mark.parametrize("mode", ["lookahead", "retrieval", "proxy"])
def test_short_requests_run_dense_with_no_host_traffic(mode):
    prompts = _prompts(30, 47)  # 30 + 40 and 47 + 33 tokens: both within the 80-token window throughout
    dense = _run(_engine("dense"), prompts, 33)
    eng = _engine(mode)
    for t in eng.runner.host.k + eng.runner.host.v:
        t.fill_(float("nan"))
    used = []
    out = _run(eng, prompts, 33, watch=lambda e: used.append(e.stats().host_blocks_used))
    assert out == dense
    assert set(used) == {0} and eng.runner.counters()["units_fetched"] == 0
    assert all(bool(torch.isnan(t).all()) for t in eng.runner.host.k + eng.runner.host.v)  # nothing written back


def test_short_context_off_offloads_as_before():
    eng = _engine("lookahead", short_context=False)
    _run(eng, _prompts(30), 30)
    assert eng.runner.counters()["units_fetched"] > 0


@pytest.mark.parametrize("plen", [40, 80])  # crosses mid-decode; a prompt of exactly the window crosses at once
def test_crossing_matches_short_context_off(plen):
    prompts = _prompts(plen, 20)
    off = _engine("retrieval", short_context=False)
    on = _engine("retrieval")
    held = []
    out_on = _run(
        on,
        prompts,
        60,
        watch=lambda e: held.append(len(e.scheduler.running[0].host_blocks) if 0 in e.scheduler.running else None),
    )
    out_off = _run(off, prompts, 60)
    assert out_on == out_off
    first = next(h for h in held if h)  # no host blocks until the crossing, then every block of the context
    assert held[: held.index(first)] == [0] * held.index(first) and first == K + 2
    # the host holds the same KV of request 0 (lane 0) in both runs, in the blocks each run gave it
    b_on, b_off = on.runner.model.ws.lane_blocks[0][: K + 2], off.runner.model.ws.lane_blocks[0][: K + 2]
    for l in range(len(on.runner.host.k)):
        torch.testing.assert_close(on.runner.host.k[l][b_on], off.runner.host.k[l][b_off])
        torch.testing.assert_close(on.runner.host.v[l][b_on], off.runner.host.v[l][b_off])


def test_lookahead_crossing_runs_to_the_end():
    eng = _engine("lookahead")
    out = _run(eng, _prompts(60), 50)
    assert len(out[0]) == 50 and eng.runner.counters()["units_fetched"] > 0
    assert eng.stats().host_blocks_used == 0


def test_steps_with_no_short_lane_run_the_plain_sparse_step():
    """The runner decides on the host whether a step may hold a short lane: when none can, the step carries no
    short-context masks (every background plan gets the plain integer cap), and the output equals the rule off."""
    prompts = _prompts(120, 150)  # both beyond the 80-token window from their prefill on
    off = _run(_engine("lookahead", short_context=False), prompts, 12)
    eng = _engine("lookahead")
    caps, bg = [], eng.runner.pipe._bg_cap
    eng.runner.pipe._bg_cap = lambda *a: caps.append(bg(*a)) or caps[-1]
    assert _run(eng, prompts, 12) == off
    assert caps and all(isinstance(c, int) for c in caps)


def _spy_steps(eng):
    """Wrap the model's decode step and prediction: returns (the ``short`` of each step, predictions made)."""
    shorts, preds = [], []
    m = eng.runner.model
    core, predict = m.decode_core, m.selector.predict
    m.decode_core = lambda *a, **kw: shorts.append(kw.get("short")) or core(*a, **kw)
    m.selector.predict = lambda *a, **kw: preds.append(1) or predict(*a, **kw)
    return shorts, preds


@pytest.mark.parametrize("mode", ["lookahead", "retrieval", "proxy"])
def test_all_short_steps_skip_drafting_and_prediction(mode):
    """While every lane is short, the step is resident-dense: one query per lane (no draft token), no prediction,
    selection or fetch; the output still equals dense."""
    prompts = _prompts(30, 47)
    dense = _run(_engine("dense"), prompts, 33)
    eng = _engine(mode)
    m = eng.runner.model
    queries, core, qkv = [], m.decode_core, m.dec.qkv  # per decode step: [lanes, query rows of its first layer]

    def step(lanes, *a, **kw):
        queries.append([lanes.shape[0]])
        return core(lanes, *a, **kw)

    def first_qkv(l, x, p):
        if l == 0 and queries and len(queries[-1]) == 1:
            queries[-1].append(x.shape[0])
        return qkv(l, x, p)

    m.decode_core, m.dec.qkv = step, first_qkv
    shorts, preds = _spy_steps(eng)
    assert _run(eng, prompts, 33) == dense
    assert shorts and set(shorts) == {"all"} and preds == []
    assert queries and all(rows == lanes for lanes, rows in queries) and max(q[0] for q in queries) == 2


def test_mixed_steps_carry_masks_and_the_crossing_copies_on_the_device():
    """A short lane beside a long one: the step is "some" (masks) until the short lane crosses; the crossing copies
    on the device (ModelExec has no host-side offload) and the run equals the rule off (retrieval: exact selection
    each step)."""
    prompts = _prompts(60, 150)  # 60 tokens crosses the 80-token window at the 21st step; 150 is long at once
    off = _run(_engine("retrieval", short_context=False), prompts, 40)
    eng = _engine("retrieval")
    shorts, _ = _spy_steps(eng)
    assert _run(eng, prompts, 40) == off
    # alone while the long prompt prefills ("all"), beside it ("some"), then crossed ("none")
    order = [s for i, s in enumerate(shorts) if i == 0 or s != shorts[i - 1]]
    assert order == ["all", "some", "none"]
    assert not hasattr(eng.runner.model, "offload")


@pytest.mark.parametrize("mode", ["lookahead", "proxy"])
def test_background_crossing_puts_the_prompt_kv_on_the_host(mode):
    """A prompt of exactly the window crosses at its first decode step: the host then holds the prompt's KV, the
    same values the rule off wrote at prefill."""
    prompts = _prompts(80)
    on, off = _engine(mode), _engine(mode, short_context=False)
    _run(on, prompts, 3)
    _run(off, prompts, 3)
    nb = 80 // BS
    b_on, b_off = on.runner.model.ws.lane_blocks[0][:nb], off.runner.model.ws.lane_blocks[0][:nb]
    for l in range(len(on.runner.host.k)):
        torch.testing.assert_close(on.runner.host.k[l][b_on], off.runner.host.k[l][b_off])
        torch.testing.assert_close(on.runner.host.v[l][b_on], off.runner.host.v[l][b_off])


def test_all_short_steps_attend_a_power_of_two_of_slots_and_draft_only_before_crossing():
    """An all-short step attends the longest lane's full blocks rounded up to a power of two (16 .. top_k slots);
    its draft head runs only for lanes whose next step is their crossing."""
    eng = _engine("lookahead", top_k=40, max_context=700)  # window 656 tokens: slots 16, 32, 40
    r = eng.runner
    assert [r._dense_slots([p]) for p in (0, 271, 272, 527, 528, 639)] == [16, 16, 32, 32, 40, 40]
    proposed, propose = [], r.drafts.propose
    r.drafts.propose = lambda lanes, aux, tok: proposed.append(lanes.tolist()) or propose(lanes, aux, tok)
    w = r.short.window_tokens
    aux = torch.zeros(2, 3 * r.shape.hidden)
    lanes = torch.tensor([0, 1])
    r._propose("all", lanes, [w - 5, w - 1], aux, torch.tensor([3, 4]))  # lane 1's next step crosses
    r._propose("some", lanes, [w - 5, w], aux, torch.tensor([3, 4]))
    assert proposed == [[1], [0, 1]]

"""Short contexts in the executor (issue 15, oasis_core.short_context): a sparse-mode lane whose context fits its
resident set runs dense on the GPU with no host blocks, fetches or write-backs, and crosses to the host once."""

import random

import pytest
import torch

from oasis_exec.config import ExecConfig
from oasis_exec.engine import Engine
from oasis_exec.scheduler import SamplingParams

BS, K = 16, 4  # window: (K + 1) * BS = 80 tokens


def _engine(mode, **kw):
    torch.set_num_threads(1)
    return Engine(
        ExecConfig(
            model="tiny",
            device="cpu",
            dtype="float32",
            mode=mode,
            top_k=K,
            block_size=BS,
            max_context=320,
            max_lanes=2,
            draft_vocab=64,
            prefill_chunk=48,
            **{"short_context": True, **kw},
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
    b_on, b_off = on.runner.lane_blocks[0][: K + 2], off.runner.lane_blocks[0][: K + 2]
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

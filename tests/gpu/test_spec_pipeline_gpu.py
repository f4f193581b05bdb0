"""``spec_predict = "beside"`` on CUDA (``oasis_exec.workingset.spec_pipeline``): the candidates, the beside plan and its
copies on the side streams during the verify pass, the repair after the acceptance, in the speculative step's CUDA
graph (``DecodeGraphs.spec_step``: one graph per batch size, draft length and acceptance kind, so every k the
adaptive choice may pick).

- Graphs equal eager at k = 1, 2, 3 (logits, tokens, acceptance, repaired lane-steps) with drawn acceptance that
  fills blocks mid-run (repairs), and the slots hold their blocks' host copies after.
- The attention draft head at k = 1 (after and beside): graphs equal eager, its K/V included.
- On the side streams (fp32), with an unlimited cap, every step ends with the attended blocks the after variant's
  steps end with (the CPU test's lockstep comparison: the streams' ordering of the beside stage, the commit and the
  repair is what it checks here).

``OASIS_GPU_TESTS_DEVICE=cpu`` runs the file on the CPU as a dry run (no graphs, no streams there)."""

import os

import pytest
import torch
from exec_cases import cfg, prompts, run_logits

from oasis_core.selection import attended_blocks
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("OASIS_GPU_TESTS_DEVICE", "cuda")


def _slots_hold_their_blocks(eng) -> int:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()
    r = eng.runner
    st, checked = r.store, 0
    for q in eng.scheduler.running.values():
        blocks = r.model.ws.lane_blocks[q.lane]
        for l in range(r.L):
            for h in range(r.H):
                row = q.lane * r.H + h
                for s, b in enumerate(st.resident[l, row].tolist()):
                    if b >= 0:
                        assert torch.equal(st.k[l][row * st.W + s].cpu(), r.host.k[l][blocks[b], h].cpu())
                        assert torch.equal(st.v[l][row * st.W + s].cpu(), r.host.v[l][blocks[b], h].cpu())
                        checked += 1
    return checked


def _eager_then_graphs(kw, ps, n=40):
    """The same requests run eager, then in CUDA graphs: (the two runners, the graph keys run, the eager and graphed
    logits and outputs); on CUDA the speculative steps must have run through graphs."""
    runners, keys = [], []

    def hook(r):
        runners.append(r)
        run = r.cuda_graphs.run
        r.cuda_graphs.run = lambda key, *a, **kk: (keys.append(key), run(key, *a, **kk))[1]

    ref, out_ref = run_logits(cfg("lookahead", DEVICE, cuda_graph=False, **kw), ps, n, runner_hook=hook)
    got, out = run_logits(cfg("lookahead", DEVICE, cuda_graph=True, **kw), ps, n, runner_hook=hook)
    if DEVICE.startswith("cuda"):
        assert {key[0] for key in keys} >= {"chain", "spec"}  # the speculative steps ran through graphs
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.isfinite(b).all()
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    return runners


@pytest.mark.parametrize("k,accept", [(1, {"alpha": 0.9}), (2, {"2": [2, 3, 5]}), (3, {"3": [1, 2, 2, 3]})])
def test_beside_graphs_equal_eager_at_every_k(k, accept):
    ps = prompts(13, (90, 120, 64))
    kw = dict(
        top_k=3,
        fetch_ratio=0.67,
        transfer="uva",
        speculative_k=k,
        short_context=False,
        synthetic_accept=accept,
        spec_predict="beside",
    )
    runners = _eager_then_graphs(kw, ps)
    assert [r.spec.predict_used for r in runners] == ["beside", "beside"]
    assert runners[1].spec.steps == runners[0].spec.steps > 0
    assert runners[1].spec.accepts == runners[0].spec.accepts
    stats = [r.spec.beside.stats() for r in runners]
    assert stats[0] == stats[1] and stats[0]["spec_predict_repairs"] > 0
    eng = Engine(cfg("lookahead", DEVICE, cuda_graph=True, **kw))
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=40))
    for _ in range(8):
        eng.step()
    eng.runner.pipe.wait_all()
    assert _slots_hold_their_blocks(eng) > 0
    eng.close()


@pytest.mark.parametrize("predict", ["after", "beside"])
def test_attn_head_spec_graphs_equal_eager(predict):
    """The attention draft head at k = 1 (``draft_head="attn"``): its resync (``AttnDraftHead.propose_accepted``,
    the accepted positions appended to its K/V with masked writes) inside the speculative step's graph gives the
    eager steps' logits, tokens, acceptance and head K/V, and writes nothing past a lane's length (drawn acceptance:
    the random head's drafts accepted at 0.6, so steps append 1 or 2 positions)."""
    ps = prompts(13, (90, 120, 64))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", speculative_k=1, short_context=False, draft_head="attn")
    kw.update(synthetic_accept={"alpha": 0.6}, spec_predict=predict)
    runners = _eager_then_graphs(kw, ps)
    assert [r.spec.predict_used for r in runners] == [predict, predict]
    assert runners[1].spec.steps == runners[0].spec.steps > 0
    assert runners[1].spec.accepts == runners[0].spec.accepts
    assert runners[0].spec.accepts[1, 1] > 0 and runners[0].spec.accepts[1, 0] > 0
    kv = [r.drafts.head.kv for r in runners]
    assert torch.equal(kv[0].n, kv[1].n)
    assert sorted(kv[0].n.tolist()[:3]) == sorted(len(p) + 40 - 1 for p in ps)
    for lane, n in enumerate(kv[0].n.tolist()):
        assert not kv[1].k[lane, n:].any() and not kv[1].v[lane, n:].any()
        for a, b in ((kv[0].k, kv[1].k), (kv[0].v, kv[1].v)):
            assert torch.allclose(a[lane, :n].float(), b[lane, :n].float(), atol=2e-2, rtol=2e-2)


def test_beside_on_the_side_streams_attends_what_after_attends():
    kw = dict(
        dtype="bfloat16",  # the CUDA kernels take bf16 / fp16 (a float32 run stops at block_score's dtype check)
        top_k=4,
        fetch_ratio=1.0,
        transfer="uva",
        short_context=False,
        speculative_k=3,
        synthetic_accept={"alpha": 0.6},
        cuda_graph=False,
    )
    engs = [Engine(cfg("lookahead", DEVICE, spec_predict=v, **kw)) for v in ("after", "beside")]
    ps = prompts()
    for e in engs:
        for p in ps:
            e.add_request(p, SamplingParams(max_tokens=40))
    while engs[0].has_work():
        for e in engs:
            e.step()
        if not engs[0].has_work() or not engs[0].runner.spec.steps:
            continue
        sets = []
        for e in engs:
            r = e.runner
            r.pipe.wait_all()
            lanes = sorted(q.lane for q in e.scheduler.running.values())
            rows = [lane * r.H + h for lane in lanes for h in range(r.H)]
            sets.append(
                [
                    torch.sort(
                        attended_blocks(r.store.resident[l], r.store.last_sel[l], r.cfg.top_k)[rows], 1
                    ).values.cpu()
                    for l in range(r.L)
                ]
            )
        for a, b in zip(*sets):
            assert torch.equal(a, b)
    assert engs[1].runner.spec.beside.stats()["spec_predict_repairs"] > 0
    for e in engs:
        e.close()

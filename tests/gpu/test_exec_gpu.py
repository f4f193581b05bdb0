"""GPU-only executor checks (run on the H200 with `pytest -m gpu`): CUDA-graph steps equal eager steps, and the
per-head mapping equals the slot contents with the device-side write-back and UVA transfers."""

import pytest
import torch
from exec_cases import (
    assert_same_run,
    cfg,
    chains_of,
    drive,
    prompts,
    run_logits,
    run_state,
    slots_hold_their_blocks,
)

from oasis_exec.config import STREAM_PRIORITIES
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.gpu


def _graphs_equal_eager(mode, ps, steps, **kw):
    """CUDA-graph steps give the eager steps' tokens, and their logits within bf16 noise; returns the tokens."""
    ref, out_ref = run_logits(cfg(mode, "cuda", cuda_graph=False, **kw), ps, steps)
    got, out = run_logits(cfg(mode, "cuda", cuda_graph=True, **kw), ps, steps)
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.isfinite(b).all()
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    assert out == out_ref
    return out


@pytest.mark.parametrize("mode", ["dense", "quest", "retrieval", "proxy", "lookahead", "hisparse"])
def test_cuda_graph_steps_equal_eager_steps(mode):
    _graphs_equal_eager(mode, prompts(7, (90, 120, 64)), 40, top_k=3, fetch_ratio=0.67, transfer="uva")


def _slots_checked(eng) -> None:
    assert slots_hold_their_blocks(eng) > 0


@pytest.mark.parametrize(
    "graph, prio, cg, kern, ipi",
    [
        (False, "normal", "on", "loads", 2),
        (True, "normal", "on", "loads", 2),
        (True, "high", "on", "loads", 2),
        (True, "low", "off", "loads", 2),
        (True, "pred_low", "off", "loads", 2),
        (True, "normal", "off", "loads", 2),
        (True, "normal", "off", "loads", 8),
        (True, "normal", "off", "tma", 2),
    ],
)
def test_mapping_matches_slots_on_gpu(graph, prio, cg, kern, ipi):
    c = cfg(
        "lookahead",
        "cuda",
        top_k=3,
        fetch_ratio=0.67,
        max_context=900,
        max_lanes=2,
        transfer="uva",
        cuda_graph=graph,
        stream_priority=prio,
        copy_graph=cg,
        uva_kernel=kern,
        uva_items_per_iter=ipi,
    )
    eng = Engine(c)
    assert eng.runner.pipe.ext.copy_graph == (cg == "on")
    step_p, pred_p, copy_p = STREAM_PRIORITIES[prio]
    pipe = eng.runner.pipe
    assert (pipe.step_priority, pipe.s_pred.priority, pipe.s_copy.priority) == (step_p, pred_p, copy_p)
    if step_p:  # the step captured above a side stream
        assert eng.runner.cuda_graphs._stream().priority == step_p
    for p in prompts(2, (40, 65)):
        eng.add_request(p, SamplingParams(max_tokens=700))
    steps = 0
    while eng.has_work():
        eng.step()
        steps += 1
        if steps % 200 == 0:
            slots_hold_their_blocks(eng)
    assert eng.runner.counters()["units_fetched"] > 100
    eng.close()


@pytest.mark.parametrize("graph", [False, True])
def test_synthetic_sets_drawn_ahead_equal_drawn_in_step(graph):
    """The runner draws the next step's synthetic sets on a side stream during the step (``presynth``), or, with
    ``synthetic_ahead``, 8 steps' at once before them (then each step's again; the model's top-K run beside them,
    ``synthetic_topk``); the selections, mappings and tokens must equal those of drawing them at the step's start."""
    ps = prompts(3, (70, 90))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", selection="synthetic", cuda_graph=graph)

    def at_step(r):
        r.sources.presynth = lambda *a: None

    ref = run_state(cfg("lookahead", "cuda", **kw), ps, 30, at_step)
    assert ref[2] > 0
    assert_same_run(run_state(cfg("lookahead", "cuda", **kw), ps, 30), ref)  # presynth
    assert_same_run(run_state(cfg("lookahead", "cuda", **kw, synthetic_ahead=8, synthetic_topk=True), ps, 30), ref)


@pytest.mark.parametrize("graph", [False, True])
def test_fused_topk_gives_the_run_of_the_sort(graph):
    """``topk_kernel="fused"`` (oasis_kernels.topk_select in the prediction, captured with the step) chooses the blocks the
    torch sort does: same tokens, mappings and fetches (selection=model)."""
    ps = prompts(4, (70, 90))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", cuda_graph=graph)
    ref = run_state(cfg("lookahead", "cuda", **kw, topk_kernel="sort"), ps, 30)
    assert ref[2] > 0
    assert_same_run(run_state(cfg("lookahead", "cuda", **kw, topk_kernel="fused"), ps, 30), ref)


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_fused_kv_write_equals_indexed_write(mode):
    """oasis_kernels.kv_write in the step (graphs on) gives the same logits and tokens as the indexed assignment."""
    ps = prompts(5, (70, 90))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", cuda_graph=True)
    ref, out_ref = run_logits(cfg(mode, "cuda", fused_kv_write=False, **kw), ps, 24)
    got, out = run_logits(cfg(mode, "cuda", fused_kv_write=True, **kw), ps, 24)
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("kernel", ["torch", "native"])
def test_host_path_in_graphs_equals_eager(kernel):
    """The host-gather path captured in CUDA graphs (external events, worker after each replay) gives the logits
    and tokens of the same path run eagerly with the torch gather; with ``host_kernel="native"`` the C gather."""
    ps = prompts(9, (90, 120, 64))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="host", host_threads=2)
    ref, out_ref = run_logits(cfg("lookahead", "cuda", cuda_graph=False, host_kernel="torch", **kw), ps, 40)
    eng_probe = Engine(cfg("lookahead", "cuda", cuda_graph=True, host_kernel=kernel, **kw))
    assert eng_probe.runner.pipe.ext.graph_host  # this torch has external events: the graph mode is what runs below
    assert (eng_probe.runner.pipe.host_path.native is not None) == (kernel == "native")
    eng_probe.close()
    got, out = run_logits(cfg("lookahead", "cuda", cuda_graph=True, host_kernel=kernel, **kw), ps, 40)
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    assert out == out_ref


@pytest.mark.parametrize("prio,kernel", [("normal", "torch"), ("high", "torch"), ("normal", "native")])
def test_host_path_in_graphs_mapping_matches_slots(prio, kernel):
    c = cfg(
        "lookahead",
        "cuda",
        top_k=3,
        fetch_ratio=0.67,
        max_context=900,
        max_lanes=2,
        transfer="host",
        host_threads=2,
        cuda_graph=True,
        stream_priority=prio,
        host_kernel=kernel,
    )
    eng = Engine(c)
    for p in prompts(4, (40, 65)):
        eng.add_request(p, SamplingParams(max_tokens=300))
    for _ in range(250):
        eng.step()
    r = eng.runner
    r.pipe.wait_all()  # the worker's last jobs
    assert slots_hold_their_blocks(eng) > 0 and r.counters()["units_fetched"] > 100
    assert r.cuda_graphs.graphs  # the steps ran as graphs
    eng.close()


def test_uva_copy_graphs_equal_copies_inside_the_step_graph():
    """UVA copies captured as a graph of their own (copy_graph, launched after each step's graph, joined by external
    events) give the logits, tokens and mapping of the same copies captured inside the step's graph."""
    ps = prompts(11, (90, 120, 64))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", cuda_graph=True)
    ref, out_ref = run_logits(cfg("lookahead", "cuda", copy_graph="off", **kw), ps, 40)
    launched = []  # per replay: whether its copies went out as a copy graph (close() frees them, so count here)

    def hook(r):
        orig = r.pipe.after_replay
        r.pipe.after_replay = lambda key: (launched.append(key in r.pipe.uva.copy_graphs), orig(key))

    got, out = run_logits(cfg("lookahead", "cuda", copy_graph="on", **kw), ps, 40, runner_hook=hook)
    assert launched and all(launched)  # every replayed step's copies ran as a graph of their own
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("mode", ["retrieval", "lookahead", "hisparse"])
def test_short_context_in_graphs_equals_eager_and_crosses_on_the_device(mode):
    """Short contexts under CUDA graphs (steps "all", "some", "none" each a graph; the crossing eager, its copy to
    the host by the write-back kernel): the logits and tokens of the eager run, the slots hold the host's copies of
    their blocks after the crossing (the CPU tests check float32 runs against the rule off token for token)."""
    ps = prompts(11, (40, 55))  # window (3 + 1) * 16 = 64 tokens: both cross mid-run, at different steps
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", short_context=True, max_context=400, max_lanes=2)
    ref, out_ref = run_logits(cfg(mode, "cuda", cuda_graph=False, **kw), ps, 80)
    got, out = run_logits(cfg(mode, "cuda", cuda_graph=True, **kw), ps, 80)
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    eng = Engine(cfg(mode, "cuda", cuda_graph=True, **kw))
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=80))
    for _ in range(60):  # both lanes crossed (about step 25 and 10), both still running
        eng.step()
    assert {k[1] for k in eng.runner.cuda_graphs.graphs} >= {"all", "none"}
    assert slots_hold_their_blocks(eng) > 0
    eng.close()


@pytest.mark.parametrize("spec", ["drift", "per-layer:0.5", "recall:0.9"])
def test_adaptive_fetch_policies_in_graphs_equal_eager(spec):
    """The adaptive fetch-cap policies that read only device state (no clock) give the same logits and tokens with
    the step captured in CUDA graphs as eagerly."""
    ps = prompts(13, (90, 120))
    kw = dict(top_k=3, fetch_ratio=0.34, transfer="uva", fetch_policy=spec, short_context=False)
    ref, out_ref = run_logits(cfg("lookahead", "cuda", cuda_graph=False, **kw), ps, 40)
    eng = Engine(cfg("lookahead", "cuda", cuda_graph=True, **kw))
    assert eng.runner.caps.adaptive
    eng.close()
    got, out = run_logits(cfg("lookahead", "cuda", cuda_graph=True, **kw), ps, 40)
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)


def test_hisparse_graphs_equal_eager_and_slots_hold_their_blocks():
    """hisparse on the GPU (plan_select over the hot cache with the slot list; the misses read from the pinned pool
    in the same launch, or by the UVA gather after it): with either fetch, CUDA-graph steps give the eager logits
    and tokens; both fetches give the same tokens and fetch counts; every hot-cache slot holds its block's host
    copy over a long run."""
    ps = prompts(17, (90, 120, 64))
    tokens, counts = {}, {}
    for fg in (True, False):
        kw = dict(top_k=3, hot_slots=7, transfer="uva", fused_hot_gather=fg)
        tokens[fg] = _graphs_equal_eager("hisparse", ps, 40, **kw)
        eng = Engine(cfg("hisparse", "cuda", cuda_graph=True, max_context=900, max_lanes=2, **kw))
        assert eng.runner.store.S == 7 and eng.runner.pipe.bufs.slot_buf is not None
        drive(eng, prompts(2, (40, 65)), 700, 200, _slots_checked)
        assert eng.runner.cuda_graphs.graphs
        counts[fg] = eng.runner.counters()
        eng.close()
    assert tokens[True] == tokens[False]
    assert counts[True] == counts[False] and counts[True]["units_fetched"] > 100


@pytest.mark.parametrize(
    "mode, transfer, kernel",
    [
        ("lookahead", "uva", "torch"),
        ("lookahead", "host", "torch"),
        ("lookahead", "host", "native"),
        ("retrieval", "uva", "torch"),
        ("hisparse", "uva", "torch"),
    ],
)
def test_fp8_host_graphs_equal_eager_and_slots_hold_the_dequantized_host_copies(mode, transfer, kernel):
    """An fp8 host copy (host_kv_dtype=fp8_e4m3) on the GPU: the write-back kernel quantizes through UVA, the UVA
    gather (or the staged fp8 rows + the scatter) dequantizes into bf16 slots. CUDA-graph steps give the eager logits
    and tokens; every resident slot equals its block's dequantized host copy over a long run (short contexts on:
    both lanes cross on the device first); the logits stay near the bf16-host run's."""
    ps = prompts(19, (90, 120, 64))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer=transfer, host_kv_dtype="fp8_e4m3", host_threads=2)
    kw["host_kernel"] = kernel
    ref, out_ref = run_logits(cfg(mode, "cuda", cuda_graph=False, **kw), ps, 40)
    got, out = run_logits(cfg(mode, "cuda", cuda_graph=True, **kw), ps, 40)
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.isfinite(b).all()
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    eng = Engine(cfg(mode, "cuda", cuda_graph=True, max_context=900, max_lanes=2, **kw))
    assert eng.runner.host.quantized and eng.runner.host.k[0].dtype == torch.float8_e4m3fn
    assert eng.runner.store.k[0].dtype == torch.bfloat16
    for p in prompts(2, (40, 65)):
        eng.add_request(p, SamplingParams(max_tokens=500))
    steps = 0
    while eng.has_work():
        eng.step()
        steps += 1
        if steps % 200 == 0:
            eng.runner.pipe.wait_all()  # the host path's worker jobs
            assert slots_hold_their_blocks(eng) > 0
    assert eng.runner.cuda_graphs.graphs and eng.runner.counters()["units_fetched"] > 100
    eng.close()


@pytest.mark.parametrize("mode,accept", [("dense", None), ("lookahead", None), ("lookahead", {"3": [1, 2, 2, 3]})])
def test_speculative_steps_in_graphs_equal_eager(mode, accept):
    """Speculative steps (k = 3) as CUDA graphs (the draft chain, then the pass with the device-side acceptance,
    commit and resync: ``DecodeGraphs.spec_chain`` / ``spec_step``) give the eager steps' logits, tokens and
    acceptance. Lookahead fetches (top-K 3 of up to 14 blocks); with a synthetic acceptance (the random head accepts
    almost nothing) runs of up to 4 tokens fill blocks in the middle of a step; the slots hold their blocks' host
    copies after."""
    ps = prompts(13, (90, 120, 64))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", speculative_k=3, short_context=False)
    if accept:
        kw["synthetic_accept"] = accept
    runners, keys = [], []

    def hook(r):
        runners.append(r)
        run = r.cuda_graphs.run
        r.cuda_graphs.run = lambda key, *a, **k: (keys.append(key), run(key, *a, **k))[1]

    ref, out_ref = run_logits(cfg(mode, "cuda", cuda_graph=False, **kw), ps, 40, runner_hook=hook)
    got, out = run_logits(cfg(mode, "cuda", cuda_graph=True, **kw), ps, 40, runner_hook=hook)
    assert {k[0] for k in keys} >= {"chain", "spec"}  # the speculative steps ran through graphs
    assert runners[1].spec.steps == runners[0].spec.steps > 0
    assert runners[1].spec.accepts == runners[0].spec.accepts
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.isfinite(b).all()
            assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    if mode == "lookahead":
        eng = Engine(cfg(mode, "cuda", cuda_graph=True, **kw))
        for p in ps:
            eng.add_request(p, SamplingParams(max_tokens=40))
        for _ in range(8):
            eng.step()
        eng.runner.pipe.wait_all()
        assert slots_hold_their_blocks(eng) > 0
        eng.close()


@pytest.mark.parametrize("mode,copy_graph", [("dense", "off"), ("lookahead", "off"), ("lookahead", "on")])
def test_decode_chains_in_graphs_equal_single_steps(mode, copy_graph):
    """Graphed decode steps chained on the device (decode_chain: each step's tokens and draft tokens feed the next,
    the host reads the chain once) give the tokens of one graphed step a scheduler step; mid-run, the lookahead
    slots hold the host copies of their blocks."""
    from exec_cases import run_synthesized

    ps = prompts(13, (90, 120, 64))
    kw = dict(top_k=3, fetch_ratio=0.67, transfer="uva", cuda_graph=True, copy_graph=copy_graph, short_context=False)
    ref_eng, ref, _ = run_synthesized(cfg(mode, "cuda", **kw), ps, 40)
    ref_eng.close()
    eng, out, steps = run_synthesized(cfg(mode, "cuda", decode_chain=8, **kw), ps, 40)
    eng.close()
    assert max(steps) == 8 and len(steps) <= 6
    assert out == ref
    if mode == "lookahead":  # real prefill: a synthesized one leaves random slots (the sink block keeps them)
        eng = Engine(cfg(mode, "cuda", decode_chain=8, **kw))
        assert chains_of(eng, ps, 8, 3) == 3  # three chains of 8: two captured and replayed
        assert slots_hold_their_blocks(eng) > 0
        eng.close()


@pytest.mark.parametrize("mode,marks", [("lookahead", False), ("proxy", False), ("lookahead", True)])
def test_victim_cache_graphs_equal_eager_cpu_and_slots_hold_their_blocks(mode, marks):
    """A background mode's victim cache on the GPU (plan_select over S = 3K slots, oasis_kernels.attend_slots for the K
    slots attention reads): CUDA-graph steps give the eager logits and tokens; every slot holds its block's host
    copy over a long run."""
    kw = dict(top_k=3, hot_slots=9, fetch_ratio=0.34, transfer="uva", plan_marks=marks)
    _graphs_equal_eager(mode, prompts(19, (90, 120, 64)), 40, **kw)
    eng = Engine(cfg(mode, "cuda", cuda_graph=True, max_context=900, max_lanes=2, **kw))
    assert eng.runner.store.S == 9 and (eng.runner.pipe.bufs.marks is not None) == marks
    drive(eng, prompts(2, (40, 65)), 700, 200, _slots_checked)
    torch.cuda.synchronize()  # the prediction stream's last plans
    assert not any(m.any() for m in eng.runner.pipe.bufs.marks or [])
    assert eng.runner.cuda_graphs.graphs and eng.runner.counters()["units_fetched"] > 100
    eng.close()


def _repeating(seed, n_unit, reps):
    g = torch.Generator().manual_seed(seed)
    unit = torch.randint(1, 250, (n_unit,), generator=g).tolist()
    return (unit * reps)[: n_unit * reps - seed]


def _ngram_run(c, ps, n=40):
    """Greedy run; returns (outputs, drafts the device prompt lookup gave, graph keys captured)."""
    eng = Engine(c)
    out = eng.generate(ps, SamplingParams(max_tokens=n))
    used, graphs = eng.runner.drafts.ngram.used, set(eng.runner.cuda_graphs.graphs)
    eng.close()
    return out, used, graphs


@pytest.mark.parametrize("spec", [False, True])
def test_prompt_lookup_runs_inside_graphs_and_chains(spec):
    """draft_ngram 2 (runner/ngram_drafts.py: the lookup on the device in every step): graphed steps chained 8 at a
    time (each chain's inner steps replay the captured lookup) give the tokens of eager single steps and the same
    count of lookup drafts; speculative steps (k = 3; the lookup inside the chain's graph, the accepted drafts written
    inside the step's) likewise against eager speculative steps, with many drafts accepted. K covers every block."""
    ps = [_repeating(0, 23, 3), _repeating(1, 31, 2), _repeating(2, 17, 4)]
    kw = dict(top_k=20, fetch_ratio=1.0, short_context=False, transfer="uva", draft_ngram=2)
    if spec:
        kw.update(mode="dense", speculative_k=3)
    else:
        kw.update(mode="lookahead")
    ref, used_ref, _ = _ngram_run(cfg(device="cuda", cuda_graph=False, decode_chain=1, **kw), ps)
    out, used, graphs = _ngram_run(cfg(device="cuda", cuda_graph=True, decode_chain=8, **kw), ps)
    assert graphs and (not spec or any(k[0] == "chain" for k in graphs))
    assert out == ref
    assert used == used_ref > 0

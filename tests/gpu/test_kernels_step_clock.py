"""oasis_kernels.step_clock (%globaltimer into a device tensor) and the adaptive fetch caps under CUDA graphs: GPU only
(the interpreter cannot run inline PTX; the CPU's host-clock path is tests/unit/test_fetch_caps.py)."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_stamp_counts_forward_and_replays_in_a_graph():
    from oasis_kernels.step_clock import stamp

    ns = torch.zeros(2, dtype=torch.int64, device="cuda")
    stamp(ns)
    stamp(ns, end=True)
    torch.cuda.synchronize()
    first = ns.tolist()
    assert first[0] > 0 and first[1] >= 0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        stamp(ns)
        stamp(ns, end=True)
    g.replay()
    torch.cuda.synchronize()
    assert int(ns[0]) > first[0] and int(ns[1]) >= 0  # each replay reads the clock anew


@pytest.mark.parametrize("graph", [False, True])
def test_budget_policy_runs_in_the_step(graph):
    from exec_cases import cfg, prompts

    from oasis_exec.engine.engine import Engine
    from oasis_exec.engine.scheduler import SamplingParams

    eng = Engine(
        cfg(
            "lookahead",
            "cuda",
            top_k=3,
            fetch_ratio=0.67,
            transfer="uva",
            cuda_graph=graph,
            fetch_policy="budget:0.5,min_cap=0,max_ratio=1",
            link_gb_s=1.0,
        )
    )
    for p in prompts(3, (70, 90)):
        eng.add_request(p, SamplingParams(max_tokens=30))
    while eng.has_work():
        eng.step()
    torch.cuda.synchronize()
    caps = eng.runner.caps
    assert caps.adaptive and caps.clock.ticked and float(caps.clock.seconds) > 0
    assert bool(graph) == bool(eng.runner.cuda_graphs.graphs)
    assert eng.runner.counters()["units_fetched"] > 0
    eng.close()

"""Bookkeeping of the host path's CUDA-graph mode (oasis_exec.pipeline.Prefetcher), on CPU with a stand-in job:
which layers a capture registers, what after_replay submits, what before_replay joins. The CUDA side (external
events inside a captured step) is checked on the GPU by tests/test_exec_gpu.py."""
from concurrent.futures import ThreadPoolExecutor

import torch

from oasis_exec.engine import Engine

from test_exec_engine import cfg


def test_after_replay_submits_the_captured_layers_and_before_replay_joins_them():
    eng = Engine(cfg("lookahead", "cpu", transfer="host"))
    pipe = eng.runner.pipe
    ran = []
    pipe.worker = ThreadPoolExecutor(max_workers=1)
    pipe._stagers = [f"stg{l}" for l in range(pipe.store.L)]
    pipe.planned_x = [f"p{l}" for l in range(pipe.store.L)]
    pipe.copied_x = [f"c{l}" for l in range(pipe.store.L)]
    pipe._host_job = lambda layer, stg, n, planned, end, every: ran.append((layer, stg, n, planned, end, every))
    pipe.begin_capture(4)
    pipe._graph_layers[4] += [(0, 24), (1, 24)]  # what launch() registers while the step of 4 lanes is captured
    pipe.begin_capture(2)
    pipe._graph_layers[2] += [(0, 12)]
    pipe.after_replay(4)
    pipe.before_replay()
    assert ran == [(0, "stg0", 24, "p0", "c0", 0), (1, "stg1", 24, "p1", "c1", 0)]
    assert pipe.jobs == [None] * pipe.store.L and pipe.done == [None] * pipe.store.L
    pipe.after_replay(2)
    pipe.before_replay()
    assert ran[-1] == (0, "stg0", 12, "p0", "c0", 0)
    pipe.after_replay(3)  # a key never captured: nothing to do
    pipe.before_replay()
    assert len(ran) == 3
    pipe.host_share, pipe.host_every = True, 4  # UVA with a host share: the worker takes every 4th item
    pipe.after_replay(2)
    pipe.before_replay()
    assert ran[-1] == (0, "stg0", 12, "p0", "c0", 4)
    pipe.worker.shutdown()
    eng.close()


def test_graph_mode_is_off_without_cuda():
    eng = Engine(cfg("lookahead", "cpu", transfer="host"))
    assert eng.runner.pipe.graph_host is False
    assert torch.cuda.is_available() or not eng.runner._graph_ok([0])
    eng.close()


def test_host_job_with_a_share_takes_every_nth_item_of_the_list():
    """_host_job's item choice (every > 0: items 0, every, 2 * every, ...), checked on CPU through its gather call."""
    import kernels.gather as kg

    eng = Engine(cfg("lookahead", "cpu", transfer="host"))
    pipe = eng.runner.pipe
    stg = type("Stg", (), {})()
    stg.src = torch.tensor([[10, 11, -1, 13, 14, 15, 16], [0, 1, 2, 3, 4, 5, 6]], dtype=torch.int32)
    stg.free = stg.stage_k = stg.stage_v = None
    got = {}

    def fake_gather(hk, hv, sb, sh, sk, sv, flat):
        got["flat"] = flat.tolist()
        raise StopIteration  # the DMA half needs CUDA: stop after the choice

    orig, kg.host_gather_stage = kg.host_gather_stage, fake_gather
    ready = type("Ev", (), {"synchronize": lambda self: None})()
    try:
        for every, want in ((0, [10, 11, 13, 14, 15, 16]), (3, [10, 13, 16]), (2, [10, 14, 16])):
            try:
                pipe._host_job(0, stg, 7, ready, None, every)
            except StopIteration:
                pass
            assert got["flat"] == want, every
    finally:
        kg.host_gather_stage = orig
    eng.close()

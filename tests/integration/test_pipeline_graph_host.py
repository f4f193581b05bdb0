"""Bookkeeping of the host path's CUDA-graph mode (oasis_exec.workingset.prefetcher.Prefetcher), on CPU with a stand-in job:
which layers a capture registers, what after_replay submits, what before_replay joins. The CUDA side (external
events inside a captured step) is checked on the GPU by tests/gpu/test_exec_gpu.py."""

from concurrent.futures import ThreadPoolExecutor

import torch
from exec_cases import cfg

from oasis_exec.engine.engine import Engine


def test_after_replay_submits_the_captured_layers_and_before_replay_joins_them():
    eng = Engine(cfg("lookahead", "cpu", transfer="host"))
    pipe = eng.runner.pipe
    ran = []
    worker = ThreadPoolExecutor(max_workers=1)

    class StandInHostPath:  # transfer_host.HostPath's submit, with a job that only records what it was given
        def submit(self, layer, n, planned, end=None):
            return worker.submit(lambda: ran.append((layer, n, planned, end)))

    pipe.host_path = StandInHostPath()
    pipe.ext.planned = [f"p{l}" for l in range(pipe.store.L)]
    pipe.ext.copied = [f"c{l}" for l in range(pipe.store.L)]
    pipe.begin_capture(4)
    pipe.ext.layers[4] += [(0, 24), (1, 24)]  # what launch() registers while the step of 4 lanes is captured
    pipe.begin_capture(2)
    pipe.ext.layers[2] += [(0, 12)]
    pipe.after_replay(4)
    pipe.before_replay()
    assert ran == [(0, 24, "p0", "c0"), (1, 24, "p1", "c1")]
    assert pipe.jobs == [None] * pipe.store.L and pipe.done == [None] * pipe.store.L
    pipe.after_replay(2)
    pipe.before_replay()
    assert ran[-1] == (0, 12, "p0", "c0")
    pipe.after_replay(3)  # a key never captured: nothing to do
    pipe.before_replay()
    assert len(ran) == 3
    worker.shutdown()
    pipe.host_path = None
    eng.close()


def test_graph_mode_is_off_without_cuda():
    eng = Engine(cfg("lookahead", "cpu", transfer="host"))
    assert eng.runner.pipe.ext.graph_host is False
    assert torch.cuda.is_available() or not eng.runner.cuda_graphs.ok([0])
    eng.close()

"""The executor's slot tables obey oasis_core.mapping's per-head invariants: every plan the runner applies during a
CPU run (tiny dummy model, several lanes, admissions, many decode steps) is applied to a ``HeadMapping`` mirror too,
which must then equal the runner's ``resident`` table and pass ``HeadMapping.check``; the slots hold the host
blocks the mapping names. Run with the fixed cap and with an adaptive policy (per-row cap tensors)."""

import numpy as np
import pytest
import torch
from exec_cases import cfg, prompts

from oasis_core.mapping import HeadMapping
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Mirror:
    """A ``HeadMapping`` following the runner: lanes map to request chunks, rows (layer, lane * H + head) to the
    mapping's layer-major rows."""

    def __init__(self, runner):
        self.r, self.H, self.L = runner, runner.H, runner.L
        self.m = HeadMapping(runner.max_lanes, runner.L, runner.H, runner.cfg.top_k)
        self.chunk, self.fresh, self.was_short = {}, set(), set()
        self.caps, self.plans = [], 0
        admit, select = runner._admit, runner.pipe.select

        def on_admit(a):
            admit(a)
            if a.lane in self.chunk:
                self.m.release(a.lane)
            self.chunk[a.lane] = self.m.allocate(a.lane)
            self.fresh.add(a.lane)  # its first working set is written by the prefill, not by a plan

        def on_select(layer, pred, rows, step, cap):
            runner_rows = torch.arange(runner.store.resident.shape[1])[rows]
            mrows = self.rows(layer, runner_rows)
            lanes = {int(x) // self.H for x in runner_rows}
            # short lanes (oasis_core.short_context) keep their blocks by device-side promotion, not by plans: while
            # a lane holds no host blocks, or is crossing, and one step after, its table is taken as the runner's
            short = {lane for lane in lanes if not runner.model.ws.lane_blocks[lane] or lane in runner._crossing}
            for lane in lanes & (self.fresh | short | self.was_short):
                self.sync(lane)
            self.was_short = short
            plan = select(layer, pred, rows, step, cap)
            self.m.apply(plan, mrows)
            self.m.check()
            assert np.array_equal(self.m.table[mrows], runner.store.resident[layer][rows].numpy())
            self.caps.append(cap)
            self.plans += 1
            return plan

        runner._admit, runner.pipe.select = on_admit, on_select

    def rows(self, layer, runner_rows):
        lane, head = runner_rows // self.H, runner_rows % self.H
        start = torch.tensor([self.chunk[int(b)].start for b in lane])
        return (start + layer * self.H + head).numpy()

    def sync(self, lane):
        self.fresh.discard(lane)
        rows = torch.arange(lane * self.H, (lane + 1) * self.H)
        for layer in range(self.L):
            self.m.table[self.rows(layer, rows)] = self.r.store.resident[layer][rows].numpy()
        self.m.check()

    def check_slots(self):
        """Each occupied slot of a live lane holds the host block the mapping names (K and V)."""
        st, host = self.r.store, self.r.host
        for lane in set(self.chunk) - self.fresh:
            blocks = self.r.model.ws.lane_blocks[lane]
            if not blocks:  # a short lane: its KV lives on the GPU only (oasis_core.short_context)
                continue
            for layer in range(self.L):
                for h in range(self.H):
                    row = self.chunk[lane].start + layer * self.H + h
                    for s, b in enumerate(self.m.table[row]):
                        if b >= 0:
                            slot = (lane * self.H + h) * st.W + s
                            assert torch.equal(st.k[layer][slot], host.k[layer][blocks[b], h]), (lane, layer, h, s)
                            assert torch.equal(st.v[layer][slot], host.v[layer][blocks[b], h])


@pytest.mark.parametrize(
    "mode, policy", [("lookahead", None), ("proxy", "budget:0.02,min_cap=0,max_ratio=1"), ("retrieval", None)]
)
def test_runner_slots_keep_the_mapping_invariants(mode, policy):
    eng = Engine(
        cfg(
            mode,
            top_k=3,
            fetch_ratio=0.67,
            max_context=400,
            max_lanes=2,
            fetch_policy=policy,
            link_gb_s=1.0,
            short_context=True,
        )
    )
    mirror = Mirror(eng.runner)
    for p in prompts(6, (40, 65, 50)):  # three requests on two lanes: a lane is reused
        eng.add_request(p, SamplingParams(max_tokens=60))
    steps = 0
    while eng.has_work():
        eng.step()
        steps += 1
        if steps % 20 == 0:
            mirror.check_slots()
    mirror.check_slots()
    assert mirror.plans > 100 and len(mirror.chunk) == 2
    assert eng.runner.counters()["units_fetched"] > 0
    tensors = [c for c in mirror.caps if isinstance(c, torch.Tensor)]
    if policy is None:  # the fixed cap; rows of short lanes get 0 (a per-row tensor while a lane is short)
        ints = {c for c in mirror.caps if not isinstance(c, torch.Tensor)}
        assert ints == {eng.runner.caps.max_cap}
        assert {int(x) for t in tensors for x in t} <= {0, eng.runner.caps.max_cap}
    else:  # the budget policy's per-row caps, after the first step's fixed fallback
        assert len(tensors) > 0.9 * len(mirror.caps)
        allc = torch.cat(tensors)
        assert int(allc.min()) >= 0 and int(allc.max()) <= eng.runner.caps.max_cap
        assert len(set(allc.tolist())) > 1  # the caps vary with the rows' misses and the step time
    eng.close()

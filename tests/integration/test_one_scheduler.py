"""One scheduler for both backends (oasis_core.scheduler): its rules on a fake accounting, then the simulator and the
executor driven with the same trace, asserting the same sequence of plans (admissions, chunks, decodes, preemptions,
rejections)."""

import random
import subprocess
import sys

import pytest

from oasis_core.scheduler import REJECT_REASONS, Request, Scheduler


class TokenAccounting:
    """GPU: one unit per request (a lane); host: one unit per token held, ``staging`` ignored."""

    def __init__(self, lanes, host):
        self.lanes, self.host = lanes, host
        self.used = [0, 0]

    def need(self, r, tokens, *, staging):
        return 1, tokens

    def capacity(self):
        return self.lanes, self.host

    def resize(self, r, gpu, host):
        dg, dh = gpu - r.gpu_held, host - r.host_held
        if self.used[0] + dg > self.lanes or self.used[1] + dh > self.host:
            return False
        self.used[0] += dg
        self.used[1] += dh
        return True


def _sched(lanes=4, host=1000, chunk=64, **kw):
    ended = []
    s = Scheduler(
        accounting=TokenAccounting(lanes, host), prefill_tokens=chunk, on_end=lambda r, now: ended.append(r), **kw
    )
    return s, ended


def _drive(s, max_steps=10_000):
    plans = []
    for _ in range(max_steps):
        if not s.has_work():
            return plans
        p = s.schedule()
        plans.append(p)
        s.update(p)
    raise AssertionError("the scheduler did not drain")


def test_core_scheduler_is_stdlib_only():
    code = "import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None; import oasis_core.scheduler"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_preemption_takes_the_newest_and_it_re_prefills_prompt_plus_output():
    s, ended = _sched(lanes=3, host=100, chunk=100)
    a, b = Request(id="a", prompt_len=40, max_tokens=30), Request(id="b", prompt_len=40, max_tokens=30)
    s.add(a)
    s.add(b)
    p = s.schedule()
    assert [r.id for r in p.admitted] == ["a", "b"] and [(c.req.id, c.n) for c in p.prefill] == [("a", 40), ("b", 40)]
    s.update(p)  # both hold 41 tokens: 82 of 100
    preempted_plan = None
    for _ in range(20):
        p = s.schedule()
        if p.preempted:
            preempted_plan = p
            break
        s.update(p)
    assert [r.id for r in preempted_plan.preempted] == ["b"] and s.preemptions == 1  # the newest admitted
    # it re-prefills its prompt and every generated token but the last
    assert b.state == "waiting" and b.prefill_target == 40 + b.generated - 1 and b.prefill_done == 0
    assert s.waiting[0] is b and b.preempted == 1 and a.state == "decode"
    _drive(s)
    assert [(r.id, r.state, r.generated) for r in ended] == [("a", "completed", 30), ("b", "completed", 30)]


def test_a_request_that_is_its_own_victim_waits_for_memory():
    s, ended = _sched(lanes=2, host=60, chunk=100)
    a, b = Request(id=0, prompt_len=20, max_tokens=30), Request(id=1, prompt_len=20, max_tokens=30)
    s.add(a)
    s.add(b)
    _drive(s)
    assert sorted((r.id, r.state, r.generated) for r in ended) == [(0, "completed", 30), (1, "completed", 30)]
    assert s.preemptions >= 1 and b.preempted >= 1 and a.preempted == 0


@pytest.mark.parametrize(
    "prompt,out,reason", [(90, 20, "context_limit"), (30, 60, "host_capacity"), (85, 5, "host_capacity")]
)
def test_rejections_end_at_once_with_a_reason_and_never_block_the_queue(prompt, out, reason):
    s, ended = _sched(lanes=2, host=80, chunk=32, max_context=100)
    big = Request(id="big", prompt_len=prompt, max_tokens=out)
    small = Request(id="small", prompt_len=10, max_tokens=3)
    assert not s.add(big) and s.add(small)
    assert (big.state, big.reason) == ("rejected", reason) and s.rejections == {reason: 1}
    p = s.schedule()
    assert [(r.id, r.reason) for r in p.rejected] == [("big", reason)] and [r.id for r in p.admitted] == ["small"]
    _drive(s)
    assert [(r.id, r.state) for r in ended] == [("big", "rejected"), ("small", "completed")]


def test_gpu_capacity_rejection():
    class Staging(TokenAccounting):  # prefilling holds the prompt on the GPU too, as the simulator's sparse modes do
        def need(self, r, tokens, *, staging):
            return 1 + (tokens if staging else 0), tokens

    s = Scheduler(accounting=Staging(50, 1000), prefill_tokens=16)
    r = Request(id=0, prompt_len=60, max_tokens=2)
    assert not s.add(r) and r.reason == "gpu_capacity"


def test_no_starvation_behind_an_unadmittable_head():
    """Head-of-line blocking: a queue whose head can never fit must not stall; rejected requests free the queue."""
    s, ended = _sched(lanes=1, host=50, chunk=8)
    reqs = [Request(id=i, prompt_len=(200 if i % 3 == 0 else 10), max_tokens=4) for i in range(9)]
    for r in reqs:
        s.add(r)
    _drive(s)
    assert sorted(r.id for r in ended if r.state == "completed") == [1, 2, 4, 5, 7, 8]
    assert sorted(r.id for r in ended if r.state == "rejected") == [0, 3, 6]


def test_conservation_every_added_request_ends_exactly_once():
    rng = random.Random(7)
    s, ended = _sched(lanes=4, host=400, chunk=48, max_context=300)
    added = []
    for i in range(200):
        r = Request(id=i, prompt_len=rng.randrange(1, 260), max_tokens=rng.randrange(1, 80))
        s.add(r)
        added.append(r)
        for _ in range(rng.randrange(0, 3)):
            if s.has_work():
                p = s.schedule()
                s.update(p, stopped=[x.id for x in p.decode if rng.random() < 0.01])
        if rng.random() < 0.05:
            s.abort(rng.choice(added).id)
    _drive(s)
    assert sorted(r.id for r in ended) == list(range(200))  # each once
    assert {r.state for r in ended} <= {"completed", "rejected", "aborted"}
    assert all(r.reason in REJECT_REASONS for r in ended if r.state == "rejected")
    assert all(r.reason in ("length", "stop") for r in ended if r.state == "completed")
    assert s.preemptions > 0 and s.acct.used == [0, 0]  # preemption happened; every unit given back
    assert s.abort(0) is None


def test_budget_mixes_decodes_and_chunks_in_admission_order():
    s, _ = _sched(lanes=3, chunk=10)
    for i, n in enumerate((4, 15, 9)):
        s.add(Request(id=i, prompt_len=n, max_tokens=5))
    got = []
    for _ in range(4):
        p = s.schedule()
        got.append(([(c.req.id, c.start, c.n) for c in p.prefill], [r.id for r in p.decode]))
        s.update(p)
    assert got == [([(0, 0, 4), (1, 0, 6)], []), ([(1, 6, 9), (2, 0, 1)], [0]), ([(2, 1, 8)], [0, 1]), ([], [0, 1, 2])]
    s2, _ = _sched(lanes=3, chunk=10, decode_with_prefill=False)  # prompts first
    s2.add(Request(id=0, prompt_len=4, max_tokens=5))
    s2.add(Request(id=1, prompt_len=15, max_tokens=5))
    p = s2.schedule()
    s2.update(p)
    p = s2.schedule()
    assert p.prefill and not p.decode


def test_bad_construction_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="prefill_tokens"):
        Scheduler(accounting=TokenAccounting(1, 1), prefill_tokens=0)
    with pytest.raises(ValueError, match="max_tokens"):
        Request(id=0, prompt_len=3, max_tokens=0)


# ---- both backends, one trace ----

TRACE = [(40, 70), (56, 60), (30, 12), (210, 8), (20, 10), (64, 60)]  # (prompt, output); 210 + 8 > the host pool
LANES, HOST_BLOCKS, BS, CHUNK = 3, 13, 16, 48


def _sim_plans():
    from oasis_core.geometry import KVGeometry
    from oasis_core.specs import get_model
    from oasis_core.trace import Trace, TraceRequest
    from oasis_sim import sim
    from oasis_sim.config import SimConfig

    plans = []

    class Recording(sim.SimScheduler):
        def schedule(self, now=0.0):
            p = super().schedule(now)
            plans.append(p.describe())
            return p

    bpt = KVGeometry(get_model("tiny"), BS).bytes_per_token
    cfg = SimConfig(
        model="tiny",
        mode="lookahead",
        top_k=4,
        block_size=BS,
        max_batch=LANES,
        chunk_tokens=CHUNK,
        hbm_bytes=1e12,
        host_bytes=HOST_BLOCKS * BS * bpt,
        timeline_steps=0,
        fast_forward=0,  # a plan a step, as the executor's (a stretch takes steps without asking the scheduler)
    )
    trace = Trace(
        requests=tuple(
            TraceRequest(id=i, arrival_s=0.0, prompt_tokens=p, output_tokens=o) for i, (p, o) in enumerate(TRACE)
        )
    )
    orig = sim.SimScheduler
    sim.SimScheduler = Recording
    try:
        res = sim.simulate(cfg, trace)
    finally:
        sim.SimScheduler = orig
    return plans, res.summary


def _exec_plans():
    import torch

    from oasis_exec.config import ExecConfig
    from oasis_exec.engine.engine import Engine
    from oasis_exec.engine.scheduler import SamplingParams

    torch.set_num_threads(1)
    unit = 2 * 2 * BS * 16 * 4 * 2  # tiny: layers x KV heads x block x head_dim x float32 x (K, V)
    eng = Engine(
        ExecConfig(
            model="tiny",
            device="cpu",
            dtype="float32",
            mode="lookahead",
            top_k=4,
            block_size=BS,
            max_context=320,
            max_lanes=LANES,
            host_kv_gb=(HOST_BLOCKS + 0.5) * unit / 1e9,
            draft_vocab=64,
            prefill_chunk=CHUNK,
            short_context=True,  # the simulator's default: both backends apply the rule
            decode_chain=1,  # the simulator runs one decode step a scheduler step
        )
    )
    assert eng.runner.host_blocks_total == HOST_BLOCKS
    plans, sched = [], eng.scheduler
    orig = sched.schedule

    def schedule(now=0.0):
        p = orig(now)
        plans.append(p.describe())
        return p

    sched.schedule = schedule
    rng = random.Random(5)
    rejected, outs = [], {}
    for i, (p, o) in enumerate(TRACE):
        try:
            outs[eng.add_request([rng.randrange(1, 250) for _ in range(p)], SamplingParams(max_tokens=o))] = []
        except ValueError as e:
            rejected.append((i, str(e)))
    while eng.has_work():
        for out in eng.step():
            outs[out.request_id].extend(out.new_token_ids)
    return plans, rejected, outs, eng


def test_simulator_and_executor_make_the_same_plans():
    sim_plans, summary = _sim_plans()
    exec_plans, rejected, outs, eng = _exec_plans()
    busy = [p for p in sim_plans if any(p)]  # the simulator's loop asks once more when it has drained
    assert busy == [p for p in exec_plans if any(p)]
    preempted = [p[1] for p in busy if p[1]]
    assert preempted and busy[0][2] == ((3, "host_capacity"),)  # a preemption and a rejection happened
    assert any(len(p[3]) > 1 for p in busy) and any(p[3] and p[4] for p in busy)  # chunks of two; mixed steps
    assert [i for i, _ in rejected] == [3] and "host_capacity" in rejected[0][1]
    assert (summary["requests_completed"], summary["rejected_host_capacity"]) == (5, 1)
    assert summary["preemptions"] == len([r for p in preempted for r in p])
    # every accepted request got its whole output, preemption or not; the executor holds nothing afterwards
    assert {rid: len(t) for rid, t in outs.items()} == {i: o for i, (_, o) in enumerate(TRACE) if i != 3}
    st = eng.stats()
    assert (st.lanes_used, st.host_blocks_used, len(eng.runner.model.ws.scratch)) == (0, 0, 0)


def test_executor_preemption_keeps_greedy_output():
    """A preempted request re-prefills prompt + output[:-1] and continues: its greedy tokens are those of a run
    without preemption (dense-equivalent top-K, float32)."""
    import torch

    from oasis_exec.config import ExecConfig
    from oasis_exec.engine.engine import Engine
    from oasis_exec.engine.scheduler import SamplingParams

    torch.set_num_threads(1)
    unit = 2 * 2 * BS * 16 * 4 * 2
    rng = random.Random(9)
    prompts = [[rng.randrange(1, 250) for _ in range(n)] for n in (40, 44)]

    def run(host_blocks):
        eng = Engine(
            ExecConfig(
                model="tiny",
                device="cpu",
                dtype="float32",
                mode="retrieval",
                top_k=16,
                block_size=BS,
                max_context=320,
                max_lanes=2,
                draft_vocab=64,
                prefill_chunk=CHUNK,
                host_kv_gb=(host_blocks + 0.5) * unit / 1e9,
                short_context=False,
            )
        )  # top_k=16: every request is short, holding no host blocks
        out = eng.generate(prompts, SamplingParams(max_tokens=40))
        return out, eng.scheduler.preemptions

    roomy, n0 = run(40)
    tight, n1 = run(8)
    assert n0 == 0 and n1 >= 1 and tight == roomy

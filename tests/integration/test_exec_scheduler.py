"""The executor's side of the one scheduler is torch-free: admission by lanes, host blocks taken as a request grows,
chunked prefill with decodes mixed in, retirement. The engine forgets retired requests (bounded state), reports `stats()`, and samples per request (seed, top_p)."""

import math
import random
import subprocess
import sys

import pytest

from oasis_core.scheduler import Scheduler
from oasis_exec.engine.scheduler import EngineRequest, LaneAccounting, SamplingParams


def test_scheduler_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; import oasis_exec.engine.scheduler as s; import oasis_core.scheduler; "
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _sched(lanes, host_blocks, chunk=32, **kw):
    acct = LaneAccounting(max_lanes=lanes, host_blocks=host_blocks, block_size=16, needs_host=True)
    return Scheduler(accounting=acct, prefill_tokens=chunk, **kw), acct


def _req(i, n, max_tokens, **kw):
    return EngineRequest(id=i, prompt=list(range(n)), sampling=SamplingParams(max_tokens=max_tokens, **kw))


def test_lanes_and_host_blocks_are_taken_as_requests_grow():
    s, acct = _sched(2, 10, decode_with_prefill=False)  # prompts first
    a, b, c = _req(0, 70, 10), _req(1, 20, 12), _req(2, 60, 4)
    for r in (a, b, c):
        assert s.add(r)
    p = s.schedule()
    # a's prompt needs ceil(70/16) = 5 blocks and b's 2 (not prompt + max_tokens as a whole-request reservation
    # would); c waits for a lane.
    assert [(r.id, r.lane, r.host_blocks) for r in p.admitted] == [(0, 0, [0, 1, 2, 3, 4]), (1, 1, [5, 6])]
    assert [(ch.req.id, ch.start, ch.n, ch.last) for ch in p.prefill] == [(0, 0, 32, False)]
    s.update(p)
    p = s.schedule()
    assert [(ch.req.id, ch.start, ch.n) for ch in p.prefill] == [(0, 32, 32)]
    s.update(p)
    p = s.schedule()  # a's last 6 tokens and b's first 20 share the step's 32 prompt tokens
    assert [(ch.req.id, ch.start, ch.n, ch.last) for ch in p.prefill] == [(0, 64, 6, True), (1, 0, 20, True)]
    assert not p.decode
    s.update(p)
    assert (a.generated, b.generated, len(a.host_blocks), len(b.host_blocks)) == (1, 1, 5, 2)
    p = s.schedule()
    assert [r.id for r in p.decode] == [0, 1] and not p.prefill
    done = []
    for _ in range(9):
        done += s.update(p)
        p = s.schedule()
    # a held 70 + 10 = 80 tokens: its 5 blocks from admission on; b 20 + 10 tokens: still 2 blocks
    assert [(r.id, r.reason, r.generated) for r in done] == [(0, "length", 10)]
    assert len(b.host_blocks) == 2 and a.host_blocks == [] and a.lane == -1
    assert [r.id for r in p.admitted] == [2] and c.lane == 0


def test_decodes_ride_along_with_prefill_chunks():
    s, _ = _sched(3, 30)
    a, b = _req(0, 20, 50), _req(1, 70, 50)
    s.add(a)
    s.add(b)
    kinds = []
    for _ in range(4):
        p = s.schedule()
        kinds.append(([(c.req.id, c.start, c.n) for c in p.prefill], [r.id for r in p.decode]))
        s.update(p)
    assert kinds == [([(0, 0, 20), (1, 0, 12)], []), ([(1, 12, 32)], [0]), ([(1, 44, 26)], [0]), ([], [0, 1])]


def test_stop_and_abort_free_resources():
    s, acct = _sched(1, 4)
    a = EngineRequest(
        id=0, prompt=[1, 2, 3], sampling=SamplingParams(max_tokens=8, stop_ids=(42,)), synthetic_prefill=True
    )
    s.add(a)
    p = s.schedule()
    assert not p.prefill and p.decode == (a,) and a.prompt_len + a.generated - 1 == 2  # decodes token 3 at position 2
    (r,) = s.update(p, stopped=[0])
    assert r.finish_reason == "stop" and acct.free_lanes == [0] and len(acct.free_host) == 4
    b = _req(1, 2, 8)
    s.add(b)
    s.schedule()
    assert s.abort(1).finish_reason == "abort" and acct.free_lanes == [0] and s.abort(1) is None
    c = _req(2, 2, 8)
    s.add(c)
    assert s.abort(2).state == "aborted" and not s.has_work()  # aborted while waiting
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_bench_cli_writes_a_record(tmp_path):
    import json

    from oasis_exec.__main__ import main

    out, recording = tmp_path / "r.json", tmp_path / "rec.json"
    main(
        [
            "bench",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--mode",
            "lookahead",
            "--context",
            "300",
            "--concurrency",
            "2",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--top-k",
            "8",
            "--kv-budget-gb",
            "0.01",
            "--selection",
            "synthetic",
            "--out",
            str(out),
            "--record",
            str(recording),
            "--record-hardware",
            "h200",
        ]
    )
    rec = json.loads(out.read_text().splitlines()[-1])
    for k in (
        "mode",
        "context",
        "concurrency",
        "kv_budget_gb",
        "throughput_tok_s",
        "tpot_ms_p50",
        "tpot_ms_p99",
        "bytes_moved_per_step",
        "hidden_fraction",
        "peak_gpu_bytes",
        "peak_host_bytes",
        "selection",
        "device",
        "date",
        "commit",
    ):
        assert k in rec
    assert rec["concurrency"] == 2 and rec["steps"] == 4 and rec["selection"] == "synthetic"

    from oasis_core.recording import load_recording

    r = load_recording(recording)  # --record: the same run as a recording the simulator can replay
    assert (r.config["mode"], r.config["concurrency"], r.config["hardware"]) == ("lookahead", 2, "h200")
    assert r.config["transfer_path"] == "uva"  # the default --transfer auto runs the UVA gather
    assert r.results["tpot_ms_p50"] == pytest.approx(rec["tpot_ms_p50"])


# ---- the engine: bounded state, stats, per-request sampling ----


def _engine(mode="lookahead", **kw):
    from oasis_exec.config import ExecConfig
    from oasis_exec.engine.engine import Engine

    base = dict(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode=mode,
        top_k=4,
        max_context=320,
        max_lanes=3,
        block_size=16,
        draft_vocab=64,
        prefill_chunk=24,
        decode_chain=1,  # the engine's state after every decode step
    )
    base.update(kw)
    return Engine(ExecConfig(**base))


def _prompt(rng, n):
    return [rng.randrange(1, 250) for _ in range(n)]


def _run(eng, reqs):
    """reqs: [(prompt, SamplingParams)] -> the token list of each, by running the engine dry."""
    ids = [eng.add_request(p, sp) for p, sp in reqs]
    outs = {i: [] for i in ids}
    while eng.has_work():
        for o in eng.step():
            outs[o.request_id].extend(o.new_token_ids)
    return [outs[i] for i in ids]


@pytest.mark.parametrize("mode", ["lookahead", "dense"])
def test_engine_state_stays_bounded_over_many_requests(mode):
    """Many requests, some aborted while waiting, mid-prefill or mid-decode: nothing accumulates in the engine, the
    scheduler or the runner, and every pool is back to empty at the end."""
    import torch

    torch.set_num_threads(1)
    eng = _engine(mode)
    rng = random.Random(0)
    sizes = []
    live, ended, aborted = set(), 0, 0
    for i in range(120):
        sp = SamplingParams(max_tokens=rng.randrange(1, 6), temperature=rng.choice([0.0, 0.9]), seed=i)
        live.add(eng.add_request(_prompt(rng, rng.randrange(1, 60)), sp))
        for _ in range(rng.randrange(0, 4)):
            for o in eng.step():
                if o.finish_reason is not None:
                    live.discard(o.request_id)
                    ended += 1
        if live and rng.random() < 0.2:
            rid = rng.choice(sorted(live))
            assert eng.abort(rid)
            live.discard(rid)
            aborted += 1
        s, r = eng.scheduler, eng.runner
        sizes.append(
            (len(s.running) + len(s.waiting), len(eng._keys), len(r.model.ws.scratch), len(r.model.ws.lane_blocks))
        )
    while eng.has_work():
        for o in eng.step():
            if o.finish_reason is not None:
                live.discard(o.request_id)
                ended += 1
    assert not live and ended + aborted == 120 and aborted > 10
    s, r = eng.scheduler, eng.runner
    assert not hasattr(s, "finished")
    assert (len(s.running), len(s.waiting), len(eng._keys), len(r.model.ws.scratch)) == (0, 0, 0, 0)
    assert max(n for _, n, _, _ in sizes) <= max(n for n, _, _, _ in sizes) <= 120
    assert max(n for _, _, n, _ in sizes) <= 1 and max(n for _, _, _, n in sizes) <= eng.max_lanes
    st = eng.stats()
    assert (st.running, st.waiting, st.lanes_used, st.gpu_slots_used, st.host_blocks_used) == (0, 0, 0, 0, 0)
    assert st.lanes_free == eng.max_lanes and st.host_blocks_free == r.host_blocks_total


def test_engine_stats_while_busy():
    eng = _engine("lookahead", max_lanes=2, short_context=False)  # 40-70 tokens would all be short
    rng = random.Random(1)
    for _ in range(3):
        eng.add_request(_prompt(rng, 40), SamplingParams(max_tokens=30))
    for _ in range(12):
        eng.step()
    st = eng.stats()
    sh = eng.runner.shape
    assert (st.running, st.waiting, st.lanes_used, st.lanes_free, st.lanes_total) == (2, 1, 2, 0, 2)
    assert st.slots_per_lane == sh.n_layers * sh.n_kv_heads * 4 and st.gpu_slots_used == 2 * st.slots_per_lane
    # host blocks follow what each request holds (prompt + generated tokens), not a prompt + max_tokens reservation
    held = [-(-(r.prompt_len + r.generated) // 16) for r in eng.scheduler.running.values()]
    assert st.host_blocks_used == sum(held) < 2 * 5 and st.host_blocks_total == eng.runner.host_blocks_total
    assert st.prefetch_bytes == st.prefetch_units * eng.unit_bytes and st.prefetch_units >= 0
    assert math.isnan(st.hidden_fraction) and st.stall_s == 0.0 and isinstance(st.stage_ms, dict)  # not profiled
    assert eng.stats(read_counters=False).prefetch_units == st.prefetch_units


@pytest.mark.parametrize("mode", ["lookahead", "dense"])
def test_seeded_request_is_deterministic_whatever_the_batch(mode):
    rng = random.Random(2)
    target = _prompt(rng, 37)
    others = [_prompt(rng, n) for n in (50, 12, 70, 25)]
    sp = SamplingParams(max_tokens=12, temperature=1.0, seed=1234)
    alone = _run(_engine(mode), [(target, sp)])[0]
    # In a batch: other sampled requests before and after it, with other seeds (and one unseeded), fewer lanes.
    mix = [
        (others[0], SamplingParams(max_tokens=9, temperature=1.0, seed=1)),
        (others[1], SamplingParams(max_tokens=15, temperature=0.7)),
        (target, sp),
        (others[2], SamplingParams(max_tokens=5, temperature=1.3, seed=1234)),
        (others[3], SamplingParams(max_tokens=8)),
    ]
    assert _run(_engine(mode), mix)[2] == alone
    assert _run(_engine(mode, max_lanes=2), mix[::-1])[2] == alone  # other order, fewer lanes
    assert _run(_engine(mode), [(target, SamplingParams(max_tokens=12, temperature=1.0, seed=99))])[0] != alone
    # Unseeded requests follow the engine seed.
    un = SamplingParams(max_tokens=12, temperature=1.0)
    assert _run(_engine(mode, seed=4), [(target, un)]) == _run(_engine(mode, seed=4), [(target, un)])
    assert _run(_engine(mode, seed=4), [(target, un)]) != _run(_engine(mode, seed=5), [(target, un)])


def test_sample_top_p_and_temperature():
    import torch

    from oasis_exec.runner.sampling import sample, uniform

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    P = [SamplingParams(temperature=1.0, top_p=p) for p in (1.0, 0.5, 0.8, 0.81)]
    draws = [[uniform(7, i)] * 4 for i in range(4000)]
    got = torch.stack([sample(logits, P, d) for d in draws])  # [n, 4]
    freq = [torch.bincount(got[:, j], minlength=4).float() / len(draws) for j in range(4)]
    assert torch.allclose(freq[0], torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    assert freq[1].tolist() == [1.0, 0.0, 0.0, 0.0]  # the top token holds 0.5 >= top_p
    assert freq[2][2:].sum() == 0 and abs(freq[2][0] - 0.5 / 0.8) < 0.03  # {0, 1} hold 0.8
    assert freq[3][3] == 0 and freq[3][2] > 0.1  # 0.81 needs the third token
    greedy = sample(logits, [SamplingParams()] * 4, [0.99] * 4)
    assert greedy.tolist() == [0] * 4
    assert 0.0 <= min(uniform(k, i) for k in range(50) for i in range(50)) < 1.0


def test_top_p_reaches_the_engine():
    rng = random.Random(3)
    p = _prompt(rng, 30)
    greedy = _run(_engine("dense"), [(p, SamplingParams(max_tokens=10))])[0]
    tiny_p = _run(_engine("dense"), [(p, SamplingParams(max_tokens=10, temperature=5.0, top_p=1e-6, seed=3))])[0]
    hot = _run(_engine("dense"), [(p, SamplingParams(max_tokens=10, temperature=5.0, seed=3))])[0]
    assert tiny_p == greedy != hot  # a vanishing nucleus is the argmax; a hot full distribution is not

"""The tiny executor cases several test files share: a CPU (or CUDA) config of the dummy model, prompts, and a
greedy run that keeps every step's logits."""

import torch

from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams


def cfg(mode, device="cpu", **kw):
    base = dict(
        model="tiny",
        device=device,
        dtype="float32" if device == "cpu" else "bfloat16",
        mode=mode,
        top_k=4,
        max_context=320,
        max_lanes=3,
        block_size=16,
        draft_vocab=64,
        prefill_chunk=48,
        decode_chain=1,  # a step a token: the tests compare every step's logits (decode chains: their own tests)
        spec_chain=1,  # likewise a speculative step a call (chained speculative steps: test_exec_spec_chain.py)
    )
    base.update(kw)
    return ExecConfig(**base)


def prompts(seed=0, lens=(70, 33, 100)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 250, (n,), generator=g).tolist() for n in lens]


def run_logits(c, ps, steps, runner_hook=None):
    """Greedy generation; returns {request: [logits per produced token]} and outputs."""
    eng = Engine(c)
    if runner_hook:
        runner_hook(eng.runner)
    ids = [eng.add_request(p, SamplingParams(max_tokens=steps)) for p in ps]
    logs = {i: [] for i in ids}
    outs = {i: [] for i in ids}
    while eng.has_work():
        for o in eng.step():
            outs[o.request_id].extend(o.new_token_ids)
        for rid, lg in eng.runner.last_logits.items():
            logs[rid].append(lg.float().cpu())
    out = [outs[i] for i in ids]
    eng.close()
    return logs, out


def host_keys(run, lane: int, n_full: int, layer: int):
    """The host copy's keys of ``lane``'s first ``n_full`` blocks in ``layer``: [H, n_full * bs, D]."""
    phys = torch.tensor(run.model.ws.lane_blocks[lane][:n_full])
    keys = run.host.k[layer][phys]  # [n, H, bs, D]
    return keys.permute(1, 0, 2, 3).reshape(keys.shape[1], -1, keys.shape[-1])


def host_copy_blocks(block_score: str, steps: int = 25):
    """A lookahead engine with ``block_score`` after ``steps`` steps of two prompts (70 and 100 tokens): yields
    (store, lane, layer, n_full, keys) for each running request's layers, ``keys`` the host copy's of its
    ``n_full`` whole blocks (``host_keys``); closes the engine after."""
    from oasis_exec.engine.engine import Engine
    from oasis_exec.engine.scheduler import SamplingParams

    c = cfg("lookahead", top_k=2, fetch_ratio=0.5, block_score=block_score)
    eng = Engine(c)
    for p in prompts(lens=(70, 100)):
        eng.add_request(p, SamplingParams(max_tokens=30))
    for _ in range(steps):
        eng.step()
    run = eng.runner
    try:
        for r in eng.scheduler.running.values():
            n_full = (r.n_tokens - 1) // c.block_size
            for layer in range(run.L):
                yield run.store, r.lane, layer, n_full, host_keys(run, r.lane, n_full, layer)
    finally:
        eng.close()


def live_lanes(eng) -> dict:
    """{lane: tokens so far} of the engine's running requests (test_exec_engine._check_mapping's argument)."""
    return {r.lane: r.n_tokens for r in eng.scheduler.running.values()}


def drive(eng, ps, max_tokens, every, check):
    """Add prompts ``ps`` as requests of ``max_tokens`` each and step ``eng`` until it has no work, calling
    ``check(eng)`` every ``every`` steps (long runs that check the slots as they go). Returns the steps."""
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=max_tokens))
    steps = 0
    while eng.has_work():
        eng.step()
        steps += 1
        if steps % every == 0:
            check(eng)
    return steps


def run_synthesized(c, ps, n, sampling=None):
    """Greedy (or ``sampling``) run of prompts ``ps`` with their KV synthesized, so that every request decodes from
    the first step on and the batches are the same whatever the run's decode chain; the host pool holds the bench's
    pattern (a synthesized prefill writes no host copy). Returns (engine, outputs, the most tokens a request
    emitted in each engine step); the caller closes the engine."""
    eng = Engine(c)
    if eng.runner.host is not None:
        eng.runner.host.fill_pattern(c.seed)
    steps = []
    ids = [eng.add_request(p, sampling or SamplingParams(max_tokens=n), synthetic_prefill=True) for p in ps]
    outs = {i: [] for i in ids}
    while eng.has_work():
        got = eng.step()
        steps.append(max((len(o.new_token_ids) for o in got), default=0))
        for o in got:
            outs[o.request_id].extend(o.new_token_ids)
    return eng, [outs[i] for i in ids], steps


def oracle_chain(eng, reference, wrong=lambda position: False):
    """A stand-in for ``Drafts.chain`` that drafts the reference continuation (``reference``: request id ->
    the output of a non-speculative greedy run), so that a speculative run accepts several tokens a step; a draft
    at a position where ``wrong(position)`` holds is made wrong (a rejection there)."""

    def chain(lanes, toks, pos, k):
        by_lane = {r.lane: r for r in eng.scheduler.running.values()}
        rows = []
        for lane, p in zip(lanes.tolist(), pos.tolist()):
            r = by_lane[lane]
            seq = r.prompt + list(reference[r.id])
            row = []
            for j in range(1, k + 1):
                t = seq[p + j] if p + j < len(seq) else 0
                row.append((t + 1) % eng.runner.shape.vocab if wrong(p + j) else t)
            rows.append(row)
        return torch.tensor(rows, dtype=torch.int64, device=lanes.device)

    return chain


def layer0_kv_exact(eng, ps, outs):
    """Layer 0's KV depends on the tokens alone: the lanes' host copies, summaries and local blocks must be those of
    prompt + output (but the last token, whose KV the next step would write)."""
    r = eng.runner
    st, bs, dec = r.store, r.bs, r.dec
    for lane, (p, o) in enumerate(zip(ps, outs)):
        seq = p + o[:-1]
        T = len(seq)
        _, k, v = dec.qkv(0, dec.embed[torch.tensor(seq)], torch.arange(T))  # [T, H, D]
        nf = T // bs
        hb = r.model.ws.lane_blocks[lane]
        for b in range(nf):
            torch.testing.assert_close(r.host.k[0][hb[b]], k[b * bs : (b + 1) * bs].transpose(0, 1))
            torch.testing.assert_close(r.host.v[0][hb[b]], v[b * bs : (b + 1) * bs].transpose(0, 1))
        nb = -(-T // bs)
        for b in range(nb):
            kb = k[b * bs : min(T, (b + 1) * bs)]
            torch.testing.assert_close(st.kmin[0, lane][:, b], kb.amin(0))
            torch.testing.assert_close(st.kmax[0, lane][:, b], kb.amax(0))
        assert torch.isinf(st.kmin[0, lane][:, nb:]).all()  # nothing summarised past the context
        m = T % bs
        slot = st.slot_base(torch.tensor([lane]))[0] + st.LOCAL
        torch.testing.assert_close(st.k[0][slot][:, :m], k[nf * bs : T].transpose(0, 1))
        torch.testing.assert_close(st.v[0][slot][:, :m], v[nf * bs : T].transpose(0, 1))


def run_state(c, ps, steps, runner_hook=None):
    """Greedy run of prompts ``ps``; returns (each engine step's (request, tokens), the slot tables ``resident`` and
    ``last_sel`` cloned where the store has them (a sparse working set), units fetched from the host), for
    comparing two runs that must choose the same blocks (``assert_same_run``)."""
    eng = Engine(c)
    if runner_hook:
        runner_hook(eng.runner)
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=steps))
    toks = []
    while eng.has_work():
        toks += [(o.request_id, o.new_token_ids) for o in eng.step()]
    if torch.cuda.is_available() and c.device == "cuda":
        torch.cuda.synchronize()
    st = eng.runner.store
    held = [t.clone() for t in (getattr(st, "resident", None), getattr(st, "last_sel", None)) if t is not None]
    out = (toks, held, eng.runner.counters()["units_fetched"])
    eng.close()
    return out


def assert_same_run(got, ref):
    """Two ``run_state`` results: the same tokens, slot tables and fetches."""
    assert got[0] == ref[0]
    assert len(got[1]) == len(ref[1])
    assert all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))
    assert got[2] == ref[2]


def slots_hold_their_blocks(eng) -> int:
    """Every resident (layer, row, slot) holds the host pool's copy of its block (an fp8 pool: dequantized,
    ``HostPool.read``); returns how many were checked. Holds after a real prefill: a synthesized one
    (``Admit.synthetic_prefill``) fills the first working set's slots with random values, not the host's."""
    if eng.runner.device.type == "cuda":
        torch.cuda.synchronize()
    r = eng.runner
    st = r.store
    checked = 0
    for lane, req in [(q.lane, q) for q in eng.scheduler.running.values()]:
        blocks = r.model.ws.lane_blocks[lane]
        for l in range(r.L):
            for h in range(r.H):
                row = lane * r.H + h
                for s, b in enumerate(st.resident[l, row].tolist()):
                    if b >= 0:
                        assert b < req.n_tokens // r.bs
                        if r.host.quantized:
                            hk, hv = (t[0] for t in r.host.read(l, torch.tensor([blocks[b]]), torch.tensor([h])))
                        else:
                            hk, hv = r.host.k[l][blocks[b], h], r.host.v[l][blocks[b], h]
                        assert torch.equal(st.k[l][row * st.W + s].cpu(), hk), (l, row, s, b)
                        assert torch.equal(st.v[l][row * st.W + s].cpu(), hv)
                        checked += 1
    return checked


def chains_of(eng, ps, chain, n, max_tokens=40) -> int:
    """Prompts ``ps`` admitted with a real prefill, then engine steps until ``n`` of them emitted a whole chain of
    ``chain`` tokens (at most 200 steps); returns how many did."""
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=max_tokens))
    done = 0
    for _ in range(200):
        if done == n or not eng.has_work():
            break
        done += max((len(o.new_token_ids) for o in eng.step()), default=0) == chain
    return done

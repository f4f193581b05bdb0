"""Prefill/decode split with remote partial fetching (RPF), for real: two processes over ``torch.distributed``.

Rank 0 is the prefill node: an engine that prefills the prompt for real and holds its full KV in its host pool.
Rank 1 is the decode node: an engine whose host pool starts filled with NaN, so that reading any unit that never
arrived would poison the output. At hand-off the prefill node sends (``handoff="rpf"``):

- the first decode step's predicted blocks: per layer the union over the KV heads of the top-K the last prompt
  token's query chose (``oasis_core.rpf.RemoteLedger.handoff`` at block granularity), K and V for every head;
- the per-head maps of that first working set (which slot holds which block: ``resident`` / ``last_sel``);
- the min/max key summaries of every full block; the newest (partial, local) block; the request's metadata and the
  draft state: the first sampled token, the draft head's token and its probability (``ExecConfig.draft_gate``; this
  draft head attends only its own position, so it has no KV state of its own: ``oasis_exec.model.draft``).

Every later miss is fetched from the prefill node's pool as the decode node's prefetch pipeline plans it (each
layer's capped plan, ``Prefetcher``): the decode node's ``RemoteLedger`` names the planned units not yet received,
which are asked for and received before the layer's host-to-slot copy; a unit crosses at most once (the ledger
raises ``RPFError`` otherwise) and never more than the cap a row and step. ``handoff="full"`` sends every full
block at hand-off instead (the baseline), so nothing is fetched later.

On one host the "network" is gloo's send/recv over loopback TCP (``Wire``); ``measure_link`` times it by ping-pong
(latency and rate), the figures the simulator's NIC model is given (``SimConfig.nic_bytes_per_s``). ``split_run``
returns one record: bytes by kind (hand-off and per decode token), the ledger's counters, TTFT and the decode
node's host KV bytes, and the decode node's tokens (the prefill node's first token first).

One request at a time, on the CPU (the remote fetch hooks the inline transfer path; the GPU paths are not hooked
yet); a sparse background mode (lookahead, proxy) with a fixed fetch
cap and ``short_context`` off (a short request would keep its KV on the GPU and hand nothing off).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import numpy as np
import torch

from oasis_core.block_scorers import DEFAULT_SCORER, TOKENS
from oasis_core.rpf import RemoteLedger

from ..config import replace_config
from ..engine.engine import Engine
from ..engine.scheduler import SamplingParams

PREFILL, DECODE = 0, 1
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool)
_HEAD = 8  # int64 header of a message: dtype index, ndim, up to 6 sizes


class Wire:
    """Tensors to and from ``peer`` (gloo send/recv), with the payload bytes counted by kind and the seconds spent
    sending or receiving."""

    def __init__(self, peer: int):
        self.peer = peer
        self.bytes = Counter()
        self.seconds = 0.0
        self.messages = 0

    def send(self, t, kind: str) -> None:
        t = t.contiguous().cpu()
        h = torch.zeros(_HEAD, dtype=torch.int64)
        h[0], h[1] = _DTYPES.index(t.dtype), t.dim()
        h[2 : 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        t0 = time.perf_counter()
        torch.distributed.send(h, self.peer)
        if t.numel():
            torch.distributed.send(t.view(torch.uint8) if t.dtype == torch.bool else t, self.peer)
        self.seconds += time.perf_counter() - t0
        self.bytes[kind] += t.numel() * t.element_size()
        self.messages += 1

    def recv(self, kind: str):
        t0 = time.perf_counter()
        h = torch.zeros(_HEAD, dtype=torch.int64)
        torch.distributed.recv(h, self.peer)
        dtype, nd = _DTYPES[int(h[0])], int(h[1])
        t = torch.empty(tuple(int(x) for x in h[2 : 2 + nd]), dtype=dtype)
        if t.numel():
            torch.distributed.recv(t.view(torch.uint8) if dtype == torch.bool else t, self.peer)
        self.seconds += time.perf_counter() - t0
        self.bytes[kind] += t.numel() * t.element_size()
        self.messages += 1
        return t


def measure_link(wire: Wire, rank: int, sizes=(8, 1 << 20, 1 << 24, 1 << 26), reps: int = 10) -> dict | None:
    """Ping-pong between the two ranks: the decode node asks, the prefill node answers with ``n`` bytes. Returns (on
    the decode node) ``{"latency_s", "bytes_per_s", "rtt_s": {n: best round trip}}``: the latency is half the
    smallest message's round trip, the rate ``n / (rtt(n) - rtt(smallest))`` of the largest; None on the other
    rank."""
    best = {}
    for n in sizes:
        buf = torch.zeros(n, dtype=torch.uint8)
        for _ in range(reps):
            if rank == PREFILL:
                wire.recv("probe")
                wire.send(buf, "probe")
                continue
            t0 = time.perf_counter()
            wire.send(torch.zeros(1, dtype=torch.int64), "probe")
            wire.recv("probe")
            best[n] = min(best.get(n, float("inf")), time.perf_counter() - t0)
    if rank == PREFILL:
        return None
    small, big = min(sizes), max(sizes)
    return {
        "latency_s": best[small] / 2,
        "bytes_per_s": (big - small) / max(best[big] - best[small], 1e-9),
        "rtt_s": {str(n): best[n] for n in sizes},
    }


def split_config(cfg):
    """The configuration a split run runs, ``cfg`` checked: tokens that ``block_score=auto`` chose becomes the
    two-vector default (below), and prompt lookup given (``draft_ngram`` > 0) is turned off: the hand-off sends no
    token ids, so the decode node has no lookup to draft from. ValueError for what the split cannot run."""
    if not (cfg.sparse and cfg.mode_spec.background) or cfg.short_context or cfg.fetch_policy is not None:
        raise ValueError("rpf_split: a background sparse mode, short_context off and a fixed fetch cap")
    if cfg.device != "cpu":  # the remote fetch hooks the inline transfer; the CUDA paths (UVA, host) are not hooked
        raise ValueError("rpf_split: the CPU only (device=cpu): the GPU transfer paths have no remote-fetch hook yet")

    # the hand-off sends kmin / kmax; the per-token channels are not sent yet: tokens given is refused, tokens that
    # block_score=auto chose becomes the two-vector default
    cfg = without_tokens(cfg, "rpf_split: block_score=tokens hands off no per-token summaries yet")
    return replace_config(cfg, draft_ngram=0) if cfg.draft_ngram else cfg


def _prefill_node(cfg, prompt, n_out, handoff, wire) -> dict:
    eng = Engine(cfg)
    run, st, host = eng.runner, eng.runner.store, eng.runner.host
    L, H, K, bs = run.L, run.H, run.cfg.top_k, run.bs
    rid = eng.add_request(prompt, SamplingParams(max_tokens=n_out))
    t_start = time.monotonic()  # one clock for both processes (CLOCK_MONOTONIC is system-wide)
    t0 = time.perf_counter()
    running = eng.scheduler.running
    while rid not in running or not running[rid].output:
        eng.step()
    prefill_s = time.perf_counter() - t0
    r = eng.scheduler.running[rid]
    lane, n_tok = r.lane, len(prompt)
    n_full = n_tok // bs
    phys = torch.tensor(run.model.ws.lane_blocks[lane][:n_full])
    rows = slice(lane * H, (lane + 1) * H)
    resident, last_sel = st.resident[:, rows].cpu(), st.last_sel[:, rows].cpu()
    mask, _ = _handoff_mask(resident, handoff, L, H, K, n_full, host.unit_bytes)
    li, hi, bi = (torch.from_numpy(x) for x in np.nonzero(mask))
    t1 = time.perf_counter()
    handoff_start = time.monotonic()
    # the draft's probability travels with it, as its float32 bits (ExecConfig.draft_gate: else the decode node would
    # gate on its 1.0)
    conf = torch.ones(1) if run.drafts.conf is None else run.drafts.conf[lane : lane + 1].float().cpu()
    meta = torch.tensor([n_tok, r.output[0], int(run.drafts.tok[lane]), int(conf.view(torch.int32)[0])])
    base = st.slot_base(torch.tensor([lane], device=st.host_table.device))[0].cpu()
    wire.send(meta, "meta+draft")  # five messages: the hand-off is one flow, as the simulator's NIC sees it
    wire.send(torch.stack([resident, last_sel]), "tables")
    wire.send(torch.stack([st.kmin[:, lane, :, :n_full], st.kmax[:, lane, :, :n_full]]), "summaries")
    wire.send(torch.stack([torch.stack([x[l][base + st.LOCAL] for l in range(L)]) for x in (st.k, st.v)]), "local")
    # the predicted units (K and V of every head of a block in a layer's union), in (layer, head, block) order
    wire.send(
        torch.stack([torch.cat([x[l][phys[bi[li == l]], hi[li == l]] for l in range(L)]) for x in (host.k, host.v)]),
        "blocks",
    )
    handoff_send_s = time.perf_counter() - t1
    served, twice = 0, 0
    crossed = torch.from_numpy(mask)  # this node's own count of what crossed: the at-most-once check of the record
    while True:  # remote misses until the decode node is done: [n, 3] (layer, head, block) -> K, V [n, bs, D]
        req = wire.recv("requests")
        if req.shape[0] == 0:
            break
        l = int(req[0, 0])
        wire.send(torch.stack([x[l][phys[req[:, 2]], req[:, 1]] for x in (host.k, host.v)]), "remote")
        twice += int(crossed[l, req[:, 1], req[:, 2]].sum())
        crossed[l, req[:, 1], req[:, 2]] = True
        served += req.shape[0]
    eng.close()
    return {
        "prefill_s": prefill_s,
        "handoff_send_s": handoff_send_s,
        "units_served": served,
        "units_crossed_twice": twice,  # counted by the prefill node over hand-off and remote fetches: must be 0
        "t_start": t_start,
        "t_handoff_start": handoff_start,
    }


def _handoff_mask(resident, handoff, L, H, K, n_full, unit_bytes):
    """bool [L, H, n_full]: the units the hand-off carries (``RemoteLedger.handoff`` of the first working set at
    block granularity, or every full block)."""
    led = RemoteLedger(L, H, max(n_full, 1), unit_bytes)
    pred = resident[:, :, :K].numpy() if handoff == "rpf" else np.broadcast_to(np.arange(n_full), (L, H, n_full))
    led.handoff(pred, "block", local_blocks=0)
    return led.sent[:, :, :n_full].copy(), led


def _decode_node(cfg, n_out, handoff, wire, poison) -> dict:
    eng = Engine(cfg)
    run, st, host, pipe = eng.runner, eng.runner.store, eng.runner.host, eng.runner.pipe
    L, H, K, bs = run.L, run.H, run.cfg.top_k, run.bs
    if poison:  # a unit read before it arrived turns the output into NaN
        for t in host.k + host.v:
            t.fill_(float("nan"))
    t0 = time.perf_counter()
    c0 = time.process_time()
    meta = wire.recv("meta+draft")  # waits through the prefill (wait_cpu_s: whether the wait took a core)
    wait_cpu_s = time.process_time() - c0
    n_tok, first, draft_tok = (int(x) for x in meta[:3])
    draft_conf = meta[3:].to(torch.int32).view(torch.float32)  # [1]: the bits the prefill node sent
    n_full = n_tok // bs
    tables = wire.recv("tables")
    kmin, kmax = wire.recv("summaries")
    lk, lv = wire.recv("local")
    mask, ledger = _handoff_mask(tables[0], handoff, L, H, K, n_full, host.unit_bytes)
    li, hi, bi = (torch.from_numpy(x) for x in np.nonzero(mask))
    kv = wire.recv("blocks")
    recv_s = time.perf_counter() - t0
    t_received = time.monotonic()
    state = {"phys": None, "remote_units": 0, "fetches": 0, "max_row": 0, "t_installed": None}
    dev = st.host_table.device

    def install(a) -> None:  # replaces the synthesized prefill of the admission: what the hand-off carried
        phys = torch.tensor(a.host_blocks[:n_full], dtype=torch.int64)
        state["phys"] = phys
        rows = slice(a.lane * H, (a.lane + 1) * H)
        base = st.slot_base(torch.tensor([a.lane], device=dev))[0].cpu()
        st.resident[:, rows] = tables[0].to(dev)
        st.last_sel[:, rows] = tables[1].to(dev)
        st.kmin[:, a.lane, :, :n_full] = kmin.to(dev)
        st.kmax[:, a.lane, :, :n_full] = kmax.to(dev)
        for l in range(L):
            sel = li == l
            host.k[l][phys[bi[sel]], hi[sel]], host.v[l][phys[bi[sel]], hi[sel]] = kv[0][sel], kv[1][sel]
            res = tables[0][l]  # [H, S]: the first working set's blocks, slot by slot
            h, j = torch.nonzero(res >= 0, as_tuple=True)
            st.k[l][(base[h] + j).to(dev)] = host.k[l][phys[res[h, j]], h].to(dev)
            st.v[l][(base[h] + j).to(dev)] = host.v[l][phys[res[h, j]], h].to(dev)
            st.k[l][(base + st.LOCAL).to(dev)] = lk[l].to(dev)
            st.v[l][(base + st.LOCAL).to(dev)] = lv[l].to(dev)
        run.drafts.tok[a.lane] = draft_tok
        if run.drafts.conf is not None:
            run.drafts.conf[a.lane] = draft_conf[0].to(run.drafts.conf.device)
        state["t_installed"] = time.monotonic()

    run.model.synthesize = install
    local_copy = pipe._transfer_inline
    cap = pipe.caps.fixed

    def fetch_remote_then_copy(layer, plan, lanes) -> None:  # the prefetch pipeline's transfer of one layer
        fb = plan.fetch_block.cpu().numpy().reshape(H, -1)
        need = np.full((L, H, fb.shape[1]), -1, dtype=np.int64)
        need[layer] = fb
        got = ledger.request(need, cap=cap)  # the at-most-once gate (raises RPFError on a second crossing)
        state["max_row"] = max(state["max_row"], int(got.n_fetch.max()))
        h, c = np.nonzero(got.blocks[layer] >= 0)
        if len(h):
            b = got.blocks[layer][h, c]
            ids = torch.from_numpy(np.stack([np.full_like(h, layer), h, b], 1))
            wire.send(ids, "requests")
            k, v = wire.recv("remote")
            phys = state["phys"][torch.from_numpy(b)]
            host.k[layer][phys, torch.from_numpy(h)] = k
            host.v[layer][phys, torch.from_numpy(h)] = v
            state["remote_units"] += len(h)
            state["fetches"] += 1
        local_copy(layer, plan, lanes)

    pipe._transfer_inline = fetch_remote_then_copy
    # the prompt's ids are not needed (nothing is recomputed): the request holds the prompt's length, then the first
    # token, which the first decode step reads at position n_tok
    eng.add_request([0] * n_tok + [first], SamplingParams(max_tokens=n_out - 1), synthetic_prefill=True)
    tokens = [first]
    per_step = []
    t1 = time.perf_counter()
    while eng.has_work():
        before = state["remote_units"]
        for o in eng.step():
            tokens.extend(o.new_token_ids)
        per_step.append(state["remote_units"] - before)
    decode_s = time.perf_counter() - t1
    wire.send(torch.zeros(0, 3, dtype=torch.int64), "requests")  # done
    ledger.check()
    ctx_blocks = (n_tok + n_out - 1) // bs  # full blocks once the last token is in
    eng.close()
    return {
        "tokens": tokens,
        "n_full": n_full,
        "handoff_units": int(mask.sum()),
        "remote_units": state["remote_units"],
        "ledger_units_sent": int(ledger.sent.sum()),
        "ledger_units_selected": int(ledger.selected.sum()),
        "remote_units_per_step": per_step,
        "remote_fetch_messages": state["fetches"],
        "max_remote_units_per_row_step": state["max_row"],
        "cap_units_per_row_step": int(cap),
        "wait_cpu_s": wait_cpu_s,
        "handoff_recv_s": recv_s,  # from the start: it includes the wait for the prefill
        "t_received": t_received,
        "t_installed": state["t_installed"],
        "decode_s": decode_s,
        "unit_bytes": host.unit_bytes,
        "decode_host_kv_bytes": (int(ledger.sent.sum()) + L * H * (ctx_blocks - n_full)) * host.unit_bytes,
        "decode_host_kv_bytes_at_handoff": int(mask.sum()) * host.unit_bytes,
        "full_kv_bytes": L * H * n_full * host.unit_bytes,
    }


def _node(cfg, prompt, n_out, handoff, poison, probe) -> dict:
    rank = torch.distributed.get_rank()
    wire = Wire(DECODE if rank == PREFILL else PREFILL)
    torch.distributed.barrier()
    if rank == PREFILL:
        out = _prefill_node(cfg, prompt, n_out, handoff, wire)
    else:
        out = _decode_node(cfg, n_out, handoff, wire, poison)
    out["wire_bytes"] = dict(wire.bytes)
    out["wire_s"] = wire.seconds
    if probe:  # after the run, both nodes idle: the link the simulator's NIC is given
        out["link"] = measure_link(wire, rank)
    return out


def split_run(cfg, prompt, n_out: int, handoff: str = "rpf", poison: bool = True, probe: bool = True) -> dict:
    """Prefill ``prompt`` on one process, hand off (``handoff``: "rpf" | "full") and decode ``n_out`` tokens (the
    first one sampled by the prefill node) on another; two processes spawned here over gloo (NCCL is not used: the
    wire is host memory either way). ``poison``: the decode node's host pool starts as NaN; ``probe``: the link is
    measured after the run (``measure_link``). Returns ``{"prefill": rank 0's record, "decode": rank 1's,
    "handoff_s": the hand-off's wire time, "ttft_s": from the prefill's start until the decode node holds the
    hand-off}`` (both nodes read the system-wide monotonic clock)."""
    from ..model import tensor_parallel

    if handoff not in ("rpf", "full"):
        raise ValueError(f"handoff: must be rpf or full, got {handoff!r}")
    cfg = split_config(cfg)
    cfg = dataclasses.replace(cfg, max_lanes=1, host_requests=1, decode_chain=1)  # per-step remote units
    p, d = tensor_parallel.launch(_node, 2, cfg, list(prompt), n_out, handoff, poison, probe, every_rank=True)
    return {
        "prefill": p,
        "decode": d,
        "handoff_s": d["t_received"] - p["t_handoff_start"],  # the wire's part of the hand-off
        "ttft_s": d["t_installed"] - p["t_start"],  # prefill + hand-off + installing it: the first token streams
    }


def without_tokens(cfg, why: str):
    """``cfg`` with ``tokens`` replaced by ``DEFAULT_SCORER`` where ``auto`` chose it (a tool that cannot run it:
    ``rpf_split``'s hand-off sends no per-token channels); ValueError naming ``why`` where ``tokens`` was given."""
    if cfg.block_score != TOKENS:
        return cfg
    if cfg.block_score_auto is None:
        raise ValueError(f"{why}; use another block_score")
    new = replace_config(cfg, block_score=DEFAULT_SCORER, token_basis=None, token_rank=0)
    object.__setattr__(new, "block_score_auto", f"auto: {why}")
    return new

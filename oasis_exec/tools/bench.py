"""Closed-loop decode benchmark at fixed concurrency (the paper's Fig. 11 setup).

N requests with a ``context``-token prompt each are admitted together; their prefill is synthesized (KV filled
with random values, see ``runner``), then every request decodes ``warmup + steps + 1`` tokens in lockstep. The
``steps`` steps after the warm-up are timed on the host around the step (which ends with the sampled tokens
reaching the host); the last step, in which every request finishes and its lane is released, is not timed (steady
decode, as vLLM's decode-only figures; records before this rule timed it as their last step).
With ``speculative_k > 0`` every request holds ``(warmup + steps + 1) * (k + 1)`` output
tokens, ``throughput_tok_s`` counts the tokens the timed steps emitted, ``accepted_tokens_per_step`` is their mean per
request and step (accepted drafts plus the target's token; 1.0 without speculation), ``accepted_hist`` their
acceptance, ``{"k": [lanes that accepted 0 .. k drafts]}`` per draft length ``k`` (``speculative_k auto`` drafts
several lengths; null without speculation), and the requests still running
after the timed steps are aborted. One JSON record per run; fields are listed in ``RECORD_FIELDS``. ``concurrency`` is the requests that ran:
``requested_concurrency`` bounded by the GPU lanes and the host pool, ``clipped_by`` naming the bound that took
requests away (``gpu_lanes`` | ``host_pool``; null when none did). With ``--profile`` (eager) the record also holds
``layer_events``: ``[[step, layer, stage, start_ms, end_ms], ...]`` of up to ``LAYER_EVENT_STEPS`` sampled timed
steps, ms since the first timed step began (stage ``layers`` on the main stream, ``stall``, and ``pred``,
``select``, ``transfer`` on the side streams; CUDA events on a GPU, as in the profiled H200 runs of
experiments/real_model_step_cost/README.md, ``time.perf_counter`` on the CPU, where the stages run inline, one after the other).
"""

from __future__ import annotations

import datetime
import gc
import json
import logging
import os
import platform
import resource
import statistics
import time

import torch

from oasis_core import provenance, speculation

from ..capture import freeze_startup_objects
from ..config import ExecConfig, replace_config
from ..engine.engine import Engine
from ..engine.scheduler import SamplingParams
from ..model import tensor_parallel as tp
from ..runner.runner import Runner

log = logging.getLogger(__name__)

RECORD_FIELDS = (
    "mode",
    "context",
    "requested_concurrency",
    "concurrency",
    "clipped_by",
    "kv_budget_gb",
    "throughput_tok_s",
    "speculative_k",
    "accepted_tokens_per_step",
    "accepted_hist",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "layer_ms",
    "stage_ms_per_step",
    "bytes_moved_per_step",
    "transfer_gb_s",
    "hidden_fraction",
    "peak_gpu_bytes",
    "peak_host_bytes",
    "host_pool_bytes",
    "host_kv_dtype",
    "selection",
    "device",
    "date",
    "commit",
)


LAYER_EVENT_STEPS = 4  # timed steps whose per-layer stage timestamps a --profile run keeps (record "layer_events")


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def accepted_hist(counts, before=None) -> dict:
    """The timed steps' acceptance: ``{"k": [lanes that accepted 0, 1, .., k drafts]}`` per draft length ``k >= 1``
    of a speculative step (``Runner.spec_accepts``: (drafts, accepted) -> lanes; ``before``: the counts at the first
    timed step). A recording carries it as ``results.accepted_hist``, the simulator's acceptance distribution."""
    before = before or {}
    out = {}
    for (k, n), c in sorted(counts.items()):
        c -= before.get((k, n), 0)
        if k >= 1 and c > 0:
            out.setdefault(str(k), [0] * (k + 1))[n] += c
    return out


def layer_event_steps(steps: int, most: int = LAYER_EVENT_STEPS) -> list:
    """Timed-step indices whose per-layer stage times ``--profile`` keeps: at most ``most``, evenly spaced."""
    if steps <= most:
        return list(range(steps))
    return sorted({round(j * (steps - 1) / (most - 1)) for j in range(most)})


def real_prompts(tokens, context: int, n: int) -> list:
    """``n`` prompts of ``context`` tokens cut from the token stream ``tokens`` (real text) at evenly spaced
    offsets, wrapping around: each request reads different text."""
    if not len(tokens):
        raise ValueError("real_prompts: no tokens")
    reps = -(-(context + len(tokens)) // len(tokens))
    stream = list(tokens) * reps
    step = max(1, len(tokens) // max(n, 1))
    return [stream[(i * step) % len(tokens) : (i * step) % len(tokens) + context] for i in range(n)]


def bench_requests(eng, context: int, concurrency: int, steps: int, warmup: int) -> tuple:
    """(n, clipped_by): the requests the bench runs on ``eng``, ``concurrency`` bounded by the GPU lanes and, in
    sparse modes, by the host pool's blocks; ``clipped_by`` names the bound that took requests away (``"gpu_lanes"``,
    ``"host_pool"``), else None. Raises ``ValueError`` if not one request fits."""
    n, clipped_by = concurrency, None
    if eng.max_lanes < n:
        n, clipped_by = eng.max_lanes, "gpu_lanes"
    if eng.cfg.sparse:
        out_tokens = (warmup + steps + 1) * eng.cfg.step_tokens_max  # BenchConfig.output_tokens
        per_req = -(-(context + out_tokens) // eng.cfg.block_size)
        if eng.runner.host_blocks_total // per_req < n:
            n, clipped_by = eng.runner.host_blocks_total // per_req, "host_pool"
    if n < 1:
        raise ValueError(f"no request fits: lanes {eng.max_lanes}, host blocks {eng.runner.host_blocks_total}")
    return n, clipped_by


CLIP_REASONS = {
    "gpu_lanes": "lanes the GPU KV store holds (--kv-budget-gb, --max-lanes; without either: 4)",
    "host_pool": "requests the host pool holds (--host-kv-gb)",
}


def build_bench_engine(
    cfg: ExecConfig,
    context: int,
    concurrency: int,
    steps: int,
    warmup: int = 5,
    host_fill: bool = True,
    prompt_tokens=None,
    output_tokens: int | None = None,
    decoder=None,
) -> tuple:
    """The benchmark's engine: built, its host pool filled (``host_fill``), and ``n`` requests of ``context``
    tokens (synthesized prefill, ``warmup + steps + 1`` output tokens each: none finishes in a timed step) queued;
    they are admitted by the first step. ``n`` is ``concurrency`` bounded by the lanes and, in sparse modes, the
    host blocks (``bench_requests``; a clipped run logs a warning). Unless ``cfg`` says otherwise (``host_kv_gb``,
    ``host_requests``) the host pool is sized for ``concurrency`` requests, not for every lane
    (``oasis_exec.kv.host_memory``). With ``prompt_tokens`` (a real text's token ids) the prompts are cut from that
    text and prefilled for real (``run_bench`` runs every prefill before the warm-up), so that ``selection=model``
    on real weights selects from real keys. ``output_tokens``: each request's, instead of the bench's (several
    measurements over one prefill, ``run_bench_phases``). ``decoder``: the model's weights, already loaded (a
    study of many runs loads them once). Returns (engine, n)."""
    if prompt_tokens is not None:
        # every prompt prefilled before any request decodes: interleaved decode steps would let the first requests
        # finish (or run ahead) before the timed steps, which must see all n decoding together
        cfg = replace_config(cfg, prefill_interleave=False)
    if cfg.host_requests is None:
        cfg = replace_config(cfg, host_requests=concurrency)
    eng = Engine(cfg, Runner(cfg, decoder=decoder) if decoder is not None else None)
    runner = eng.runner
    n, clipped_by = bench_requests(eng, context, concurrency, steps, warmup)
    if clipped_by:
        log.warning("bench: concurrency %d clipped to %d: the %s", concurrency, n, CLIP_REASONS[clipped_by])
    if runner.host is not None and context > 0 and host_fill and prompt_tokens is None:
        runner.host.fill_pattern(cfg.seed)
    out_tokens = output_tokens or (warmup + steps + 1) * cfg.step_tokens_max  # BenchConfig.output_tokens
    sp = SamplingParams(max_tokens=out_tokens + (prompt_tokens is not None))
    vocab = runner.shape.vocab
    if prompt_tokens is not None:
        top = max(prompt_tokens, default=-1)
        if top >= vocab:  # ids made for another model's vocabulary
            eng.close()
            raise ValueError(
                f"prompt token ids go up to {top}: the model's vocabulary is {vocab} (ids made for another model?)"
            )
        for p in real_prompts(prompt_tokens, context, n):
            eng.add_request(p, sp)
        return eng, n
    for i in range(n):
        eng.add_request([(7 * i + j) % (vocab - 1) + 1 for j in range(context)], sp, synthetic_prefill=True)
    return eng, n


def _prefill_all(eng, n: int) -> float:
    """Step until every request is admitted and decoding (real prefill); returns the seconds it took. Raises if any
    request has finished or decoded ahead of the others by then (the timed steps need all ``n`` in lockstep)."""
    t0 = time.perf_counter()
    sch = eng.scheduler
    while sch.waiting or any(r.state != "decode" for r in sch.running.values()):
        eng.step()
    outs = [len(r.output) for r in sch.running.values()]
    if len(outs) != n or max(outs) != 1:
        raise RuntimeError(
            f"bench: after the prefill {len(outs)} of {n} requests decode, with {min(outs, default=0)}"
            f"..{max(outs, default=0)} tokens each (expected all {n} with 1)"
        )
    return time.perf_counter() - t0


def run_bench(
    cfg: ExecConfig,
    context: int,
    concurrency: int,
    steps: int,
    warmup: int = 5,
    host_fill: bool = True,
    prompt_tokens=None,
    prompt_name: str | None = None,
    decoder=None,
) -> dict:
    return _bench(cfg, context, concurrency, steps, warmup, host_fill, prompt_tokens, prompt_name, decoder)[0]


def _bench(cfg, context, concurrency, steps, warmup, host_fill, prompt_tokens, prompt_name, decoder, phases=None):
    """Build, prefill, then one ``measure`` (``phases`` None) or one a ``speculative_k`` of ``phases``."""
    out_tokens = None if phases is None else sum((warmup + steps) * (k + 1) for k in _phase_ks(cfg, phases)) + 1
    t_build = time.perf_counter()
    eng, n = build_bench_engine(
        cfg, context, concurrency, steps, warmup, host_fill, prompt_tokens, out_tokens, decoder=decoder
    )
    clipped_by = bench_requests(eng, context, concurrency, steps, warmup)[1]
    build_s = time.perf_counter() - t_build
    prefill_s = _prefill_all(eng, n) if prompt_tokens is not None else 0.0
    run = dict(clipped_by=clipped_by, context=context, host_fill=host_fill, prompt_tokens=prompt_tokens,
               prompt_name=prompt_name, prefill_s=prefill_s, build_s=build_s, concurrency=concurrency)  # fmt: skip
    recs = []
    for i, p in enumerate([None] if phases is None else phases):
        if p is None:
            recs.append(measure(eng, n, steps, warmup, **run))
            continue
        eng.runner.set_speculative_k(p)
        recs.append(dict(measure(eng, n, steps, warmup, **run), phase=i, phases=list(phases), prefill_shared=True))
    _finish(eng)
    return recs


def _phase_ks(cfg, phases) -> list:
    ks = [speculation.parse_spec(p, cfg.block_size)[0] for p in phases]
    if max(ks) != cfg.spec_max_k:
        raise ValueError(f"run_bench_phases: cfg.speculative_k must be the phases' longest ({max(ks)})")
    return ks


def _finish(eng) -> None:
    """End the bench's requests (a speculative or chained run's, which hold tokens for several a step, aborted: where
    no chain ran, a short or sampled run, they would take one step a token) and close."""
    if eng.cfg.step_tokens_max > 1:  # the engine's config: a phase's runner config drafts no more than it
        for rid in list(eng.scheduler.running) + [r.id for r in eng.scheduler.waiting]:
            eng.abort(rid)
    while eng.has_work():  # the untimed last step: every request finishes
        eng.step()
    eng.close()


def run_bench_phases(
    cfg: ExecConfig,
    context: int,
    concurrency: int,
    steps: int,
    warmup: int,
    phases,
    prompt_tokens=None,
    prompt_name: str | None = None,
    host_fill: bool = True,
    decoder=None,
) -> list:
    """One record a ``speculative_k`` value of ``phases`` (ints, ``auto``, ``auto:N``), all measured on one engine
    over one prefill, one phase after the other (``warmup`` untimed and ``steps`` timed steps each; a real prefill
    of long contexts on the CPU costs minutes, the decode steps seconds). ``cfg.speculative_k`` must be the phases'
    longest (``Runner.set_speculative_k``: the buffers are sized for it). Each record names its ``phase`` and
    ``phases`` and has ``prefill_shared`` true; the contexts of later phases are longer by the earlier phases'
    tokens. A phase with ``speculative_k`` 0 in ``dense`` still runs the draft head's proposal each step (the engine
    holds one for the phases after it), which an engine built with ``speculative_k`` 0 does not."""
    return _bench(cfg, context, concurrency, steps, warmup, host_fill, prompt_tokens, prompt_name, decoder, phases)


def measure(
    eng,
    n,
    steps,
    warmup,
    *,
    clipped_by,
    context,
    host_fill,
    prompt_tokens,
    prompt_name,
    prefill_s,
    build_s,
    concurrency,
) -> dict:
    """``warmup`` untimed then ``steps`` timed decode steps of ``eng``'s ``n`` requests, and the bench's record of
    them (the configuration fields from ``eng.runner.cfg``)."""
    runner = eng.runner
    cfg = runner.cfg
    times = []
    traced = set(layer_event_steps(steps)) if cfg.profile else set()
    layer_events, t_first = [], None
    emitted = 0  # output tokens of the timed steps (a speculative step emits up to speculative_k + 1 a request)
    per_req = []  # output tokens a request of each timed step (1; a speculative step or a decode chain: more)
    # as a served engine does once built (oasis_exec.server.adapter): the engine's objects leave the collector's walk
    # for the run, so a full collection in a timed step no longer takes ~0.2 s (gc_timed below counts what still runs)
    freeze_startup_objects()
    beside = runner.spec.beside  # spec_predict beside: its step is two graphs (with the repair and without)
    if beside is not None and warmup >= 4:  # the first two speculative warm-up steps make the repair's graph
        beside.force_repairs = 2
    gc_s = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}  # Python's collections in the timed steps: generation -> [n, s]
    gc_t0 = []

    def gc_clock(phase, info):
        if phase == "start":
            gc_t0[:] = [time.perf_counter()]
        elif gc_t0:
            g = gc_s[info["generation"]]
            g[0] += 1
            g[1] += time.perf_counter() - gc_t0[0]

    try:  # the collector's state is restored however the steps end (an exception leaves no frozen process)
        for i in range(warmup + steps):
            if i == warmup and beside is not None:
                beside.force_repairs = 0  # too short a warm-up: the repair's graph is made in the timed steps
            if i == warmup:
                if cfg.device == "cuda":
                    torch.cuda.synchronize()
                runner.trace.stage_ms = {}
                c0 = runner.counters()
                acc0 = dict(runner.spec.accepts)
                sp0 = runner.spec.beside.stats() if runner.spec.beside is not None else {}
                passes0 = runner.decode_steps
                keys0 = runner.cuda_graphs.keys()  # graph keys run before the timed steps (eager or captured)
                gc.callbacks.append(gc_clock)
            runner.trace.step = i - warmup if i - warmup in traced else None
            t0 = time.perf_counter()
            if i == warmup:
                t_first = t0
            out = eng.step()
            times.append(time.perf_counter() - t0)
            if i >= warmup:
                got = sum(len(o.new_token_ids) for o in out)
                emitted += got
                per_req.append(got / max(len(out), 1))
            if runner.trace.layer_events:  # ms since the step began -> ms since the first timed step began (host clock)
                off = 1e3 * (t0 - t_first)
                layer_events += [
                    [s, l, k, round(off + a, 4), round(off + max(a, b), 4)]
                    for s, l, k, a, b in runner.trace.layer_events
                ]
                runner.trace.layer_events = []
            if not out:
                break
    finally:
        runner.trace.step = None
        if gc_clock in gc.callbacks:
            gc.callbacks.remove(gc_clock)
        gc.unfreeze()  # back to the oldest generation: a process running many benches (the tests) frees dropped engines
    t_end = time.perf_counter()
    if cfg.device == "cuda":
        torch.cuda.synchronize()  # copies still running past the last timed step (UVA copy graphs) count too
        t_end = time.perf_counter()
    timed = times[warmup:]
    # TPOT: a step's wall time over the tokens it gave each request (the step time itself when it gave one)
    tpot = [t / m for t, m in zip(timed, per_req)] if timed else []
    c1 = runner.counters()
    sp1 = runner.spec.beside.stats() if runner.spec.beside is not None else None
    shape = runner.shape
    # bytes one (block, head) fetch moves: the host copy's (an fp8 copy: the codes and the two scales)
    if runner.host is not None:
        unit_bytes = runner.host.unit_bytes
    else:
        unit_bytes = 2 * cfg.block_size * shape.head_dim * torch.tensor([], dtype=runner.dtype).element_size()
    units = c1["units_fetched"] - c0["units_fetched"]
    slots = runner.store.S if cfg.sparse else None  # a row's GPU blocks (kv_layout.victim_slots may grow them)
    # the timed steps' wall time, from the first one's start (all copies drained) until the device is idle
    total_s = t_end - t_first if timed else 0.0
    stage = {k: v / max(len(timed), 1) for k, v in runner.trace.stage_ms.items()}
    transfer_ms = stage.get("transfer", 0.0)
    stall_ms = stage.get("stall", 0.0)
    # per decode pass (a decode chain runs several a scheduler step; a speculative step, one)
    passes = max(runner.decode_steps - passes0, 1) if timed else 1
    bytes_step = units * unit_bytes / passes
    dev_name = torch.cuda.get_device_name() if cfg.device == "cuda" else platform.processor() or "cpu"
    uva = runner.pipe is not None and runner.pipe.route.path == "uva"
    drafting = cfg.mode_spec.drafts or cfg.spec_max_k  # the draft fields below: None where nothing drafts
    rec = {
        "mode": cfg.mode,
        "context": context,
        "concurrency": n,
        "requested_concurrency": concurrency,
        "clipped_by": clipped_by,
        "max_lanes": eng.max_lanes,
        "kv_budget_gb": cfg.kv_budget_gb,
        "host_kv_gb": cfg.host_kv_gb,
        "steps": len(timed),
        "warmup": warmup,
        "throughput_tok_s": emitted / total_s if total_s else 0.0,  # emitted tokens: n a step without speculation
        "speculative_k": cfg.speculative_k,
        "accepted_tokens_per_step": emitted / (n * len(timed)) if timed else None,  # mean emitted a request a step
        "accepted_hist": accepted_hist(runner.spec.accepts, acc0) if cfg.spec_max_k and timed else None,
        # who decided the accepted drafts: the target (model) or, benchmark only, draws (synthetic_accept)
        "acceptance": ("synthetic" if cfg.synthetic_accept else "model") if cfg.spec_max_k else None,
        "synthetic_accept": cfg.synthetic_accept,
        # spec_predict: the variant that ran (beside may fall back to after: spec_predict_reason) and, beside, the
        # timed lane-steps and those that needed a repair (oasis_exec.workingset.spec_pipeline)
        "spec_predict": runner.spec.predict_used if cfg.spec_max_k else None,
        "spec_predict_reason": runner.spec.predict_reason,
        **{k_: v_ - sp0.get(k_, 0) for k_, v_ in (sp1 or {}).items()},
        "decode_chain": cfg.chain_max,  # the longest chain the run could take (1: off, speculative or profiled)
        "spec_chain": cfg.spec_chain_max,  # the longest chain of speculative steps (1: off)
        "tpot_ms_p50": 1e3 * statistics.median(tpot) if tpot else None,
        "tpot_ms_p99": 1e3 * _pct(tpot, 99) if tpot else None,
        "tpot_ms_mean": 1e3 * total_s / max(sum(per_req), 1),
        "step_ms_p50": 1e3 * statistics.median(timed) if timed else None,  # a scheduler step's wall time
        "step_ms_mean": 1e3 * total_s / max(len(timed), 1),
        "layer_ms": stage.get("layers", 0.0) / shape.n_layers if "layers" in stage else None,
        "stage_ms_per_step": stage,
        "bytes_moved_per_step": bytes_step,
        "bytes_moved_total": units * unit_bytes,
        "transfer_gb_s": bytes_step / (transfer_ms * 1e6) if transfer_ms else None,
        "hidden_fraction": max(0.0, 1.0 - stall_ms / transfer_ms) if transfer_ms else None,
        "drift_blocks_per_step": (c1["missing"] - c0["missing"]) / max(len(timed), 1),
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cfg.device == "cuda" else None,
        "host_pool_bytes": runner.host.nbytes if runner.host is not None else 0,
        "host_kv_dtype": cfg.host_kv_dtype if cfg.sparse else None,  # the host copy's elements (fp8_e4m3: + scales)
        "unit_bytes": unit_bytes,  # bytes of one (block, head) fetch, what bytes_moved_per_step counts
        "peak_host_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "selection": cfg.selection,
        # synthetic: sets drawn before the run (their generator's GPU work outside the timed steps) / the model
        # selection's top-K run too
        "synthetic_ahead": cfg.synthetic_ahead if cfg.selection == "synthetic" else None,
        "synthetic_topk": cfg.synthetic_topk if cfg.selection == "synthetic" else None,
        # the prediction's top-K (selection=model, or synthetic_topk): fused (oasis_kernels.topk_select) or sort
        "topk_kernel": cfg.topk_kernel if cfg.sparse and (cfg.selection == "model" or cfg.synthetic_topk) else None,
        "transfer": cfg.transfer if cfg.sparse else None,
        "transfer_path": runner.pipe.route.path if runner.pipe is not None else None,  # what "auto" resolved to
        "uva_programs": runner.pipe.gather_programs(n) if uva else None,  # the programs the steps of n lanes used
        "uva_items_per_iter": cfg.gather_items_per_iter if uva else None,
        "stream_priority": runner.pipe.route.priority if runner.pipe is not None else None,
        "uva_kernel": cfg.uva_kernel if uva else None,
        "copy_graph": bool(runner.pipe is not None and runner.pipe.ext.copy_graph and runner.cuda_graphs.graphs),
        # decode steps were captured and replayed as CUDA graphs (greedy speculative ones too)
        "cuda_graph": bool(runner.cuda_graphs.graphs),
        # graph keys first run (eagerly, then captured) inside the timed steps: each such step pays compiles and a
        # capture (e.g. ["spec", B, k, forced, repair]); [] when the warm-up made every graph the timed steps used
        "graphs_new_in_timed": [list(k_) for k_ in runner.cuda_graphs.keys() - keys0] if timed else None,
        # Python's garbage collections inside the timed steps, by generation: [count, ms] (a full one can take
        # hundreds of ms in a process this size: a step that is slow for no GPU reason)
        "gc_timed": {str(g): [n_, round(1e3 * t_, 3)] for g, (n_, t_) in gc_s.items()},
        "no_transfer": cfg.no_transfer,
        "fetch_ratio": cfg.fetch_ratio,
        "fetch_policy": cfg.fetch_policy if cfg.sparse else None,
        "short_context": runner.short is not None,
        "top_k": cfg.top_k,
        # the block scorer that ran (ExecConfig.block_score: what auto became), why auto chose it (None: given), and
        # tokens' channels: the rank the stores keep and the basis file (None: the first RoPE pairs)
        "block_score": cfg.block_score,
        "block_score_auto": cfg.block_score_auto,
        "token_rank": runner.kv.geometry.token_rank or None,
        "token_basis": cfg.token_basis,
        # GPU blocks a row holds when more than top_k: hisparse's hot cache, a background mode's victim cache
        "hot_slots": slots if cfg.mode_spec.hot_cache or slots != cfg.top_k else None,
        "plan_marks": bool(runner.pipe is not None and runner.pipe.bufs.marks is not None),  # plan_select's membership
        "tensor_parallel": cfg.tensor_parallel,  # ranks; this record's rank, and the KV heads it owns
        "tp_rank": runner.tp.rank if runner.tp is not None else 0,
        "kv_heads": shape.n_kv_heads,
        # a hybrid model's layer kinds (per layer: None = full attention, else its window); None: every layer full
        "layer_windows": list(shape.layer_windows) if shape.is_hybrid else None,
        "lane_bytes": runner.kv.lane_bytes,  # GPU bytes of one lane (slots, summaries, tables): what the budget divides
        "model": cfg.model_path or cfg.model,
        "dummy_weights": cfg.model_path is None,
        "synthetic_params": cfg.synthetic,
        "prefill": f"real ({prompt_name or 'given tokens'})"
        if prompt_tokens is not None
        else "synthesized (random KV)",
        "prefill_s": prefill_s,
        "draft": cfg.draft_path if drafting else None,
        "draft_head": cfg.draft_head if drafting else None,
        "draft_ngram": cfg.draft_ngram if drafting else None,
        # drafts prompt lookup gave over the run (prefill, warm-up and timed steps; a synthesized prefill: 0)
        "draft_ngram_used": runner.drafts.ngram.used if drafting and runner.drafts.ngram is not None else None,
        "host_pool_filled": bool(host_fill and runner.host is not None and prompt_tokens is None),
        "build_s": build_s,
        "device": dev_name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": provenance.commit(),
        "step_ms": [1e3 * t for t in timed],  # every timed step (oasis_exec.tools.recorder samples them)
    }
    if layer_events:
        rec["layer_events"] = sorted(layer_events, key=lambda e: (e[0], e[3], e[1]))
    return rec


def _bench_rank(*args) -> list:
    """One rank's ``run_bench`` under ``oasis_exec.model.tensor_parallel.launch``: every rank's record, gathered."""
    rec = run_bench(*args)
    recs = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(recs, rec)
    return recs


def run_bench_tp(cfg: ExecConfig, *args) -> dict | None:
    """``run_bench`` on ``cfg.tensor_parallel`` ranks (``oasis_exec.model.tensor_parallel.launch``: spawned here, or under
    torchrun, where only rank 0 returns the record; gloo on the CPU, NCCL with one GPU a rank). The record is rank
    0's, the largest share (its step times are the run's: every layer ends with all-reduces; its bytes are its own,
    as the simulator's ``tensor_parallel`` run simulates rank 0); ``all_ranks`` sums ``bytes_moved_per_step``,
    ``bytes_moved_total`` and ``host_pool_bytes`` over the ranks (each copies and holds its own KV heads); ``ranks``
    keeps every rank's record but its step times and layer events."""
    backend = "nccl" if cfg.device.startswith("cuda") else "gloo"
    recs = tp.launch(_bench_rank, cfg.tensor_parallel, cfg, *args, backend=backend)
    if int(os.environ.get("RANK", "0")) != 0:  # torchrun: rank 0 writes the record
        return None
    rec = dict(recs[0])
    rec["all_ranks"] = {
        k: sum(r[k] for r in recs) for k in ("bytes_moved_per_step", "bytes_moved_total", "host_pool_bytes")
    }
    rec["ranks"] = [{k: v for k, v in r.items() if k not in ("step_ms", "layer_events")} for r in recs]
    return rec


def write_record(rec: dict, path: str | None) -> None:
    line = json.dumps(rec)
    if path:
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(line + "\n")
    print(line)

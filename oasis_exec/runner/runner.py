"""The model runner: owns every GPU tensor and executes one ``RunnerCall`` (prefill chunk or decode step).

Decode, per layer l (sparse modes): QKV for the real token (and, in ``lookahead``, the draft token stacked behind
it) -> wait for layer l's transfer of the previous step -> write the real token's K/V into the local block ->
(``retrieval``: select and copy now, on the critical path) -> sparse attention over the resident slots + local
block (+ the draft token's own K/V for the draft query) -> flush a block that just filled (host copy, summary) ->
launch prediction -> selection -> transfer of layer l for the next step in the background (``proxy``: from the
real query; ``lookahead``: from the draft query) -> output projection and MLP.

Dense modes keep the whole cache on the GPU in pages: ``dense`` attends every token (``oasis_kernels.paged_attn``),
``quest`` attends the top-K blocks of the current query plus the local block (``oasis_kernels.sparse_attn`` over the
pages seen as slots).

Speculative decoding (``ExecConfig.speculative_k > 0``; dense and lookahead; ``oasis_exec.runner.speculative``): a step of
lanes none of which is short or crossing drafts ``k`` tokens a lane with the head, verifies them in one target pass
(``ModelExec.decode_spec``), accepts a prefix and emits it plus one token of the target, and keeps only the
accepted tokens' KV (``ModelExec.commit_spec``); ``execute`` then returns a list of tokens a request. Greedy and
synthetic acceptance run on the device and as CUDA graphs (``DecodeGraphs.spec_chain`` / ``spec_step``); sampled
rows eagerly. Other steps, and every step with ``speculative_k = 0``, are the ordinary ones above.

Benchmarks synthesize prefill (``Admit.synthetic_prefill``): the KV of the prompt is filled with random values
(host pool pattern, random summaries and slots) rather than computed, so that many 16K-token requests start in
seconds. The real chunked-prefill path is used for correctness tests and serving.

The pieces, each a module of its own: ``kv.layout`` (the stores and their sizes, ``Runner.kv``), ``model_exec``
(the layer loop: prefill, synthesized prefill, the decode step, the verification pass) over the working sets
(``oasis_exec.workingset``: one per mode family), ``drafts`` (the draft head's state), ``spec_step`` (a
speculative step and its counts, ``Runner.spec``), ``decode_graphs`` (CUDA-graph capture and replay),
``workingset.prefetcher`` (the background prefetch), ``workingset.selection_sources`` (synthetic, replayed and
recorded selections) and ``sampling`` (the default sampler; a call may carry its own, ``RunnerCall.sampler``).
``Runner`` wires them and is what the engine, the bench, the server adapter and the quality harness use.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from oasis_core.short_context import ShortContext
from oasis_core.specs import ModelSpec, get_model

from ..config import ExecConfig
from ..kv.layout import build_kv_layout
from ..model import tensor_parallel
from ..model.decoder import Decoder
from ..model.draft_attn import build_draft
from ..workingset.fetch_caps import DeviceCaps
from ..workingset.prefetcher import Prefetcher
from ..workingset.selection_sources import SelectionSources
from ..workingset.step import rows_index
from .decode_graphs import DecodeGraphs
from .drafts import Drafts
from .logit_rows import LogitRows
from .model_exec import ModelExec, StepTrace
from .sampling import TemperatureSampler
from .spec_step import SpecStep

if TYPE_CHECKING:  # the engine's call, built by its scheduler (the runner imports nothing of the engine)
    from ..engine.scheduler import RunnerCall


def _dtype(name):
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def _decoder(cfg, shape, tp, dtype, device):
    """The model: weights from ``cfg.model_path``, else dummy weights of ``shape`` (or ``cfg.model``'s)."""
    fused = cfg.fused_ops and device.type == "cuda"  # on CPU the kernels would run in Triton's interpreter
    if cfg.model_path:
        return Decoder.from_path(cfg.model_path, dtype, device, fused, tp)
    return Decoder.build(shape or get_model(cfg.model), None, cfg.seed, dtype, device, fused, tp)


def _drafts(cfg, decoder, max_lanes, dtype, device) -> Drafts:
    head = None
    if cfg.mode_spec.drafts or cfg.spec_max_k:
        head = build_draft(
            cfg.draft_head,
            decoder.full_shape,  # replicated on every rank: the same head as with one rank
            decoder.embed,
            cfg.draft_path,
            min(cfg.draft_vocab, decoder.shape.vocab),
            cfg.seed + 1,
            dtype,
            device,
            decoder.lm_head,
            cfg.max_context,
        )
    return Drafts(
        head,
        max_lanes=max_lanes,
        hidden=decoder.shape.hidden,
        speculative=bool(cfg.spec_max_k),
        dtype=dtype,
        device=device,
        ngram=cfg.draft_ngram if head is not None else 0,
        gate=cfg.draft_gate > 0,
        max_context=cfg.max_context,
    )


class Runner:
    def __init__(self, cfg: ExecConfig, *, shape: ModelSpec | None = None, decoder: Decoder | None = None):
        self.cfg = cfg
        self.device = dev = torch.device(cfg.device)
        dt = _dtype(cfg.dtype)
        self.tp = tensor_parallel.group(cfg.tensor_parallel)  # None with one rank
        self.dec = decoder = decoder or _decoder(cfg, shape, self.tp, dt, dev)
        self.shape = s = decoder.shape  # tensor parallel: this rank's heads and MLP share (full_shape: the model's)
        if cfg.model_path and cfg.max_context > s.max_context_tokens:  # dummy weights have no trained positions
            raise ValueError(
                f"ExecConfig.max_context: {cfg.max_context} tokens exceed the model's "
                f"{s.max_context_tokens} positions ({s.name}); pass --max-context "
                f"{s.max_context_tokens} or less"
            )
        # Short contexts (oasis_core.short_context): lanes whose context fits the resident set run dense on the GPU
        self.short = (
            ShortContext(top_k=cfg.top_k, block_size=cfg.block_size) if cfg.sparse and cfg.short_context else None
        )
        self._crossing = set()  # lanes whose next decode step is their crossing (host blocks just taken)
        self.kv = kv = build_kv_layout(cfg, shape=s, dtype=dt, device=dev)
        self.caps = self.pipe = None
        if cfg.sparse:
            self.caps = DeviceCaps(
                policy=cfg.cap_policy(),
                top_k=cfg.top_k,
                n_layers=s.n_layers,
                bytes_per_block_head=kv.geometry.host_bytes_per_block_head(cfg.host_kv_dtype),  # what a fetch moves
                link_bytes_per_s=cfg.link_gb_s * 1e9,
                device=dev,
                state_rows=kv.max_lanes * s.n_kv_heads,  # per-row policy state sized once: no growth in a capture
                fetch_layers=s.n_full_layers,  # a hybrid model's windowed layers fetch nothing
            )
            self.pipe = Prefetcher(cfg=cfg, store=kv.store, host=kv.host, device=dev, caps=self.caps)
        # With cfg.profile, the bench sets trace.step on a few sampled steps (model_exec.StepTrace)
        self.trace = StepTrace()
        self.drafts = _drafts(cfg, decoder, kv.max_lanes, dt, dev)
        self.model = ModelExec(
            cfg=cfg,
            decoder=decoder,
            drafts=self.drafts,
            store=kv.store,
            host=kv.host,
            pipe=self.pipe,
            caps=self.caps,
            trace=self.trace,
            max_lanes=kv.max_lanes,
            device=dev,
            dtype=dt,
            short=self.short,
        )
        # sampler(logits [rows, V], sampling params a row) -> token ids [rows]; rows are the call's prefill request,
        # else its decode items, in order. A call may carry its own (RunnerCall.sampler: the engine's, keyed per
        # request); this one serves calls that carry none.
        self.sampler = TemperatureSampler(generator=torch.Generator(device=dev).manual_seed(cfg.seed))
        # synthetic / replayed selections and the recorded sets (selection_sources.py)
        self.sources = SelectionSources(
            cfg=cfg,
            mode=cfg.mode_spec,
            store=kv.store,
            shape=s,
            device=dev,
            n_layers=s.n_layers,
            n_kv_heads=s.n_kv_heads,
            top_k=cfg.top_k,
            block_size=cfg.block_size,
        )
        self.cuda_graphs = DecodeGraphs(cfg=cfg, device=dev, model=self.model, sources=self.sources)
        self.spec = SpecStep(
            cfg,
            model=self.model,
            graphs=self.cuda_graphs,
            sources=self.sources,
            generator=self.sampler.generator,
            pipe=self.pipe,
            max_lanes=kv.max_lanes,
        )
        self.decode_steps = 0
        self.last_logits = {}
        self.last_logits_seq = {}

    # -- what callers read: sizes, and the KV stores' handles (``kv``: the layout) -----------------------------------

    @property
    def store(self):
        """The GPU KV store (slots and their tables, or pages)."""
        return self.kv.store

    @property
    def host(self):
        """The host pool (sparse modes; else None)."""
        return self.kv.host

    @property
    def max_lanes(self) -> int:
        return self.kv.max_lanes

    @property
    def host_blocks_total(self) -> int:
        return self.kv.host_blocks_total

    @property
    def dtype(self) -> torch.dtype:
        return _dtype(self.cfg.dtype)

    @property
    def H(self) -> int:
        return self.shape.n_kv_heads

    @property
    def L(self) -> int:
        return self.shape.n_layers

    @property
    def bs(self) -> int:
        return self.cfg.block_size

    # -- plan entry point ---------------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: RunnerCall) -> dict:
        self.last_logits = {}
        self.last_logits_seq = {}  # a speculative step's: req_id -> logits [emitted, V], a row per emitted token
        if plan.admit:
            self.model.ws.wait_all()  # no background work may touch a lane being reset
        for a in plan.admit:
            self._admit(a)
        sampler = plan.sampler or self.sampler
        if plan.prefill is not None:
            return self._prefill(plan.prefill, plan.sampling, sampler)
        if plan.decode:
            return self._decode(plan, sampler)
        return {}

    def _admit(self, a) -> None:
        if self.drafts.ngram is not None:
            self.drafts.ngram.admit(a.lane)
        self.sources.admit(a.lane)
        self._crossing.discard(a.lane)
        self.spec.admit(a.lane)
        self.model.ws.admit(a.lane, a.host_blocks)
        if a.synthetic_prefill:
            self.model.synthesize(a)

    def _prefill(self, ch, sampling, sampler) -> dict:
        if self.drafts.ngram is not None:  # the chunk's tokens into the lane's history (prompt lookup)
            self.drafts.ngram.prefill(ch)
        out = self.model.prefill(ch)
        if out is None:
            return {}
        logits, aux = out
        self.last_logits = {ch.req_id: logits[0]}
        tok = sampler(logits, [sampling[ch.req_id]])
        if self.drafts.head is not None:
            self.drafts.propose_prefill(ch.lane, aux, tok)
        return {ch.req_id: int(tok[0])}

    # -- decode ----------------------------------------------------------------------------------------------------

    def _decode(self, plan: RunnerCall, sampler) -> dict:
        t_step = time.perf_counter()  # speculative_k auto: every plain step's wall time, by draft length
        items = plan.decode
        lanes_list = [it.lane for it in items]
        pos_list = [it.position for it in items]
        short = self._short_step(pos_list)
        if short == "all":  # nothing is selected: no sets drawn (one drawn ahead for this step is dropped)
            sets, synth_ready = self.sources.skip(), None
        else:
            sets, synth_ready = self.sources.sets(lanes_list, pos_list)
        recorded = [] if self.sources.record is not None else None
        cross = [i for i, it in enumerate(items) if it.lane in self._crossing]
        params = [plan.sampling[it.req_id] for it in items]
        ks = self.spec.choose(items, short, cross)
        if ks:
            n_chain = self.spec.chain_len(items, params, ks, plan.chain, sets, recorded)
            if n_chain > 1:  # speculative steps back to back (ExecConfig.spec_chain)
                out, self.last_logits, self.last_logits_seq, starts = self.spec.run_chain(
                    items, ks, n_chain, synth_ready
                )
                for p_list in starts:
                    self._step_end(items, p_list, None)
                return out
            out, self.last_logits, self.last_logits_seq = self.spec.run(
                items, params, ks, sets, synth_ready, sampler, recorded
            )
            self._step_end(items, pos_list, recorded)  # no per-layer trace in a speculative step
            self.spec.observe_time(max(ks), time.perf_counter() - t_step)
            return out
        self.spec.observe_plain(items)
        if cross:  # short lanes outgrowing their window: their KV so far goes to the host in this (eager) step
            self._cross([items[i] for i in cross])
        n_chain = self._chain_len(plan, params, short, cross)
        toks_out, logits_seq = self._chain(items, params, sampler, n_chain, short, cross, sets, synth_ready, recorded)
        logits = logits_seq[-1]
        ids = [it.req_id for it in items]
        self.last_logits = LogitRows(ids, logits.__getitem__)
        if n_chain > 1:
            seq = torch.stack(logits_seq, 1)  # [B, n_chain, V]
            self.last_logits_seq = LogitRows(ids, seq.__getitem__)
            out = torch.stack(toks_out, 1).tolist()  # the chain's one host synchronisation: [B] lists of n_chain
        else:
            out = toks_out[0].tolist()  # the step's one host synchronisation
        if short == "none" and not cross:
            self.spec.observe_time(0, time.perf_counter() - t_step)
        self._step_end(items, [p + n_chain - 1 for p in pos_list], recorded)
        return {it.req_id: out[i] for i, it in enumerate(items)}

    def _chain(self, items, params, sampler, n_chain, short, cross, sets, synth_ready, recorded):
        """``n_chain`` ordinary steps back to back (decode_chain: step i's tokens feed step i + 1 on the device, no
        host read between). Returns (sampled tokens [B] a step, logits [B, V] a step: clones when n_chain > 1, as a
        graph's logits are overwritten by the next replay)."""
        dev = self.device
        lanes_list = [it.lane for it in items]
        pos_list = [it.position for it in items]
        toks = torch.tensor([it.token for it in items], device=dev)
        pos = torch.tensor(pos_list, device=dev)
        dense_slots = self._dense_slots(pos_list) if short == "all" else None
        graphed = not cross and self.cuda_graphs.ok(lanes_list)
        # lanes on the device before anything is queued: a list -> device copy waits for the stream (PyTorch's
        # blocking host-to-device copy), which after the launch would hold the draft's launches until the step ends
        lanes = torch.arange(len(lanes_list), device=dev) if graphed else torch.tensor(lanes_list, device=dev)
        toks_out, logits_seq = [], []
        for i in range(n_chain):
            if i:
                pos_list = [p + 1 for p in pos_list]
                toks, pos = toks_out[-1], pos + 1
                sets, synth_ready = self.sources.sets(lanes_list, pos_list)
            if graphed:
                logits, aux = self.cuda_graphs.replay(lanes_list, toks, pos, sets, short, dense_slots)
            else:
                rows = rows_index(lanes_list, self.H)
                logits, aux = self.model.decode_core(
                    lanes, rows, toks, pos, sets, recorded, cross=cross or None, short=short, dense_slots=dense_slots
                )
            if synth_ready is not None:
                self.sources.presynth(lanes_list, synth_ready)
            tok = sampler(logits, params)
            if self.drafts.head is not None:
                self._propose(short, lanes, pos_list, aux, tok)
            toks_out.append(tok)
            logits_seq.append(logits.clone() if n_chain > 1 else logits)
            if i < n_chain - 1:
                self._step_end(items, pos_list, recorded)
        return toks_out, logits_seq

    def _chain_len(self, plan, params, short, cross) -> int:
        """Ordinary steps this call runs back to back (``RunnerCall.chain``, the engine's share of
        ``ExecConfig.decode_chain``): 1 unless every row is greedy,
        no lane is short or crossing (a lane short now could cross inside the chain), no speculative decoding, no
        profile and no recorded sets (each reads the host every step); at most every request's remaining tokens
        (``DecodeItem.max_new``) and ``block_size`` (a chain fills at most one block, whose host copy is written by
        the step that fills it: the host block of the next one, taken after the chain, is not read before it fills)."""
        cfg = self.cfg
        if (
            plan.chain == 1
            or short != "none"
            or cross
            or cfg.spec_max_k
            or cfg.profile
            or self.sources.record is not None
            or any(sp.temperature > 0 for sp in params)
        ):
            return 1
        return max(1, min(plan.chain, self.bs, min(it.max_new for it in plan.decode)))

    def _step_end(self, items, pos_list, recorded) -> None:
        """A decode step's stage times (``--profile`` on CUDA), its recorded sets, the step count."""
        tr = self.trace
        if self.pipe is not None and self.cfg.profile and self.device.type == "cuda":
            for k_, v_ in self.pipe.collect(tr.step_ref).items():
                tr.stage_ms[k_] = tr.stage_ms.get(k_, 0.0) + v_
            if tr.step_ref is not None:  # side-stream stages of a traced step (--profile; ran on the H200)
                tr.layer_events += [[tr.step, l, k_, a, b] for k_, l, a, b in self.pipe.log.events if a >= 0]
                self.pipe.log.events = []
        tr.step_ref = None
        if recorded:
            self.sources.add_record(recorded, [it.req_id for it in items], pos_list)
        self.decode_steps += 1

    def set_speculative_k(self, value) -> None:
        """Another ``speculative_k`` (an int, ``auto``, ``auto:N``) from the next step on, at most the longest this
        runner was built for (its buffers are sized for it; ``bench.run_bench_phases``: several draft lengths over
        one prefill). ``auto`` starts a fresh acceptance estimate for every lane."""
        self.spec.set_k(value)
        self.cfg = self.spec.cfg

    def _short_step(self, pos_list) -> str:
        """How many lanes of a step over positions ``pos_list`` can be short, decided on the host (no device read):
        "none", "some" or "all" (``ModelExec.decode_core``'s ``short``)."""
        if self.short is None or not self.short.dense(min(pos_list) + 1):
            return "none"
        return "all" if self.short.dense(max(pos_list) + 1) else "some"

    def _dense_slots(self, pos_list) -> int:
        """Slots an all-short step attends per row: the longest lane's full blocks, rounded up to a power of two
        (at least 16, at most ``top_k``), so that a few CUDA graphs cover every length."""
        n = max(pos_list) // self.bs
        return min(self.cfg.top_k, max(16, 1 << max(n - 1, 0).bit_length()))

    def _propose(self, short, lanes, pos_list, aux, tok) -> None:
        """The draft tokens after a step (``lanes``: the step's, on the device). In an all-short step only the lanes
        whose next step is their crossing draft: a short lane's draft token is read only from its crossing on (its
        lookahead query)."""
        if short != "all" or self.drafts.attends:  # an attending head writes every position's K/V
            self.drafts.propose(lanes, aux, tok)
            return
        nxt = [i for i, p in enumerate(pos_list) if self.short.crossing(p + 2)]
        if nxt:
            idx = torch.tensor(nxt, device=self.device)
            self.drafts.propose(lanes[idx], aux[idx], tok[idx])

    def _cross(self, items) -> None:
        """Checks the crossing of short lanes (``ShortContext.crossing``): their host blocks were taken for this
        step, which copies every block written so far device->host on the device (``ResidentSet._offload``) before
        any of them can be evicted."""
        for it in items:
            ctx = it.position + 1
            if not self.short.crossing(ctx):
                raise RuntimeError(
                    f"lane {it.lane}: host blocks taken at context {ctx}, not at its crossing "
                    f"({self.short.window_tokens + 1})"
                )
            self._crossing.discard(it.lane)

    # -- accounting -----------------------------------------------------------------------------------------------

    def extend_blocks(self, lane: int, blocks) -> None:
        """Host blocks a lane's request took as it grew: appended to its block table (sparse modes)."""
        if self.model.ws.extend(lane, blocks) and self.short is not None:  # a short lane's first: it crosses next
            self._crossing.add(lane)

    def release(self, req_id, preempted: bool = False) -> None:
        """Drop what the runner holds for a request that ended early (the prompt KV scratch of a chunked prefill);
        ``preempted``: first wait until no background copy may still read a host block it held (its lane and host
        blocks change hands)."""
        if preempted:
            self.model.ws.wait_all()
        self.model.ws.release(req_id)

    def counters(self) -> dict:
        if self.pipe is None:
            return {"units_fetched": 0, "missing": 0}
        return {"units_fetched": int(self.pipe.units), "missing": int(self.pipe.missing)}

    def close(self) -> None:
        self.model.ws.wait_all()
        self.sources.save()
        if self.pipe is not None:
            self.pipe.close()
        self.cuda_graphs.close()

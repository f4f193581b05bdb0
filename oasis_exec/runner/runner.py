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

The pieces, each a module of its own: ``kv_layout`` (the stores and their sizes), ``model_exec`` (the forward passes:
prefill, synthesized prefill, the decode step and its prediction), ``decode_graphs`` (CUDA-graph capture and
replay of decode steps), ``pipeline`` (the background prefetch), ``selection_sources`` (synthetic, replayed and
recorded selections) and ``sampling`` (the default sampler). ``Runner`` wires them and is what the engine, the
bench, the server adapter and the quality harness use.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from typing import TYPE_CHECKING

import torch

from oasis_core.short_context import ShortContext
from oasis_core.specs import ModelSpec, get_model
from oasis_core.speculation import AdaptiveK, parse_spec, synthetic_acceptance

from ..config import ExecConfig
from ..kv.layout import build_kv_layout
from ..model import tensor_parallel
from ..model.decoder import Decoder
from ..model.draft_attn import build_draft
from ..workingset.fetch_caps import DeviceCaps
from ..workingset.prefetcher import Prefetcher
from ..workingset.selection_sources import SelectionSources
from .decode_graphs import DecodeGraphs
from .model_exec import ModelExec, StepTrace
from .sampling import TemperatureSampler
from .speculative import accept, rows_of

if TYPE_CHECKING:  # the engine's call, built by its scheduler (the runner imports nothing of the engine)
    from ..engine.scheduler import RunnerCall


def _dtype(name):
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def _rows_of(lanes_list, H):
    """Rows of the lanes: a slice when they are contiguous (views, no copies), else an index list."""
    lo = lanes_list[0]
    if lanes_list == list(range(lo, lo + len(lanes_list))):
        return slice(lo * H, (lo + len(lanes_list)) * H)
    return torch.tensor([b * H + h for b in lanes_list for h in range(H)])


class _Clock:
    """Three marks around a speculative step's draft chain and verify pass (``speculative_k auto`` measuring γ):
    CUDA events on a GPU (read after the acceptance has synchronised), the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> tuple:
        """(seconds of the draft chain, seconds of the verify pass)."""
        a, b, c = self.marks
        if self.cuda:
            return a.elapsed_time(b) / 1e3, b.elapsed_time(c) / 1e3
        return b - a, c - b


SYNTH_ACCEPT_SALT = 0x5A11CE  # the seeded draws of synthetic_accept


class Runner:
    def __init__(self, cfg: ExecConfig, *, shape: ModelSpec | None = None, decoder: Decoder | None = None):
        self.cfg = cfg
        self.mode = mode = cfg.mode_spec
        self.device = dev = torch.device(cfg.device)
        self.dtype = dt = _dtype(cfg.dtype)
        self.tp = tensor_parallel.group(cfg.tensor_parallel)  # None with one rank
        if decoder is None:
            fused = cfg.fused_ops and dev.type == "cuda"  # on CPU the kernels would run in Triton's interpreter
            if cfg.model_path:
                decoder = Decoder.from_path(cfg.model_path, dt, dev, fused, self.tp)
            else:
                shape = shape or get_model(cfg.model)
                decoder = Decoder.build(shape, None, cfg.seed, dt, dev, fused, self.tp)
        self.dec = decoder
        self.shape = s = decoder.shape  # tensor parallel: this rank's heads and MLP share (full_shape: the model's)
        if cfg.model_path and cfg.max_context > s.max_context_tokens:  # dummy weights have no trained positions
            raise ValueError(
                f"ExecConfig.max_context: {cfg.max_context} tokens exceed the model's "
                f"{s.max_context_tokens} positions ({s.name}); pass --max-context "
                f"{s.max_context_tokens} or less"
            )
        draft = None
        if mode.drafts or cfg.spec_max_k:
            draft = build_draft(
                cfg.draft_head,
                decoder.full_shape,  # replicated on every rank: the same head as with one rank
                decoder.embed,
                cfg.draft_path,
                min(cfg.draft_vocab, s.vocab),
                cfg.seed + 1,
                dt,
                dev,
                decoder.lm_head,
                cfg.max_context,
            )
        self.bs, self.H, self.L = cfg.block_size, s.n_kv_heads, s.n_layers
        self.K = cfg.top_k
        # Short contexts (oasis_core.short_context): lanes whose context fits the resident set run dense on the GPU
        self.short = ShortContext(top_k=self.K, block_size=self.bs) if cfg.sparse and cfg.short_context else None
        self._crossing = set()  # lanes whose next decode step is their crossing (host blocks just taken)
        kv = build_kv_layout(cfg, shape=s, dtype=dt, device=dev)
        self.geometry, self.lane_bytes, self.max_lanes = kv.geometry, kv.lane_bytes, kv.max_lanes
        self.store, self.host, self.host_blocks_total = kv.store, kv.host, kv.host_blocks_total
        self.caps = self.pipe = None
        if cfg.sparse:
            self.cap_policy = cfg.cap_policy()
            self.caps = DeviceCaps(
                policy=self.cap_policy,
                top_k=self.K,
                n_layers=self.L,
                bytes_per_block_head=kv.geometry.host_bytes_per_block_head(cfg.host_kv_dtype),  # what a fetch moves
                link_bytes_per_s=cfg.link_gb_s * 1e9,
                device=dev,
                state_rows=kv.max_lanes * self.H,  # per-row policy state sized once: no growth inside a capture
                fetch_layers=s.n_full_layers,  # a hybrid model's windowed layers fetch nothing
            )
            self.max_cap = self.caps.max_cap
            self.pipe = Prefetcher(cfg=cfg, store=self.store, host=self.host, device=dev, caps=self.caps)
        # With cfg.profile, the bench sets trace_step on a few sampled steps (model_exec.StepTrace)
        self.trace = StepTrace()
        self.model = ModelExec(
            cfg=cfg,
            decoder=decoder,
            draft=draft,
            store=self.store,
            host=self.host,
            pipe=self.pipe,
            caps=self.caps,
            trace=self.trace,
            max_lanes=self.max_lanes,
            device=dev,
            dtype=dt,
            short=self.short,
        )
        self.gen = torch.Generator(device=dev).manual_seed(cfg.seed)
        # sampler(logits [rows, V], sampling params a row) -> token ids [rows]; rows are the plan's prefill
        # request, else its decode items, in order. The Engine installs its per-request-seeded sampler here.
        self.sampler = TemperatureSampler(generator=self.gen)
        # speculative steps' draws above temperature 0: spec_draws(req_ids, n) -> (u_acc, u_draw), each [B, n]
        # uniforms in [0, 1) (oasis_exec.runner.speculative.accept); the Engine installs its per-request-keyed one
        self.spec_draws = None
        self.spec_steps = 0  # speculative steps run, and the tokens they emitted (every lane's)
        self.spec_tokens = 0
        self.spec_lanes = 0
        self.spec_accepts = Counter()  # (drafts a lane, accepted) -> lanes: results.accepted_hist of a recording
        # speculative_k auto (oasis_core.speculation): each lane's draft length from its measured acceptance
        self.adaptive = AdaptiveK(cfg.spec_max_k, cfg.speculative_gamma) if cfg.spec_adaptive else None
        # synthetic_accept (benchmark only, dummy weights): accepted drafts drawn, seeded, instead of the target's
        self.synth_accept = synthetic_acceptance(cfg.synthetic_accept) if cfg.synthetic_accept else None
        self.synth_rng = random.Random(cfg.seed ^ SYNTH_ACCEPT_SALT)
        # synthetic / replayed selections and the recorded sets (selection_sources.py)
        self.sources = SelectionSources(
            cfg=cfg,
            mode=mode,
            store=self.store,
            shape=s,
            device=dev,
            n_layers=self.L,
            n_kv_heads=self.H,
            top_k=self.K,
            block_size=self.bs,
        )
        self.cuda_graphs = DecodeGraphs(
            cfg=cfg, device=dev, model=self.model, pipe=self.pipe, sources=self.sources, n_kv_heads=self.H
        )
        self.decode_steps = 0
        self.last_logits = {}
        self.last_logits_seq = {}

    # -- what the callers read of the parts ---------------------------------------------------------------------

    @property
    def draft(self):
        """The draft head (modes that draft; else None); the quality harness may replace it."""
        return self.model.draft

    @draft.setter
    def draft(self, head) -> None:
        self.model.draft = head

    @property
    def draft_tok(self):
        return self.model.draft_tok

    @property
    def lane_blocks(self) -> dict:
        return self.model.lane_blocks

    @property
    def scratch(self) -> dict:
        return self.model.scratch

    @property
    def graphs(self) -> dict:
        return self.cuda_graphs.graphs

    @property
    def trace_step(self):
        return self.trace.step

    @trace_step.setter
    def trace_step(self, step) -> None:
        self.trace.step = step

    @property
    def layer_events(self) -> list:
        return self.trace.layer_events

    @layer_events.setter
    def layer_events(self, events) -> None:
        self.trace.layer_events = events

    @property
    def stage_ms(self) -> dict:
        return self.trace.stage_ms

    @stage_ms.setter
    def stage_ms(self, stages) -> None:
        self.trace.stage_ms = stages

    # -- plan entry point ---------------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: RunnerCall) -> dict:
        self.last_logits = {}
        self.last_logits_seq = {}  # a speculative step's: req_id -> logits [emitted, V], a row per emitted token
        if plan.admit and self.pipe is not None:
            self.pipe.wait_all()  # no background work may touch a lane being reset
        for a in plan.admit:
            self._admit(a)
        if plan.prefill is not None:
            return self._prefill(plan.prefill, plan.sampling)
        if plan.decode:
            return self._decode(plan)
        return {}

    def _admit(self, a) -> None:
        self.sources.admit(a.lane)
        self._crossing.discard(a.lane)
        if self.adaptive is not None:  # a new request on the lane: its acceptance is its own
            self.adaptive.drop(a.lane)
        if self.cfg.sparse:
            self.lane_blocks[a.lane] = list(a.host_blocks)
            self.store.reset_lane(a.lane, a.host_blocks)
            self.caps.reset_rows(slice(a.lane * self.H, (a.lane + 1) * self.H))  # adaptive policies' row state
        else:
            self.store.reset_lane(a.lane)
        if a.synthetic_prefill:
            self.model.synthesize(a)

    def _prefill(self, ch, sampling) -> dict:
        out = self.model.prefill(ch)
        if out is None:
            return {}
        logits, aux = out
        self.last_logits = {ch.req_id: logits[0]}
        tok = self.sampler(logits, [sampling[ch.req_id]])
        if self.draft is not None:
            self.model.propose_prefill(ch.lane, aux, tok)
        return {ch.req_id: int(tok[0])}

    # -- decode ----------------------------------------------------------------------------------------------------

    def _decode(self, plan: RunnerCall) -> dict:
        t_step = time.perf_counter()  # speculative_k auto: every plain step's wall time, by draft length
        dev = self.device
        items = plan.decode
        lanes_list = [it.lane for it in items]
        pos_list = [it.position for it in items]
        toks = torch.tensor([it.token for it in items], device=dev)
        pos = torch.tensor(pos_list, device=dev)
        short = self._short_step(pos_list)
        dense_slots = self._dense_slots(pos_list) if short == "all" else None
        if short == "all":  # nothing is selected: no sets drawn (one drawn ahead for this step is dropped)
            sets, synth_ready = self.sources.skip(), None
        else:
            sets, synth_ready = self.sources.sets(lanes_list, pos_list)
        recorded = [] if self.sources.record is not None else None
        cross = [i for i, it in enumerate(items) if it.lane in self._crossing]
        ks = self._spec_k(items, short, cross)
        if ks:
            out = self._decode_spec(plan, ks, sets, synth_ready, recorded)
            if self.adaptive is not None:
                self.adaptive.observe_step(max(ks), time.perf_counter() - t_step)
            return out
        if self.adaptive is not None:  # an ordinary step: the lanes' acceptance evidence only decays
            for it in items:
                self.adaptive.observe(it.lane, 0, 0)
        if cross:  # short lanes outgrowing their window: their KV so far goes to the host in this (eager) step
            self._cross([items[i] for i in cross])
        params = [plan.sampling[it.req_id] for it in items]
        n_chain = self._chain_len(plan, params, short, cross)
        graphed = not cross and self.cuda_graphs.ok(lanes_list)
        # lanes on the device before anything is queued: a list -> device copy waits for the stream (PyTorch's
        # blocking host-to-device copy), which after the launch would hold the draft's launches until the step ends
        lanes = torch.arange(len(lanes_list), device=dev) if graphed else torch.tensor(lanes_list, device=dev)
        toks_out, logits_seq = [], []
        for i in range(n_chain):  # decode_chain: step i's tokens feed step i + 1 on the device, no host read between
            if i:
                pos_list = [p + 1 for p in pos_list]
                toks, pos = toks_out[-1], pos + 1
                sets, synth_ready = self.sources.sets(lanes_list, pos_list)
            if graphed:
                logits, aux = self.cuda_graphs.replay(lanes_list, toks, pos, sets, short, dense_slots)
            else:
                logits, aux = self.model.decode_core(
                    lanes,
                    _rows_of(lanes_list, self.H),
                    toks,
                    pos,
                    sets,
                    recorded,
                    cross=cross or None,
                    short=short,
                    dense_slots=dense_slots,
                )
            if synth_ready is not None:
                self.sources.presynth(lanes_list, synth_ready)
            tok = self.sampler(logits, params)
            if self.draft is not None:
                self._propose(short, lanes, pos_list, aux, tok)
            toks_out.append(tok)
            if n_chain > 1:  # a row per emitted token (logprobs); a graph's logits are overwritten by the next replay
                logits_seq.append(logits.clone())
            if i < n_chain - 1:
                self._step_end(items, pos_list, recorded)
        self.last_logits = {it.req_id: logits[i] for i, it in enumerate(items)}
        if n_chain > 1:
            seq = torch.stack(logits_seq, 1)  # [B, n_chain, V]
            self.last_logits_seq = {it.req_id: seq[i] for i, it in enumerate(items)}
        if n_chain == 1:
            out = tok.tolist()  # the step's one host synchronisation
        else:
            out = torch.stack(toks_out, 1).tolist()  # the chain's one host synchronisation: [B] lists of n_chain
        if self.adaptive is not None and short == "none" and not cross:
            self.adaptive.observe_step(0, time.perf_counter() - t_step)
        self._step_end(items, pos_list, recorded)
        return {it.req_id: out[i] for i, it in enumerate(items)}

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
                tr.layer_events += [[tr.step, l, k_, a, b] for k_, l, a, b in self.pipe.events if a >= 0]
                self.pipe.events = []
        tr.step_ref = None
        if recorded:
            self.sources.add_record(recorded, [it.req_id for it in items], pos_list)
        self.decode_steps += 1

    def set_speculative_k(self, value) -> None:
        """Another ``speculative_k`` (an int, ``auto``, ``auto:N``) from the next step on, at most the longest this
        runner was built for (its buffers are sized for it; ``bench.run_bench_phases``: several draft lengths over
        one prefill). ``auto`` starts a fresh acceptance estimate for every lane."""
        k, adaptive = parse_spec(value, self.cfg.block_size)
        built = self.model.cfg.spec_max_k
        if k > built:
            raise ValueError(f"Runner.set_speculative_k: {value!r} drafts more than the {built} this runner holds")
        self.cfg = dataclasses.replace(self.cfg, speculative_k=value)
        self.adaptive = AdaptiveK(k, self.cfg.speculative_gamma) if adaptive else None

    def _spec_k(self, items, short, cross):
        """Drafts of a speculative step (``oasis_exec.runner.speculative``) a lane, or None (the ordinary step) when off, when
        a lane is short or crossing, or when no lane drafts. Fixed ``speculative_k``: the same ``k`` for every lane,
        fewer when a lane may emit fewer tokens (``DecodeItem.max_new``: the batch's least). ``auto``: one length for
        the step from every lane's acceptance estimate (``AdaptiveK.choose_batch``), a lane's at most its
        ``max_new - 1`` (its drafts past that count as rejected: ``accept``'s ``limits``); now and then an ordinary
        step, timed (``AdaptiveK.probe_due``)."""
        k = self.cfg.spec_max_k
        if not k or short != "none" or cross:
            return None
        if self.adaptive is None:
            k = max(0, min(k, min(it.max_new for it in items) - 1))
            return [k] * len(items) if k else None
        if self.adaptive.probe_due():  # an ordinary step, timed: the cost speculation is weighed against
            return None
        k = self.adaptive.choose_batch([it.lane for it in items])  # one length: the pass verifies the longest
        ks = [max(0, min(k, it.max_new - 1)) for it in items]
        return ks if max(ks) else None

    def _decode_spec(self, plan: RunnerCall, ks, sets, synth_ready, recorded) -> dict:
        """A speculative step (``oasis_exec.runner.speculative``): ``ks[i]`` drafts for lane ``i`` (the chain and the pass
        run ``k = max(ks)`` for all), one verification pass, the acceptance, then what the accepted tokens keep.
        Greedy and synthetic acceptance run on the device (``ModelExec.spec_core``), as CUDA graphs where the
        ordinary step may (``DecodeGraphs.spec_chain`` / ``spec_step``); rows above temperature 0 are verified by
        rejection sampling on the host between the pass and the commit (eager). Returns {req_id: [emitted tokens]}."""
        dev, items = self.device, plan.decode
        k = max(ks)
        lanes_list = [it.lane for it in items]
        pos_list = [it.position for it in items]
        lanes = torch.tensor(lanes_list, device=dev)
        rows = _rows_of(lanes_list, self.H)
        toks = torch.tensor([it.token for it in items], device=dev)
        pos = torch.tensor(pos_list, device=dev)
        params = [plan.sampling[it.req_id] for it in items]
        sampled = self.synth_accept is None and any(sp.temperature > 0 for sp in params)
        graphed = not sampled and self.cuda_graphs.ok(lanes_list)
        clock = _Clock(dev) if self.adaptive is not None and k >= 2 else None  # γ: the chain runs k - 1 head steps
        if clock is not None:
            clock.mark()
        if graphed:
            drafts = self.cuda_graphs.spec_chain(len(items), toks, pos, k)
        else:
            drafts = self.model.draft_chain(lanes, toks, pos, k)
        if clock is not None:
            clock.mark()
        if sampled:
            logits, aux, saved = self.model.decode_spec(lanes, rows, toks, drafts, pos, sets)
            req_ids = [it.req_id for it in items]
            if self.spec_draws is not None:
                u_acc, u_draw = self.spec_draws(req_ids, k + 1)
            else:
                u_acc = torch.rand(len(items), k + 1, generator=self.gen, device=dev, dtype=torch.float64)
                u_draw = torch.rand(len(items), k + 1, generator=self.gen, device=dev, dtype=torch.float64)
            n_acc, out = accept(logits, drafts, params, u_acc, u_draw, ks if min(ks) < k else None)
            n_t = torch.tensor(n_acc, device=dev)
            self.model.commit_spec(lanes, rows, pos, n_t, saved, sets, recorded)
            ar = torch.arange(len(items), device=dev)
            self.model.propose(lanes, aux[ar, n_t], torch.tensor([o[-1] for o in out], device=dev))
        else:
            lim = torch.tensor(ks, device=dev)
            n_forced = None
            if self.synth_accept is not None:  # benchmark only (dummy weights): drawn, not the target's verdict
                n_forced = torch.tensor([self.synth_accept.draw(ki, self.synth_rng.random) for ki in ks], device=dev)
            if graphed:
                logits, n_t, emitted = self.cuda_graphs.spec_step(len(items), toks, pos, drafts, lim, n_forced, sets)
            else:
                logits, n_t, emitted = self.model.spec_core(
                    lanes, rows, toks, pos, drafts, lim, n_forced, sets, recorded
                )
        if synth_ready is not None:  # the next step's synthetic sets, drawn while the GPU runs this step
            self.sources.presynth(lanes_list, synth_ready)
        if clock is not None:
            clock.mark()
        if not sampled:
            n_acc, out = rows_of(n_t, emitted)  # the step's one host synchronisation
        if clock is not None:  # synchronised: the marks' times are known
            chain_s, verify_s = clock.spans()
            self.adaptive.observe_cost(chain_s / (k - 1), verify_s)
        for it, ki, n in zip(items, ks, n_acc):
            self.spec_accepts[ki, n] += 1
            if self.adaptive is not None:
                self.adaptive.observe(it.lane, ki, n)
        self.last_logits = {it.req_id: logits[i, n_acc[i]] for i, it in enumerate(items)}
        self.last_logits_seq = {it.req_id: logits[i, : n_acc[i] + 1] for i, it in enumerate(items)}
        self._step_end(items, pos_list, recorded)  # no per-layer trace in a speculative step
        self.spec_steps += 1
        self.spec_lanes += len(items)
        self.spec_tokens += sum(len(o) for o in out)
        return {it.req_id: out[i] for i, it in enumerate(items)}

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
        return min(self.K, max(16, 1 << max(n - 1, 0).bit_length()))

    def _propose(self, short, lanes, pos_list, aux, tok) -> None:
        """The draft tokens after a step (``lanes``: the step's, on the device). In an all-short step only the lanes
        whose next step is their crossing draft: a short lane's draft token is read only from its crossing on (its
        lookahead query)."""
        if short != "all" or self.model.draft_attends:  # an attending head writes every position's K/V
            self.model.propose(lanes, aux, tok)
            return
        nxt = [i for i, p in enumerate(pos_list) if self.short.crossing(p + 2)]
        if nxt:
            idx = torch.tensor(nxt, device=self.device)
            self.model.propose(lanes[idx], aux[idx], tok[idx])

    def _cross(self, items) -> None:
        """Checks the crossing of short lanes (``ShortContext.crossing``): their host blocks were taken for this
        step, which copies every block written so far device->host on the device (``ModelExec._offload``) before
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
        """Host blocks a lane's request took as it grew: appended to its block table (sparse modes). Scalar writes
        (a fill kernel each, usually one block) so that no host-to-device copy synchronises the step."""
        have = self.lane_blocks[lane]
        if not have and self.short is not None:  # a short lane's first host blocks: its next step crosses
            self._crossing.add(lane)
        for b in blocks:
            self.store.host_table[lane, len(have)] = int(b)
            have.append(b)

    def release(self, req_id) -> None:
        """Drop what the runner holds for a request that ended early (the prompt KV scratch of a chunked prefill)."""
        self.scratch.pop(req_id, None)

    def counters(self) -> dict:
        if self.pipe is None:
            return {"units_fetched": 0, "missing": 0}
        return {"units_fetched": int(self.pipe.units), "missing": int(self.pipe.missing)}

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.wait_all()
        self.sources.save()
        if self.pipe is not None:
            self.pipe.close()
        self.cuda_graphs.close()

"""The engine: schedule -> execute -> update on the one scheduler (``oasis_core.scheduler``), and the request API
a server loop drives. A step executes one plan: its prefill chunks (a runner call each), then its decode batch.

    eng = Engine(ExecConfig(...))
    rid = eng.add_request(prompt_ids, SamplingParams(max_tokens=32, temperature=0.7, top_p=0.9, seed=1))
    while eng.has_work():
        for out in eng.step(): ...   # StepOutput(request_id, new_token_ids, finish_reason); several ids a
                                     # step with ExecConfig.speculative_k (cut at a stop token, at max_tokens)
    eng.abort(rid)
    eng.stats()                      # Stats: requests, lanes, slots, host blocks, prefetch, stage times

A request lives in the engine from ``add_request`` until the step that reports its ``finish_reason`` (or until
``abort``); after that the engine holds nothing of it, so a long-running server does not grow. Callers that want a
request's whole output collect it from the step outputs, as ``generate`` does.

Sampling (``oasis_exec.runner.sampling``): greedy at temperature 0, else temperature and nucleus (``top_p``) sampling with
counter-based per-request randomness, so a request with a ``seed`` yields the same tokens whatever batch it runs in.
Teacher forcing (``SamplingParams.forced``): the request's first outputs are the given tokens, each decoded through
the mode's own decode step (its selection, prefetch and draft head see the forced tokens), one a step (no decode
chain while a forced token is due), never stopped by a stop id; the server scores prompts this way in sparse modes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from oasis_core import modes
from oasis_core.scheduler import Scheduler

from ..config import ExecConfig
from ..runner.runner import Runner
from ..runner.sampling import _mix64, request_key, sample, uniform
from .scheduler import Admit, DecodeItem, EngineRequest, LaneAccounting, PrefillChunk, RunnerCall, SamplingParams

ACCEPT_SALT = 0xACCE97  # the acceptance draws of a speculative step: a stream of their own per request


@dataclass(frozen=True)
class StepOutput:
    request_id: int
    new_token_ids: tuple
    finish_reason: str | None = None


@dataclass(frozen=True)
class Stats:
    """A snapshot of the engine. Prefetch, stall and stage counters are cumulative (stage times come from the
    runner's per-stage timers, which it records with ``--profile`` on CUDA; without them ``hidden_fraction`` is
    NaN)."""

    running: int  # admitted requests (prefilling or decoding)
    waiting: int  # queued, not yet admitted
    lanes_used: int  # GPU lanes: one per admitted request
    lanes_free: int
    slots_per_lane: int  # GPU KV slots of one lane: L * H * the store's S (sparse modes) or L * H * max_blocks (paged)
    host_blocks_used: int  # host pool blocks (sparse modes; 0 / 0 in dense and quest)
    host_blocks_free: int
    prefetch_units: int  # (block, KV head) units copied host -> GPU
    prefetch_bytes: int
    hidden_fraction: float  # share of transfer time hidden behind compute; NaN = not measured
    stall_s: float  # time layers waited for their transfers
    stage_ms: dict = field(default_factory=dict)  # runner stage -> cumulative ms

    @property
    def gpu_slots_used(self) -> int:
        return self.lanes_used * self.slots_per_lane

    @property
    def gpu_slots_free(self) -> int:
        return self.lanes_free * self.slots_per_lane

    @property
    def lanes_total(self) -> int:
        return self.lanes_used + self.lanes_free

    @property
    def host_blocks_total(self) -> int:
        return self.host_blocks_used + self.host_blocks_free


class Engine:
    def __init__(self, cfg: ExecConfig, runner: Runner | None = None):
        self.cfg = cfg
        self.runner = runner or Runner(cfg)
        self.acct = LaneAccounting(
            max_lanes=self.runner.max_lanes,
            host_blocks=self.runner.host_blocks_total,
            block_size=cfg.block_size,
            needs_host=modes.get(cfg.mode).sparse,
            short=self.runner.short,
        )
        self.scheduler = Scheduler(
            accounting=self.acct,
            prefill_tokens=cfg.prefill_chunk,
            max_context=cfg.max_context,
            decode_with_prefill=cfg.prefill_interleave,
        )
        self._plan: RunnerCall | None = None  # the runner call being executed (rows of the sampling call)
        self._keys: dict = {}  # req_id -> random key, for requests the scheduler holds
        self._ids = itertools.count()
        self._units = 0  # prefetch units at the last counter read
        # every runner call carries the engine's sampler (RunnerCall.sampler): per-request keys, top_p, forced
        # tokens, and a speculative step's acceptance draws; a harness may install another here (``sampler``)
        self._own_sampler = self.sampler = _Sampler(self)
        shape = self.runner.shape
        self.slots_per_lane = (
            shape.n_layers * shape.n_kv_heads * (self.runner.store.S if cfg.sparse else cfg.max_blocks)
        )
        host = getattr(self.runner, "host", None)  # bytes of one (block, head) fetch: the host copy's (fp8: + scales)
        if host is not None:
            self.unit_bytes = host.unit_bytes
        else:
            self.unit_bytes = 2 * cfg.block_size * shape.head_dim * _element_size(self.runner.dtype)

    @property
    def max_lanes(self) -> int:
        return self.runner.max_lanes

    def add_request(self, prompt_ids, sampling: SamplingParams | None = None, synthetic_prefill=False) -> int:
        """Queue a request; ValueError when it can never be served (it is rejected: over the context limit, or
        more host blocks than the pool holds)."""
        sampling = sampling or SamplingParams()
        if sampling.forced and self.cfg.spec_max_k:
            raise ValueError("forced tokens (teacher forcing) need speculative_k 0: a speculative step drafts its own")
        r = EngineRequest(
            id=next(self._ids), prompt=list(prompt_ids), sampling=sampling, synthetic_prefill=synthetic_prefill
        )
        if not self.scheduler.add(r):
            need = len(r.prompt) + sampling.max_tokens
            detail = {
                "context_limit": f"exceeds max_context {self.cfg.max_context}",
                "host_capacity": f"needs {-(-need // self.cfg.block_size)} host blocks, the pool holds "
                f"{self.runner.host_blocks_total}",
            }.get(r.reason, "")
            raise ValueError(
                f"request rejected ({r.reason}): prompt ({len(r.prompt)}) + max_tokens ({sampling.max_tokens}) {detail}"
            )
        self._keys[r.id] = request_key(sampling.seed, self.cfg.seed, r.id)
        return r.id

    def abort(self, req_id) -> bool:
        """End a request now and free its lane and host blocks; False when it is unknown or already ended."""
        r = self.scheduler.abort(req_id)
        self._forget(req_id)
        return r is not None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list:
        """One plan: its prefill chunks (a runner call each), then its decode batch (one runner call)."""
        sch, runner = self.scheduler, self.runner
        plan = sch.schedule()
        outs = []
        for r in plan.preempted:  # its lane and host blocks are free again: drop what the runner holds of it
            runner.release(r.id, preempted=True)
        for r in plan.rejected:  # accepted earlier, rejected at re-admission (add_request raised for the others)
            if r.id in self._keys:
                self._forget(r.id)
                outs.append(StepOutput(r.id, (), r.reason))
        if plan.empty:
            return outs
        sampling = {r.id: r.sampling for r in sch.running.values()}
        admit = tuple(
            Admit(
                r.id,
                r.lane,
                tuple(r.host_blocks),
                r.synthetic_prefill and not r.preempted,
                r.prompt_len,
                r.sampling.seed if r.sampling.seed is not None else r.id,
            )
            for r in plan.admitted
        )
        tokens, first_logits = {}, {}
        for ch in plan.prefill:
            r = ch.req
            toks = tuple(r.token_at(p) for p in range(ch.start, ch.start + ch.n))
            got = self._call(
                RunnerCall(admit, PrefillChunk(r.id, r.lane, ch.start, toks, ch.last), (), sampling, 1, self.sampler)
            )
            admit = ()
            if ch.last and not r.output:  # a re-prefill's sample is output[-1] again, not a new token
                tokens[r.id] = got[r.id]
                first_logits.update(runner.last_logits)
        if plan.decode:
            items = []
            for r in sorted(plan.decode, key=lambda x: x.lane):
                pos = r.prompt_len + r.generated - 1
                items.append(DecodeItem(r.id, r.lane, r.token_at(pos), pos, r.max_tokens - r.generated))
            tokens.update(self._call(RunnerCall(admit, None, tuple(items), sampling, self._chain(plan), self.sampler)))
        if first_logits:  # every runner call resets them: the step's new tokens all keep their logits row
            runner.last_logits = {**first_logits, **runner.last_logits}
        # a decode yields one token, a speculative one several: cut after the first stop token, never past max_tokens
        new, emitted, stopped = {}, {}, []
        for rid, got in tokens.items():
            r = sch.running[rid]
            seq = [int(t) for t in got] if isinstance(got, (list, tuple)) else [int(got)]
            seq = seq[: max(1, r.max_tokens - len(r.output))]
            free = len(r.sampling.forced) - len(r.output)  # forced tokens never stop a request
            stop = next((i for i, t in enumerate(seq) if t in r.sampling.stop_ids and i >= free), None)
            if stop is not None:
                seq = seq[: stop + 1]
                stopped.append(rid)
            r.output.extend(seq)
            new[rid] = tuple(seq)
            emitted[rid] = len(seq)
        done = {r.id: r.reason for r in sch.update(plan, stopped=stopped, emitted=emitted)}
        for r, blocks in self.acct.take_grown():
            if r.lane >= 0:
                runner.extend_blocks(r.lane, blocks)
        for rid in done:
            self._forget(rid)
        return outs + [StepOutput(rid, seq, done.get(rid)) for rid, seq in new.items()]

    def generate(self, prompts, sampling: SamplingParams | None = None) -> list:
        ids = [self.add_request(p, sampling) for p in prompts]
        outs = {i: [] for i in ids}
        while self.has_work():
            for o in self.step():
                if o.request_id in outs:
                    outs[o.request_id].extend(o.new_token_ids)
        return [outs[i] for i in ids]

    def stats(self, read_counters: bool = True) -> Stats:
        """A snapshot. Reading the prefetch counter synchronises the device: with ``read_counters=False`` the value
        of the last read is reported (a server refreshing its metrics after every step reads it now and then)."""
        s, a, r = self.scheduler, self.acct, self.runner
        if read_counters:
            self._units = int(r.counters()["units_fetched"])
        stage = dict(r.trace.stage_ms)
        transfer_ms, stall_ms = stage.get("transfer", 0.0), stage.get("stall", 0.0)
        host_free = len(a.free_host)
        return Stats(
            running=len(s.running),
            waiting=len(s.waiting),
            lanes_used=r.max_lanes - len(a.free_lanes),
            lanes_free=len(a.free_lanes),
            slots_per_lane=self.slots_per_lane,
            host_blocks_used=r.host_blocks_total - host_free if r.host_blocks_total else 0,
            host_blocks_free=host_free if r.host_blocks_total else 0,
            prefetch_units=self._units,
            prefetch_bytes=self._units * self.unit_bytes,
            hidden_fraction=max(0.0, 1.0 - stall_ms / transfer_ms) if transfer_ms else math.nan,
            stall_s=stall_ms / 1e3,
            stage_ms=stage,
        )

    def close(self) -> None:
        self.runner.close()

    # -- internals ------------------------------------------------------------------------------------------------

    def _call(self, call: RunnerCall) -> dict:
        self._plan = call
        try:
            return self.runner.execute(call)
        finally:
            self._plan = None

    def _chain(self, plan) -> int:
        """The decode steps this step's batch may chain (``ExecConfig.decode_chain``, or ``spec_chain`` speculative
        steps): none while another request waits for work the chain would delay (a prefill under way, a queued
        request with a lane free for it), nor with a sampler other than the engine's (one installed by a harness may
        read the host every step)."""
        sch = self.scheduler
        limit = max(self.cfg.chain_max, self.cfg.spec_chain_max)  # ordinary steps' chains or speculative steps'
        if (
            limit == 1
            or plan.prefill
            or len(plan.decode) < len(sch.running)
            or (sch.waiting and self.acct.free_lanes)
            or self.sampler is not self._own_sampler
            or any(len(r.output) < len(r.sampling.forced) for r in sch.running.values())  # one forced token a step
        ):
            return 1
        return limit

    def _forget(self, req_id) -> None:
        self._keys.pop(req_id, None)
        self.runner.release(req_id)  # a request aborted mid chunked prefill leaves its prompt KV in the runner

    def _sample(self, logits, params):
        """The runner's sampling call: ``params`` are the call's SamplingParams in the order of the logits rows,
        which is the call's prefill request, else its decode items. A re-prefill after a preemption yields the
        request's last output token again (the next decode's input), so the draft sees the token it will decode."""
        call = self._plan
        rows = [call.prefill.req_id] if call.prefill is not None else [it.req_id for it in call.decode]
        if len(rows) != len(params):
            raise RuntimeError(f"sampling {len(params)} rows for a call of {len(rows)} requests")
        running = self.scheduler.running
        if call.prefill is not None and running[rows[0]].output:
            import torch

            return torch.tensor([running[rows[0]].output[-1]], dtype=torch.int64, device=logits.device)
        draws = [
            uniform(self._keys[rid], len(running[rid].output)) if sp.temperature > 0 else 0.0
            for rid, sp in zip(rows, params)
        ]
        tok = sample(logits, params, draws)
        forced = [
            (i, sp.forced[len(running[rid].output)])
            for i, (rid, sp) in enumerate(zip(rows, params))
            if len(running[rid].output) < len(sp.forced)
        ]
        if forced:  # teacher forcing: the next step and the draft head see the forced token
            import torch

            idx, val = zip(*forced)
            tok = tok.clone()
            tok[torch.tensor(idx, device=tok.device)] = torch.tensor(val, dtype=tok.dtype, device=tok.device)
        return tok

    def _spec_draws(self, req_ids, n):
        """A speculative step's uniforms (``oasis_exec.runner.speculative.accept``), [B, n] each: ``u_draw[:, j]`` is the
        draw of the request's output token ``len(output) + j`` (the ordinary step's stream), ``u_acc[:, j]`` the
        acceptance test of the draft there (a second stream of the same key)."""
        running = self.scheduler.running
        u_acc, u_draw = [], []
        for rid in req_ids:
            key, base = self._keys[rid], len(running[rid].output)
            u_draw.append([uniform(key, base + j) for j in range(n)])
            akey = _mix64(key ^ ACCEPT_SALT)
            u_acc.append([uniform(akey, base + j) for j in range(n)])
        return u_acc, u_draw


class _Sampler:
    """The engine's sampler of a runner call (``RunnerCall.sampler``): ``sampler(logits, params)`` draws each row's
    token with its request's key (``Engine._sample``), ``draws(req_ids, n)`` a speculative step's uniforms
    (``Engine._spec_draws``)."""

    def __init__(self, engine):
        self._engine = engine

    def __call__(self, logits, params):
        return self._engine._sample(logits, params)

    def draws(self, req_ids, n):
        return self._engine._spec_draws(req_ids, n)


def _element_size(dtype) -> int:
    import torch

    return torch.tensor([], dtype=dtype).element_size()

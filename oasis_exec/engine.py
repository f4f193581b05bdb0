"""The engine: schedule -> execute -> update, and the request API a server loop drives.

    eng = Engine(ExecConfig(...))
    rid = eng.add_request(prompt_ids, SamplingParams(max_tokens=32, temperature=0.7, top_p=0.9, seed=1))
    while eng.has_work():
        for out in eng.step(): ...   # StepOutput(request_id, new_token_ids, finish_reason)
    eng.abort(rid)
    eng.stats()                      # Stats: requests, lanes, slots, host blocks, prefetch, stage times

A request lives in the engine from ``add_request`` until the step that reports its ``finish_reason`` (or until
``abort``); after that the engine holds nothing of it, so a long-running server does not grow. Callers that want a
request's whole output collect it from the step outputs, as ``generate`` does.

Sampling (``oasis_exec.sampling``): greedy at temperature 0, else temperature and nucleus (``top_p``) sampling with
counter-based per-request randomness, so a request with a ``seed`` yields the same tokens whatever batch it runs in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .config import ExecConfig
from .runner import Runner
from .sampling import request_key, sample, uniform
from .scheduler import BatchPlan, SamplingParams, Scheduler


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
    slots_per_lane: int  # GPU KV slots of one lane: L * H * top_k (sparse modes) or L * H * max_blocks (paged)
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
        self.scheduler = Scheduler(self.runner.max_lanes, self.runner.host_blocks_total, cfg.block_size,
                                   cfg.prefill_chunk, needs_host=cfg.sparse, interleave=cfg.prefill_interleave)
        self._plan: BatchPlan | None = None  # the plan being executed (rows of the sampling call)
        self._keys: dict = {}  # req_id -> random key, for requests the scheduler holds
        self._units = 0  # prefetch units at the last counter read
        self.runner.sampler = self._sample  # the runner samples through the engine: per-request keys and top_p
        shape = self.runner.shape
        self.slots_per_lane = shape.n_layers * shape.n_kv_heads * (cfg.top_k if cfg.sparse else cfg.max_blocks)
        self.unit_bytes = 2 * cfg.block_size * shape.head_dim * _element_size(self.runner.dtype)

    @property
    def max_lanes(self) -> int:
        return self.runner.max_lanes

    def add_request(self, prompt_ids, sampling: SamplingParams | None = None, synthetic_prefill=False) -> int:
        sampling = sampling or SamplingParams()
        need = len(prompt_ids) + sampling.max_tokens
        if need > self.cfg.max_context:
            raise ValueError(f"prompt ({len(prompt_ids)}) + max_tokens ({sampling.max_tokens}) exceeds max_context "
                             f"{self.cfg.max_context}")
        if self.cfg.sparse and -(-need // self.cfg.block_size) > self.runner.host_blocks_total:
            raise ValueError(f"request needs {-(-need // self.cfg.block_size)} host blocks, the pool holds "
                             f"{self.runner.host_blocks_total}")
        rid = self.scheduler.add(list(prompt_ids), sampling, synthetic_prefill)
        self._keys[rid] = request_key(sampling.seed, self.cfg.seed, rid)
        return rid

    def abort(self, req_id) -> bool:
        """End a request now and free its lane and host blocks; False when it is unknown or already ended."""
        r = self.scheduler.abort(req_id)
        self._forget(req_id)
        return r is not None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list:
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        self._plan = plan
        try:
            tokens = self.runner.execute(plan)
        finally:
            self._plan = None
        done = {r.id: r.finish_reason for r in self.scheduler.update(plan, tokens)}
        for rid in done:
            self._forget(rid)
        return [StepOutput(rid, (tok,), done.get(rid)) for rid, tok in tokens.items()]

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
        s, r = self.scheduler, self.runner
        if read_counters:
            self._units = int(r.counters()["units_fetched"])
        stage = dict(r.stage_ms)
        transfer_ms, stall_ms = stage.get("transfer", 0.0), stage.get("stall", 0.0)
        host_free = len(s.free_host)
        return Stats(
            running=len(s.running), waiting=len(s.waiting),
            lanes_used=r.max_lanes - len(s.free_lanes), lanes_free=len(s.free_lanes),
            slots_per_lane=self.slots_per_lane,
            host_blocks_used=r.host_blocks_total - host_free if r.host_blocks_total else 0,
            host_blocks_free=host_free if r.host_blocks_total else 0,
            prefetch_units=self._units, prefetch_bytes=self._units * self.unit_bytes,
            hidden_fraction=max(0.0, 1.0 - stall_ms / transfer_ms) if transfer_ms else math.nan,
            stall_s=stall_ms / 1e3, stage_ms=stage,
        )

    def close(self) -> None:
        self.runner.close()

    # -- internals ------------------------------------------------------------------------------------------------

    def _forget(self, req_id) -> None:
        self._keys.pop(req_id, None)
        self.runner.release(req_id)  # a request aborted mid chunked prefill leaves its prompt KV in the runner

    def _sample(self, logits, params):
        """The runner's sampling call: ``params`` are the plan's SamplingParams in the order of the logits rows,
        which is the plan's prefill request, else its decode items."""
        plan = self._plan
        rows = [plan.prefill.req_id] if plan.prefill is not None else [it.req_id for it in plan.decode]
        if len(rows) != len(params):
            raise RuntimeError(f"sampling {len(params)} rows for a plan of {len(rows)} requests")
        running = self.scheduler.running
        draws = [uniform(self._keys[rid], len(running[rid].output)) if sp.temperature > 0 else 0.0
                 for rid, sp in zip(rows, params)]
        return sample(logits, params, draws)


def _element_size(dtype) -> int:
    import torch

    return torch.tensor([], dtype=dtype).element_size()

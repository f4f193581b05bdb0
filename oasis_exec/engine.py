"""The engine: schedule -> execute -> update, and the request API a server loop drives.

    eng = Engine(ExecConfig(...))
    rid = eng.add_request(prompt_ids, SamplingParams(max_tokens=32))
    while eng.has_work():
        for out in eng.step(): ...   # StepOutput(request_id, new_token_ids, finish_reason)
    eng.abort(rid)

``generate(prompts, sampling)`` runs to completion and returns the output ids of each prompt.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import ExecConfig
from .runner import Runner
from .scheduler import SamplingParams, Scheduler


@dataclass(frozen=True)
class StepOutput:
    request_id: int
    new_token_ids: tuple
    finish_reason: str | None = None


class Engine:
    def __init__(self, cfg: ExecConfig, runner: Runner | None = None):
        self.cfg = cfg
        self.runner = runner or Runner(cfg)
        self.scheduler = Scheduler(self.runner.max_lanes, self.runner.host_blocks_total, cfg.block_size,
                                   cfg.prefill_chunk, needs_host=cfg.sparse)

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
        return self.scheduler.add(list(prompt_ids), sampling, synthetic_prefill)

    def abort(self, req_id) -> bool:
        return self.scheduler.abort(req_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list:
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        tokens = self.runner.execute(plan)
        done = {r.id: r.finish_reason for r in self.scheduler.update(plan, tokens)}
        return [StepOutput(rid, (tok,), done.get(rid)) for rid, tok in tokens.items()]

    def generate(self, prompts, sampling: SamplingParams | None = None) -> list:
        ids = [self.add_request(p, sampling) for p in prompts]
        while self.has_work():
            self.step()
        return [self.scheduler.finished[i].output for i in ids]

    def close(self) -> None:
        self.runner.close()

"""Wrap the executor's engine (`oasis_exec.engine.engine.Engine`) to the server's `ServingEngine` protocol.

Engine options come from `oasis_exec.config.ExecConfig`: every field becomes a `--kebab-case` flag with the
field's help, so the server accepts exactly the options the executor does. `--model` names a preset, or a real
model (a `.gguf` file or a local Hugging Face directory) as a shorthand for `--model-path`; `--dummy` asks for random
weights. A real model is served under its own name (GGUF `general.name`, else the directory's name) and, unless
`--max-context` says otherwise, with a context of its trained positions.

Accounting for `/metrics`, read from the public `Engine.stats()` (the same definitions as `oasis_exec.tools.bench`):

- GPU slots: a lane is one request's reservation in the GPU KV store; a lane holds `L * H * top_k` selectable
  block slots in the sparse modes and `L * H * max_blocks` paged blocks in `dense` / `quest`.
- Host blocks: the scheduler's host pool blocks in use (sparse modes; dense modes keep no host copy).
- Prefetch bytes: (block, KV head) units fetched host -> GPU, times the bytes of one unit's K and V.
- Hidden fraction and stall time: from the runner's per-stage times, which it records with `--profile` on CUDA;
  without them the hidden fraction reads NaN.

Log-probabilities: the engine's runner keeps the logits each step sampled from (`Runner.last_logits`, request id
-> row), which `step` reads right after the engine's step for the requests that asked; a prompt is scored with the
model's dense reference forward (`Decoder.forward_dense`), the same weights and attention as the chunked prefill,
whose logits for the whole prompt ([T, vocab] float32) it keeps for the moment of the call. That is what a served
prompt's prefill computes in every mode; in a sparse mode (`ModelInfo.sparse_decode`) the server scores by forced
decode instead (`Sampling.forced_ids` -> `SamplingParams.forced`), see `scoring.py`.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from typing import Any

from .engine_protocol import EngineStats, ModelInfo, Sampling, StepOutput, TokenLogprobs

COUNTER_PERIOD_S = 0.1  # refresh of the prefetch byte counter while busy
MODEL_HELP = (
    "oasis_core model preset, or a real model: a .gguf file or a local Hugging Face directory (as --model-path)"
)
MAX_CONTEXT_HELP = "most tokens of one request (prompt + output); a real model's default: its trained positions"


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine options (`oasis_exec.config.add_engine_options`: every ExecConfig field, its default, and
    `--dummy`), with `--model` also taking a real model."""
    from oasis_exec.config import add_engine_options

    add_engine_options(
        p.add_argument_group("engine (oasis_exec.config.ExecConfig)"),
        helps={"model": MODEL_HELP, "max_context": MAX_CONTEXT_HELP},
    )


def exec_config_from_args(args: argparse.Namespace):
    from oasis_exec.config import engine_config

    fixed: dict[str, Any] = {}
    model = getattr(args, "model", None)
    path = getattr(args, "model_path", None)
    if not path and model and (os.path.isdir(model) or model.endswith(".gguf")):
        path = fixed["model_path"] = model
    if path and getattr(args, "dummy", False):
        raise ValueError("--dummy and --model-path exclude each other")
    if path:
        fixed["model"], positions = real_model(path)
        if getattr(args, "max_context", None) is None:
            fixed["max_context"] = positions
    return engine_config(args, **fixed)


@functools.lru_cache(maxsize=4)
def real_model(path: str) -> tuple[str, int]:
    """(served id, trained positions) of a `.gguf` file or a Hugging Face directory. The id is a short slug, as
    vLLM serves one: the file's stem (`SmolLM2-135M-Instruct.Q4_1`) or the directory's name -- never a local path,
    nor the GGUF's free-text `general.name` (`Smollm2 135M 8k Lc100K Mix1 Ep2`); `--served-model-name` overrides."""
    if path.endswith(".gguf"):
        from oasis_exec.model.gguf import read_gguf

        g = read_gguf(path)
        return os.path.splitext(os.path.basename(path))[0], g.spec.max_context_tokens
    from oasis_exec.model.decoder import read_hf_config

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"--model-path {path}: neither a .gguf file nor a Hugging Face directory with config.json")
    return os.path.basename(os.path.normpath(path)), read_hf_config(path).max_context_tokens


def build_engine(args: argparse.Namespace) -> "ExecutorEngine":
    cfg = exec_config_from_args(args)
    from oasis_exec.capture import freeze_startup_objects
    from oasis_exec.engine.engine import Engine  # imports torch

    eng = ExecutorEngine(Engine(cfg))
    freeze_startup_objects()  # the load's objects out of every later full collection (a step-long pause)
    return eng


class ExecutorEngine:
    """`ServingEngine` over `oasis_exec.engine.engine.Engine` (request ids are the engine's)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        cfg, shape = engine.cfg, engine.runner.shape
        self.model_info = ModelInfo(
            name=cfg.model,
            max_model_len=cfg.max_context,
            vocab_size=shape.vocab,
            eos_token_ids=(),
            model_dir=cfg.model_path,
            dummy=cfg.model_path is None,
            mode=cfg.mode,
            device=cfg.device,
            sparse_decode=cfg.mode_spec.selects,
        )
        self._counters_at = float("-inf")
        self._top_n: dict = {}  # request id -> alternatives a token, for the requests that asked for logprobs

    def add_request(self, prompt_ids, sampling: Sampling):
        from oasis_exec.engine.scheduler import SamplingParams

        if sampling.forced_ids and self.engine.cfg.spec_max_k:
            raise ValueError(
                "echo: scoring a prompt in a sparse mode decodes it with forced tokens, which speculative decoding "
                "cannot do; serve with --score-attention dense (the dense reference) or without --speculative-k"
            )
        sp = SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop_ids=tuple(sampling.stop_token_ids),
            seed=sampling.seed,
            forced=tuple(sampling.forced_ids),
        )
        rid = self.engine.add_request(list(prompt_ids), sp)
        if sampling.logprobs is not None:
            self._top_n[rid] = sampling.logprobs
        return rid

    def step(self) -> list[StepOutput]:
        outs = self.engine.step()
        asked = [o for o in outs if o.request_id in self._top_n]
        scored = self._score(asked) if asked else {}
        for o in outs:
            if o.finish_reason is not None:
                self._top_n.pop(o.request_id, None)
        return [
            StepOutput(o.request_id, tuple(o.new_token_ids), o.finish_reason, scored.get(o.request_id)) for o in outs
        ]

    def _score(self, outs) -> dict:
        """request id -> (TokenLogprobs of each new token,), from the logits the step sampled from (a speculative
        step: the runner's ``last_logits_seq``, a row per emitted token)."""
        import torch

        runner = self.engine.runner
        single, multi = runner.last_logits, getattr(runner, "last_logits_seq", None) or {}
        rows, chosen, top_n, spans = [], [], [], []
        for o in outs:
            n = len(o.new_token_ids)
            lg = multi.get(o.request_id)
            if lg is None and n == 1 and o.request_id in single:
                lg = single[o.request_id][None]
            if lg is None or lg.shape[0] < n:
                raise RuntimeError("logprobs: the engine's step did not leave one logits row per new token")
            rows.append(lg[:n])  # the engine may have cut a speculative run at a stop token
            chosen.extend(o.new_token_ids)
            top_n.extend([self._top_n[o.request_id]] * n)
            spans.append(n)
        lp = torch.log_softmax(torch.cat(rows).float(), -1)
        scored = _token_logprobs(lp, torch.tensor(chosen, device=lp.device)[:, None], top_n)
        out, i = {}, 0
        for o, n in zip(outs, spans):
            out[o.request_id] = tuple(scored[i : i + n])
            i += n
        return out

    def prompt_logprobs(self, prompt_ids, top_n: int) -> list:
        import torch

        with torch.inference_mode():
            logits = self.engine.runner.dec.forward_dense(list(prompt_ids))  # [T, V]
            rows = torch.log_softmax(logits[:-1].float(), -1)
            chosen = torch.tensor(list(prompt_ids[1:]), device=rows.device)[:, None]
            return [None, *_token_logprobs(rows, chosen, [top_n] * len(chosen))]

    def score_next(self, prompt_ids, top_n: int, sampling: Sampling):
        """`prompt_logprobs` and the first output token, sampled from the last prompt position's logits as the
        engine samples a request's first token from its prefill (prefill attention is dense in every mode)."""
        import torch

        from oasis_exec.engine.scheduler import SamplingParams
        from oasis_exec.runner.sampling import request_key, sample, uniform

        ids = list(prompt_ids)
        with torch.inference_mode():
            lp = torch.log_softmax(self.engine.runner.dec.forward_dense(ids).float(), -1)  # [T, V]
            sp = SamplingParams(max_tokens=1, temperature=sampling.temperature, top_p=sampling.top_p)
            key = request_key(sampling.seed, self.engine.cfg.seed, len(ids))
            tok = sample(lp[-1:], [sp], [uniform(key, 0) if sp.temperature > 0 else 0.0])  # [1]
            chosen = torch.tensor([*ids[1:], int(tok[0])], device=lp.device)[:, None]
            scored = _token_logprobs(lp, chosen, [top_n] * len(ids))
        return [None, *scored[:-1]], int(tok[0]), scored[-1]

    def check(self) -> None:
        if self.model_info.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()  # a lost device or a sticky kernel fault raises here

    def abort(self, request_id) -> None:
        self._top_n.pop(request_id, None)
        self.engine.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_work()

    def stats(self) -> EngineStats:
        now = time.monotonic()
        # Reading the prefetch counter syncs the device: at most every COUNTER_PERIOD_S while busy, always when idle.
        read = now - self._counters_at >= COUNTER_PERIOD_S or not self.engine.has_work()
        if read:
            self._counters_at = now
        s = self.engine.stats(read_counters=read)
        return EngineStats(
            running=s.running,
            waiting=s.waiting,
            gpu_slots_used=s.gpu_slots_used,
            gpu_slots_total=s.gpu_slots_used + s.gpu_slots_free,
            host_blocks_used=s.host_blocks_used,
            host_blocks_total=s.host_blocks_total,
            prefetch_bytes=s.prefetch_bytes,
            hidden_fraction=s.hidden_fraction,
            stall_s=s.stall_s,
            extra={"gpu_lanes_used": s.lanes_used, "gpu_lanes_total": s.lanes_total},
        )


def _token_logprobs(rows, chosen, top_n: list[int]) -> list[TokenLogprobs]:
    """rows: log-probabilities [N, V]; chosen: token ids [N, 1]; top_n: alternatives a row. One device -> host copy."""
    k = max(top_n, default=0)
    picked = rows.gather(1, chosen)[:, 0].tolist()
    if k == 0:
        return [TokenLogprobs(lp) for lp in picked]
    vals, ids = rows.topk(min(k, rows.shape[-1]), dim=-1)
    vals, ids = vals.tolist(), ids.tolist()
    return [TokenLogprobs(lp, tuple(zip(i[:n], v[:n]))) for lp, i, v, n in zip(picked, ids, vals, top_n)]

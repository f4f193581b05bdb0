"""The bench's view: what ``python -m oasis_exec bench`` measures, predicted by the simulator.

The executor's bench fills ``concurrency`` lanes with a synthesized prefill of ``context`` tokens each, runs
``warmup`` scheduler steps, then times ``steps`` more, every lane decoding in lockstep (a scheduler step runs a
decode chain of ``decode_chain`` tokens); it reports TPOT (a token's time), tok/s (lanes / TPOT) and host->GPU bytes
a decode pass. ``run_point`` builds the same closed loop in the simulator (``SimConfig.decode_only``,
``kv_budget_gb`` with the executor's lane rules, ``no_transfer`` for the twin) and reads the same three figures off
the step log.

A **bench point** (one JSON object a line, ``traces/bench_points/``) names a measured run: the configuration
(``model``, ``mode``, ``engine`` oasis | vllm, ``context``, ``lanes``, ``kv_budget_gb``, ``top_k``, ``hot_slots``,
``fetch_ratio``, ``no_transfer``, ``transfer_path``, ``decode_chain``, ``host_kv_dtype``, ``synthetic_preset``),
what it measured (``tpot_ms``, ``tok_s``, ``bytes_per_step`` or null) and where it comes from (``weights`` real |
dummy, ``selection``, ``device``, ``date``, ``commit``, ``source``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Optional

from oasis_core import modes
from oasis_core.specs import get_model
from oasis_core.trace import Trace, TraceRequest

from .config import ConfigError, SimConfig

WARMUP_STEPS = 4  # the bench's defaults (oasis_exec.bench): warm-up and timed scheduler steps
TIMED_STEPS = 24
# (request, layer) groups the bench's selection is simulated on: ~10% sampling error a group on the victim cache's
# bytes over the bench's 192 timed passes (its fetches are rare events, each group's heads drawn together), ~1.3% here
SELECTION_GROUPS = 64
# vLLM's harness (experiments/dense_vs_lookahead_throughput/vllm_dense.py): ``--decode``'s default, and vLLM 0.26's
# token budget a step (``max_num_batched_tokens`` for the LLM class on a GPU of >= 70 GiB: H100, H200)
VLLM_HARNESS_DECODE = 128
VLLM_BATCHED_TOKENS = 16384


@dataclass(frozen=True)
class BenchPoint:
    model: str
    mode: str
    context: int
    lanes: int
    tpot_ms: Optional[float] = None
    tok_s: Optional[float] = None
    bytes_per_step: Optional[float] = None
    engine: str = "oasis"
    hardware: str = "h200"
    kv_budget_gb: Optional[float] = None
    top_k: int = 128
    hot_slots: Optional[int] = None
    fetch_ratio: float = 0.05
    no_transfer: bool = False
    transfer_path: str = "uva"
    decode_chain: int = 8
    host_kv_dtype: str = "auto"
    synthetic_preset: str = "smollm2"
    weights: str = "dummy"
    selection: str = "synthetic"
    device: str = "NVIDIA H200"
    decode: Optional[int] = None  # vLLM points: the harness's decode tokens a request (None: VLLM_HARNESS_DECODE)
    block_score: Optional[str] = None  # the executor's block scorer (its record's block_score; None: SimConfig's)
    token_rank: Optional[int] = None  # with block_score tokens: the record's token_rank
    warmup: Optional[int] = None  # the run's warm-up and timed scheduler steps (None: the bench's defaults)
    steps: Optional[int] = None
    date: str = ""
    commit: str = ""
    source: str = ""
    note: str = ""

    @property
    def name(self) -> str:
        s = f"{self.engine}:{self.model}:{self.mode}:{self.context}x{self.lanes}"
        if modes.get(self.mode).selects:
            s += f":K{self.top_k}"
            if self.hot_slots:
                s += f":S{self.hot_slots}"
        if self.no_transfer:
            s += ":nt"
        if self.host_kv_dtype != "auto":
            s += f":{self.host_kv_dtype}"
        return s + (f"@{self.commit}" if self.commit else "")

    def measured_tpot_s(self) -> Optional[float]:
        if self.tpot_ms is not None:
            return self.tpot_ms / 1e3
        if self.tok_s:
            return self.lanes / self.tok_s
        return None

    def config(self, **over) -> SimConfig:
        """The simulator's configuration of this point (``over``: more SimConfig fields, e.g. the predictor).

        The selection is simulated as the executor draws it: for every full layer (the generator's per-layer draft
        error ramp is the executor's) and for ``ceil(SELECTION_GROUPS / policy_layers)`` requests averaged
        (``profile_replicas``), so that the bytes a step carry a small sampling error where fetches are rare (a
        victim cache); ``run_point`` also covers the bench's passes with the profile."""
        try:
            layers = get_model(self.model).n_full_layers
        except ValueError:
            layers = 1  # an unknown model: make_config says so
        vals = dict(
            model=self.model,
            hardware=self.hardware,
            mode=self.mode,
            engine=self.engine,
            top_k=self.top_k,
            hot_slots=self.hot_slots,
            fetch_ratio=self.fetch_ratio,
            transfer_path=self.transfer_path,
            host_kv_dtype=self.host_kv_dtype,
            kv_budget_gb=self.kv_budget_gb,
            decode_only=True,
            no_transfer=self.no_transfer,
            decode_chain=self.decode_chain,
            concurrency=self.lanes,
            synthetic={"preset": self.synthetic_preset},
            timeline_steps=0,
            short_context=False,
            max_batch=max(256, self.lanes),
            policy_layers=layers,
        )
        vals.update({k: getattr(self, k) for k in ("block_score", "token_rank") if getattr(self, k) is not None})
        vals.update(over)
        pl = vals["policy_layers"]  # SELECTION_GROUPS groups whatever the layers sampled (a bad value: make_config)
        if "profile_replicas" not in over and isinstance(pl, int) and pl >= 1:
            vals["profile_replicas"] = -(-SELECTION_GROUPS // pl)
        from .config import make_config

        return make_config(vals)


def load_points(paths) -> list:
    """Bench points from ``.jsonl`` files and folders of them (sorted), each tagged with its file in ``source``
    when it names none."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(dp, f) for dp, _d, fs in os.walk(p) for f in fs if f.endswith(".jsonl"))
        else:
            files.append(p)
    names = {f.name for f in fields(BenchPoint)}
    out = []
    for f in files:
        try:
            text = open(f, encoding="utf-8").read()
        except OSError as e:
            raise ConfigError(f"{f}: cannot read: {e.strerror}") from None
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{f}:{i}: not JSON: {e.msg}") from None
            bad = sorted(set(d) - names)
            if bad:
                raise ConfigError(f"{f}:{i}: {bad[0]}: unknown bench-point field")
            d.setdefault("source", f)
            try:
                out.append(BenchPoint(**d))
            except TypeError as e:
                raise ConfigError(f"{f}:{i}: {e}") from None
    return out, files


def dumps_point(p: BenchPoint) -> str:
    return json.dumps({k: v for k, v in asdict(p).items() if v not in (None, "")}, sort_keys=True)


def bench_trace(context: int, lanes: int, output_tokens: int) -> Trace:
    return Trace(tuple(TraceRequest(i, 0.0, context, output_tokens) for i in range(lanes)))


def vllm_first_tokens(lanes: int, context: int, budget: int = VLLM_BATCHED_TOKENS) -> list:
    """Tokens each request of vLLM's harness holds when its clock starts.

    ``vllm_dense.py`` adds ``lanes`` prompts of ``context`` tokens at once; vLLM's scheduler fills a step's token
    budget with the running requests' decodes first (one token each), then the waiting prompts' chunks in order, and
    a prompt's last chunk samples its first token. The clock starts after the step in which the last request got its
    first token: by then a request whose prompt finished ``j`` steps earlier holds ``j + 1`` tokens. (H100 probes of
    1dc31ae, mean tokens a request at the start: 7,800 x 16 5.0, 2,048 x 64 4.5; H200 8,096 x 32 9.0; Gemma 32,000 x
    16 16.0; this rule: 4.5, 5.4, 8.5, 16.0.)"""
    done = [0] * lanes
    first = [0] * lanes  # the step of each request's first token (0: not yet)
    step = running = 0
    while running < lanes:
        step += 1
        left = budget - running
        for i in range(lanes):
            if first[i] or left <= 0:
                continue
            take = min(left, context - done[i])
            done[i] += take
            left -= take
            if done[i] >= context:
                first[i] = step
        running = sum(1 for f in first if f)
    return [step - f + 1 for f in first]


def vllm_harness_tpot(step_s, lanes: int, context: int, decode: int, budget: int = VLLM_BATCHED_TOKENS):
    """TPOT as ``vllm_dense.py`` reports it: ``decode_s · lanes / decode_tokens`` after its clock starts
    (``vllm_first_tokens``), where the requests that started early finish early and the last steps run fewer of them.
    ``step_s(batch)``: one decode step's seconds at that batch. Where the step barely grows with the batch (vLLM's host
    loop on a small model) this is above the steady step: 3.54 ms reported for SmolLM2 8,096 x 32 (decode 64) on the
    H200 over 0.198 s / 64 steps = 3.09 ms a step; 3.70 against 3.19 ms at 7,800 x 32 on the H100."""
    left = sorted(decode + 1 - t for t in vllm_first_tokens(lanes, context, budget))
    secs = toks = 0.0
    done = 0
    for i, n in enumerate(left):  # batches of lanes - i requests for n - done steps
        if n > done:
            b = lanes - i
            secs += (n - done) * step_s(b)
            toks += (n - done) * b
            done = n
    return secs * lanes / toks


@dataclass(frozen=True)
class BenchResult:
    tpot_s: float
    tok_s: float
    bytes_per_step: float  # host->GPU bytes a decode pass (a token of every lane)
    lanes: int  # lanes that ran together (the budget's, at most the concurrency)
    wall_s: float
    steps: int

    def as_dict(self) -> dict:
        return {
            "tpot_ms": round(self.tpot_s * 1e3, 4),
            "tok_s": round(self.tok_s, 2),
            "bytes_per_step": round(self.bytes_per_step),
            "lanes": self.lanes,
            "wall_s": round(self.wall_s, 3),
            "steps": self.steps,
        }


def run_point(p: BenchPoint, warmup: int | None = None, steps: int | None = None, **over) -> BenchResult:
    """Simulate the bench run of ``p``: lanes decoding in lockstep, ``warmup`` then ``steps`` scheduler steps of
    ``decode_chain`` tokens (default: the point's own, else the bench's defaults); TPOT = mean decode-pass time of the
    timed passes.

    The selection's profile covers every pass of the run (``profile_steps``, unless ``over`` names it): the bench
    starts each row from the generator's current set, and a victim cache then fills for tens to hundreds of passes
    (the cap times the passes against the near-miss window), so the bench's timed passes are not the steady tail
    of a 64-pass profile. With dummy weights the prompt is not clipped to the model's positions (``max_context``),
    as the executor does not clip it."""
    from .sim import simulate

    if p.engine == "vllm":
        return run_vllm_harness(p, **over)
    warmup = warmup if warmup is not None else p.warmup if p.warmup is not None else WARMUP_STEPS
    steps = steps if steps is not None else p.steps if p.steps is not None else TIMED_STEPS
    cfg = p.config(**over)
    chain = min(cfg.decode_chain, cfg.block_size)
    out_tokens = (warmup + steps + 1) * chain
    if "profile_steps" not in over:
        cfg = cfg.with_(profile_steps=max(cfg.profile_steps, out_tokens + 1))
    if p.weights == "dummy" and "max_context" not in over:
        # dummy weights have no trained positions: the executor's bench runs any context (its lanes sized as
        # bench_lanes sizes them), where the model's limit would clip the prompt
        cfg = cfg.with_(max_context=p.context + out_tokens + 2 * cfg.block_size)
    res = simulate(cfg, bench_trace(p.context, p.lanes, out_tokens))
    lg = res.steps
    lo, hi = warmup * chain, (warmup + steps) * chain
    idx = [i for i in range(lo, min(hi, len(lg.dur))) if lg.decode[i] and not lg.prefill[i]]
    if not idx:
        raise ConfigError(f"bench point {p.name}: no decode step to time")
    dur = sum(lg.dur[i] for i in idx) / len(idx)
    n = max(lg.decode[i] for i in idx)
    nbytes = sum(lg.h2d[i] for i in idx) / len(idx)
    return BenchResult(dur, n / dur, nbytes, n, res.wall_s, len(lg.dur))


def run_vllm_harness(p: BenchPoint, **over) -> BenchResult:
    """Simulate what vLLM's harness (``vllm_dense.py``) measures for ``p``: from the step in which the last request
    got its first token (``vllm_first_tokens``), every request decoding the rest of its ``decode + 1`` tokens in one
    closed loop (the early ones finish first), and TPOT = the loop's seconds · lanes / its tokens
    (``vllm_harness_tpot``'s rule, here on the simulator's own step log)."""
    from .sim import simulate

    decode = p.decode or VLLM_HARNESS_DECODE
    cfg = p.config(**over)
    if p.weights == "dummy" and "max_context" not in over:
        cfg = cfg.with_(max_context=p.context + decode + 2 * cfg.block_size)
    tok0 = vllm_first_tokens(p.lanes, p.context)
    trace = Trace(tuple(TraceRequest(i, 0.0, p.context + t - 1, decode + 1 - t) for i, t in enumerate(tok0)))
    res = simulate(cfg, trace)
    lg = res.steps
    idx = [i for i in range(len(lg.dur)) if lg.decode[i] and not lg.prefill[i]]
    if not idx:
        raise ConfigError(f"bench point {p.name}: no decode step to time")
    secs = sum(lg.dur[i] for i in idx)
    toks = sum(lg.decode[i] for i in idx)
    tpot = secs * p.lanes / toks
    nbytes = sum(lg.h2d[i] for i in idx) / len(idx)
    return BenchResult(tpot, p.lanes / tpot, nbytes, max(lg.decode[i] for i in idx), res.wall_s, len(lg.dur))

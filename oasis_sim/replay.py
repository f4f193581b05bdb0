"""Replay an executor recording in the simulator: same workload, same configuration, same measured quantities.

``replay(rec, predictor=None) -> ReplayResult`` builds the ``SimConfig`` of the recording (:func:`sim_config`),
runs it, and reads the simulated run the way the executor's bench reads the real one:

- **workload**: the bench admits ``concurrency`` requests of ``context`` tokens with a *synthesized* prefill, then
  decodes ``warmup_steps + steps`` tokens in lockstep and times the last ``steps``. The replay runs the same
  requests closed-loop with the whole prefill in one chunk (``chunk_tokens = concurrency × context``), so every
  request starts decoding in the same step, and memory sized so the recorded batch is admitted whole (the executor
  already decided admission; the replay checks timing, not capacity).
- **window**: the decode steps with the full batch and no prefill, after skipping ``warmup_steps`` of them; the
  next ``steps`` steps are the window. TPOT p50 / p99 use the bench's definitions (median; nearest rank) over the
  window's step durations; throughput = ``concurrency × steps / Σ durations``.
- **stages**: the predictor is wrapped in a tap that logs every ``time(op, shape)`` call per step (a step's calls
  end with ``lm_head``), giving the predicted per-layer stage times -- ``gemm`` (QKV/O/MLP + norms), ``attn``,
  ``pred`` (score + top-K), ``select``, ``transfer`` (the copy path: latency + bytes / rate), ``layers`` (all of
  the compute stream's layer time, stalls included) and ``stall``.
- **trace recordings** (``workload = "trace"``, written by ``serve --record``): the recorded requests run
  open-loop at their arrival times, at most ``max_lanes`` in the batch, prefill chunked as the server did; the
  window is every step that decoded, TPOT / TTFT / throughput are the simulator's own per-request figures (the
  recorder measures the served requests the same way), and per-step figures are per decode step.
- **selections**: when the recording names a selection file (``results.selection_file``), its recorded block
  sets drive the policy (``selection=replay``, converted to the simulator's replay JSON); otherwise the seeded
  synthetic generator with the recording's parameters.

Metric keys (:data:`METRICS`) are shared with ``measured_metrics(rec)``; ``validate`` compares the two.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from typing import Optional

from oasis_core import modes
from oasis_core.geometry import KVGeometry
from oasis_core.recording import Recording, closed_loop_requests, load_selection
from oasis_core.specs import get_link
from oasis_core.trace import Trace

from .config import ConfigError, SimConfig, make_config
from .layer_kinds import LayerKinds
from .predictor import RooflinePredictor, TimePredictor
from .sim import SCATTER_EFFICIENCY, SimResult, simulate
from .timeline import exec_timeline

# Metrics compared by validate: name -> (unit, description)
METRICS = {
    "tpot_ms_p50": ("ms", "TPOT p50"),
    "tpot_ms_p99": ("ms", "TPOT p99"),
    "throughput_tok_s": ("tok/s", "decode throughput"),
    "ttft_ms_p50": ("ms", "TTFT p50"),
    "pcie_h2d_bytes_per_step": ("B", "host->GPU bytes per step"),
    "stall_ms_per_step": ("ms", "stall per step"),
    "layer_ms_layers": ("ms", "per layer: compute stream (stalls included)"),
    "layer_ms_gemm": ("ms", "per layer: GEMMs"),
    "layer_ms_attn": ("ms", "per layer: attention"),
    "layer_ms_pred": ("ms", "per layer: top-K prediction"),
    "layer_ms_select": ("ms", "per layer: selection"),
    "layer_ms_transfer": ("ms", "per layer: transfer (host gather + copy)"),
}


def _pct_nearest(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def n_layers(rec: Recording) -> int:
    from oasis_core.specs import get_model

    return get_model(rec.config["model"]).n_layers


def measured_metrics(rec: Recording) -> dict:
    """The recording's measurements under :data:`METRICS` keys (None where not measured)."""
    r = rec.results
    L = n_layers(rec)
    st = r["stage_ms_per_step"]
    out = {k: None for k in METRICS}
    out.update(
        tpot_ms_p50=r["tpot_ms_p50"],
        tpot_ms_p99=r["tpot_ms_p99"],
        throughput_tok_s=r["throughput_tok_s"],
        ttft_ms_p50=r["ttft_ms_p50"],
        stall_ms_per_step=r["stall_ms_per_step"],
        pcie_h2d_bytes_per_step=r["bytes_per_step"].get("pcie_h2d"),
    )
    for stage in ("layers", "gemm", "attn", "pred", "select"):
        if stage in st:
            out[f"layer_ms_{stage}"] = st[stage] / L
    if "transfer" in st or "host_gather" in st:
        out["layer_ms_transfer"] = (st.get("transfer", 0.0) + st.get("host_gather", 0.0)) / L
    return out


class TapPredictor(TimePredictor):
    """Delegates to ``inner`` and logs ``(op, shape, seconds)`` per step; a step's last call is ``lm_head``."""

    def __init__(self, inner: TimePredictor):
        self.inner = inner
        self.steps: list[list] = []
        self._cur: list = []

    def time(self, op, shape):
        t = self.inner.time(op, shape)
        self._cur.append((op, dict(shape), t))
        if op == "lm_head":
            self.steps.append(self._cur)
            self._cur = []
        return t

    def __getattr__(self, name):  # expose the inner predictor's extras (e.g. a fitted copy rate)
        return getattr(self.inner, name)


# ----------------------------------------------------------------------------------------------------------------


def _replay_sets_json(rec: Recording, out_path: str) -> int:
    """Write the recording's selected sets as the simulator's ReplaySets JSON; returns the layers sampled (P)."""
    sets, layers = load_selection(rec.selection_path(), rec.config["top_k"])
    steps = [{"true_next": s.tolist(), "draft": s.tolist(), "proxy": s.tolist()} for s in sets[1:]]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"top_k": rec.config["top_k"], "initial": sets[0].tolist(), "steps": steps}, f)
    return len(layers)


def sim_config(
    rec: Recording,
    h2d_bytes_per_s: Optional[float] = None,
    replay_file: Optional[str] = None,
    policy_layers: Optional[int] = None,
    **overrides,
) -> SimConfig:
    """The ``SimConfig`` that mirrors the recording (see the module docstring). Raises ``ConfigError`` naming
    the recording when a field has no simulator equivalent (unknown model or hardware preset, ...)."""
    c = rec.config
    n, ctx = c["concurrency"], c["context"]
    out_tokens = _closed_loop_output(c)
    values = dict(
        model=c["model"],
        hardware=c["hardware"],
        mode=c["mode"],
        top_k=c["top_k"],
        block_size=c["block_size"],
        fetch_ratio=c["fetch_ratio"],
        seed=c["seed"],
        concurrency=n,
        max_batch=max(256, n),
        chunk_tokens=n * ctx,
        transfer_path=c["transfer_path"] or "dma",
        timeline_steps=out_tokens + 1,
        profile_steps=max(64, out_tokens + 1),
        decode_chain=1,  # a recording's steps are single steps (recording_from_bench refuses chained runs)
        spec_chain=1,
    )
    requests = [(n, ctx, out_tokens)]  # (count, prompt, output) the memory must hold at once
    if c["workload"] == "trace":  # open loop at the recorded arrival times, the server's batch and chunk limits
        reqs = rec.trace.requests
        longest = max(q.output_tokens for q in reqs)
        del values["concurrency"]
        values.update(
            max_batch=c.get("max_lanes") or max(256, n),
            timeline_steps=min(c["steps"] + 1, 1000),
            profile_steps=max(64, longest + 1),
        )
        if c.get("prefill_chunk"):
            values["chunk_tokens"] = c["prefill_chunk"]
        else:
            del values["chunk_tokens"]
        requests = [(1, q.prompt_tokens, q.output_tokens) for q in reqs]
    if c.get("host_kv_dtype") and c["host_kv_dtype"] != "auto":  # the recorded host copy (fp8: half the bytes)
        values["host_kv_dtype"] = c["host_kv_dtype"]
    if c.get("tensor_parallel", 1) > 1:  # rank 0 of a tensor-parallel run: its share of the model, the all-reduces
        values["tensor_parallel"] = c["tensor_parallel"]
    if c.get("speculative_k"):  # speculative: the draft length, and the measured acceptance to draw from
        values["speculative_k"] = c["speculative_k"]
        if c.get("speculative_gamma") is not None:
            values["speculative_gamma"] = c["speculative_gamma"]
        if rec.results.get("accepted_hist"):
            values["speculative_accepted_hist"] = dict(rec.results["accepted_hist"])
        if c.get("spec_predict"):  # the executor's prediction beside the verify pass (oasis_sim.spec_pipeline)
            values["spec_predict"] = c["spec_predict"]
    if "topk_kernel" in c and c["topk_kernel"] is None:  # a sparse run that made no top-K (the recorder: sparse only)
        values["prediction_topk"] = False
    if c.get("no_transfer"):  # the bench's copy-less twin: planned as recorded, nothing copied
        values["no_transfer"] = True
    if c.get("hot_slots"):  # the recorded hot cache (hisparse) or victim cache (a background mode)
        values["hot_slots"] = c["hot_slots"]
    if c.get("synthetic"):
        values["synthetic"] = dict(c["synthetic"])
    if c.get("fetch_policy"):  # the recorded policy; an adaptive one needs the exact per-step plans
        from oasis_core.fetchcap import get_policy

        values["fetch_policy"] = c["fetch_policy"]
        if not get_policy(c["fetch_policy"]).static:
            values["policy_sampling"] = "exact"
    if h2d_bytes_per_s:
        values["h2d_bytes_per_s"] = float(h2d_bytes_per_s)
    if replay_file:
        values.update(selection="replay", replay_file=replay_file, policy_layers=policy_layers or 1)
    values.update(overrides)
    try:
        cfg = make_config(values)
        geo = KVGeometry(cfg.model_spec, cfg.block_size)
        _check_layer_kinds(c, cfg.model_spec)
    except ConfigError as e:
        raise ConfigError(f"{rec.source or rec.name}: config: {e}") from None
    # Memory that admits the whole recorded batch (every recorded request of a trace) at once.
    kv = sum(k * (p + o + cfg.block_size) for k, p, o in requests) * geo.bytes_per_token
    count = sum(k for k, _p, _o in requests)
    need_hbm = (
        cfg.model_spec.weight_bytes + kv + count * (geo.resident_bytes(cfg.resident_slots) + cfg.draft_state_bytes)
    )
    hbm = max(cfg.hardware_spec.hbm_bytes, need_hbm * 1.1 / cfg.hbm_utilization)
    return cfg.with_(hbm_bytes=float(hbm), host_bytes=float(max(kv * 1.1, 1e9)))


def _check_layer_kinds(c, model) -> None:
    """A recording that names its layer kinds (``config.layer_windows``: a hybrid run) must match the preset it is
    replayed on, layer for layer (a preset without windows: every layer full)."""
    lw = c.get("layer_windows")
    if lw is None:
        return
    preset = list(model.layer_windows) or [None] * model.n_layers
    if list(lw) != preset:
        raise ConfigError(
            f"layer_windows: the recorded layer kinds differ from model {c['model']}'s {preset}, got {list(lw)}"
        )


def _closed_loop_output(c) -> int:
    """Output tokens of a closed-loop replay's requests: the warm-up and timed steps, plus the prefill's token; a
    speculative run's ``(steps + 1) × (k + 1)`` as the bench's, so that none finishes in the window."""
    out = c["warmup_steps"] + c["steps"] + 1
    if c.get("speculative_k"):
        from oasis_core.speculation import parse_spec

        out *= parse_spec(c["speculative_k"], c["block_size"])[0] + 1
    return out


def workload(rec: Recording) -> Trace:
    """The requests the replay runs: closed-loop recordings decode one token more than they time-and-warm, since
    the simulated prefill yields the first token (the bench's synthesized prefill does not)."""
    c = rec.config
    if c["workload"] != "closed-loop":
        return Trace(rec.trace.requests)
    return Trace(closed_loop_requests(c["concurrency"], c["context"], _closed_loop_output(c)))


@dataclass
class ReplayResult:
    recording: Recording
    cfg: SimConfig
    sim: SimResult
    window: list  # indices into sim.steps of the timed steps
    predicted: dict  # METRICS keys
    stage_ms_per_step: dict
    op_steps: list = field(default_factory=list)  # per window step: [(op, shape, seconds)]

    def files(self) -> dict:
        """Output files: the simulator's own (timeline.json = predicted) + replay.json + exec_timeline.json."""
        out = self.sim.files()
        out["replay.json"] = (
            json.dumps(
                {
                    "recording": self.recording.name,
                    "config": self.cfg.to_dict(),
                    "window_steps": len(self.window),
                    "predicted": self.predicted,
                    "measured": measured_metrics(self.recording),
                    "stage_ms_per_step": self.stage_ms_per_step,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )
        out["exec_timeline.json"] = json.dumps(exec_timeline(self.recording), separators=(",", ":"))
        return out


def _copy_rate(cfg: SimConfig) -> tuple:
    hw = cfg.hardware_spec
    return (cfg.h2d_bytes_per_s or hw.h2d_bytes_per_s * SCATTER_EFFICIENCY), get_link(hw.pcie_link).latency_s


def replay(
    rec: Recording,
    predictor: Optional[TimePredictor] = None,
    work_dir: Optional[str] = None,
    use_selection: bool = True,
    config: Optional[dict] = None,
) -> ReplayResult:
    """Simulate the recording. ``predictor``: default the roofline of its model and hardware; a predictor with an
    ``h2d_bytes_per_s`` attribute (the fitted one) also sets the copy rate, and one with a ``gather_sm_share``
    other than None the UVA gather's SM share. ``work_dir``: where the converted selection file goes (a temporary
    directory by default). ``config``: ``SimConfig`` fields set over the recording's, e.g. ``{"fetch_policy":
    "drift", "policy_sampling": "exact"}`` (a recording carries ``fetch_ratio``, not the bench's ``fetch_policy``,
    so a replay is of ``Fixed(fetch_ratio)`` without it)."""
    h2d = getattr(predictor, "h2d_bytes_per_s", None) if predictor is not None else None
    share = getattr(predictor, "gather_sm_share", None) if predictor is not None else None
    overrides = {} if share is None else {"gather_sm_share": float(share)}
    overrides.update(config or {})
    tmp = None
    replay_file = policy_layers = None
    if use_selection and rec.selection_path():
        if work_dir is None:
            tmp = tempfile.TemporaryDirectory()
            work_dir = tmp.name
        os.makedirs(work_dir, exist_ok=True)
        replay_file = os.path.join(work_dir, "selection_replay.json")
        policy_layers = _replay_sets_json(rec, replay_file)
    try:
        cfg = sim_config(rec, h2d, replay_file, policy_layers, **overrides)
        inner = predictor or RooflinePredictor(cfg.model_spec, cfg.hardware_spec)
        tap = TapPredictor(inner)
        res = simulate(cfg, workload(rec), tap)
    finally:
        if tmp is not None:
            tmp.cleanup()
    log = res.steps
    if len(tap.steps) != len(log.dur):
        raise RuntimeError(f"replay: predictor tap saw {len(tap.steps)} steps, the engine ran {len(log.dur)}")
    c = rec.config
    n = c["concurrency"]
    trace = c["workload"] == "trace"
    if trace:
        window = [i for i in range(len(log.dur)) if log.decode[i] > 0]
        if not window:
            raise RuntimeError(f"{rec.name}: replay: no step decoded")
    else:
        full = [i for i in range(len(log.dur)) if log.decode[i] == n and log.prefill[i] == 0]
        window = full[c["warmup_steps"] : c["warmup_steps"] + c["steps"]]
        if not window:
            raise RuntimeError(f"{rec.name}: replay: no decode step ran the whole batch of {n}")
    L = cfg.model_spec.n_layers
    rate, lat = _copy_rate(cfg)
    durs = [log.dur[i] for i in window]
    stages = {k: 0.0 for k in ("layers", "gemm", "attn", "pred", "select", "transfer", "stall")}
    mode = modes.get(cfg.mode)
    background = mode.background
    kinds = LayerKinds(cfg.model_spec)
    Lf = kinds.n_full  # layers with selection and transfers (L without windows)
    for i in window:
        ops = {}
        for op, _shape, t in tap.steps[i]:
            ops[op] = ops.get(op, 0.0) + t
        stages["gemm"] += L * (ops.get("gemm_layer", 0.0) + ops.get("norm_rope", 0.0))
        if kinds.hybrid:
            stages["attn"] += _hybrid_attn(tap.steps[i], kinds)
        else:
            stages["attn"] += L * ops.get("attn_decode", 0.0)
        if mode.selects:
            stages["pred"] += Lf * (ops.get("score", 0.0) + ops.get("topk", 0.0))
            stages["select"] += Lf * ops.get("select", 0.0)
        if background and log.h2d[i] > 0:
            stages["transfer"] += Lf * lat + log.h2d[i] / rate
        stages["stall"] += log.stall[i]
        stages["layers"] += log.dur[i] - ops.get("step_overhead", 0.0) - ops.get("lm_head", 0.0)
    k = len(window)
    stage_ms = {s: 1e3 * v / k for s, v in stages.items()}
    pred = {m: None for m in METRICS}
    # TPOT as the bench measures it: a step's time over the tokens it gave each request (a speculative step or a
    # decode chain gives more than one; before 2026-12-06 this was the step time, 1.46x the k = 1 executor's TPOT)
    tpot = [log.dur[i] * log.decode[i] / log.emitted[i] if log.emitted[i] else log.dur[i] for i in window]
    pred.update(
        tpot_ms_p50=1e3 * statistics.median(tpot),
        tpot_ms_p99=1e3 * _pct_nearest(tpot, 99),
        throughput_tok_s=sum(log.emitted[i] for i in window) / sum(durs),  # n a step without speculation
        ttft_ms_p50=res.summary["ttft_ms_p50"],
        pcie_h2d_bytes_per_step=sum(log.h2d[i] for i in window) / k,
        stall_ms_per_step=stage_ms["stall"],
    )
    if trace:  # per request, as the recorder measured the served requests
        sm = res.summary
        pred.update(
            tpot_ms_p50=sm["tpot_ms_p50"] or 0.0,
            tpot_ms_p99=sm["tpot_ms_p99"] or 0.0,
            throughput_tok_s=sm["throughput_tok_s"],
        )
    for s in ("layers", "gemm", "attn", "pred", "select", "transfer"):
        pred[f"layer_ms_{s}"] = stage_ms[s] / L
    return ReplayResult(rec, cfg, res, window, pred, stage_ms, [tap.steps[i] for i in window])


def _hybrid_attn(calls, kinds: LayerKinds) -> float:
    """A hybrid step's decode attention over all layers: the engine asks ``attn_decode`` once for the full layers,
    then once a window (``kinds.distinct`` order) for its windowed layers."""
    times = [t for op, _shape, t in calls if op == "attn_decode"]
    if not times:
        return 0.0
    per = [kinds.n_full, *(kinds.count[w] for w in kinds.distinct)]
    return sum(n * t for n, t in zip(per, times))


def write_replay(result: ReplayResult, out_dir: str) -> list:
    os.makedirs(out_dir, exist_ok=True)
    names = []
    for name, text in result.files().items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        names.append(name)
    return names


def replay_table(result: ReplayResult) -> str:
    meas = measured_metrics(result.recording)
    rows = [("metric", "measured", "predicted")]
    for k, (unit, _d) in METRICS.items():
        m, p = meas.get(k), result.predicted.get(k)
        if m is None and p is None:
            continue
        rows.append((f"{k} [{unit}]", "-" if m is None else f"{m:,.4g}", "-" if p is None else f"{p:,.4g}"))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:<{w[0]}}  {b:>{w[1]}}  {c:>{w[2]}}" for a, b, c in rows)

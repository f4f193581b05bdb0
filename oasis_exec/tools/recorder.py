"""Executor recordings from bench results, and the executor side's Chrome-trace timeline. Torch-free.

- :func:`recording_from_bench` turns the dict ``oasis_exec.tools.bench.run_bench`` returns (one JSON record) plus the
  run's ``ExecConfig`` (or a dict of its fields) into an ``oasis_core.recording.Recording``;
  :func:`write_bench_recording` saves it (and the selected block sets, when given, as a compressed ``.npz`` beside
  it).
- :func:`exec_timeline` converts a recording's per-layer stage timestamps (``results.layer_events``) and sampled
  step durations into Chrome trace JSON with the same tracks as the simulator's ``timeline.json``, so the measured
  and the predicted timelines of one recording can be opened side by side in Perfetto.
- :func:`recording_from_serve` / :func:`write_serve_recording`: the same for a serving run (``serve --record``):
  the served requests become an open-loop ``trace`` workload.

Bench keys read (``bench.RECORD_FIELDS`` and the rest of its record): ``mode, context, concurrency,
requested_concurrency, kv_budget_gb, host_kv_gb, steps, warmup, throughput_tok_s, tpot_ms_p50, tpot_ms_p99,
tpot_ms_mean, stage_ms_per_step, bytes_moved_per_step, bytes_moved_total, hidden_fraction, selection, transfer,
fetch_ratio, top_k, model, device, date, commit`` and, when the bench provides them, ``speculative_k`` (into
``config``), ``accepted_hist`` and ``accepted_tokens_per_step`` (into ``results``), ``step_ms`` (every timed
step's duration, ms), ``layer_events`` (``[[step, layer, stage, start_ms, end_ms], ...]``) and ``ttft_ms_p50``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, is_dataclass
from typing import Any, Mapping, Optional

import numpy as np

from oasis_core import modes
from oasis_core.recording import SAMPLED_STEPS_MAX, Recording, build_recording, save_recording, save_selection
from oasis_core.trace import Request

# executor transfer path -> the simulator's / recording's name
TRANSFER_NAMES = {"host": "dma", "uva": "uva", "auto": "uva"}  # "auto" runs the UVA gather (pipeline.py)
# substrings of torch.cuda.get_device_name() -> oasis_core.specs hardware preset
DEVICE_PRESETS = (("H200", "h200"), ("H100", "h100-sxm"))
_EXTRA_RESULTS = (
    "tpot_ms_mean",
    "step_ms_mean",
    "layer_ms",
    "transfer_gb_s",
    "drift_blocks_per_step",
    "peak_gpu_bytes",
    "peak_host_bytes",
    "host_pool_bytes",
    "build_s",
    "bytes_moved_total",
)


def hardware_preset(device: str) -> Optional[str]:
    for key, preset in DEVICE_PRESETS:
        if key.lower() in (device or "").lower():
            return preset
    return None


def _hardware(caller: str, hardware: Optional[str], device: str) -> str:
    """``hardware`` if given, else the preset of ``device``; ``ValueError`` naming ``caller`` when neither tells."""
    hw = hardware or hardware_preset(device)
    if hw is None:
        raise ValueError(f"{caller}: hardware: cannot tell the preset from device {device!r}; pass hardware=")
    return hw


def sample_steps(step_ms, most: int = SAMPLED_STEPS_MAX) -> list:
    """At most ``most`` evenly spaced entries ``{"step": i, "duration_s": s}`` of the per-step durations (ms),
    always including the slowest step so the recorded p99 stays visible."""
    n = len(step_ms)
    if n == 0:
        return []
    if n <= most:
        idx = list(range(n))
    else:
        idx = sorted(
            {round(j * (n - 1) / (most - 2)) for j in range(most - 1)} | {max(range(n), key=lambda i: step_ms[i])}
        )
    return [{"step": i, "duration_s": round(step_ms[i] / 1e3, 9)} for i in idx]


def _fields(cfg) -> dict:
    if cfg is None:
        return {}
    if is_dataclass(cfg):
        return asdict(cfg)
    return dict(cfg)


def recording_from_bench(
    bench: Mapping[str, Any],
    exec_config=None,
    *,
    hardware: Optional[str] = None,
    model: Optional[str] = None,
    selection_file: Optional[str] = None,
    meta: Optional[Mapping[str, Any]] = None,
    source: str = "<recording>",
) -> Recording:
    """Recording of one bench run. ``exec_config``: the run's ``ExecConfig`` (or a dict of its fields; missing
    fields fall back to the bench record and the executor's defaults). ``hardware``: the simulator preset; default
    from the device name (H200 -> ``h200``, H100 -> ``h100-sxm``). ``model``: preset name when the bench ran from
    a checkpoint path. Raises ``ValueError`` when the hardware cannot be told, ``RecordingError`` when the result
    is not a valid recording."""
    c = _fields(exec_config)
    b = dict(bench)
    chain = int(b.get("decode_chain", c.get("decode_chain", 1)) or 1)
    if chain > 1:  # the simulator runs one decode step a scheduler step
        raise ValueError(
            f"recording_from_bench: a run with decode_chain {chain} is not a recording the simulator replays "
            "(it models one decode step a scheduler step); record with decode_chain 1"
        )
    device = str(b.get("device") or "unknown")
    hw = _hardware("recording_from_bench", hardware, device)
    mode = b["mode"]
    sparse = modes.get(mode).sparse
    transfer_raw = b.get("transfer") or c.get("transfer") or "host"
    stages = {k: float(v) for k, v in (b.get("stage_ms_per_step") or {}).items()}
    steps = int(b["steps"])
    config = {
        "mode": mode,
        "model": model or c.get("model") or b.get("model"),
        "hardware": hw,
        "workload": "closed-loop",
        "context": int(b["context"]),
        "concurrency": int(b["concurrency"]),
        "requested_concurrency": int(b.get("requested_concurrency", b["concurrency"])),
        "kv_budget_gb": b.get("kv_budget_gb", c.get("kv_budget_gb")),
        "host_kv_gb": b.get("host_kv_gb"),
        "top_k": int(b.get("top_k", c.get("top_k", 128))),
        "block_size": int(c.get("block_size", 16)),
        "fetch_ratio": float(b.get("fetch_ratio", c.get("fetch_ratio", 0.05))),
        "transfer_path": TRANSFER_NAMES.get(transfer_raw, transfer_raw) if sparse else None,
        "exec_transfer": transfer_raw if sparse else None,
        "selection": b.get("selection", c.get("selection", "model")),
        "seed": int(c.get("seed", 0)),
        "warmup_steps": int(b.get("warmup", 0)),
        "steps": steps,
        "no_transfer": bool(b.get("no_transfer", c.get("no_transfer", False))),
        "dummy_weights": bool(b.get("dummy_weights", c.get("model_path") is None)),
        "profile": bool(c.get("profile", bool(stages))),
        "synthetic": b.get("synthetic_params", c.get("synthetic")),
        "fetch_policy": b.get("fetch_policy", c.get("fetch_policy")),
        "hot_slots": b.get("hot_slots", c.get("hot_slots")),  # a row's GPU blocks above top_k (None: S = K)
        # the host copy's element type (sparse modes; None: dense, or a record from before it, i.e. "auto")
        "host_kv_dtype": (b.get("host_kv_dtype") or c.get("host_kv_dtype") or "auto") if sparse else None,
    }
    tp = int(b.get("tensor_parallel", c.get("tensor_parallel", 1)) or 1)
    if tp > 1:  # rank 0's record: the simulator simulates rank 0's share (SimConfig.tensor_parallel)
        config["tensor_parallel"] = tp
    spec_k = b.get("speculative_k", c.get("speculative_k")) or 0
    if spec_k:  # speculative decoding: the draft length (an int, or auto / auto:N) and its gamma
        config["speculative_k"] = spec_k
        if c.get("speculative_gamma") is not None:
            config["speculative_gamma"] = c["speculative_gamma"]
        # who decided the accepted drafts: the target (model) or, benchmark only, draws (synthetic_accept)
        synth = b.get("synthetic_accept", c.get("synthetic_accept"))
        config["acceptance"] = b.get("acceptance") or ("synthetic" if synth else "model")
        if synth:
            config["synthetic_accept"] = synth
    per_step = float(b.get("bytes_moved_per_step") or 0.0)
    stall = stages.get("stall")
    results = {
        "tpot_ms_p50": float(b["tpot_ms_p50"]),
        "tpot_ms_p99": float(b["tpot_ms_p99"]),
        "throughput_tok_s": float(b["throughput_tok_s"]),
        "ttft_ms_p50": b.get("ttft_ms_p50"),  # the bench synthesizes prefill: no TTFT unless it says otherwise
        "stage_ms_per_step": stages,
        "bytes_per_step": {"pcie_h2d": per_step},
        "link_bytes": {"pcie_h2d": int(round(float(b.get("bytes_moved_total") or per_step * steps)))},
        "stall_ms_per_step": stall if stall is not None else (0.0 if not sparse else None),
        "hidden_fraction": b.get("hidden_fraction"),
        "device": device,
        "date": str(b.get("date") or "unknown"),
        "commit": str(b.get("commit") or "unknown"),
    }
    for k in _EXTRA_RESULTS:
        if b.get(k) is not None:
            results[k] = b[k]
    if b.get("accepted_hist"):  # speculative: {"k": [lanes that accepted 0 .. k drafts]} over the timed steps
        results["accepted_hist"] = {str(k): [int(x) for x in v] for k, v in b["accepted_hist"].items()}
        results["accepted_tokens_per_step"] = b.get("accepted_tokens_per_step")
    if b.get("step_ms"):
        results["steps"] = sample_steps(list(b["step_ms"]))
        results["steps_sampled_of"] = len(b["step_ms"])
    if b.get("layer_events"):
        results["layer_events"] = [list(e) for e in b["layer_events"]]
    if selection_file:
        results["selection_file"] = selection_file
    m = {"recorder": "oasis_exec.recorder", "bench_record_keys": sorted(b)}
    m.update(meta or {})
    return build_recording(config, results, meta=m, source=source)


def write_bench_recording(
    path: str, bench: Mapping[str, Any], exec_config=None, selection_sets=None, selection_layers=(0,), **kw
) -> Recording:
    """Save the recording of one bench run at ``path``; ``selection_sets`` (integer array
    ``[steps + 1, rows, K]``, see ``oasis_core.recording.save_selection``) goes to ``<path minus .json>.sel.npz``."""
    sel_name = None
    if selection_sets is not None:
        base = path[:-5] if path.endswith(".json") else path
        sel_path = base + ".sel.npz"
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        save_selection(sel_path, selection_sets, list(selection_layers))
        sel_name = os.path.basename(sel_path)
    rec = recording_from_bench(bench, exec_config, selection_file=sel_name, source=path, **kw)
    save_recording(rec, path)
    return rec


# ----------------------------------------------------------------------------------------------------------------
# Recordings of a serving run (``python -m oasis_exec serve --record FILE``)


def _pct_linear(xs, q):
    """numpy's linear-interpolation percentile, as ``oasis_sim.metrics`` reads a simulated run."""
    return float(np.percentile(xs, q)) if len(xs) else None


def recording_from_serve(
    serve: Mapping[str, Any],
    exec_config=None,
    *,
    hardware: Optional[str] = None,
    model: Optional[str] = None,
    meta: Optional[Mapping[str, Any]] = None,
    source: str = "<recording>",
) -> Recording:
    """Recording of what a server served (``config.workload = "trace"``). ``serve`` holds ``requests`` (every
    accepted request that ended: ``id, arrival_s`` (since the server started), ``prompt_tokens, output_tokens``
    (generated), ``ttft_ms, tpot_ms, finish_s, finish_reason``), ``step_ms`` (every engine step), ``max_running``,
    ``max_lanes``, ``decode_steps``, ``prefetch_bytes``, ``stage_ms`` (cumulative, profiled runs only),
    ``hidden_fraction``, ``device``, ``date``, ``commit``, ``server`` (its options).

    Requests that ended before producing a token (aborted or failed while queued or in prefill) are **excluded**
    from the workload and counted in ``results.requests_dropped`` (finish reason -> count); a request aborted or
    failed after producing tokens is kept with the tokens it produced, and ``results.request_finish_reasons``
    (parallel to ``requests``) says how each ended (``length``, ``stop``, ``abort``, ``error``). Measured metrics
    use the simulator's definitions over the kept requests: TTFT = first token - arrival, TPOT = (last token -
    first token) / (tokens - 1), percentiles by linear interpolation, throughput = tokens / (last token - first
    arrival). Per-step figures (stages, bytes, stall) are per decode step (``decode_steps``; the executor runs
    prefill and decode in separate steps); ``config.steps`` counts every engine step."""
    c = _fields(exec_config)
    s = dict(serve)
    device = str(s.get("device") or "unknown")
    hw = _hardware("recording_from_serve", hardware, device)
    ended = list(s.get("requests") or ())
    kept = sorted((q for q in ended if q["output_tokens"] >= 1), key=lambda q: (round(q["arrival_s"], 6), q["id"]))
    if not kept:
        raise ValueError("recording_from_serve: requests: no served request produced a token, nothing to record")
    dropped = {}
    for q in ended:
        if q["output_tokens"] < 1:
            dropped[q["finish_reason"]] = dropped.get(q["finish_reason"], 0) + 1
    requests = tuple(
        Request(
            id=int(q["id"]),
            arrival_s=round(max(q["arrival_s"], 0.0), 6),
            prompt_tokens=int(q["prompt_tokens"]),
            output_tokens=int(q["output_tokens"]),
        )
        for q in kept
    )
    mode = c.get("mode", "lookahead")
    sparse = modes.get(mode).sparse
    transfer_raw = c.get("transfer") or "host"
    step_ms = [float(x) for x in s.get("step_ms") or ()]
    steps = max(len(step_ms), 1)
    per = int(s.get("decode_steps") or 0) or steps  # per-step figures: per decode step
    stages = {k: float(v) / per for k, v in (s.get("stage_ms") or {}).items()}
    config = {
        "mode": mode,
        "model": model or c.get("model"),
        "hardware": hw,
        "workload": "trace",
        "context": max(q.prompt_tokens for q in requests),
        "concurrency": max(int(s.get("max_running") or 1), 1),
        "max_lanes": s.get("max_lanes"),
        "kv_budget_gb": c.get("kv_budget_gb"),
        "host_kv_gb": c.get("host_kv_gb"),
        "top_k": int(c.get("top_k", 128)),
        "block_size": int(c.get("block_size", 16)),
        "fetch_ratio": float(c.get("fetch_ratio", 0.05)),
        "transfer_path": TRANSFER_NAMES.get(transfer_raw, transfer_raw) if sparse else None,
        "exec_transfer": transfer_raw if sparse else None,
        "selection": c.get("selection", "model"),
        "seed": int(c.get("seed", 0)),
        "warmup_steps": 0,
        "steps": steps,
        "prefill_chunk": c.get("prefill_chunk"),
        "no_transfer": bool(c.get("no_transfer", False)),
        "dummy_weights": c.get("model_path") is None,
        "profile": bool(c.get("profile", False)),
        "synthetic": c.get("synthetic"),
        "fetch_policy": c.get("fetch_policy"),
        "hot_slots": c.get("hot_slots"),
        "host_kv_dtype": c.get("host_kv_dtype", "auto") if sparse else None,
        "exec_config": c,
        "server": dict(s.get("server") or {}),
    }
    ttft = [float(q["ttft_ms"]) for q in kept]
    tpot = [float(q["tpot_ms"]) for q in kept if q["output_tokens"] > 1 and q.get("tpot_ms") is not None]
    span_s = max(q["finish_s"] for q in kept) - min(q["arrival_s"] for q in kept)
    tokens = sum(q.output_tokens for q in requests)
    total_bytes = int(s.get("prefetch_bytes") or 0)
    stall = stages.get("stall")
    hidden = s.get("hidden_fraction")
    results = {
        "tpot_ms_p50": _pct_linear(tpot, 50) if tpot else 0.0,
        "tpot_ms_p99": _pct_linear(tpot, 99) if tpot else 0.0,
        "throughput_tok_s": tokens / span_s if span_s > 0 else 0.0,
        "ttft_ms_p50": _pct_linear(ttft, 50),
        "ttft_ms_p99": _pct_linear(ttft, 99),
        "stage_ms_per_step": stages,
        "bytes_per_step": {"pcie_h2d": total_bytes / per},
        "link_bytes": {"pcie_h2d": total_bytes},
        "stall_ms_per_step": stall if stall is not None else (0.0 if not sparse else None),
        "hidden_fraction": None if hidden is None or hidden != hidden else float(hidden),  # NaN: not measured
        "device": device,
        "date": str(s.get("date") or "unknown"),
        "commit": str(s.get("commit") or "unknown"),
        "decode_steps": per,
        "requests_served": len(kept),
        "requests_dropped": dropped,
        "output_tokens": tokens,
        "wall_s": span_s,
        "request_finish_reasons": [q["finish_reason"] for q in kept],
    }
    if step_ms:
        results["steps"] = sample_steps(step_ms)
        results["steps_sampled_of"] = len(step_ms)
    m = {"recorder": "oasis_exec.recorder (serve)"}
    m.update(meta or {})
    return build_recording(config, results, meta=m, requests=requests, source=source)


def write_serve_recording(path: str, serve: Mapping[str, Any], exec_config=None, **kw) -> Recording:
    """Save the recording of a serving run at ``path`` (see :func:`recording_from_serve`)."""
    rec = recording_from_serve(serve, exec_config, source=path, **kw)
    save_recording(rec, path)
    return rec


def selection_from_pt(pt_path: str, layers, kv_heads: int, last_steps: int, request_row: int = 0):
    """Selected sets from the executor's ``record_path`` file (``torch.save({"pred": [per step [L, B*H, K]]})``):
    the rows of request lane ``request_row`` at ``layers``, the last ``last_steps`` steps -> numpy
    ``[steps, len(layers) * kv_heads, K]``. Imports torch (run it where the recording was made)."""
    import torch  # only here: the rest of this module is torch-free

    pred = torch.load(pt_path)["pred"][-last_steps:]
    lo = request_row * kv_heads
    rows = [torch.cat([p[l, lo : lo + kv_heads] for l in layers], 0) for p in pred]
    return torch.stack(rows).cpu().numpy()


# ----------------------------------------------------------------------------------------------------------------
# Chrome trace of the measured run

# Same tracks as oasis_sim.timeline: 1 compute, 2 side stream, 3 h2d copy, 4 steps; 5 the host gather (CPU).
_TRACK_OF = {
    "layers": 1,
    "compute": 1,
    "attn": 1,
    "gemm": 1,
    "stall": 1,
    "pred": 2,
    "select": 2,
    "transfer": 3,
    "host_gather": 5,
}
_TRACKS = {1: "compute", 2: "side stream (predict+select)", 3: "h2d copy", 4: "steps", 5: "host gather (CPU)"}


def exec_timeline(rec: Recording) -> dict:
    """Chrome trace (``{"traceEvents": [...]}``) of the measured run, microseconds.

    With ``results.layer_events``: one slice per recorded (step, layer, stage), at its measured time. Steps: the
    sampled step durations laid end to end on track 4 (exact when every step was kept, ``args.sampled`` names the
    step otherwise). With neither, one slice per stage of the mean step (``stage_ms_per_step``) stacked on its
    track and marked ``"mean": true`` -- a summary, not a measured timeline."""
    r = rec.results
    ev = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"executor (measured) {rec.name}"}}]
    ev += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": n}} for t, n in _TRACKS.items()]

    def x(name, tid, t0_ms, dur_ms, args=None):
        e = {
            "name": name,
            "ph": "X",
            "pid": 1,
            "tid": tid,
            "ts": round(t0_ms * 1e3, 3),
            "dur": round(max(dur_ms, 0.0) * 1e3, 3),
        }
        if args:
            e["args"] = args
        ev.append(e)

    layer_events = r.get("layer_events") or []
    for step, layer, stage, a, b in layer_events:
        x(f"{stage} L{layer}", _TRACK_OF.get(stage, 1), a, b - a, {"step": step})
    steps = r.get("steps") or []
    t = 0.0
    for s in steps:
        d = 1e3 * s["duration_s"]
        x(f"step {s['step']}", 4, t, d, {"sampled": True} if len(steps) < rec.config["steps"] else None)
        t += d
    if not layer_events and not steps:
        tpot = r.get("step_ms_mean", r.get("tpot_ms_mean", r["tpot_ms_p50"]))
        x("mean step", 4, 0.0, tpot, {"mean": True})
        start = {}
        for stage, ms in sorted(r["stage_ms_per_step"].items()):
            tid = _TRACK_OF.get(stage, 1)
            x(stage, tid, start.get(tid, 0.0), ms, {"mean": True, "ms_per_step": ms})
            start[tid] = start.get(tid, 0.0) + ms
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def write_exec_timeline(rec: Recording, path: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(exec_timeline(rec), separators=(",", ":")))

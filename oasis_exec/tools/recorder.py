"""Executor recordings from bench results. Torch-free.

- :func:`recording_from_bench` turns the dict ``oasis_exec.tools.bench.run_bench`` returns (one JSON record) plus the
  run's ``ExecConfig`` (or a dict of its fields) into an ``oasis_core.recording.Recording``;
  :func:`write_bench_recording` saves it (and the selected block sets, when given, as a compressed ``.npz`` beside
  it).
- :func:`selection_from_pt`: the selected block sets of a ``.pt`` record, for ``write_bench_recording``.

A serving run's recording is ``oasis_exec.server.recording``; the Chrome trace of a recording is
``oasis_sim.timeline.exec_timeline``.

Bench keys read (``bench.RECORD_FIELDS`` and the rest of its record): ``mode, context, concurrency,
requested_concurrency, kv_budget_gb, host_kv_gb, steps, warmup, throughput_tok_s, tpot_ms_p50, tpot_ms_p99,
tpot_ms_mean, stage_ms_per_step, bytes_moved_per_step, bytes_moved_total, hidden_fraction, selection, transfer,
fetch_ratio, top_k, model, device, date, commit`` and, when the bench provides them, ``speculative_k`` and
``layer_windows`` (a hybrid model's layer kinds, which the replay checks against its preset; into ``config``), ``accepted_hist`` and ``accepted_tokens_per_step`` (into ``results``), ``step_ms`` (every timed
step's duration, ms), ``layer_events`` (``[[step, layer, stage, start_ms, end_ms], ...]``) and ``ttft_ms_p50``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from oasis_core import modes
from oasis_core.recording import Recording, build_recording, save_recording, save_selection
from oasis_core.recording_parts import TRANSFER_NAMES, config_fields, hardware_of, sample_steps

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
    c = config_fields(exec_config)
    b = dict(bench)
    # the chains the run could take: the bench's (spec_chain: its spec_chain_max; records older than the field
    # never chained speculative steps), else the config's
    for name, chain in (
        ("decode_chain", b.get("decode_chain", c.get("decode_chain", 1))),
        ("spec_chain", b.get("spec_chain", 1)),
    ):
        chain = int(chain or 1)
        if chain > 1:  # the simulator runs one decode step a scheduler step
            raise ValueError(
                f"recording_from_bench: a run with {name} {chain} is not a recording the simulator replays "
                f"(it models one decode step a scheduler step); record with {name} 1"
            )
    device = str(b.get("device") or "unknown")
    hw = hardware_of("recording_from_bench", hardware, device)
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
    if sparse and "topk_kernel" in b:  # the prediction's top-K kernel; None: the run made none (synthetic sets
        config["topk_kernel"] = b["topk_kernel"]  # without synthetic_topk), which the replay then prices as none
    if b.get("layer_windows") is not None:  # a hybrid model: per layer, None (full) or its window
        config["layer_windows"] = list(b["layer_windows"])
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
        if (
            b.get("spec_predict") == "beside"
        ):  # the prediction beside the pass ran (oasis_exec.workingset.spec_pipeline)
            config["spec_predict"] = "beside"
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


def selection_from_pt(pt_path: str, layers, kv_heads: int, last_steps: int, request_row: int = 0):
    """Selected sets from the executor's ``record_path`` file (``torch.save({"pred": [per step [L, B*H, K]]})``):
    the rows of request lane ``request_row`` at ``layers``, the last ``last_steps`` steps -> numpy
    ``[steps, len(layers) * kv_heads, K]``. Imports torch (run it where the recording was made)."""
    import torch  # only here: the rest of this module is torch-free

    pred = torch.load(pt_path)["pred"][-last_steps:]
    lo = request_row * kv_heads
    rows = [torch.cat([p[l, lo : lo + kv_heads] for l in layers], 0) for p in pred]
    return torch.stack(rows).cpu().numpy()

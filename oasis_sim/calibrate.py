"""``python -m oasis_sim calibrate POINTS... --out FILE``: fit the calibrated predictor's constants on bench points.

The steady bench step (every lane decoding, no prefill, nothing waiting) is priced op by op as the engine prices it
(``oasis_sim.engine.SimEngine.execute``) with the points' *measured* bytes a step, so that the timing constants are not
fitted to the selection model's errors::

    c    = gemm_layer(n (+ n draft rows)) + norm_rope + attn_decode(KV bytes read, n) [+ sparse_overhead(n)]
           [+ score + top-K in place (quest)] [+ g · x + side_contention (background modes)]
    x    = latency + bytes_per_step / L / copy_rate                                       (0 without bytes)
    step = max(step_overhead(chain) + L · c + lm_head(n), L · x, L · (score + top-K + select), step_floor)

A vLLM point is scored as its harness reports TPOT (``bench.vllm_harness_tpot``: the clock starts when the last
request has its first token, so the early requests finish early and the last steps run fewer of them), from this step
at each batch.

and the constants (``CalibParams``, all but ``gemm_flops_eff``; ``step_host_s`` first, from runs equal but for their
decode chain: ``fit``) minimise the robust sum of squared relative TPOT
errors (``scipy.optimize.least_squares``, plain squared loss (``soft_l1`` made the fit depend on the points' order: two minima, one ignoring the one
vLLM point of the small model); the H200's runs of one configuration
differ by up to 15% call to call, and a few runs sit on a slow path) within physical bounds (efficiencies in
(0.05, 1], times >= 0, the copy rate at most the link's measured host->GPU rate). vLLM's per-layer fixed cost is
tied to our dense engine's (the same kernels a layer) so that the small model's vLLM step is not extrapolated from
one shape.

The output records where the constants come from: the point files (sha256 and counts), the date, the repository's
commit, and the fit's median and worst |error| per file. ``test_calibrate.py`` checks the closed form against the
simulator's own bench run.
"""

from __future__ import annotations

import datetime
import hashlib
import subprocess
from dataclasses import asdict, fields, replace
from typing import Optional

import numpy as np

from oasis_core import modes
from oasis_core.geometry import KVGeometry
from oasis_core.specs import get_hardware, get_model

from .bench import VLLM_HARNESS_DECODE, BenchPoint, vllm_harness_tpot
from .calibrated import CalibParams, CalibratedPredictor, Calibration

# fitted constants and their bounds (lo, hi); the rest of CalibParams keep their defaults
FITTED = {
    "weight_eff": (0.05, 1.0),
    "attn_eff_dense": (0.05, 1.0),
    "attn_eff_sparse": (0.05, 1.0),
    "attn_eff_vllm": (0.05, 1.0),
    "layer_fixed_dense_s": (0.0, 500e-6),
    "layer_fixed_sparse_s": (0.0, 500e-6),
    "request_layer_s": (0.0, 20e-6),
    "step_fixed_s": (0.0, 5e-3),
    "step_host_s": (0.0, 10e-3),
    "step_vllm_s": (0.0, 10e-3),
    "step_vllm_request_s": (0.0, 200e-6),  # fitted only with floor probes (``floor_probes``)
    # an SM's stream in vLLM's attention (calibrated.vllm_attn_waves): 132 SMs x 10-200 GB/s = 1.3-26 TB/s; fitted
    # only with vLLM points, from WAVE_START (full waves then never bind below 4.8 TB/s: only a part-filled wave shows)
    "vllm_sm_bytes_per_s": (10e9, 200e9),
    # the calibrated card's host over the floor probes' card's, for vLLM's loop: fitted only with another card's probes
    "vllm_host_ratio": (0.33, 3.0),
    "copy_bytes_per_s": (42e9, 49e9),  # the UVA gather measured alone: 42-49 GB/s (DESIGN.md, issue 39)
    "gather_sm_share": (0.0, 0.9),
}
# Points of another card than the calibration's (``BenchPoint.hardware``): the fit takes only what is the host's,
# vLLM floor probes at <= FLOOR_KNEE_REQUESTS requests (its host loop, CPU-side, on the same 16-core Xeon type on the
# H100 and H200 machines), each scored against the floor alone (a + b · requests), so that no GPU constant is fitted on
# another card; never a step past the knee, where attention's HBM bandwidth (3.35 against 4.8 TB/s) sets it
# (``card_admits``; those are validated, not fitted)
FLOOR_KNEE_REQUESTS = 8
WAVE_START = 50e9
RATIO_PRIOR = 0.01  # the prior's residual a unit of log(vllm_host_ratio): 1.45 costs what a 0.4% TPOT error does
RATIO_STARTS = (1.0, 2.0)  # vllm_host_ratio's starts (``fit``)
SCALE = {k: (1e9 if k.endswith("per_s") else 1e-6 if k.endswith("_s") else 1.0) for k in FITTED}
LOSS = "linear"
LOSS_SCALE = 0.05


LATER_FIELDS = ("warmup", "steps", "decode", "block_score", "token_rank")  # BenchPoint's: absent, a point keeps its key


def point_key(p: BenchPoint) -> str:
    """Content key of a point (its configuration and measurement, not its file)."""
    d = asdict(p)
    d.pop("source", None)
    d.pop("note", None)
    for k in LATER_FIELDS:
        if d[k] is None:
            d.pop(k)
    return hashlib.sha1(repr(sorted(d.items())).encode()).hexdigest()[:16]


def steady_step_s(pred: CalibratedPredictor, p: BenchPoint, bytes_per_step: float, params: CalibParams) -> float:
    """Seconds of one steady bench step of ``p`` (the module docstring's closed form)."""
    model, mode = pred.model, modes.get(p.mode)
    geo = KVGeometry(model, 16)
    L, kvh, bs = model.n_layers, model.n_kv_heads, geo.block_size
    n, ctx = p.lanes, p.context
    tokens = n + (n if mode.drafts else 0)
    t = pred.time
    c = t("gemm_layer", {"tokens": tokens}) + t("norm_rope", {"tokens": tokens})
    if mode.whole_kv_on_gpu:
        c += t("attn_decode", {"kv_bytes": n * ctx * geo.bytes_per_token_layer, "requests": n})
    else:
        att = n * min(ctx, (p.top_k + 1) * bs)
        c += t("attn_decode", {"kv_bytes": att * geo.bytes_per_token_layer})
    side = select = 0.0
    side_bytes = 0.0
    if mode.selects:
        blocks = n * -(-ctx // bs)
        summary = blocks * kvh * geo.summary_bytes_per_block_head
        side = t("score", {"summary_bytes": summary}) + t("topk", {"elements": blocks * kvh})
        side_bytes = summary + 8.0 * blocks * kvh
        if mode.sparse:
            select = t("select", {"rows": n * kvh})
            c += t("sparse_overhead", {"requests": n})
    if mode.selects_in_place:
        c += side
    x = 0.0
    if mode.background:
        layer_bytes = 0.0 if p.no_transfer else bytes_per_step / L
        if layer_bytes > 0:
            rate = min(params.copy_bytes_per_s, pred.hw.h2d_bytes_per_s)
            x = pred.hw.link.latency_s + layer_bytes / rate
        if p.transfer_path == "uva":
            c += params.gather_sm_share * x
        c += t("side_contention", {"hbm_bytes": side_bytes + layer_bytes})
    chain = min(p.decode_chain, bs)
    step = t("step_overhead", {"chain": chain}) + L * c + t("lm_head", {"tokens": n})
    if mode.background:
        step = max(step, L * x, L * (side + select))
    return max(step, t("step_floor", {"requests": n}))


def _params(theta, base: CalibParams, fitted=FITTED) -> CalibParams:
    vals = {k: float(v) * SCALE[k] for k, v in zip(fitted, theta)}
    vals["layer_fixed_vllm_s"] = vals["layer_fixed_dense_s"]  # tied: the same kernels a layer
    return replace(base, **vals)


def predict(points, params: CalibParams, bytes_of=None) -> np.ndarray:
    """Steady step seconds of each point (``bytes_of(p)``: its bytes a step; default the measured ones)."""
    out = []
    for p in points:
        pred = CalibratedPredictor(get_model(p.model), get_hardware(p.hardware), params, p.mode, p.engine)
        b = bytes_of(p) if bytes_of is not None else (p.bytes_per_step or 0.0)
        if p.engine == "vllm":  # what its harness reports (bench.vllm_harness_tpot), from the steady step a batch

            def step_s(n, p=p, pred=pred, b=b, memo={}):  # noqa: B006 - a memo of this point's steps
                if n not in memo:
                    memo[n] = steady_step_s(pred, replace(p, lanes=n), b, params)
                return memo[n]

            out.append(harness_tpot(p, step_s))
        else:
            out.append(steady_step_s(pred, p, b, params))
    return np.array(out)


def harness_tpot(p: BenchPoint, step_s) -> float:
    """TPOT of vLLM point ``p`` as its harness reports it, ``step_s(batch)`` a steady step's seconds."""
    return vllm_harness_tpot(step_s, p.lanes, p.context, p.decode or VLLM_HARNESS_DECODE)


def chain_pairs(points) -> list:
    """Pairs of runs of one file equal but for their decode chain: ``(short, long)``."""
    groups: dict = {}
    for p in points:
        if not p.measured_tpot_s():
            continue
        d = asdict(p)
        for k in ("decode_chain", "tpot_ms", "tok_s", "note", "date"):
            d.pop(k)
        groups.setdefault(repr(sorted(d.items())), []).append(p)
    out = []
    for g in groups.values():
        short = [p for p in g if p.decode_chain == 1]
        long = [p for p in g if p.decode_chain > 1]
        out += list(zip(short, long))  # in file order: the runs of one call pair up
    return out


def floor_probes(points, least: int = 3) -> bool:
    """Whether ``points`` hold vLLM runs of one model and context at ``least`` distinct batch sizes with a measured
    step: what separates vLLM's host loop a step (``step_vllm_s``) from its growth a request (``step_vllm_request_s``)."""
    seen: dict = {}
    for p in points:
        if p.engine == "vllm" and p.measured_tpot_s():
            seen.setdefault((p.model, p.context), set()).add(p.lanes)
    return any(len(v) >= least for v in seen.values())


def card_admits(p: BenchPoint, card: str) -> bool:
    """Whether a calibration of ``card`` may be fitted on ``p``: every point measured on ``card``; of another card only
    a vLLM floor probe at <= ``FLOOR_KNEE_REQUESTS`` requests (the host loop's a and b, not the card's bandwidth)."""
    if p.hardware == card:
        return True
    return p.engine == "vllm" and p.lanes <= FLOOR_KNEE_REQUESTS


def split_by_card(points, card: str):
    """(points the fit of ``card`` may use, points of another card it leaves out: ``card_admits``)."""
    keep, out = [], []
    for p in points:
        (keep if card_admits(p, card) else out).append(p)
    return keep, out


def host_share_s(pairs) -> Optional[float]:
    """The host's round trip a step, from chain pairs: ``T(1) - T(c) = h · (1 - 1/c)``, the median over pairs."""
    hs = []
    for a, b in pairs:
        d = a.measured_tpot_s() - b.measured_tpot_s()
        hs.append(d / (1.0 - 1.0 / min(b.decode_chain, 16)))
    return float(np.median(hs)) if hs else None


def fit(points, base: CalibParams | None = None, card: str | None = None):
    """(CalibParams, the points fitted, their relative TPOT errors) on ``points`` (those with a measured TPOT or
    tok/s and, in background modes with copies, bytes a step; with ``card``, only those ``card_admits``, another
    card's scored against the floor alone on its own host: ``(step_vllm_s + lanes · step_vllm_request_s) /
    vllm_host_ratio``, the ratio fitted from ``RATIO_STARTS`` with a weak prior at 1). First the host's round trip a step
    (``step_host_s``) from the pairs of runs equal but for their decode chain (``host_share_s``; those runs, of an
    older engine, then leave the fit), then the rest by least squares."""
    from scipy.optimize import least_squares

    base = base or CalibParams()
    if card is not None:
        points = split_by_card(points, card)[0]
    pairs = chain_pairs(points)
    h = host_share_s(pairs)
    fitted = dict(FITTED)
    if not floor_probes(points):  # one vLLM batch size cannot tell the floor's growth from its constant
        fitted.pop("step_vllm_request_s")
    elif not base.step_vllm_request_s:  # start inside its range: at the bound 0 the floor's max() hides its slope
        base = replace(base, step_vllm_request_s=20e-6)
    if not any(p.engine == "vllm" and (card is None or p.hardware == card) for p in points):
        fitted.pop("vllm_sm_bytes_per_s")  # no vLLM step of the card: the term stays as given (0: off)
    elif not base.vllm_sm_bytes_per_s:
        base = replace(base, vllm_sm_bytes_per_s=WAVE_START)
    if h is not None:
        base = replace(base, step_host_s=max(h, 0.0))
        fitted.pop("step_host_s")
        paired = {id(p) for ab in pairs for p in ab}
        points = [p for p in points if id(p) not in paired]
    use = [
        p
        for p in points
        if p.measured_tpot_s() and (not modes.get(p.mode).background or p.no_transfer or p.bytes_per_step is not None)
    ]
    if not use:
        raise ValueError("calibrate: no point with a measured TPOT or tok/s")
    meas = np.array([p.measured_tpot_s() for p in use])
    probe = np.array([card is not None and p.hardware != card for p in use])  # another card's floor probes
    if not probe.any():
        fitted.pop("vllm_host_ratio")
    same = [p for p, o in zip(use, probe) if not o]

    def resid(theta, base, fitted):
        prm = _params(theta, base, fitted)
        t = np.empty(len(use))
        t[~probe] = predict(same, prm)
        for i in np.flatnonzero(probe):  # the floor alone on its host, as the harness reports it
            t[i] = harness_tpot(use[i], prm.probe_floor_s)
        return t / meas - 1.0

    def solve(base, fitted):
        """(params, cost, errors): least squares from ``base`` over ``fitted``, with vllm_host_ratio's prior."""
        x0 = np.array([getattr(base, k) / SCALE[k] for k in fitted])
        lo = np.array([b[0] / SCALE[k] for k, b in fitted.items()])
        hi = np.array([b[1] / SCALE[k] for k, b in fitted.items()])
        x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

        def objective(theta):
            r = resid(theta, base, fitted)
            if not probe.any():
                return r
            return np.append(r, RATIO_PRIOR * np.log(_params(theta, base, fitted).vllm_host_ratio))

        sol = least_squares(objective, x0, bounds=(lo, hi), loss=LOSS, f_scale=LOSS_SCALE, x_scale="jac")
        return _params(sol.x, base, fitted), sol.cost, resid(sol.x, base, fitted)

    if "vllm_host_ratio" not in fitted:
        params, _cost, err = solve(base, fitted)
        return params, use, err
    # The ratio from two starts, the better kept: where the card's own steps sit on the GPU side of the floor for small
    # ratios, the cost is flat there and falls past a threshold, so a start at 1 stays at 1 (a local minimum, the
    # prior's); where no step of the card shows its floor, the ratio, a and b slide together along the probes'
    # (a + b · n) / ratio, and the prior keeps the hosts alike (both starts end at the same cost but for the prior's)
    best = None
    for r in RATIO_STARTS:
        prm, cost, err = solve(replace(base, vllm_host_ratio=r), fitted)
        if best is None or cost < best[1]:
            best = (prm, cost, err)
    return best[0], use, best[2]


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def repo_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def calibrate(points, files, card: str = "h200") -> Calibration:
    """The calibration of ``card`` (``BenchPoint.hardware``) on ``points``: another card's points enter only as
    ``card_admits`` says, and those left out are named in ``fit.other_card_left_out``."""
    params, used, err = fit(points, card=card)
    left_out = split_by_card(points, card)[1]
    by_file: dict = {}
    for p, e in zip(used, err):
        by_file.setdefault(p.source, []).append(abs(e) * 100)
    fit_summary = {
        "points": len(used),
        "median_abs_err_pct": round(float(np.median(np.abs(err)) * 100), 2),
        "worst_abs_err_pct": round(float(np.max(np.abs(err)) * 100), 2),
        "by_source": {
            s: {"points": len(v), "median": round(float(np.median(v)), 2), "worst": round(float(max(v)), 2)}
            for s, v in sorted(by_file.items())
        },
        "fitted_points": sorted(point_key(p) for p in used),
        "other_card_fitted": sorted(p.name + " on " + p.hardware for p in used if p.hardware != card),
        "other_card_left_out": sorted(p.name + " on " + p.hardware for p in left_out),
        "probe_cards": sorted({p.hardware for p in used if p.hardware != card}),
        "card_rule": f"points of another card than {card}: only vLLM floor probes at <= {FLOOR_KNEE_REQUESTS} "
        "requests (oasis_sim.calibrate.card_admits), scored against the floor alone on their host, "
        "(a + b * requests) / vllm_host_ratio",
        "method": f"scipy.optimize.least_squares, relative TPOT residuals, {LOSS} loss (f_scale {LOSS_SCALE}), bounds in "
        "oasis_sim.calibrate.FITTED; layer_fixed_vllm_s tied to layer_fixed_dense_s; vllm_host_ratio from the starts "
        f"{list(RATIO_STARTS)}, the better kept, with a prior residual {RATIO_PRIOR} * log(ratio)",
    }
    return Calibration(
        params,
        hardware=card,
        date=datetime.date.today().isoformat(),
        commit=repo_commit(),
        fitted_on=tuple(f"{f} sha256:{_sha(f)}" for f in files),
        fit=fit_summary,
    )


def describe_params(params: CalibParams) -> str:
    rows = []
    for f in fields(params):
        v = getattr(params, f.name)
        if f.name.endswith("per_s"):
            rows.append(f"{f.name} = {v / 1e9:.2f} GB/s")
        elif f.name.endswith("_s"):
            rows.append(f"{f.name} = {v * 1e6:.2f} us")
        else:
            rows.append(f"{f.name} = {v:.4f}")
    return "\n".join(rows)


def add_subcommand(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the calibrated predictor on bench points (traces/bench_points)")
    p.add_argument("points", nargs="+", help="bench-point .jsonl files or folders of them")
    p.add_argument("--out", required=True, help="calibration file to write (JSON)")
    p.add_argument(
        "--card",
        default="h200",
        help="the card calibrated (BenchPoint.hardware); another card's points enter only as vLLM floor probes at "
        f"<= {FLOOR_KNEE_REQUESTS} requests",
    )


def cmd_calibrate(args) -> int:
    import os

    from .bench import load_points
    from .files import prepare_out_dir

    points, files = load_points(args.points)
    d = os.path.dirname(os.path.abspath(args.out))
    prepare_out_dir(d)
    cal = calibrate(points, files, args.card)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(cal.to_json())
    print(describe_params(cal.params))
    fs = cal.fit
    for name in fs["other_card_fitted"]:
        print(f"  fitted, another card (floor probe): {name}")
    for name in fs["other_card_left_out"]:
        print(f"  left out, another card: {name}")
    print(f"fit: {fs['points']} points, median |error| {fs['median_abs_err_pct']}%, worst {fs['worst_abs_err_pct']}%")
    for s, v in fs["by_source"].items():
        print(f"  {s}: {v['points']} points, median {v['median']}%, worst {v['worst']}%")
    print(f"wrote {args.out}")
    return 0

"""A timing predictor fitted to executor recordings, behind the simulator's ``TimePredictor`` interface.

Each operation's time is an affine function of the analytic roofline's time for the same shape::

    t_fitted(op, shape) = max(0, scale[op] · t_roofline(op, shape) + offset[op])

so the fit interpolates over batch, context and selected blocks exactly as the roofline does (the roofline time is
the feature that carries the shape), while the coefficients absorb what the roofline misses: kernel efficiency,
launch overheads, the draft head's extra work. Coefficients are fitted per *family* of modes -- ``dense``
(dense, quest: paged attention over the whole context) and ``sparse`` (retrieval, proxy, lookahead: sparse
attention over the resident set) -- because the two run different attention kernels; a family with no training
recordings borrows the other's.

Groups (targets from ``results.stage_ms_per_step``, per layer unless said; features: mean roofline op times of the
recording's timed window, taken from a roofline replay):

=============  ============================================  ====================================================
group          target                                        model
=============  ============================================  ====================================================
compute        ``(layers - stall) / L``                      ``a·(gemm_layer + norm_rope) + b·attn_decode + c``
side           ``pred / L``                                  ``a·(score + topk) + c``
select         ``select / L``                                ``a·select + c``
step           ``tpot_mean - layers`` (per step)             ``a·lm_head + c`` (``c`` becomes ``step_overhead``)
copy rate      ``(transfer + host_gather) / L`` vs bytes     ``latency + bytes / rate`` per transfer path
=============  ============================================  ====================================================

The roofline's ``sparse_overhead`` and ``side_contention`` terms are not fitted: they are subtracted from the
compute target and passed through unchanged.

Without stage times (a run without ``--profile``) the compute target falls back to
``(tpot_mean - roofline head and tail - stall) / L``. Each group is solved by non-negative least squares on rows
divided by their target (relative error); with fewer recordings than coefficients it drops the intercept, then
keeps a pure scale, and with none it keeps the roofline.

**Never scored on its own data**: :class:`FittedModel` carries ``fitted_on``, the content keys of the recordings
it was fitted from; ``oasis_sim.validate`` builds one model per scored recording without it (leave-one-out, or the
``--calibrate-from`` set minus the scored recording) and refuses to score a recording found in ``fitted_on``.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

from oasis_core.recording import Recording
from oasis_core.trace import dumps_trace

from .predictor import OPS, RooflinePredictor, TimePredictor

DENSE_FAMILY = ("dense", "quest")


def family(mode: str) -> str:
    return "dense" if mode in DENSE_FAMILY else "sparse"


def recording_key(rec: Recording) -> str:
    """Content key of a recording (same bytes, same key, whatever the path)."""
    return hashlib.sha1(dumps_trace(rec.trace).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class OpFit:
    scale: float = 1.0
    offset_s: float = 0.0


class FittedPredictor(TimePredictor):
    """``scale · base.time(op, shape) + offset`` per op (ops without a fit: the base's time). ``h2d_bytes_per_s``
    (fitted copy rate of scattered blocks, or None) is read by ``oasis_sim.replay`` to set the copy path."""

    def __init__(self, base: TimePredictor, fits: Mapping[str, OpFit], h2d_bytes_per_s: Optional[float] = None):
        for op in fits:
            if op not in OPS:
                raise ValueError(f"FittedPredictor: unknown op {op!r}; choose one of: {', '.join(OPS)}")
        self.base = base
        self.fits = dict(fits)
        self.h2d_bytes_per_s = h2d_bytes_per_s

    def time(self, op, shape) -> float:
        t = self.base.time(op, shape)
        f = self.fits.get(op)
        if f is None:
            return t
        v = f.scale * t + f.offset_s
        return v if v > 0.0 else 0.0


# ----------------------------------------------------------------------------------------------------------------
# Training samples


@dataclass(frozen=True)
class Sample:
    """One recording reduced to what the fit needs (seconds; per layer unless marked)."""

    key: str
    name: str
    family: str
    transfer_path: Optional[str]
    n_layers: int
    feat: Mapping[str, float]  # roofline: gemm, attn, side, select (per layer); lm_head, step_overhead (per step)
    meas: Mapping[str, Optional[float]]  # layers, stall, pred, select, transfer (per step); tpot_mean
    bytes_per_step: float
    link_latency_s: float


def sample_of(rec: Recording, roofline_replay) -> Sample:
    """``roofline_replay``: ``oasis_sim.replay.replay(rec)`` run with the roofline predictor."""
    res = roofline_replay
    L = res.cfg.model_spec.n_layers
    acc = {"gemm": 0.0, "attn": 0.0, "side": 0.0, "select": 0.0, "lm_head": 0.0, "step_overhead": 0.0,
           "unfitted": 0.0}
    for ops in res.op_steps:
        for op, _shape, t in ops:
            if op in ("gemm_layer", "norm_rope"):
                acc["gemm"] += t
            elif op == "attn_decode":
                acc["attn"] += t
            elif op in ("score", "topk"):
                acc["side"] += t
            elif op in ("select", "lm_head", "step_overhead"):
                acc[op] += t
            elif op in ("sparse_overhead", "side_contention"):  # taken from the roofline as they are, not fitted
                acc["unfitted"] += t
    k = max(len(res.op_steps), 1)
    feat = {n: v / k for n, v in acc.items()}
    r = rec.results
    st = r["stage_ms_per_step"]

    def ms(name):
        return None if name not in st else st[name] / 1e3

    transfer = None
    if "transfer" in st or "host_gather" in st:
        transfer = (st.get("transfer", 0.0) + st.get("host_gather", 0.0)) / 1e3
    stall = r["stall_ms_per_step"] / 1e3 if r["stall_ms_per_step"] is not None else ms("stall")
    meas = {"layers": ms("layers"), "stall": stall, "pred": ms("pred"), "select": ms("select"),
            "transfer": transfer, "tpot_mean": r.get("tpot_ms_mean", r["tpot_ms_p50"]) / 1e3}
    from oasis_core.specs import get_link

    lat = get_link(res.cfg.hardware_spec.pcie_link).latency_s
    return Sample(recording_key(rec), rec.name, family(rec.config["mode"]), rec.config["transfer_path"], L, feat,
                  meas, float(r["bytes_per_step"].get("pcie_h2d", 0.0)), lat)


# ----------------------------------------------------------------------------------------------------------------
# Fitting


def nnls_relative(X: np.ndarray, y: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """argmin_{c >= 0} Σ ((X c - y) / y)² over rows with y > 0, by trying every column subset (k <= 4).

    Ties (residual within ``tol`` relative of the best, as when a feature is constant over the data and so
    collinear with the intercept) go to the subset with the fewest columns, then to the one without the last column
    (the intercept): a scale of the roofline extrapolates to unseen shapes, a constant does not."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = y > 0
    X, y = X[keep] / y[keep, None], np.ones(int(keep.sum()))
    k = X.shape[1]
    found = []
    for mask in itertools.product((0, 1), repeat=k):
        cols = [j for j in range(k) if mask[j]]
        if not cols or len(y) == 0:
            continue
        coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(k)
        full[cols] = coef
        found.append((float(np.sum((X @ full - y) ** 2)), len(cols), k - 1 in cols, full))
    if not found:
        return np.zeros(k)
    best = min(r for r, *_ in found)
    ok = [f for f in found if f[0] <= best + tol * max(best, 1e-12) + 1e-12]
    return min(ok, key=lambda f: (f[1], f[2]))[3]


def _fit_group(rows: Sequence[tuple], n_features: int) -> Optional[np.ndarray]:
    """rows: (features [n_features] incl. a trailing 1 for the intercept, target). Coefficients, or None."""
    rows = [(f, y) for f, y in rows if y is not None and y > 0]
    if not rows:
        return None
    X = np.array([f for f, _ in rows], dtype=float)
    y = np.array([y for _, y in rows], dtype=float)
    if len(rows) < n_features:  # too few recordings: no intercept
        coef = nnls_relative(X[:, :-1], y)
        return np.append(coef, 0.0)
    return nnls_relative(X, y)


@dataclass
class FittedModel:
    """Per family: op -> OpFit; per transfer path: fitted copy rate; ``fitted_on``: recording keys used."""

    fits: dict = field(default_factory=dict)  # family -> {op: OpFit}
    h2d_bytes_per_s: dict = field(default_factory=dict)  # transfer path -> B/s
    fitted_on: tuple = ()
    fitted_names: tuple = ()

    def predictor_for(self, rec: Recording) -> FittedPredictor:
        from oasis_core.specs import get_hardware, get_model

        fam = family(rec.config["mode"])
        fits = self.fits.get(fam) or self.fits.get("dense" if fam == "sparse" else "sparse") or {}
        base = RooflinePredictor(get_model(rec.config["model"]), get_hardware(rec.config["hardware"]))
        path = rec.config["transfer_path"] or "dma"
        rate = self.h2d_bytes_per_s.get(path)
        if rate is None and self.h2d_bytes_per_s:
            rate = float(np.median(list(self.h2d_bytes_per_s.values())))
        return FittedPredictor(base, fits, rate)

    def describe(self) -> dict:
        return {"fitted_on": list(self.fitted_names),
                "fits": {fam: {op: {"scale": round(f.scale, 6), "offset_us": round(f.offset_s * 1e6, 3)}
                               for op, f in ops.items()} for fam, ops in self.fits.items()},
                "h2d_gb_s": {p: round(v / 1e9, 3) for p, v in self.h2d_bytes_per_s.items()}}


def fit(samples: Sequence[Sample]) -> FittedModel:
    model = FittedModel(fitted_on=tuple(s.key for s in samples), fitted_names=tuple(s.name for s in samples))
    for fam in ("dense", "sparse"):
        ss = [s for s in samples if s.family == fam]
        if not ss:
            continue
        ops: dict = {}
        # compute: a·gemm + b·attn + c per layer
        rows = []
        for s in ss:
            stall = s.meas["stall"] or 0.0
            if s.meas["layers"] is not None:
                y = (s.meas["layers"] - stall) / s.n_layers
            else:
                y = (s.meas["tpot_mean"] - s.feat["lm_head"] - s.feat["step_overhead"] - stall) / s.n_layers
            y -= s.feat.get("unfitted", 0.0)  # per-layer roofline terms the fitted predictor passes through
            rows.append(([s.feat["gemm"], s.feat["attn"], 1.0], y))
        c = _fit_group(rows, 3)
        if c is not None:
            ops["gemm_layer"] = OpFit(c[0], c[2])
            ops["norm_rope"] = OpFit(c[0], 0.0)
            ops["attn_decode"] = OpFit(c[1], 0.0)
        # step: a·lm_head + c per step (c -> step_overhead)
        rows = [([s.feat["lm_head"], 1.0], s.meas["tpot_mean"] - s.meas["layers"]) for s in ss
                if s.meas["layers"] is not None]
        c = _fit_group(rows, 2)
        if c is not None:
            ops["lm_head"] = OpFit(c[0], 0.0)
            ops["step_overhead"] = OpFit(0.0, c[1])
        if fam == "sparse":
            rows = [([s.feat["side"], 1.0], s.meas["pred"] / s.n_layers) for s in ss if s.meas["pred"] is not None]
            c = _fit_group(rows, 2)
            if c is not None:
                ops["score"] = OpFit(c[0], c[1])
                ops["topk"] = OpFit(c[0], 0.0)
            rows = [([s.feat["select"], 1.0], s.meas["select"] / s.n_layers) for s in ss
                    if s.meas["select"] is not None]
            c = _fit_group(rows, 2)
            if c is not None:
                ops["select"] = OpFit(c[0], c[1])
        model.fits[fam] = ops
    for path in sorted({s.transfer_path for s in samples if s.transfer_path}):
        num = den = 0.0
        for s in samples:
            if s.transfer_path != path or s.meas["transfer"] is None or s.bytes_per_step <= 0:
                continue
            t = s.meas["transfer"] / s.n_layers - s.link_latency_s
            if t > 0:
                num += s.bytes_per_step / s.n_layers
                den += t
        if den > 0:
            model.h2d_bytes_per_s[path] = num / den
    return model

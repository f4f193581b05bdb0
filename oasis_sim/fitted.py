"""A timing predictor fitted to executor recordings, behind the simulator's ``TimePredictor`` interface.

Each operation's time is its roofline floor plus an affine function of the analytic roofline's time above it, for
the same shape::

    t_fitted(op, shape) = t_floor(op, shape) + scale[op] · (t_roofline(op, shape) - t_floor(op, shape)) + offset[op]

with ``scale, offset >= 0`` and ``t_floor`` = ``RooflinePredictor.floor`` (every byte at the datasheet HBM
bandwidth, every FLOP at peak, no overheads), so no fit is ever faster than the hardware can be: a 16K-token
prefill GEMM never beats peak FLOP/s, and sparse attention over a non-empty resident set never takes zero time (a
fit that leaves attention's excess at 0 keeps its floor). The fit interpolates over batch, context and selected
blocks exactly as the roofline does (the roofline time is the feature that carries the shape), while the
coefficients absorb what the roofline misses: kernel efficiency, launch overheads, the draft head's extra work. Coefficients are fitted per *family* of modes -- ``dense``
(dense, quest: paged attention over the whole context) and ``sparse`` (retrieval, proxy, lookahead, hisparse:
sparse attention over the resident set) -- because the two run different attention kernels; a family with no training
recordings borrows the other's.

Groups (targets from ``results.stage_ms_per_step``, per layer unless said; features: mean roofline op times of the
recording's timed window and their floors, taken from a roofline replay):

=============  ============================================  ====================================================
group          target                                        model (each op: its floor + the terms below, which
                                                             scale the roofline's excess over the floor)
=============  ============================================  ====================================================
compute        ``(layers - stall) / L``                      ``a·(gemm_layer + norm_rope) + b·attn_decode
                                                             + s·sparse_overhead + c``
side           ``pred / Lf``                                 ``a·(score + topk) + c``
select         ``select / Lf``                               ``a·select + c``
step           ``tpot_mean - layers`` (per step)             ``a·lm_head + c`` (``c`` becomes ``step_overhead``)
copy rate      ``(transfer + host_gather) / Lf`` vs bytes    ``latency + bytes / rate`` per transfer path
gather         TPOT vs bytes copied (see below)              ``gather_sm_share`` and, without transfer stage
                                                             times, the copy rate of the ``uva`` path
=============  ============================================  ====================================================

The roofline's ``side_contention`` term is not fitted: it is subtracted from the compute target and passed through
unchanged. ``sparse_overhead`` (per request per layer, sparse modes; zero in the dense family) is fitted with its own
scale ``s``: the roofline's 6.7 µs was calibrated at 16 requests and over-predicts the sparse step at 64.

``Lf``: the full-attention layers, where a hybrid model's prediction, selection and copies run (``L`` without
windows); the compute group's ``L`` layers carry the gather's SM share on the ``Lf`` full ones.

Without stage times (a run without ``--profile``) the compute target falls back to
``(tpot_mean - roofline head and tail - stall) / L``. Each group is solved by non-negative least squares for the
excess over the floor (features: the roofline's time above the floor; the floor is a fixed part of each row's
prediction), on rows divided by their whole target (relative error of the time, not of the excess); with fewer
recordings than coefficients it drops the intercept, then keeps a pure scale, and with none it keeps the roofline.

**Transfer settings from TPOT** (sparse family, background modes on the ``uva`` path with bytes copied): the UVA
gather's SM share ``g`` (``SimConfig.gather_sm_share``: the compute stream of a layer grows by ``g · x``, with
``x = latency + bytes_per_layer / rate`` the layer's copy) and, when no recording of the path carries transfer stage
times, the copy rate ``r`` are fitted *jointly with the compute group* from the recordings' TPOT against their bytes
per step. For each ``(g, r)`` of a bounded grid -- ``g`` in [0, 0.5], ``r`` from 10 GB/s to the link's measured
host->GPU rate (55.3 GB/s on the H200), log-spaced; 11 × 13 points, then twice 9 × 9 around the best with a quarter
of the span -- the compute target of each such recording loses ``g · x(r)``, the compute group is solved as above,
and each training recording's TPOT is predicted with the simulator's steady-state step ``max(L · (compute + g · x)
+ head and tail, L · x)`` (the copy path is one FIFO: once ``L · x`` exceeds the compute stream's step, the step is
copy-bound). A recording without a measured stall whose ``L · x`` reaches its TPOT is copy-bound at that rate and
is left out of the compute rows (its TPOT holds an unmeasured stall). The chosen point minimises
``mean(((TPOT_pred - TPOT) / TPOT)²) + w · (ln(r / r0)² + (g - g0)²)``: the data term decides ``g / r`` (compute
time lost per byte copied) and, where a recording is copy-bound, ``r``; the prior term (``w`` = 1e-4: a 1% TPOT
error on every recording costs as much as ``r`` off ``r0`` by a factor e; ``r0``: the hardware's measured UVA
gather rate, 49 GB/s on the H200; ``g0``: the configuration's share, 0.24) only settles directions the TPOTs leave
flat -- above all ``r`` when no training recording is copy-bound, where any rate that keeps them compute-bound fits
equally. With a measured rate (transfer stage times) only ``g`` is searched. The compute group is then solved at the
chosen point; ``dma`` recordings keep the configuration's share (the simulator applies it to ``uva`` only).

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

from oasis_core import modes
from oasis_core.echo import show
from oasis_core.recording import Recording
from oasis_core.trace import dumps_trace

from .predictor import OPS, RooflinePredictor, TimePredictor


def family(mode: str) -> str:
    """The mode's timing family: 'dense' (whole KV in HBM) or 'sparse' (``oasis_core.modes.Mode.family``)."""
    return modes.get(mode).family


def recording_key(rec: Recording) -> str:
    """Content key of a recording (same bytes, same key, whatever the path)."""
    return hashlib.sha1(dumps_trace(rec.trace).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class OpFit:
    """One op's fit: ``floor + scale · (roofline - floor) + offset_s`` (both >= 0, so never below the floor)."""

    scale: float = 1.0
    offset_s: float = 0.0

    def __post_init__(self):
        for name in ("scale", "offset_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ValueError(f"OpFit.{name}: must be a finite number >= 0, got {show(v)}")


class FittedPredictor(TimePredictor):
    """Per op with a fit, ``floor + scale · (base - floor) + offset`` with ``floor`` the roofline floor of the base's
    hardware (``RooflinePredictor.floor``; 0 when the base is not a roofline) and ``base - floor`` taken as 0 where
    the base is faster than the floor: a fitted time is never below the floor. Ops without a fit: the base's time.
    ``h2d_bytes_per_s`` (fitted copy rate of scattered blocks, or None; one above the hardware's link is lowered to
    it) and ``gather_sm_share`` (fitted SM share of the UVA gather, or None) are read by ``oasis_sim.replay`` to set
    the copy path; None keeps the configuration's value."""

    def __init__(
        self,
        base: TimePredictor,
        fits: Mapping[str, OpFit],
        h2d_bytes_per_s: Optional[float] = None,
        gather_sm_share: Optional[float] = None,
    ):
        for op, f in fits.items():
            if op not in OPS:
                raise ValueError(f"FittedPredictor: unknown op {show(op)}; choose one of: {', '.join(OPS)}")
            if not isinstance(f, OpFit):
                raise ValueError(f"FittedPredictor: fits[{show(op)}]: must be an OpFit, got {type(f).__name__}")
        self.base = base
        self.fits = dict(fits)
        self.gather_sm_share = gather_sm_share
        self.floor = RooflinePredictor.floor(base.model, base.hw) if isinstance(base, RooflinePredictor) else None
        self.rate_clamped_from = None  # a fitted copy rate above the hardware's link, lowered to the link
        link = base.hw.h2d_bytes_per_s if isinstance(base, RooflinePredictor) else None
        if h2d_bytes_per_s is not None and link is not None and h2d_bytes_per_s > link:
            self.rate_clamped_from, h2d_bytes_per_s = h2d_bytes_per_s, link
        self.h2d_bytes_per_s = h2d_bytes_per_s

    def time(self, op, shape) -> float:
        t = self.base.time(op, shape)
        f = self.fits.get(op)
        if f is None:
            return t
        fl = self.floor.time(op, shape) if self.floor is not None else 0.0
        return fl + f.scale * max(t - fl, 0.0) + f.offset_s

    def clamp_note(self) -> str | None:
        """One line saying that the fitted copy rate was clamped to the hardware's link, or None."""
        if self.rate_clamped_from is None:
            return None
        return (
            f"fitted predictor beyond the hardware's limits: copy rate {self.rate_clamped_from / 1e9:.1f} GB/s "
            f"clamped to the link's {self.h2d_bytes_per_s / 1e9:.1f} GB/s"
        )


# ----------------------------------------------------------------------------------------------------------------
# Training samples


# Sample.feat's groups: the ops whose roofline times each sums.
GROUP_OF = {
    "gemm_layer": "gemm",
    "norm_rope": "gemm",
    "attn_decode": "attn",
    "score": "side",
    "topk": "side",
    "select": "select",
    "lm_head": "lm_head",
    "step_overhead": "step_overhead",
    "sparse_overhead": "sparse",
    "side_contention": "unfitted",
}


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
    background: bool = False  # lookahead / proxy: copies on the copy path, overlapped with compute
    link_bytes_per_s: float = 0.0  # upper bound of a fitted copy rate (the link's measured host->GPU rate)
    prior_bytes_per_s: float = 0.0  # r0 of the TPOT fit (measured UVA gather rate, else the default copy rate)
    prior_gather_sm_share: float = 0.0  # g0 of the TPOT fit (the configuration's gather_sm_share)
    floor: Mapping[str, float] = field(default_factory=dict)  # the roofline floor of feat's groups (<= feat)
    n_full: int = 0  # full-attention layers (a hybrid model's; 0: all n_layers): the side work and copies run there

    @property
    def full(self) -> int:
        """The layers with the sparse machinery (prediction, selection, copies): the full-attention ones."""
        return self.n_full or self.n_layers

    def excess(self, name: str) -> float:
        """The roofline's time of group ``name`` above its floor: the feature a fitted scale multiplies."""
        return self.feat.get(name, 0.0) - self.floor.get(name, 0.0)

    def floor_of(self, *names: str) -> float:
        return sum(self.floor.get(n, 0.0) for n in names)


def sample_of(rec: Recording, roofline_replay) -> Sample:
    """``roofline_replay``: ``oasis_sim.replay.replay(rec)`` run with the roofline predictor."""
    res = roofline_replay
    L = res.cfg.model_spec.n_layers
    floor = RooflinePredictor.floor(res.cfg.model_spec, res.cfg.hardware_spec)
    acc = dict.fromkeys(("gemm", "attn", "side", "select", "lm_head", "step_overhead", "sparse", "unfitted"), 0.0)
    acc_floor = dict(acc)
    for ops in res.op_steps:
        for op, shape, t in ops:
            group = GROUP_OF.get(op)
            if group is None:
                continue
            acc[group] += t
            if group != "unfitted":  # side_contention is taken from the roofline as it is, not fitted
                acc_floor[group] += min(floor.time(op, shape), t)  # as FittedPredictor: excess >= 0 per call
    k = max(len(res.op_steps), 1)
    feat = {n: v / k for n, v in acc.items()}
    floors = {n: v / k for n, v in acc_floor.items() if n != "unfitted"}
    r = rec.results
    st = r["stage_ms_per_step"]

    def ms(name):
        return None if name not in st else st[name] / 1e3

    transfer = None
    if "transfer" in st or "host_gather" in st:
        transfer = (st.get("transfer", 0.0) + st.get("host_gather", 0.0)) / 1e3
    stall = r["stall_ms_per_step"] / 1e3 if r["stall_ms_per_step"] is not None else ms("stall")
    meas = {
        "layers": ms("layers"),
        "stall": stall,
        "pred": ms("pred"),
        "select": ms("select"),
        "transfer": transfer,
        # a step's mean wall time (records before step_ms_mean: tpot_ms_mean, then the time of a step)
        "tpot_mean": r.get("step_ms_mean", r.get("tpot_ms_mean", r["tpot_ms_p50"])) / 1e3,
    }
    from oasis_core.specs import get_link

    from .sim import SCATTER_EFFICIENCY

    hw = res.cfg.hardware_spec
    lat = get_link(hw.pcie_link).latency_s
    default_rate = res.cfg.h2d_bytes_per_s or hw.h2d_bytes_per_s * SCATTER_EFFICIENCY
    uva = [v for _chunk, v in hw.measured_uva_gather_bytes_per_s]
    prior = max(uva) if uva and rec.config["transfer_path"] == "uva" else default_rate
    return Sample(
        recording_key(rec),
        rec.name,
        family(rec.config["mode"]),
        rec.config["transfer_path"],
        L,
        feat,
        meas,
        float(r["bytes_per_step"].get("pcie_h2d", 0.0)),
        lat,
        background=modes.get(rec.config["mode"]).background,
        link_bytes_per_s=hw.h2d_bytes_per_s,
        prior_bytes_per_s=prior,
        prior_gather_sm_share=res.cfg.gather_sm_share,
        floor=floors,
        n_full=res.cfg.model_spec.n_full_layers,
    )


# ----------------------------------------------------------------------------------------------------------------
# Fitting


def nnls_relative(X: np.ndarray, y: np.ndarray, floor: Optional[np.ndarray] = None, tol: float = 1e-6) -> np.ndarray:
    """argmin_{c >= 0} Σ ((floor + X c - y) / y)² over rows with y > 0 (``floor``: a fixed part of each row's
    prediction, default 0), by trying every column subset (k <= 4) and c = 0.

    Ties (residual within ``tol`` relative of the best, as when a feature is constant over the data and so
    collinear with the intercept) go to the subset with the fewest columns, then to the one without the last column
    (the intercept): a scale of the roofline extrapolates to unseen shapes, a constant does not."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    b = np.zeros(len(y)) if floor is None else np.asarray(floor, dtype=float)
    keep = y > 0
    X, t = X[keep] / y[keep, None], 1.0 - b[keep] / y[keep]
    k = X.shape[1]
    found = [(float(np.sum(t**2)), 0, False, np.zeros(k))]  # everything at its floor
    for mask in itertools.product((0, 1), repeat=k):
        cols = [j for j in range(k) if mask[j]]
        if not cols or len(t) == 0:
            continue
        coef, *_ = np.linalg.lstsq(X[:, cols], t, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(k)
        full[cols] = coef
        found.append((float(np.sum((X @ full - t) ** 2)), len(cols), k - 1 in cols, full))
    best = min(r for r, *_ in found)
    ok = [f for f in found if f[0] <= best + tol * max(best, 1e-12) + 1e-12]
    return min(ok, key=lambda f: (f[1], f[2]))[3]


def _fit_group(rows: Sequence[tuple], n_features: int) -> Optional[np.ndarray]:
    """rows: (features [n_features] incl. a trailing 1 for the intercept, target, floor: the part of the target's
    prediction that is fixed, the roofline floor of the group's ops). Coefficients (>= 0), or None."""
    rows = [r for r in rows if r[1] is not None and r[1] > 0]
    if not rows:
        return None
    X = np.array([f for f, _, _ in rows], dtype=float)
    y = np.array([y for _, y, _ in rows], dtype=float)
    b = np.array([b for _, _, b in rows], dtype=float)
    if len(rows) < n_features:  # too few recordings: no intercept
        coef = nnls_relative(X[:, :-1], y, b)
        return np.append(coef, 0.0)
    return nnls_relative(X, y, b)


@dataclass
class FittedModel:
    """Per family: op -> OpFit; per transfer path: fitted copy rate and (``uva``) gather SM share; ``fitted_on``:
    recording keys used."""

    fits: dict = field(default_factory=dict)  # family -> {op: OpFit}
    h2d_bytes_per_s: dict = field(default_factory=dict)  # transfer path -> B/s
    fitted_on: tuple = ()
    fitted_names: tuple = ()
    gather_sm_share: dict = field(default_factory=dict)  # transfer path -> share of SMs (uva only)
    gather_fit: dict = field(default_factory=dict)  # transfer path -> how g and r were found (describe())

    def predictor_for(self, rec: Recording) -> FittedPredictor:
        from oasis_core.specs import get_hardware, get_model

        fam = family(rec.config["mode"])
        fits = self.fits.get(fam) or self.fits.get("dense" if fam == "sparse" else "sparse") or {}
        base = RooflinePredictor(get_model(rec.config["model"]), get_hardware(rec.config["hardware"]))
        path = rec.config["transfer_path"] or "dma"
        rate = self.h2d_bytes_per_s.get(path)
        if rate is None and self.h2d_bytes_per_s:
            rate = float(np.median(list(self.h2d_bytes_per_s.values())))
        return FittedPredictor(base, fits, rate, self.gather_sm_share.get(path))

    def describe(self) -> dict:
        return {
            "fitted_on": list(self.fitted_names),
            "fits": {
                fam: {
                    op: {"scale": round(f.scale, 6), "offset_us": round(f.offset_s * 1e6, 3)} for op, f in ops.items()
                }
                for fam, ops in self.fits.items()
            },
            "h2d_gb_s": {p: round(v / 1e9, 3) for p, v in self.h2d_bytes_per_s.items()},
            "gather_sm_share": {p: round(v, 4) for p, v in self.gather_sm_share.items()},
            "gather_fit": self.gather_fit,
        }


# TPOT fit of the transfer settings (module docstring, "Transfer settings from TPOT")
GATHER_SHARE_BOUNDS = (0.0, 0.5)
MIN_COPY_BYTES_PER_S = 10e9
PRIOR_WEIGHT = 1e-4


def _copy_layer_s(s: Sample, rate: float) -> float:
    """The simulator's copy of one full layer: ``latency + bytes / rate`` (0 with nothing to copy; a hybrid model's
    windowed layers copy nothing)."""
    return s.link_latency_s + s.bytes_per_step / s.full / rate if s.bytes_per_step > 0 else 0.0


def _compute_fit(ss: Sequence[Sample], share: float, rate: Optional[float], gathered: set):
    """The compute group at gather share ``share`` and copy rate ``rate`` (for the samples in ``gathered``).
    A recording without a measured stall whose copies alone take its TPOT at this rate is copy-bound: left out."""
    rows = []
    for s in ss:
        stall = s.meas["stall"] or 0.0
        if s.key in gathered and s.meas["stall"] is None and s.full * _copy_layer_s(s, rate) >= s.meas["tpot_mean"]:
            continue  # copy-bound at this rate: its TPOT holds an unmeasured stall, and says nothing of compute
        if s.meas["layers"] is not None:
            y = (s.meas["layers"] - stall) / s.n_layers
        else:
            y = (s.meas["tpot_mean"] - s.feat["lm_head"] - s.feat["step_overhead"] - stall) / s.n_layers
        y -= s.feat.get("unfitted", 0.0)  # per-layer roofline terms the fitted predictor passes through
        if s.key in gathered:  # the gather's SM share, charged to the compute stream of the full layers
            y -= share * _copy_layer_s(s, rate) * (s.full / s.n_layers)  # x 1.0 exactly without windows
        rows.append(
            ([s.excess("gemm"), s.excess("attn"), s.excess("sparse"), 1.0], y, s.floor_of("gemm", "attn", "sparse"))
        )
    return _fit_group(rows, 4)


def _tpot_objective(ss, share, rate, gathered, step, prior) -> tuple:
    """(objective, compute coefficients) of one grid point: mean squared relative TPOT error of the steady-state
    step plus the weak prior (module docstring)."""
    c = _compute_fit(ss, share, rate, gathered)
    if c is None:
        return float("inf"), None
    errs = []
    for s in ss:
        x = _copy_layer_s(s, rate) if s.key in gathered else 0.0
        gather = share * x * (s.full / s.n_layers)  # the full layers' gather share over all layers (x 1.0: no windows)
        layer = (
            s.floor_of("gemm", "attn", "sparse")
            + c[0] * s.excess("gemm")
            + c[1] * s.excess("attn")
            + c[2] * s.excess("sparse")
            + c[3]
            + s.feat.get("unfitted", 0.0)
            + gather
        )
        t = s.n_layers * layer + step(s)
        if x > 0 and s.full * x > t:  # copy-bound: the copy path sets the step
            t = s.full * x
        errs.append((t - s.meas["tpot_mean"]) / s.meas["tpot_mean"])
    g0, r0 = prior
    pen = (np.log(rate / r0) ** 2 if rate and r0 else 0.0) + (share - g0) ** 2
    return float(np.mean(np.square(errs))) + PRIOR_WEIGHT * pen, c


def _fit_gather(ss, gathered, step, rate_measured: Optional[float]) -> tuple:
    """(share, rate, objective) by a zooming bounded grid: 11 shares × 13 log-spaced rates, then twice 9 × 9
    around the best point with a quarter of the span."""
    gs = [s for s in ss if s.key in gathered]
    r_hi = min(s.link_bytes_per_s for s in gs) or float(np.median([s.prior_bytes_per_s for s in gs]))
    r_lo = min(MIN_COPY_BYTES_PER_S, r_hi)
    prior = (
        float(np.median([s.prior_gather_sm_share for s in gs])),
        float(np.median([s.prior_bytes_per_s for s in gs])),
    )
    if rate_measured:
        prior = (prior[0], rate_measured)
    g_lo, g_hi = GATHER_SHARE_BOUNDS
    shares = np.linspace(g_lo, g_hi, 11)
    rates = [rate_measured] if rate_measured else list(np.geomspace(r_lo, r_hi, 13))
    g_step = shares[1] - shares[0]
    r_step = 1.0 if rate_measured else rates[1] / rates[0]
    best = (float("inf"), g_lo, rates[0])
    for _level in range(3):
        for g in shares:
            for r in rates:
                obj, _c = _tpot_objective(ss, float(g), float(r), gathered, step, prior)
                if obj < best[0] - 1e-15:
                    best = (obj, float(g), float(r))
        _o, g, r = best
        g_step /= 4.0
        shares = np.clip(g + g_step * np.arange(-4, 5), g_lo, g_hi)
        if not rate_measured:
            r_step = r_step**0.25
            rates = list(np.clip(r * r_step ** np.arange(-4, 5), r_lo, r_hi))
    return best[1], best[2], best[0]


def fit(samples: Sequence[Sample]) -> FittedModel:
    model = FittedModel(fitted_on=tuple(s.key for s in samples), fitted_names=tuple(s.name for s in samples))
    for path in sorted({s.transfer_path for s in samples if s.transfer_path}):
        num = den = 0.0
        for s in samples:
            if s.transfer_path != path or s.meas["transfer"] is None or s.bytes_per_step <= 0:
                continue
            t = s.meas["transfer"] / s.full - s.link_latency_s
            if t > 0:
                num += s.bytes_per_step / s.full
                den += t
        if den > 0:
            model.h2d_bytes_per_s[path] = num / den
    for fam in ("dense", "sparse"):
        ss = [s for s in samples if s.family == fam]
        if not ss:
            continue
        ops: dict = {}
        # step: a·lm_head + c per step (c -> step_overhead)
        rows = [
            ([s.excess("lm_head"), 1.0], s.meas["tpot_mean"] - s.meas["layers"], s.floor_of("lm_head"))
            for s in ss
            if s.meas["layers"] is not None
        ]
        cs = _fit_group(rows, 2)
        if cs is not None:
            ops["lm_head"] = OpFit(cs[0], 0.0)
            ops["step_overhead"] = OpFit(0.0, cs[1])

        def step(s, cs=cs):  # head and tail of a step, as the fitted predictor will time them
            if cs is None:
                return s.feat["lm_head"] + s.feat["step_overhead"]
            return s.floor_of("lm_head") + cs[0] * s.excess("lm_head") + cs[1]

        # gather share (and, without stage times, copy rate) of the uva path, jointly with the compute group
        gathered = {s.key for s in ss if s.background and s.transfer_path == "uva" and s.bytes_per_step > 0}
        share, rate = 0.0, None
        if gathered:
            measured = model.h2d_bytes_per_s.get("uva")
            share, rate, obj = _fit_gather(ss, gathered, step, measured)
            model.gather_sm_share["uva"] = share
            model.h2d_bytes_per_s["uva"] = rate
            model.gather_fit["uva"] = {
                "rate_from": "stage times" if measured else "tpot",
                "recordings": len(gathered),
                "objective": round(float(obj), 8),
            }
        # compute: a·gemm + b·attn + c per layer
        c = _compute_fit(ss, share, rate, gathered)
        if c is not None:
            ops["gemm_layer"] = OpFit(c[0], c[3])
            ops["norm_rope"] = OpFit(c[0], 0.0)
            ops["attn_decode"] = OpFit(c[1], 0.0)
            if any(s.feat.get("sparse", 0.0) > 0 for s in ss):
                ops["sparse_overhead"] = OpFit(c[2], 0.0)
        if fam == "sparse":
            rows = [
                ([s.excess("side"), 1.0], s.meas["pred"] / s.full, s.floor_of("side"))
                for s in ss
                if s.meas["pred"] is not None
            ]
            c = _fit_group(rows, 2)
            if c is not None:
                ops["score"] = OpFit(c[0], c[1])
                ops["topk"] = OpFit(c[0], 0.0)
            rows = [
                ([s.excess("select"), 1.0], s.meas["select"] / s.full, s.floor_of("select"))
                for s in ss
                if s.meas["select"] is not None
            ]
            c = _fit_group(rows, 2)
            if c is not None:
                ops["select"] = OpFit(c[0], c[1])
        model.fits[fam] = ops
    return model

"""The calibrated predictor: per-operation costs in physical units with efficiencies fitted on the executor.

Every op is priced from what it moves and computes, with a handful of constants measured on the executor's H200
runs (``oasis_sim.calibrate``) instead of the roofline's guesses:

=================  ===============================================================================================
op                 time
=================  ===============================================================================================
``gemm_layer``     ``max(2·tokens·P_layer / (F·gemm_flops_eff), W_layer / (H·weight_eff)) + layer_fixed_s[engine]``
``attn_decode``    ``kv_bytes / (H·attn_eff[engine])``: paged attention (dense, quest; vLLM's own efficiency) or the
                   sparse kernel over the resident set (retrieval, proxy, lookahead, hisparse). ``shape['kind']``
                   (``full`` or ``sliding``) prices a windowed layer with the paged efficiency. vLLM, with
                   ``vllm_sm_bytes_per_s`` > 0 and ``shape['requests']`` (the decode batch): at least the busiest
                   SM's share, ``waves · kv_bytes / ctas / vllm_sm_bytes_per_s`` (``vllm_attn_waves``)
``sparse_overhead`` ``requests · request_layer_s`` (sparse modes: a request's draft row, index updates, launches)
``step_overhead``  ``step_fixed_s + step_host_s / chain`` (``shape['chain']``: the decode chain's length; the
                   host's sync, bookkeeping and launch of a sparse step are paid once a chain; dense and vLLM:
                   ``step_fixed_s`` alone)
``step_floor``     vLLM: ``step_vllm_s + requests · step_vllm_request_s``, the least a step lasts (its host loop runs
                   beside the GPU and grows with the batch); ours: 0
``lm_head``        the LM head's weights at ``weight_eff`` plus the logits (elementwise) per step
others             the roofline's (``oasis_sim.predictor``): norms, scoring, top-K, selection, side contention
=================  ===============================================================================================

``engine``: ``oasis`` (ours: family ``dense`` or ``sparse`` by the mode) or ``vllm`` (the vLLM-dense model,
``SimConfig.engine``). The copy path takes ``copy_bytes_per_s`` (the UVA gather's in-step rate) and the gather's
``gather_sm_share`` from the same file (``oasis_sim.sim`` reads them when ``SimConfig.predictor='calibrated'``).

The shipped constants (``data/calibration_h200.json``) carry their provenance: the recordings they were fitted on,
the date and the commit (``describe()``); ``python -m oasis_sim calibrate POINTS... --out FILE`` refits them.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Mapping, Optional

from oasis_core import modes
from oasis_core.specs import HardwareSpec, ModelSpec

from .predictor import RooflineParams, RooflinePredictor

SHIPPED = os.path.join(os.path.dirname(__file__), "data", "calibration_h200.json")
ENGINES = ("oasis", "vllm")


@dataclass(frozen=True)
class CalibParams:
    """Fitted constants (efficiencies: fractions of the datasheet peak; times in seconds)."""

    weight_eff: float = 0.6  # weight reads of memory-bound GEMMs and the LM head
    gemm_flops_eff: float = 0.6  # compute-bound GEMMs (not fitted: decode batches here stay memory-bound)
    attn_eff_dense: float = 0.85  # our paged attention over the whole context
    attn_eff_sparse: float = 0.5  # our sparse attention over the resident set
    attn_eff_vllm: float = 0.85  # vLLM's paged attention (FlashAttention-3)
    layer_fixed_dense_s: float = 40e-6  # per layer: launches and small kernels not priced by bytes (dense, quest)
    layer_fixed_sparse_s: float = 60e-6  # the same, sparse modes (more kernels a layer)
    layer_fixed_vllm_s: float = 30e-6
    request_layer_s: float = 1e-6  # per decode request per layer, sparse modes
    step_fixed_s: float = 300e-6  # per step on the GPU (embedding, sampling, graph start)
    step_host_s: float = 1.5e-3  # per host round trip of a sparse step (sync, bookkeeping, launch), once a chain
    step_vllm_s: float = 1.5e-3  # vLLM's host loop a step, overlapped with the GPU: the least a step lasts
    step_vllm_request_s: float = 0.0  # ... plus this per decode request (its scheduler, input prep and sampler)
    # vLLM's decode attention runs one CTA a (request, KV head), split along the context only to fill the SMs; an SM
    # streams its CTAs' KV at this rate (0: no such term, the step linear in the KV bytes): ``vllm_attn_waves``
    vllm_sm_bytes_per_s: float = 0.0
    # how much longer the calibrated card's host takes for vLLM's loop than the host of the card whose floor probes
    # entered the fit (``oasis_sim.calibrate.card_admits``: they are scored against the floor over this); 1: alike
    vllm_host_ratio: float = 1.0
    copy_bytes_per_s: float = 45e9  # the UVA gather's in-step rate of scattered blocks
    gather_sm_share: float = 0.2  # compute time a UVA gather takes while it runs, as a share of its time

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
                raise ValueError(f"CalibParams.{f.name}: must be a number >= 0, got {v!r}")
            if f.name == "vllm_host_ratio" and not v > 0:
                raise ValueError(f"CalibParams.{f.name}: must be > 0, got {v!r}")
            if f.name.endswith("_eff") or "_eff_" in f.name:
                if not 0 < v <= 1:
                    raise ValueError(f"CalibParams.{f.name}: must be in (0, 1], got {v!r}")

    def probe_floor_s(self, requests: int) -> float:
        """vLLM's floor a step on the floor probes' host, ``(a + b · n) / vllm_host_ratio`` (what the fit scores
        another card's probes against)."""
        return (self.step_vllm_s + requests * self.step_vllm_request_s) / self.vllm_host_ratio

    def on_probe_host(self) -> "CalibParams":
        """These constants with vLLM's floor on the floor probes' host (``probe_floor_s``), for a run there."""
        r = self.vllm_host_ratio
        return replace(
            self,
            step_vllm_s=self.step_vllm_s / r,
            step_vllm_request_s=self.step_vllm_request_s / r,
            vllm_host_ratio=1.0,
        )


@dataclass(frozen=True)
class Calibration:
    """Constants plus where they came from (``fitted_on``: point files and their counts; ``fit``: errors)."""

    params: CalibParams
    hardware: str = "h200"
    date: str = ""
    commit: str = ""
    fitted_on: tuple = ()
    fit: Mapping = field(default_factory=dict)

    def probes_ran_on(self, hardware: str) -> bool:
        """Whether ``hardware`` is another card whose vLLM floor probes entered the fit (``fit.probe_cards``)."""
        return hardware != self.hardware and hardware in self.fit.get("probe_cards", ())

    def params_on(self, hardware: str) -> CalibParams:
        """The constants for a run on ``hardware``: on a probe card vLLM's floor on its own host
        (``CalibParams.on_probe_host``), else as fitted (the calibrated card's host)."""
        return self.params.on_probe_host() if self.probes_ran_on(hardware) else self.params

    def to_json(self) -> str:
        d = {
            "params": asdict(self.params),
            "hardware": self.hardware,
            "date": self.date,
            "commit": self.commit,
            "fitted_on": list(self.fitted_on),
            "fit": dict(self.fit),
        }
        return json.dumps(d, indent=1, sort_keys=True) + "\n"

    def describe(self) -> str:
        return (
            f"calibrated on {self.hardware} ({len(self.fitted_on)} point files, {self.fit.get('points', '?')} points), "
            f"{self.date} at {self.commit}"
        )


def load_calibration(path: Optional[str] = None) -> Calibration:
    """A calibration file (``None``: the shipped one). ValueError naming the file and field on a bad one."""
    path = path or SHIPPED
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise ValueError(f"calibration {path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"calibration {path}: not JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(d, dict) or not isinstance(d.get("params"), dict):
        raise ValueError(f"calibration {path}: params: must be a mapping of CalibParams fields")
    names = {f.name for f in fields(CalibParams)}
    unknown = sorted(set(d["params"]) - names)
    if unknown:
        raise ValueError(f"calibration {path}: params.{unknown[0]}: unknown field")
    try:
        params = CalibParams(**d["params"])
    except ValueError as e:
        raise ValueError(f"calibration {path}: {e}") from None
    return Calibration(
        params,
        d.get("hardware", ""),
        d.get("date", ""),
        d.get("commit", ""),
        tuple(d.get("fitted_on", ())),
        d.get("fit", {}),
    )


def vllm_attn_waves(requests: int, kv_heads: int, n_sms: int) -> tuple:
    """(waves, CTAs) of vLLM's decode attention over ``requests`` sequences: one CTA a (request, KV head) (the KV
    head's query heads packed into it), each split along the context into ``n_sms // CTAs`` parts when that is 2 or
    more (so that the grid fills the SMs), launched in ``ceil(CTAs / n_sms)`` waves. The busiest SM streams
    ``waves / CTAs`` of the KV bytes (contexts taken as equal: the batch's mean).

    Fitted on vLLM 0.26 on the H200 (Qwen3-8B, 8 KV heads, 132 SMs; ``experiments/simulator_calibration``): 16K x 21
    requests (168 CTAs, two waves) runs as long as 32K x 10 (80 CTAs: one wave, not split) though it reads 5% more,
    and 32K x 8 (64 CTAs, split in two) as fast as 16K x 16."""
    ctas = requests * kv_heads
    if ctas <= 0:
        return 0, 0
    split = max(1, n_sms // ctas)
    ctas *= split
    return -(-ctas // n_sms), ctas


class CalibratedPredictor(RooflinePredictor):
    """The module docstring's ops for one (model, hardware, mode, engine); the rest are the roofline's."""

    memoisable = True

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        params: CalibParams,
        mode: str = "lookahead",
        engine: str = "oasis",
    ):
        if engine not in ENGINES:
            raise ValueError(f"CalibratedPredictor.engine: must be one of {', '.join(ENGINES)}, got {engine!r}")
        super().__init__(model, hardware, RooflineParams(gemm_flops_eff=params.gemm_flops_eff))
        self.c = params
        whole_kv_on_gpu = modes.get(mode).whole_kv_on_gpu  # the dense timing family
        self.engine = engine
        self.floor_s = self.floor_request_s = 0.0
        if engine == "vllm":  # its host loop runs beside the GPU (async scheduling): a floor, not an addend
            self.layer_fixed, self.attn_eff = params.layer_fixed_vllm_s, params.attn_eff_vllm
            self.step_fixed, self.step_host = params.step_fixed_s, 0.0
            self.floor_s, self.floor_request_s = params.step_vllm_s, params.step_vllm_request_s
        elif whole_kv_on_gpu:  # no sparse bookkeeping on the host: nothing for a chain to amortise (measured: the
            # real SmolLM2's dense step was 2.0-2.2 ms at chain 1 and 2.03 at chain 8)
            self.layer_fixed, self.attn_eff = params.layer_fixed_dense_s, params.attn_eff_dense
            self.step_fixed, self.step_host = params.step_fixed_s, 0.0
        else:
            self.layer_fixed, self.attn_eff = params.layer_fixed_sparse_s, params.attn_eff_sparse
            self.step_fixed, self.step_host = params.step_fixed_s, params.step_host_s
        self.paged_eff = params.attn_eff_vllm if engine == "vllm" else params.attn_eff_dense
        # vLLM's busiest SM (vllm_attn_waves): KV bytes -> seconds a batch size, linear in the bytes at each
        self.sm_Bps = params.vllm_sm_bytes_per_s if engine == "vllm" else 0.0
        self._wave_memo: dict = {}
        self.weight_Bps = self.hbm * params.weight_eff
        self._ops.update(
            gemm_layer=self._gemm_layer,
            attn_decode=self._attn_decode,
            sparse_overhead=self._sparse_overhead,
            step_overhead=self._step_overhead,
            lm_head=self._lm_head,
            step_floor=self._step_floor_calibrated,
        )

    def _gemm_layer(self, s) -> float:
        tokens = s["tokens"]
        if tokens <= 0:
            return 0.0
        compute = 2.0 * tokens * self.layer_params / (self.flops * self.c.gemm_flops_eff)
        memory = self.layer_weight_bytes / self.weight_Bps
        return (compute if compute > memory else memory) + self.layer_fixed

    def _attn_decode(self, s) -> float:
        eff = self.paged_eff if s.get("kind") == "sliding" else self.attn_eff
        per_byte = 1.0 / (self.hbm * eff)
        if self.sm_Bps:
            n = s.get("requests", 0)
            if n:
                w = self._wave_memo.get(n)
                if w is None:
                    waves, ctas = vllm_attn_waves(n, self.model.n_kv_heads, self.hw.n_sms)
                    w = self._wave_memo[n] = waves / (ctas * self.sm_Bps)
                if w > per_byte:
                    per_byte = w
        return s["kv_bytes"] * per_byte

    def _sparse_overhead(self, s) -> float:
        return s["requests"] * self.c.request_layer_s

    def _step_overhead(self, s) -> float:
        chain = s.get("chain", 1) or 1
        return self.step_fixed + self.step_host / chain

    def _step_floor_calibrated(self, s) -> float:
        return self.floor_s + s.get("requests", 0) * self.floor_request_s

    def _lm_head(self, s) -> float:
        m = self.model
        tokens = s["tokens"]
        if tokens <= 0:
            return 0.0
        compute = 2.0 * tokens * m.hidden * m.vocab / (self.flops * self.c.gemm_flops_eff)
        memory = m.hidden * m.vocab * m.dtype_bytes / self.weight_Bps
        logits = tokens * m.vocab * 4.0 / (self.hbm * self.p.elementwise_eff)
        return (compute if compute > memory else memory) + logits

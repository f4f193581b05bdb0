"""``SimConfig``: every knob of a simulation run, one frozen dataclass validated in ``__post_init__``.

Each field carries ``metadata["help"]``; the CLI builds its ``run`` options from them and a sweep grid names the
same fields. Errors are ``ConfigError("<field>: <rule>, got <value>")`` (the caller prefixes the file / record).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Optional

from oasis_core import modes, specs, speculation
from oasis_core.block_scorers import AUTO, DEFAULT_SCORER, ENGINE_SCORERS
from oasis_core.config_pieces import (
    BenchFields,
    KVFields,
    RunFields,
    SpeculationFields,
    TransferFields,
    resolve_default,
)
from oasis_core.echo import show
from oasis_core.geometry import HOST_KV_DTYPES
from oasis_core.short_context import ShortContext
from oasis_core.spec_predict import SPEC_PREDICT
from oasis_core.specs import MODES, SPARSE_MODES
from oasis_core.synthetic import SyntheticParams

SPLITS = ("none", "full", "rpf")
TRANSFER_PATHS = ("dma", "uva")
SELECTION_SOURCES = ("synthetic", "replay")
POLICY_SAMPLING = ("profile", "exact")
EVENT_MODES = ("closed", "events")
RPF_GRANULARITIES = ("block", "head")
ARRIVALS = ("trace", "closed", "poisson")
PREDICTORS = ("calibrated", "roofline")
ENGINES = ("oasis", "vllm")


class ConfigError(ValueError):
    """A bad configuration value; the message names the field and the value."""


def _h(text: str, default, **kw):
    return field(default=default, metadata={"help": text, **kw})


MAX_PROFILE_STEPS = 1 << 20  # a calibration episode's steps: beyond this the vectorised episode outgrows memory


@dataclass(frozen=True)
class SimConfig(SpeculationFields, BenchFields, TransferFields, KVFields, RunFields):
    """The simulator's run: the shared fields (``oasis_core.config_pieces``: model, mode, selection (default
    synthetic), max_context, seed, synthetic, tensor_parallel; the KV shape; the fetch cap; speculation) and its own."""

    # -- what runs (and the shared fields) --------------------------------------------------------------------
    hardware: str = _h("GPU preset (oasis_core.specs.HARDWARE)", "h100-sxm")
    # -- workload ---------------------------------------------------------------------------------------------
    arrival: str = _h("trace: the trace's arrival times | closed: fixed concurrency | poisson: open loop", "trace")
    concurrency: Optional[int] = _h("closed loop: requests kept in flight (implies arrival=closed)", None)
    rate_rps: Optional[float] = _h("poisson: mean arrivals per second", None)
    max_requests: Optional[int] = _h("use only the first N requests of the workload", None)
    time_scale: float = _h("multiply trace arrival times by this", 1.0)
    # -- serving engine ---------------------------------------------------------------------------------------
    max_batch: int = _h("most requests in the running batch", 256)
    chunk_tokens: int = _h("prefill tokens per step (chunked prefill)", 8192)
    hbm_utilization: float = _h("share of HBM the engine may use (weights included)", 0.9)
    hbm_bytes: Optional[float] = _h("override the GPU's HBM bytes", None)
    host_bytes: Optional[float] = _h("host DRAM bytes for KV per GPU (default: the node's DRAM / GPUs, x0.9)", None)
    draft_state_bytes: float = _h("per-request draft state kept in HBM (sparse modes)", 2 * 2**20)
    # -- speculative decoding (the executor's ExecConfig.speculative_k; oasis_core.speculation) -------------------
    speculative_alpha: float = _h(
        "per-position acceptance probability of the drafts (a chain: draft j counts only after drafts 1 .. j-1), "
        "unless speculative_accepted_hist is given",
        0.7,
    )
    speculative_accepted_hist: Optional[Mapping[str, Any]] = _h(
        "a measured acceptance, {\"K\": [steps accepting 0 .. K drafts]} per draft length (a recording's "
        "results.accepted_hist): per-position acceptance rates estimated from it replace speculative_alpha",
        None,
    )
    # -- transfers --------------------------------------------------------------------------------------------
    transfer_path: str = _h("dma: host gather + one DMA | uva: direct-read gather kernel (steals SMs)", "dma")
    h2d_bytes_per_s: Optional[float] = _h("effective host->GPU rate for scattered blocks (default: 0.55 x link)", None)
    gather_sm_share: float = _h("share of SMs a uva gather takes from compute while it runs", 0.24)
    # -- selection --------------------------------------------------------------------------------------------
    prediction_topk: bool = _h(
        "each layer's prediction runs its top-K (op topk) after the scoring; off: the scoring alone, as the "
        "executor's synthetic selection without synthetic_topk runs (a replay of such a recording sets it off)",
        True,
    )
    replay_file: Optional[str] = _h("replay: JSON file of recorded per-step fetch/recall figures", None)
    policy_sampling: str = _h(
        "profile: per context bucket, run oasis_core once and reuse | exact: every request", "profile"
    )
    policy_layers: int = _h("layers simulated per request (all their KV heads), scaled up to the model's layers", 2)
    profile_steps: int = _h(
        "profile: steps per calibration episode (later steps reuse the tail mean; RPF misses are stepped over the longest decode instead; a victim cache's episode spans at least four fills of its extra slots at the cap)",
        64,
    )
    profile_replicas: int = _h(
        "profile: independent requests simulated per context bucket (each policy_layers layers x KV heads rows), "
        "their figures averaged: where fetches are rare events (a victim cache) one request's rows are a noisy sample",
        1,
    )
    # -- prefill/decode split, prefix cache -------------------------------------------------------------------
    split: str = _h("none: one node | full: hand off the whole KV | rpf: remote partial fetching", "none")
    nic: str = _h("link preset of the prefill->decode NIC", "roce-400g")
    nic_bytes_per_s: Optional[float] = _h(
        "the NIC's rate, bytes/s, in place of the preset's (a measured link: experiments/two_gpu_split)", None
    )
    nic_latency_s: Optional[float] = _h("the NIC's per-transfer latency, s, in place of the preset's", None)
    rpf_granularity: str = _h(
        "rpf hand-off unit: block (union over a layer's KV heads) | head (each head's own set)", "block"
    )
    rpf_send_summaries: bool = _h(
        "rpf: the hand-off also carries every block summary (1/16 of the KV at K,V min/max)", True
    )
    prefix_cache: bool = _h("reuse prompt prefix blocks (trace prefix_block_ids)", False)
    prefix_cache_hbm_bytes: float = _h("prefix cache: HBM tier bytes (split=none: taken out of the KV pool)", 4e9)
    prefix_cache_host_bytes: float = _h("prefix cache: host tier bytes", 64e9)
    # -- timing and the bench's view (oasis_sim.calibrated, oasis_core.lanes) ---------------------------------
    predictor: str = _h(
        "calibrated: per-operation costs fitted on the executor's recorded GPU runs (calibration; on other hardware its "
        "efficiencies scale that hardware's peaks) | roofline: the analytic roofline (oasis_sim.predictor)",
        "calibrated",
    )
    calibration: Optional[str] = _h(
        "calibration file of predictor=calibrated (default: the shipped one, oasis_sim/data/calibration_h200.json)",
        None,
    )
    engine: str = _h(
        "oasis: this project's engine | vllm: vLLM dense (mode=dense): paged attention at vLLM's fitted HBM "
        "efficiency, a block allocator paging the KV budget block by block, preemption when it runs out",
        "oasis",
    )
    decode_only: bool = _h(
        "every request arrives with its prompt's KV in place (the bench's synthesized prefill): no prefill work", False
    )
    fast_forward: int = _h(
        "steady decode stretches (every running request decoding, none admitted, no event due before the "
        "stretch's last step, the policy on its steady tail, the pipeline steady, the memory growth fitting) "
        "advance up to this many steps at once with the step's duration (oasis_sim.engine); whole-KV modes (dense) "
        "also through prefill chunks, admissions and ends, exactly (oasis_sim.stretch); 0: every step simulated",
        256,
    )
    # -- simulation -------------------------------------------------------------------------------------------
    event_mode: str = _h("closed: closed-form per-layer timing | events: one SimPy event per layer stage", "closed")
    timeline_steps: int = _h("steps recorded in timeline.json (0 = none)", 200)

    def __post_init__(self):
        resolve_default(self, "selection", "synthetic")
        # block_score=auto: the executor's tokens needs a real model's channel basis (oasis_exec.scorer_auto); the
        # simulator's models are shapes without weights, so auto is always the two-vector default here
        if self.block_score == AUTO:
            object.__setattr__(self, "block_score", DEFAULT_SCORER)

        def bad(name, rule):
            raise ConfigError(f"{name}: {rule}, got {getattr(self, name)!r}")

        def choice(name, options):
            if getattr(self, name) not in options:
                bad(name, f"must be one of {', '.join(options)}")

        def integer(name, lo, optional=False, hi=None):
            v = getattr(self, name)
            if optional and v is None:
                return
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                bad(name, "must be an integer")
            if v < lo:
                bad(name, f"must be >= {lo}")
            if hi is not None and v > hi:
                bad(name, f"must be <= {hi:,}")

        def number(name, lo, hi=math.inf, lo_open=False, optional=False):
            v = getattr(self, name)
            if optional and v is None:
                return
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                bad(name, "must be a finite number")
            if (v <= lo if lo_open else v < lo) or v > hi:
                bad(name, f"must be in {'(' if lo_open else '['}{lo}, {hi}]")

        for name, table in (("model", specs.MODELS), ("hardware", specs.HARDWARE), ("nic", specs.LINKS)):
            if getattr(self, name) not in table:
                bad(name, f"must be one of {', '.join(sorted(table))}")
        try:
            mode = modes.get(self.mode)
        except ValueError:
            bad("mode", f"must be one of {', '.join(MODES)}")
        choice("arrival", ARRIVALS)
        choice("transfer_path", TRANSFER_PATHS)
        choice("host_kv_dtype", HOST_KV_DTYPES)
        choice("block_score", ENGINE_SCORERS)
        integer("token_rank", 0)
        if self.token_rank % 2:
            bad("token_rank", "must be 0 (head_dim / 4) or even (RoPE pairs)")
        choice("spec_predict", SPEC_PREDICT)
        choice("selection", SELECTION_SOURCES)
        choice("policy_sampling", POLICY_SAMPLING)
        choice("split", SPLITS)
        choice("event_mode", EVENT_MODES)
        choice("rpf_granularity", RPF_GRANULARITIES)
        choice("predictor", PREDICTORS)
        choice("engine", ENGINES)
        if self.engine == "vllm" and modes.get(self.mode).selects:
            bad("engine", f"vllm runs mode=dense, not mode={self.mode}")
        number("kv_budget_gb", 0.0, lo_open=True, optional=True)
        integer("decode_chain", 1)
        integer("spec_chain", 1)
        integer("fast_forward", 0)
        if self.calibration is not None and not isinstance(self.calibration, str):
            bad("calibration", "must be a file path")
        integer("top_k", 1)
        integer("hot_slots", 1, optional=True)
        if self.hot_slots is not None:
            why = mode.hot_slots_error(self.top_k, self.hot_slots)
            if why:
                bad("hot_slots", why)
        integer("block_size", 1)
        number("fetch_ratio", 0.0, 1.0, lo_open=True)
        integer("seed", 0)
        if self.fetch_policy is not None:
            from oasis_core.fetchcap import get_policy

            if not isinstance(self.fetch_policy, str):
                bad("fetch_policy", "must be a policy spec string such as 'budget:0.8'")
            try:
                pol = get_policy(self.fetch_policy)
            except ValueError as e:  # the message already names the spec and the bad value
                raise ConfigError(f"fetch_policy: {' '.join(str(e).split())}") from None
            if not pol.static and self.policy_sampling == "profile" and self.selection != "replay" and mode.background:
                bad(
                    "fetch_policy",
                    f"{show(pol.spec)} is adaptive (its cap follows each step's own state: misses, drift, the "
                    "link or the step's time), which policy_sampling=profile (plans precomputed per context "
                    "bucket) cannot follow; set policy_sampling=exact",
                )
        integer("concurrency", 1, optional=True)
        number("rate_rps", 0.0, lo_open=True, optional=True)
        integer("max_requests", 1, optional=True)
        number("time_scale", 0.0, lo_open=True)
        integer("max_context", 2, optional=True)
        integer("max_batch", 1)
        integer("chunk_tokens", 1)
        number("hbm_utilization", 0.0, 1.0, lo_open=True)
        number("hbm_bytes", 0.0, lo_open=True, optional=True)
        number("host_bytes", 0.0, lo_open=True, optional=True)
        number("draft_state_bytes", 0.0)
        number("h2d_bytes_per_s", 0.0, lo_open=True, optional=True)
        number("nic_bytes_per_s", 0.0, lo_open=True, optional=True)
        number("nic_latency_s", 0.0, optional=True)
        number("gather_sm_share", 0.0, 0.95)
        integer("policy_layers", 1)
        integer("profile_steps", 2, hi=MAX_PROFILE_STEPS)
        integer("profile_replicas", 1)
        number("prefix_cache_hbm_bytes", 0.0)
        number("prefix_cache_host_bytes", 0.0)
        integer("timeline_steps", 0)
        integer("tensor_parallel", 1)
        if self.tensor_parallel > 1:
            if self.split != "none":
                bad("tensor_parallel", "is modelled on one node (split=none)")
            try:
                self.model_spec  # noqa: B018  (more ranks than KV heads fail here)
            except ValueError as e:
                bad("tensor_parallel", str(e))
        try:
            k, _adaptive = speculation.parse_spec(self.speculative_k, self.block_size)
        except ValueError as e:
            bad("speculative_k", str(e))
        if k and not mode.speculative:
            bad(
                "speculative_k",
                f"only modes {' and '.join(modes.SPECULATIVE_MODES)} decode speculatively, not {self.mode}",
            )
        if k >= self.block_size:
            bad("speculative_k", f"must be < block_size ({self.block_size}): a step fills at most one block")
        number("speculative_gamma", 0.0, optional=True)
        number("speculative_alpha", 0.0, 1.0)
        if self.speculative_accepted_hist is not None:
            from oasis_core.recording import check_accepted_hist

            try:
                check_accepted_hist(self.speculative_accepted_hist)
            except ValueError as e:
                raise ConfigError(f"speculative_accepted_hist: {e}") from None
        for name in ("prefix_cache", "rpf_send_summaries", "short_context", "decode_only", "no_transfer"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")
        if self.concurrency is not None and self.arrival == "trace":
            object.__setattr__(self, "arrival", "closed")
        if self.arrival == "closed" and self.concurrency is None:
            bad("concurrency", "must be set for arrival=closed")
        if self.arrival == "poisson" and self.rate_rps is None:
            bad("rate_rps", "must be set for arrival=poisson")
        if self.selection == "replay" and not self.replay_file:
            bad("replay_file", "must name a file for selection=replay")
        spec = specs.get_model(self.model)
        if mode.selects and not spec.n_full_layers:
            bad("mode", f"selects blocks of the full-attention layers, and every layer of {self.model} is windowed")
        if self.prefix_cache and spec.is_hybrid:
            bad("prefix_cache", f"is not modelled for a hybrid model (windowed layers), got model={self.model}")
        if self.host_kv_dtype != "auto":
            if not mode.sparse:
                bad("host_kv_dtype", f"only a sparse mode keeps a host copy, not mode={self.mode}")
            if self.split != "none":
                bad("host_kv_dtype", "an fp8 host copy is modelled on one node (split=none); the hand-off is not")
        if self.split == "rpf" and not mode.sparse:
            bad("split", f"rpf needs a sparse mode ({', '.join(SPARSE_MODES)}) but mode is {show(self.mode)}")
        if self.synthetic is not None:
            if not isinstance(self.synthetic, Mapping):
                bad("synthetic", "must be a mapping of SyntheticParams fields")
            try:
                self.synthetic_params  # noqa: B018  (the property validates the overrides)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"synthetic: {e}") from None

    # -- derived ----------------------------------------------------------------------------------------------
    @property
    def synthetic_params(self) -> SyntheticParams:
        from oasis_core.synthetic_presets import resolve

        return resolve(self.synthetic)

    @property
    def sparse(self) -> bool:
        return modes.get(self.mode).sparse

    @property
    def resident_slots(self) -> int:
        """Selectable GPU blocks per (request, layer, KV head) of a sparse mode: ``top_k``, or the hot cache's
        ``hot_slots`` (default ``2 * top_k``) in a mode with one (hisparse; the executor's ``resident_slots``)."""
        return modes.get(self.mode).resident_slots(self.top_k, self.hot_slots)

    @property
    def short_context_rule(self) -> Optional[ShortContext]:
        """The short-context rule this run applies, None when it applies none (switched off, a mode with the whole
        KV on the GPU, or split=rpf, whose hand-off sends only the predicted blocks)."""
        if not (self.short_context and self.sparse and self.split != "rpf"):
            return None
        return ShortContext(top_k=self.top_k, block_size=self.block_size)

    @property
    def model_spec(self) -> specs.ModelSpec:
        """The model preset; with ``tensor_parallel > 1`` rank 0's share of it (``oasis_core.specs.tp_local``)."""
        return specs.tp_local(specs.get_model(self.model), self.tensor_parallel)

    @property
    def hardware_spec(self) -> specs.HardwareSpec:
        return specs.get_hardware(self.hardware)

    def with_(self, **kw) -> "SimConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return {
            f.name: (
                dict(getattr(self, f.name)) if isinstance(getattr(self, f.name), Mapping) else getattr(self, f.name)
            )
            for f in fields(self)
        }


def config_fields() -> dict:
    """name -> (default, help) of every SimConfig field, in declaration order."""
    return {f.name: (f.default, f.metadata["help"]) for f in fields(SimConfig)}


def make_config(values: Mapping[str, Any]) -> SimConfig:
    """Build a config from a mapping; unknown keys and bad values raise ``ConfigError`` naming the key."""
    names = {f.name for f in fields(SimConfig)}
    for k in values:
        if k not in names:
            raise ConfigError(f"{k}: unknown parameter; choose from {', '.join(sorted(names))}")
    try:
        return SimConfig(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(" ".join(str(e).split())) from None

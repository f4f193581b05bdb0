"""Timing predictors: the simulation asks ``predictor.time(op, shape)`` and never computes a latency inline.

Operations and their shape keys (all times in seconds, all per one layer unless marked per step):

=================  ============================================  =================================================
op                 shape keys                                    roofline model
=================  ============================================  =================================================
``gemm_layer``     ``tokens``                                    QKV, O and MLP GEMMs of one layer:
                                                                 ``max(2·tokens·P_layer / (F·e_f), W_layer / (H·e_w))``
``attn_decode``    ``kv_bytes`` (``requests``: the decode batch,  decode attention reads its KV once:
                   optional)                                     ``kv_bytes / A`` (A = attention read rate); linear
                                                                 in ``kv_bytes`` at a given ``requests`` for every
                                                                 predictor (the engine's stretches assume it)
``attn_prefill``   ``tokens``, ``past_tokens``                   causal flash attention FLOPs
                                                                 ``4·Hq·d·tokens·(past + tokens/2) / (F·e_pf)``
``norm_rope``      ``tokens``                                    two RMSNorms + RoPE (+ QK-norm): elementwise bytes
``score``          ``summary_bytes``                             lookahead scoring reads the block summaries
``topk``           ``elements``                                  top-K over the scores: a launch's latency
                                                                 ``topk_fixed_s`` + ``elements·4 B`` read twice
``select``         ``rows``                                      Algorithm 2 on the GPU: fixed cost + per row
``spec_repair``    (none)                                        the speculative step's repair prediction of one
                                                                 layer after the acceptance (``spec_predict =
                                                                 "beside"``, ``oasis_kernels.spec_repair``): a
                                                                 launch's latency ``spec_repair_fixed_s`` (its
                                                                 selection is ``select``)
``spec_commit``    ``k`` (drafts a lane; default 2)               a speculative step's commit of one full layer after
                                                                 the acceptance (the resident working set's
                                                                 ``commit_accepted``: the accepted drafts' K/V
                                                                 scattered (rejected ones to the trash slot), the
                                                                 summary updates, the filled block's write-back), on
                                                                 the compute stream: its ``spec_commit_kernels(k)``
                                                                 latency-bound kernels at their measured durations
                                                                 + the graph's gaps between them
                                                                 (``graph_kernel_gap_s`` each)
``spec_beside``    (none)                                        what ``spec_predict = "beside"``'s stage beside the
                                                                 verify pass launches on the prediction stream
                                                                 beyond an ordinary step's (the candidates' score
                                                                 values, two stacks, the chosen index's gather and
                                                                 their index arithmetic), charged to the pass of one
                                                                 full layer: ``spec_beside_layer_s`` (fixed)
``sparse_overhead`` ``requests``                                  per-request cost of the sparse machinery that is
                                                                 not hidden: ``requests · sparse_request_layer_s``
``side_contention`` ``hbm_bytes``                                 HBM bytes the side stream moves while compute
                                                                 runs (summary reads, top-K, landing transfers),
                                                                 charged to compute: ``side_hbm_contention ·
                                                                 bytes / A``
``lm_head``        ``tokens``                                    final norm, LM head GEMM, sampling (per step)
``draft_step``     ``tokens``                                    one step of the EAGLE-style draft head over
                                                                 ``tokens`` rows (per step; speculative decoding):
                                                                 its decoder layer's GEMMs, the ``3·hidden ->
                                                                 hidden`` feature projection and the draft LM head
                                                                 over ``DRAFT_VOCAB`` tokens, as ``gemm_layer``
``step_overhead``  (none)                                        launch/scheduling overhead per step
``step_floor``     ``requests`` (per step)                       the least a step lasts whatever the GPU does (a host
                                                                 loop overlapped with the GPU: the calibrated vLLM
                                                                 model); 0 here
``all_reduce``     ``bytes``, ``ranks``                          tensor parallelism (``SimConfig.tensor_parallel``),
                                                                 one ring all-reduce over NVLink 4 (``nvlink-4``):
                                                                 ``latency + 2(r-1)/r·bytes / (N·e_ar)``; 0 for one
                                                                 rank (two a layer: attention's and the MLP's)
=================  ============================================  =================================================

``F`` is the GPU's dense BF16 FLOP/s, ``H`` its HBM bandwidth, ``P_layer``/``W_layer`` the active parameters/weight
bytes of one layer. Every efficiency factor is a field of :class:`RooflineParams`. A predictor fitted to executor
recordings implements the same :class:`TimePredictor` interface and plugs in without touching the simulation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Mapping

from oasis_core.echo import show
from oasis_core.specs import HardwareSpec, ModelSpec, get_link

OPS = (
    "gemm_layer",
    "attn_decode",
    "attn_prefill",
    "norm_rope",
    "score",
    "topk",
    "select",
    "spec_repair",
    "spec_commit",
    "spec_beside",
    "sparse_overhead",
    "side_contention",
    "lm_head",
    "step_overhead",
    "draft_step",
    "all_reduce",
    "step_floor",
)

DRAFT_VOCAB = 32000  # the draft head's vocabulary (EAGLE-3; the executor's ExecConfig.draft_vocab default)


def spec_commit_kernels(k: int) -> tuple:
    """The commit's kernels a full layer (op spec_commit, oasis_exec/workingset/commit.py since 04c9539), one after
    another on the compute stream: (scatters, summary updates, write-backs). A phase is one scatter for K and one
    for V and a summary update; k = 1 runs one phase (a lane's one draft lies in one block), k >= 2 two (the input's
    block and the next); one write-back of a block the run filled."""
    phases = 1 if k <= 1 else 2
    return 2 * phases, phases, 1


class TimePredictor(ABC):
    """``time(op, shape) -> seconds``; ``op`` one of :data:`OPS`, ``shape`` a mapping of the keys listed above."""

    @abstractmethod
    def time(self, op: str, shape: Mapping[str, float]) -> float: ...


@dataclass(frozen=True)
class RooflineParams:
    """Efficiency factors of the analytic roofline (fractions of the datasheet peak) and fixed overheads.

    Defaults are set from DESIGN.md's H200 measurements: Qwen3-8B layer GEMMs take 0.15 ms at batch 1–128
    (386 MB of weights → 0.55 of 4.8 TB/s); decode attention reads KV at 4.3 TB/s (0.9 of peak).

    ``sparse_request_layer_s`` (op ``sparse_overhead``, added to the compute stream of ``retrieval``, ``proxy`` and
    ``lookahead`` per decode request per layer): what the sparse machinery costs beyond the roofline's byte and
    FLOP terms — draft/proxy query handling, launching the scoring, top-K and Algorithm-2 kernels per layer,
    index-table updates — which the executor measures as *not hidden* by the side streams. Default **6.7 µs**, from
    the executor's H200 run (``experiments/dense_vs_lookahead_throughput/results/executor_runs_log.md``, 16K × 16 requests, CUDA graphs):
    lookahead with its copies skipped (``--no-transfer``) 17.57 ms TPOT vs quest 13.65 ms, a 3.92 ms gap; the
    roofline (with ``side_hbm_contention`` = 1) puts the same two steps 0.07 ms apart on the ``h200`` preset, so
    3.85 ms / (16 requests × 36 layers) = 6.7 µs is unexplained per request per layer. Cross-check: the paper's
    Table 2 ratio-0.01 point and its Fig. 11 TPOT imply ≈7.7 µs on the H100 (``experiments/paper_reproduction/results/sim_paper_repro.md``).

    ``side_hbm_contention`` (op ``side_contention``, background modes): the side stream's HBM traffic per layer
    (summary reads of the scoring, top-K scores, host→GPU transfers landing in HBM) is charged to the compute
    stream at the attention read rate, times this share. Default **1**: a decode layer's compute is HBM-bound
    (weight and KV reads), so bytes another stream moves at the same time delay it by bytes / bandwidth; 0 makes
    side work free (the model before). SM stealing by a direct-read gather is separate
    (``SimConfig.gather_sm_share``, ``transfer_path='uva'``).
    """

    gemm_flops_eff: float = 0.6  # of bf16_flops, for GEMMs that are compute bound
    gemm_mem_eff: float = 0.55  # of hbm_bytes_per_s, for weight reads of memory-bound GEMMs
    attn_mem_eff: float = 0.9  # of hbm_bytes_per_s, used when the hardware has no measured attention read rate
    prefill_attn_flops_eff: float = 0.5
    elementwise_eff: float = 0.7
    score_mem_eff: float = 0.7  # summary reads by the scoring kernel
    select_fixed_s: float = 20e-6  # per layer, the selection kernel's launch and sort
    select_per_row_s: float = 2e-9
    # per layer, the top-K's one launch (oasis_kernels.topk_select): latency-bound (32 dependent counts over each row), not
    # byte-bound; 1.20 ms of GPU a 16K x 16 step over 36 layers on the H200 (experiments/dense_vs_lookahead_throughput/
    # results/topk_select_dd08326/). The byte term alone put it at ~0.3 µs.
    topk_fixed_s: float = 33e-6
    # per layer, spec_predict=beside's repair prediction after the acceptance (op spec_repair; its plan is `select`).
    # The torch path it replaced measured 4.2 ms a step on the H100 (beside at k = 1 with and without the repair, the
    # same in the no-transfer twin; dummy Qwen3-8B, 16K x 44 lanes, 2026-12-06, 486130b): 117 us a layer at 36
    # layers, ~96 us of it beyond the selection's select_fixed_s + rows (a few dozen tiny kernels). The fused kernel
    # (oasis_kernels.spec_repair, one launch of R short programs) was estimated at 8 us a layer; measured on the H100
    # (experiments/decode_step_profile/results/spec_beside_h100_6ec514d/, dummy Qwen3-8B, 16K x 44, k = 1 beside):
    # spec_repair_kernel 25.94 us alone (eager, 36 a step), 27.19 us in the step's graph. The kernel alone is taken.
    spec_repair_fixed_s: float = 25.94e-6
    # a speculative lookahead step's commit after the acceptance, per full layer (op spec_commit; oasis_exec/
    # workingset/commit.py, on the compute stream, both spec_predict variants): latency-bound kernels (B x H x k x D
    # tensors, 45,056 elements at 44 lanes and k = 1), priced by their durations in the H200 profile of the
    # 2610b77 commit code (experiments/speculative_decoding/results/profile_spec_2610b77/profile_k2.txt: dummy
    # Qwen3-8B, 16K x 32, k = 2): summary_update 3.00 us, _writeback 3.68 us. The scatter (index_put of the drafts'
    # K or V, rejected ones to the row's trash slot, since c604300) is one index_elementwise kernel of the same shape
    # as the two that masked write read and wrote with there (5.28 and 5.00 us): their mean, 5.14 us. (The masked
    # write it replaced, 8 index kernels and 4 wheres a layer, was 68.8 us a layer with its summaries and write-back;
    # on SmolLM2's shape on the H100 replacing it saved 1.98 ms a step over 30 layers, 66 us a layer:
    # experiments/decode_step_profile/results/smol_spec_h100_c604300/.)
    spec_commit_scatter_s: float = 5.14e-6
    spec_commit_summary_s: float = 3.00e-6
    spec_commit_writeback_s: float = 3.68e-6
    # between two dependent kernels of one stream inside a CUDA graph, the idle GPU time before the second starts:
    # the median of the 1,479 gaps under 10 us between consecutive kernels of the main stream in the H200 trace of a
    # 16K x 44 lookahead graph step (experiments/decode_step_profile/results/chain_gaps_f143ed3/c1n44.json.gz:
    # 0.42 us, quartiles 0.38 / 0.48). Charged where the model prices a chain of latency-bound kernels by their
    # durations alone: the commit's spec_commit_kernels(k) (op spec_commit).
    graph_kernel_gap_s: float = 0.42e-6
    # per full layer, spec_predict=beside's stage beside the verify pass beyond what an ordinary lookahead step's
    # side stage runs (op spec_beside; oasis_exec/workingset/spec_pipeline.py SpecPipeline.beside: nb and its int32
    # copies, pred.long(), pred >= 0, clamp, the scores' gather at the ids, full_like, where, the two stacks, s_hat - 1,
    # repeat_interleave, arange, the index of the chosen candidate), charged to the pass: the prediction stream's
    # small kernels hold SMs the pass's next kernel waits for (experiments/decode_step_profile/results/
    # critical_path_16k_a9d253e/). Priced kernel by kernel from the H100 profiles of the k = 1 step (experiments/
    # decode_step_profile/results/spec_beside_h100_6ec514d/spec_beside.jsonl, dummy Qwen3-8B, 16K x 44): the kernels
    # the beside graph runs 36 (or 72, 108) times a step more than the after graph, but for the repair's
    # spec_repair, plan_select and gather (after the pass: op spec_repair, select, the repair's copy), each at its
    # mean alone (the eager profile): direct_copy<128,2> 2 x 1.71, index 4.15, compare 1.62, scatter_gather 7.65,
    # direct_copy<128,4> 2.69, add 3 x 1.47, clamp 1.38, unrolled direct_copy 1.49, where 2.48, arange 0.98,
    # floor_divide 1.68, fill 1.04 us; and the two stacks' device copies, which the graph runs as memcpy32_post
    # kernels (2 x 4.44 us in the graph; eager has them as copy-engine memcpys, no kernel) = 41.87 us a layer. No beside
    # recording was used to set it.
    spec_beside_layer_s: float = 41.87e-6
    sampling_fixed_s: float = 50e-6  # per step
    step_overhead_s: float = 300e-6  # per step: scheduling, launch (CUDA graphs assumed)
    layer_overhead_s: float = 4e-6  # per layer: kernel launches not hidden by graphs
    sparse_request_layer_s: float = 6.7e-6  # per request per layer (sparse modes): see the class docstring
    side_hbm_contention: float = 1.0  # share of the side stream's HBM bytes charged to the compute stream
    allreduce_link_eff: float = 0.8  # of the NVLink rate, a ring all-reduce's bus bandwidth (unfitted: no TP run yet)

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
                raise ValueError(f"RooflineParams.{f.name}: must be a number >= 0, got {show(v)}")
            if f.name.endswith("_eff") and not 0 < v <= 1:
                raise ValueError(f"RooflineParams.{f.name}: must be in (0, 1], got {show(v)}")


# Efficiencies 1, overheads 0 (``RooflinePredictor.floor``).
PEAK_PARAMS = RooflineParams(**{f.name: (1.0 if f.name.endswith("_eff") else 0.0) for f in fields(RooflineParams)})


class RooflinePredictor(TimePredictor):
    """Analytic per-operation times from a model and a GPU spec (see the module docstring)."""

    memoisable = True  # times depend on (op, shape) only: the engine may cache them per token count

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, params: RooflineParams | None = None):
        self.model = model
        self.hw = hardware
        self.p = params or RooflineParams()
        m, p = model, self.p
        self.layer_params = m.attn_params_per_layer + m.active_mlp_params_per_layer
        self.layer_weight_bytes = m.layer_active_weight_bytes  # layer_params x dtype_bytes, experts at their own bytes
        self.flops = hardware.bf16_flops
        self.hbm = hardware.hbm_bytes_per_s
        self.attn_Bps = hardware.measured_attn_read_bytes_per_s or self.hbm * p.attn_mem_eff
        self._ops = {
            "gemm_layer": self._gemm_layer,
            "attn_decode": self._attn_decode,
            "attn_prefill": self._attn_prefill,
            "norm_rope": self._norm_rope,
            "score": self._score,
            "topk": self._topk,
            "select": self._select,
            "spec_repair": self._spec_repair,
            "spec_commit": self._spec_commit,
            "spec_beside": self._spec_beside,
            "lm_head": self._lm_head,
            "step_overhead": self._step_overhead,
            "sparse_overhead": self._sparse_overhead,
            "side_contention": self._side_contention,
            "draft_step": self._draft_step,
            "all_reduce": self._all_reduce,
            "step_floor": self._step_floor,
        }
        self.gpu_link = get_link("nvlink-4")  # between the GPUs of a node (H100 / H200): tensor parallelism
        # the draft head's weights beyond one decoder layer: the feature projection and its LM head
        self.draft_extra_params = 3 * m.hidden * m.hidden + m.hidden * min(m.vocab, DRAFT_VOCAB)

    @classmethod
    def floor(cls, model: ModelSpec, hardware: HardwareSpec) -> "RooflinePredictor":
        """The physical floor: every byte at the datasheet HBM bandwidth, every FLOP at peak BF16 FLOP/s, no fixed
        overheads. No implementation of an op can be faster; a fitted predictor (``oasis_sim.fitted``) is this floor
        plus a non-negative excess, never below it."""
        fl = cls(model, hardware, PEAK_PARAMS)
        fl.attn_Bps = fl.hbm  # not the measured attention read rate: the datasheet peak
        return fl

    def time(self, op: str, shape: Mapping[str, float]) -> float:
        try:
            fn = self._ops[op]
        except KeyError:
            raise ValueError(f"predictor op: unknown {show(op)}; choose one of: {', '.join(OPS)}") from None
        return fn(shape)

    # -- ops ------------------------------------------------------------------------------------------------
    def _gemm_layer(self, s) -> float:
        tokens = s["tokens"]
        if tokens <= 0:
            return 0.0
        compute = 2.0 * tokens * self.layer_params / (self.flops * self.p.gemm_flops_eff)
        memory = self.layer_weight_bytes / (self.hbm * self.p.gemm_mem_eff)
        return (compute if compute > memory else memory) + self.p.layer_overhead_s

    def _attn_decode(self, s) -> float:
        return s["kv_bytes"] / self.attn_Bps

    def _attn_prefill(self, s) -> float:
        t = s["tokens"]
        m = self.model
        fl = 4.0 * m.n_q_heads * m.head_dim * t * (s["past_tokens"] + t / 2.0)
        return fl / (self.flops * self.p.prefill_attn_flops_eff)

    def _norm_rope(self, s) -> float:
        m = self.model
        # two RMSNorms over hidden (read + write) and RoPE over q and k (read + write), bf16
        nbytes = s["tokens"] * m.dtype_bytes * 2.0 * (2 * m.hidden + m.q_dim + m.kv_dim)
        return nbytes / (self.hbm * self.p.elementwise_eff)

    def _score(self, s) -> float:
        return s["summary_bytes"] / (self.hbm * self.p.score_mem_eff)

    def _topk(self, s) -> float:
        return self.p.topk_fixed_s + 2.0 * 4.0 * s["elements"] / (self.hbm * self.p.elementwise_eff)

    def _select(self, s) -> float:
        return self.p.select_fixed_s + self.p.select_per_row_s * s["rows"]

    def _spec_repair(self, s) -> float:
        return self.p.spec_repair_fixed_s

    def _spec_commit(self, s) -> float:
        n_sc, n_sum, n_wb = spec_commit_kernels(int(s.get("k", 2)))
        p = self.p
        busy = n_sc * p.spec_commit_scatter_s + n_sum * p.spec_commit_summary_s + n_wb * p.spec_commit_writeback_s
        return busy + (n_sc + n_sum + n_wb - 1) * p.graph_kernel_gap_s

    def _spec_beside(self, s) -> float:
        return self.p.spec_beside_layer_s

    def _lm_head(self, s) -> float:
        m = self.model
        tokens = s["tokens"]
        if tokens <= 0:
            return 0.0
        compute = 2.0 * tokens * m.hidden * m.vocab / (self.flops * self.p.gemm_flops_eff)
        memory = m.hidden * m.vocab * m.dtype_bytes / (self.hbm * self.p.gemm_mem_eff)
        logits = tokens * m.vocab * 4.0 / (self.hbm * self.p.elementwise_eff)
        return (compute if compute > memory else memory) + logits + self.p.sampling_fixed_s

    def _draft_step(self, s) -> float:
        tokens = s["tokens"]
        if tokens <= 0:
            return 0.0
        params = self.layer_params + self.draft_extra_params
        compute = 2.0 * tokens * params / (self.flops * self.p.gemm_flops_eff)
        memory = params * self.model.dtype_bytes / (self.hbm * self.p.gemm_mem_eff)
        return (compute if compute > memory else memory) + self._norm_rope(s) + self.p.layer_overhead_s

    def _sparse_overhead(self, s) -> float:
        return s["requests"] * self.p.sparse_request_layer_s

    def _side_contention(self, s) -> float:
        return self.p.side_hbm_contention * s["hbm_bytes"] / self.attn_Bps

    def _all_reduce(self, s) -> float:
        r = s["ranks"]
        if r <= 1:
            return 0.0
        link = self.gpu_link
        rate = link.bytes_per_s * self.p.allreduce_link_eff
        lat = link.latency_s if self.p.layer_overhead_s else 0.0  # the floor (PEAK_PARAMS) has no fixed costs
        return lat + 2.0 * (r - 1) / r * s["bytes"] / rate

    def _step_overhead(self, s) -> float:
        return self.p.step_overhead_s

    def _step_floor(self, s) -> float:
        return 0.0

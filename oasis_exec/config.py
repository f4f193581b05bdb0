"""The executor's configurations: frozen dataclasses, validated on construction, whose fields become the CLIs.

``ExecConfig`` is the engine (every ``python -m oasis_exec`` command that builds one: ``bench``, ``generate``,
``serve``); ``BenchConfig`` what ``bench`` runs on it. ``add_engine_options`` / ``engine_config`` and
``add_bench_options`` / ``bench_config`` generate the options from the fields (``oasis_core.cliargs``) and build the
dataclasses back from what the command line gave, so the field defaults below are the only defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from oasis_core import cliargs, modes, speculation
from oasis_core.block_scorers import AUTO
from oasis_core.config_pieces import (
    BenchFields,
    KVFields,
    RunFields,
    SpeculationFields,
    TransferFields,
    resolve_default,
)
from oasis_core.echo import show
from oasis_core.specs import MODELS

from .cli_checks import DEVICE_PATTERN, writable_path

TRANSFERS = ("host", "uva", "auto")
# stream_priority -> (captured step, prediction stream, copy stream) CUDA priorities (0 is torch's default; -1, -2
# higher; oasis_exec.workingset.prefetcher creates the streams). normal: all level; high: both side streams above the step; low:
# both below it; pred_low: the prediction stream below, the copy level with it; pred_low_copy_high: the prediction
# below, the copy above.
STREAM_PRIORITIES = {
    "normal": (0, 0, 0),
    "high": (0, -1, -1),
    "low": (-1, 0, 0),
    "pred_low": (-1, 0, -1),
    "pred_low_copy_high": (-1, 0, -2),
}
PRIORITIES = (*STREAM_PRIORITIES, "auto")
SWITCHES = ("on", "off", "auto")
DTYPES = ("bfloat16", "float32")
GB = 1e9
MAX_CONTEXT = 16384 + 1024  # ExecConfig.max_context's default: a 16K prompt and 1K of output
# ExecConfig.draft_gate's default in a mode with a draft row (lookahead; 0, off, elsewhere): Gemma 3 270M, trained
# attention head, 32,768 tokens, K = 256 of 2,048 blocks, fetch 0.05, its own selection (H100, 2026-12-06, 1dc31ae;
# experiments/long_context_draft/results/endtoend_gemma_32k_gates_h100_1dc31ae.txt), perplexity over dense: tokens
# scorer, head: ungated +11.87%, 0.5 +3.75% (proxy +3.00%); head + prompt lookup: ungated +2.22%, 0.5 -0.26%
DRAFT_GATE = 0.5
# ExecConfig.draft_ngram's default in a mode with a draft row and no speculative decoding (0, off, elsewhere): prompt
# lookup's token where the lane's last 2+ tokens occurred before (runner/ngram_drafts.py). Gemma 3 270M, trained
# head, 32K, K = 256 blocks, fetch 0.05, tokens scorer, its own selection, five texts x 255 teacher-forced tokens
# (H100, 2026-12-06, 1d44039; experiments/long_context_draft/results/endtoend_gemma_32k_5texts_h100_1d44039.txt),
# perplexity over dense: head +5.32%, head gate 0.5 +2.08%, head + lookup +1.35%, head + lookup + gate 0.5 +0.37%
# (proxy +1.68%). Its step cost on the device (every decode step; H100, 2026-12-06, 6ec514d, dummy Qwen3-8B,
# synthetic selection, 16K x 44; results/ngram_cost_h100_6ec514d): 2,568 -> 2,555 tok/s (-0.5%), TPOT p50 17.130
# -> 17.223 ms (+0.54%). With speculative decoding too (the lookup's token replaces the chain's first proposal,
# which a single-key head continues from its own state): Gemma 3 270M, attention head, 8K of the licences, k = 1, 4
# lanes x 48 steps (this CPU, 2026-12-07, 1a7bc32; experiments/speculative_decoding/README.md, "Prompt lookup as
# the speculative draft"): first drafts accepted 23% -> 58%; SmolLM2 on argparse.py at 2K: 50% -> 48% (no match to find)
DRAFT_NGRAM = 2


# why draft_head=attn refuses speculative_k >= 2 (ExecConfig, Runner.set_speculative_k)
ATTN_NO_CHAINS = (
    "draft_head=attn speculates at k = 1 only (1 or auto:1): its drafts past the first would be a chain, the head run "
    "on its own outputs, and it is trained on the target's features only"
)


def attn_speculative_k(value):
    """``speculative_k`` with ``draft_head=attn``: ``auto`` (whose default longest draft is 4) capped at ``auto:1``;
    any other value as given (k >= 2 and ``auto:N`` with N >= 2 are refused: ``ATTN_NO_CHAINS``)."""
    return f"{speculation.AUTO}:1" if value == speculation.AUTO else value


def _f(default, help, choices=None, metavar=None, type=None):
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if metavar is not None:
        meta["metavar"] = metavar
    if type is not None:  # the option's own parser (oasis_core.cliargs): a field of several types
        meta["type"] = type
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ExecConfig(SpeculationFields, BenchFields, TransferFields, KVFields, RunFields):
    """The engine: the shared fields (``oasis_core.config_pieces``: model, mode, selection (default model),
    max_context (default 16,384 + 1,024), seed, synthetic, tensor_parallel; the KV shape; the fetch cap; speculation)
    and the executor's own."""

    model_path: str | None = _f(None, "local Hugging Face directory (config.json + *.safetensors); None = dummy")
    draft_path: str | None = _f(None, "local EAGLE-3 draft directory; None = random draft head")
    draft_vocab: int = _f(32000, "draft vocabulary of a random draft head")
    draft_head: str = _f(
        "single",
        "single: the single-key head (its layer attends only its own position); attn: the full EAGLE-3 layer over "
        "its own K/V of every earlier position (oasis_exec.model.draft_attn). attn speculates at k = 1 only "
        "(speculative_k 1 or auto:1; auto becomes auto:1): its one draft is its next-token prediction and its K/V "
        "grows by the accepted positions; no chains (k >= 2), as it is trained on the target's features only, never "
        "on its own outputs",
        ("single", "attn"),
    )
    draft_ngram: int | None = _f(
        None,
        "prompt lookup beside the draft head: where a lane's last N or more tokens occurred earlier in its context, "
        "the token that followed them there is the draft (runner/ngram_drafts.py); 0: the head alone (default: "
        f"{DRAFT_NGRAM} in a mode with a draft row, lookahead, and with speculative_k, where it replaces a chain's first "
        "proposal; 0 (off) in every other mode). "
        "It runs on the device in every decode step (a decode chain's inner steps and CUDA graphs included: chained "
        "generation and teacher-forced scoring draft the same) over each lane's tokens, max_lanes x (max_context + 1) "
        "x 4 bytes of GPU memory (44 lanes at 17,408: 3.1 MB) outside kv_budget_gb, kept only when N > 0; its step "
        "cost at 16K x 44 (H100, dummy Qwen3-8B): -0.5% tok/s. Needs really prefilled lanes: a synthesized prefill "
        "has no tokens, so nothing to look up (the step cost stays)",
    )
    draft_gate: float | None = _f(
        None,
        "lookahead: predict the next step's blocks from the draft's query only where the draft head gave its token at "
        "least this probability (prompt lookup's tokens count as certain), elsewhere from the current query (what "
        f"proxy predicts from); 0: always the draft's query (default: {DRAFT_GATE:g} in a mode with a draft row, "
        "lookahead; 0 (off) in every other mode). A random head (no --draft-path) gives ~1/vocabulary, so under the "
        "default nearly every lane predicts as proxy; synthetic and replayed sets do not read the query",
    )
    token_basis: str | None = _f(
        None,
        "block_score=tokens: the channels each full layer keeps, a .npz of experiments/block_scorers/fit_basis.py "
        "(L{layer}_pairs{token_rank} [Hkv, r] channel ids, fitted on a calibration text); None: the first "
        "token_rank / 2 RoPE pairs of every head (for dummy weights; oasis_core.token_scorer.first_pairs); "
        "block_score=auto takes the shipped basis of a real Gemma 3 270M or SmolLM2-135M "
        "(experiments/block_scorers/calib), and a basis given here makes it tokens",
    )
    dtype: str = _f("bfloat16", "bfloat16 | float32 (CPU tests)", DTYPES)
    device: str = _f("cuda", "cuda | cuda:N | cpu")
    replay_path: str | None = _f(
        None,
        "recorded selections for selection=replay: a --record-path file (.npz, "
        "oasis_core.setrecord), at any model shape",
    )
    replay_ids: str = _f(
        "wrap",
        "selection=replay at another context: block ids wrap (kept where the context has "
        "them, else mod its eligible blocks) | scale (proportional); oasis_core.setrecord",
        ("wrap", "scale"),
    )
    record_path: str | None = _f(
        None,
        "write the predicted block sets of every decode step here when the engine "
        "closes (.npz, oasis_core.setrecord; also a traces/SCHEMA.md selection file)",
    )
    link_gb_s: float = _f(
        30.0, "host->GPU rate of scattered block copies, GB/s, that an adaptive fetch policy (budget) plans with"
    )
    host_kv_gb: float | None = _f(
        None,
        "pinned host pool for the full KV cache, GB (sparse modes; default: "
        "host_requests requests of max_context tokens)",
    )
    host_requests: int | None = _f(
        None,
        "without host_kv_gb, size the host pool for this many requests of "
        "max_context tokens (default: every lane; bench: its concurrency); the "
        "pool is checked against the host's available memory before it is pinned",
    )
    max_lanes: int | None = _f(None, "cap on concurrent requests (default: what --kv-budget-gb fits; else only 4)")
    transfer: str = _f(
        "auto",
        "host (threaded gather into pinned staging + one DMA) | uva (direct-read gather "
        "kernel) | auto (path and programs from the measured table oasis_exec/transfer/table.json)",
        TRANSFERS,
    )
    host_threads: int = _f(8, "CPU threads of the host gather")
    host_kernel: str = _f(
        "auto",
        "the host gather's CPU code: torch (index_select, oasis_kernels.gather."
        "host_gather_stage) | native (one GIL-free C call a layer, oasis_kernels.host_native; "
        "needs a C compiler) | "
        "auto (the measured table's choice where its entry names one, else native when a C "
        "compiler is found, else torch)",
        ("auto", "torch", "native"),
    )
    uva_programs: int = _f(
        32, "programs of the persistent UVA gather with transfer=uva (auto takes them from the measured table)"
    )
    uva_items_per_iter: int | None = _f(
        None,
        "(block, head) items each UVA gather program loads an iteration (a power of two, at most 16): the loads it "
        "keeps in flight, so fewer programs (fewer SMs) can move the same rate. Default: 16 KiB in flight a "
        "program, i.e. 2 items of a bf16 host copy and 4 of an fp8 one (gather_items_per_iter)",
    )
    topk_kernel: str = _f(
        "fused",
        "the prediction's top-K of each layer's block scores (selection=model, synthetic_topk): fused "
        "(oasis_kernels.topk_select: one launch, a threshold select; the torch reference off CUDA) | sort "
        "(oasis_core.scoring.topk_blocks on torch: a stable sort and ~12 small kernels). The same ids; "
        "measurements: docs/exec_tuning.md",
        ("sort", "fused"),
    )
    uva_kernel: str = _f(
        "loads",
        "the UVA gather's kernel: loads (oasis_kernels.gather.uva_gather, thread loads) | tma "
        "(experimental oasis_kernels.gather_tma: TMA tile loads from the pinned pool)",
        ("loads", "tma"),
    )
    stream_priority: str = _f(
        "auto",
        "CUDA priority of the prediction and copy streams: normal | high (their "
        "kernels are scheduled ahead of the step's waiting ones) | low (a captured step's "
        "own kernels are scheduled ahead of theirs: graphs are captured on a high-priority "
        "stream; eager steps run as normal) | pred_low (the prediction stream below the "
        "step, the copy stream level with it) | pred_low_copy_high (the copy above) | "
        "auto (the measured table's choice with transfer=auto, else normal); STREAM_PRIORITIES",
        PRIORITIES,
    )
    prefill_chunk: int = _f(2048, "tokens per prefill chunk")
    prefill_interleave: bool = _f(
        True,
        "decodes ride along in every step that prefills (oasis_core.scheduler); off: "
        "prompts first, a step that prefills decodes nothing (benchmarks that need "
        "every request decoding in lockstep)",
    )
    fused_ops: bool = _f(
        True,
        "fused Triton kernels on CUDA: RMSNorm, q/k norm + RoPE, SwiGLU (oasis_kernels.fused_ops; Gemma 3's "
        "norms and GELU: oasis_kernels.gemma_ops), "
        "selection + copy list (oasis_kernels.plan_select) and the KV write (oasis_kernels.kv_write); off: "
        "the plain torch ops, which are the reference",
    )
    fused_select: bool = _f(
        True,
        "with fused_ops on CUDA: selection + copy list in one oasis_kernels.plan_select launch a "
        "layer; off: the torch oasis_core.selection.plan_step (the reference)",
    )
    plan_marks: bool = _f(
        True,
        "with fused selection, where a row holds more blocks than it attends (hot_slots > top_k, hisparse): "
        "plan_select finds membership through a zeroed row of marks a program, O(S + K), instead of S x K compares "
        "(off: the compares; measurements: docs/exec_tuning.md)",
    )
    fused_hot_gather: bool = _f(
        True,
        "mode=hisparse with fused selection on CUDA and the UVA path: the hot cache's miss lookup, the host reads of "
        "the misses and the attention's slot list in one oasis_kernels.plan_select launch a layer; off: plan_select, then "
        "the UVA gather of its copy list (two launches; also what an fp8 host copy runs, host_kv_dtype=fp8_e4m3)",
    )
    fused_kv_write: bool = _f(
        True,
        "with fused_ops: the decode step's K/V write by oasis_kernels.kv_write; off: advanced indexing (the reference)",
    )
    ring_kernel: bool = _f(
        True,
        "hybrid models' sliding layers on CUDA: decode attention over each lane's ring in place by "
        "oasis_kernels.ring_attn; off: the torch path (a gather of the rings, fp32 einsums: the reference)",
    )
    cuda_graph: bool = _f(
        True,
        "capture whole decode steps as CUDA graphs (not with --profile, recording or replayed "
        "selections, nor the host transfer path in retrieval mode)",
    )
    copy_graph: str = _f(
        "auto",
        "UVA path under CUDA graphs: on (a step's copies form a graph of their own, launched "
        "on the copy stream after the step's, so layer l's copy may run on until layer l of "
        "the next step) | off (inside the step's graph, which then ends only once they have) "
        "| auto (the measured table's choice with transfer=auto, else off)",
        SWITCHES,
    )
    profile: bool = _f(False, "CUDA events per layer and stage (small overhead)")
    synthetic_accept: dict | None = _f(
        None,
        "BENCHMARK ONLY, dummy weights: the accepted drafts of every lane's speculative step drawn (seeded) from "
        "this acceptance instead of the target's verdict, so that the step's cost and KV commit run with a real "
        "model's acceptance at a shape whose random draft head accepts nothing: {'alpha': A}, or a histogram "
        "{'k': [steps accepting 0 .. k drafts]} such as a real run's accepted_hist (oasis_core.speculation."
        "synthetic_acceptance); records say acceptance: synthetic; refused with real weights; "
        "unused at speculative_k 0",
    )
    synthetic_ahead: int = _f(
        0,
        "selection=synthetic: draw this many decode steps' sets at the first step of a lane set, before it runs, "
        "and take one a step (int32 on the device: 3 x lanes x layers x KV heads x top_k x 4 bytes a step); past "
        "them, and at 0, each step's sets are drawn beside the step before it. For benchmarks with a fixed lane "
        "set: the generator's GPU work, which a model-selected step does not do, then leaves the timed steps",
    )
    synthetic_topk: bool = _f(
        False,
        "selection=synthetic: also run the top-K of each layer's block scores that selection=model runs (its "
        "result unused), so a synthetic step does the GPU work of a model-selected one",
    )
    # not an option: set by __post_init__ (the scorer that block_score=auto became, and why)
    block_score_auto: str | None = field(
        default=None,
        init=False,
        metadata={
            "help": "block_score=auto: why it became the scorer block_score now holds (oasis_exec.scorer_auto); "
            "None: the scorer was given"
        },
    )

    def __post_init__(self):
        resolve_default(self, "selection", "model")
        resolve_default(self, "max_context", MAX_CONTEXT)
        # block_score=auto: the per-model scorer (oasis_exec.scorer_auto), resolved here so that every reader of the
        # config (the stores, the selector, records) sees the scorer that runs; block_score_auto says why (None:
        # the scorer was given)
        if self.block_score == AUTO:
            from .scorer_auto import resolve

            resolved, reason = resolve(self)
            for k, v in resolved.items():
                object.__setattr__(self, k, v)
            object.__setattr__(self, "block_score_auto", reason)

        def bad(name, why):
            raise ValueError(f"ExecConfig.{name}: {why}, got {getattr(self, name)!r}")

        for f in fields(self):
            if "choices" in f.metadata and getattr(self, f.name) not in f.metadata["choices"]:
                bad(f.name, f"must be one of {', '.join(f.metadata['choices'])}")
        # the gate applies where a step predicts from a draft (the mode's draft row); explicit values, 0 included, win
        resolve_default(self, "draft_gate", DRAFT_GATE if self.mode_spec.drafts else 0.0)
        if not isinstance(self.device, str) or not re.fullmatch(DEVICE_PATTERN, self.device):
            bad("device", "must be cpu, cuda or cuda:N")
        if self.selection == "replay" and not self.replay_path:
            bad("replay_path", "selection=replay needs a file")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            bad("block_size", "must be a power of two")
        if self.top_k < 1:
            bad("top_k", "must be >= 1")
        if self.hot_slots is not None:
            why = self.mode_spec.hot_slots_error(self.top_k, self.hot_slots)
            if why:
                bad("hot_slots", why)
            if isinstance(self.hot_slots, bool) or not isinstance(self.hot_slots, int):
                bad("hot_slots", "must be an integer")
        if self.host_kv_dtype == "fp8_e4m3":
            if not self.sparse:
                bad("host_kv_dtype", f"only a sparse mode keeps a host copy, not mode={self.mode}")
            if self.uva_kernel == "tma":
                bad(
                    "host_kv_dtype",
                    "the experimental TMA gather (uva_kernel=tma) copies bf16 only; use uva_kernel=loads",
                )
            import torch

            if not hasattr(torch, "float8_e4m3fn"):
                bad("host_kv_dtype", f"fp8_e4m3 needs torch.float8_e4m3fn, which torch {torch.__version__} lacks")
        if self.block_score == "tokens":
            if self.token_rank and (self.token_rank < 2 or self.token_rank % 2):
                bad("token_rank", "must be 0 (head_dim / 4) or even >= 2")
            if self.spec_predict == "beside":  # its repair scores one block alone; tokens normalises over all
                bad("spec_predict", "block_score=tokens predicts after the acceptance only (spec_predict=after)")
        elif self.token_basis:
            auto = f" (what block_score=auto became: {self.block_score_auto})" if self.block_score_auto else ""
            bad("token_basis", f"only block_score=tokens reads a basis, not {self.block_score}{auto}")
        if not 0 < self.fetch_ratio <= 1:
            bad("fetch_ratio", "must be in (0, 1]")
        if self.fetch_policy is not None:
            from oasis_core.fetchcap import get_policy

            if not isinstance(self.fetch_policy, str):
                bad("fetch_policy", "must be a policy spec string such as 'budget:0.8'")
            try:
                get_policy(self.fetch_policy)
            except ValueError as e:  # names the spec and the bad value
                bad("fetch_policy", " ".join(str(e).split()))
        if isinstance(self.link_gb_s, bool) or not isinstance(self.link_gb_s, (int, float)) or not self.link_gb_s > 0:
            bad("link_gb_s", "must be > 0")
        if self.max_context < self.block_size:
            bad("max_context", "must hold at least one block")
        dg = self.draft_gate
        if isinstance(dg, bool) or not isinstance(dg, (int, float)) or not 0.0 <= dg <= 1.0:
            bad("draft_gate", f"must be a probability in [0, 1] (0: off), got {show(dg)}")
        if dg and not self.mode_spec.drafts:
            bad("draft_gate", f"gates the draft's query of a lookahead step; mode {self.mode} has no draft row")
        if self.synthetic is not None:
            from oasis_core.synthetic_presets import resolve

            try:
                resolve(self.synthetic)  # an unknown preset, field or value fails here, not at the first step
            except (TypeError, ValueError) as e:
                bad("synthetic", str(e))
        sa = self.synthetic_ahead
        if isinstance(sa, bool) or not isinstance(sa, int) or sa < 0:
            bad("synthetic_ahead", f"must be an integer >= 0, got {show(sa)}")
        if (sa or self.synthetic_topk) and self.selection != "synthetic":
            bad(
                "synthetic_ahead" if sa else "synthetic_topk",
                f"only selection=synthetic takes it, not {self.selection}",
            )
        try:
            k, adaptive = speculation.parse_spec(self.speculative_k, self.block_size)
        except ValueError as e:
            bad("speculative_k", str(e))
        if self.draft_head == "attn":  # k = 1 only (oasis_exec.model.draft_attn): auto's default longest is 1
            object.__setattr__(self, "speculative_k", attn_speculative_k(self.speculative_k))
            k, adaptive = speculation.parse_spec(self.speculative_k, self.block_size)
            if k > 1:
                bad("speculative_k", ATTN_NO_CHAINS)
        if k and not self.mode_spec.speculative:
            names = " and ".join(modes.SPECULATIVE_MODES)
            bad("speculative_k", f"only modes {names} decode speculatively, not mode={self.mode}")
        if k >= self.block_size:
            bad("speculative_k", f"must be < block_size ({self.block_size}): a step fills at most one block")
        # prompt lookup where a step predicts from a draft or speculates (DRAFT_NGRAM); explicit values, 0
        # included, win
        resolve_default(self, "draft_ngram", DRAFT_NGRAM if self.mode_spec.drafts or k else 0)
        dn = self.draft_ngram
        if isinstance(dn, bool) or not isinstance(dn, int) or dn < 0:
            bad("draft_ngram", f"must be an integer >= 0 (0: off), got {show(dn)}")
        if not isinstance(self.decode_chain, int) or isinstance(self.decode_chain, bool) or self.decode_chain < 1:
            bad("decode_chain", "must be an int >= 1 (a chain runs at most block_size steps: one block filled)")
        if not isinstance(self.spec_chain, int) or isinstance(self.spec_chain, bool) or self.spec_chain < 1:
            bad("spec_chain", "must be an int >= 1 (1: off; a chain fills at most one block)")
        if self.synthetic_accept is not None:
            if self.model_path:
                bad(
                    "synthetic_accept",
                    "benchmark-only, for dummy weights: with a real model (model_path) the target's own verdict "
                    "decides what is accepted; drop one of the two",
                )
            try:
                speculation.synthetic_acceptance(self.synthetic_accept)
            except ValueError as e:
                bad("synthetic_accept", str(e))
        g = self.speculative_gamma
        if g is not None:
            if not adaptive:
                bad("speculative_gamma", "only speculative_k auto takes it")
            if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g < float("inf"):
                bad("speculative_gamma", "must be a finite number >= 0")
        for n in ("kv_budget_gb", "host_kv_gb"):
            v = getattr(self, n)
            if v is not None and v <= 0:
                bad(n, "must be > 0")
        tp = self.tensor_parallel
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            bad("tensor_parallel", "must be an integer >= 1")
        if tp > 1 and self.model_path is None and self.model in MODELS and MODELS[self.model].n_kv_heads < tp:
            bad("tensor_parallel", f"the model has {MODELS[self.model].n_kv_heads} KV heads, fewer than the ranks")
        if tp > 1 and self.block_score == "tokens" and self.token_basis:  # e.g. auto's basis, then replaced to tp 2
            bad(
                "tensor_parallel",
                "a fitted token_basis holds every KV head of a layer; it is not split over ranks yet "
                "(--block-score minmax_sum+sink, or tokens without a basis)",
            )
        for n in ("max_lanes", "host_requests", "draft_vocab", "host_threads", "uva_programs", "prefill_chunk"):
            v = getattr(self, n)
            if v is not None and v < 1:
                bad(n, "must be >= 1")
        ipi = self.uva_items_per_iter
        if ipi is not None and (
            isinstance(ipi, bool) or not isinstance(ipi, int) or not 1 <= ipi <= 16 or ipi & (ipi - 1)
        ):
            bad("uva_items_per_iter", f"must be a power of two from 1 to 16, got {show(ipi)}")

    @property
    def gather_items_per_iter(self) -> int:
        """The UVA gather's items an iteration: ``uva_items_per_iter``, or by default as many as keep 16 KiB of
        loads in flight a program (2 units of a bf16 host copy, 4 of an fp8 one, which are half the bytes)."""
        if self.uva_items_per_iter is not None:
            return self.uva_items_per_iter
        return 4 if self.host_kv_dtype == "fp8_e4m3" else 2

    @property
    def mode_spec(self) -> modes.Mode:
        """The mode's properties (``oasis_core.modes``): what it keeps on the GPU, transfers, selects with."""
        return modes.get(self.mode)

    @property
    def sparse(self) -> bool:
        return self.mode_spec.sparse

    @property
    def resident_slots(self) -> int:
        """Selectable GPU slots per (lane, layer, KV head) of a sparse mode as configured: ``top_k``, the hot
        cache's ``hot_slots`` (default ``2 * top_k``) in a mode with one, or a background mode's ``hot_slots``
        (a victim cache; at None ``top_k`` here, which ``oasis_exec.kv.layout.victim_slots`` may grow to
        3 x top_k where the budget has room: the built store's ``S`` is what runs)."""
        return self.mode_spec.resident_slots(self.top_k, self.hot_slots)

    def cap_policy(self):
        """The run's ``FetchCapPolicy``: ``Unlimited`` for a mode fetching on demand (retrieval), else
        ``fetch_policy`` when set, else ``Fixed(fetch_ratio)``."""
        from oasis_core.fetchcap import Fixed, Unlimited, get_policy

        if self.mode_spec.on_demand:
            return Unlimited()
        return get_policy(self.fetch_policy) if self.fetch_policy is not None else Fixed(self.fetch_ratio)

    @property
    def chain_max(self) -> int:
        """The longest decode chain this config runs: ``decode_chain`` up to ``block_size``; 1 with speculative
        decoding or ``profile`` (each times or reads the host every step)."""
        if self.spec_max_k or self.profile:
            return 1
        return min(self.decode_chain, self.block_size)

    @property
    def spec_chain_max(self) -> int:
        """``SpeculativeFields.spec_chain_max``; 1 with ``profile`` (it times or reads the host every step)."""
        return 1 if self.profile else super().spec_chain_max

    @property
    def step_tokens_max(self) -> int:
        """The most output tokens one scheduler step may emit a request: ``(speculative_k + 1) x spec_chain_max``
        or ``chain_max``."""
        return max((self.spec_max_k + 1) * self.spec_chain_max, self.chain_max)

    @property
    def max_blocks(self) -> int:
        return -(-self.max_context // self.block_size)

    @staticmethod
    def help() -> dict:
        return {f.name: f.metadata.get("help", "") for f in fields(ExecConfig)}


@dataclass(frozen=True)
class BenchConfig:
    """What ``python -m oasis_exec bench`` runs on the engine (``oasis_exec.tools.bench``)."""

    context: int = _f(16384, "prompt tokens of every request")
    concurrency: int = _f(
        8,
        "requests decoding together; clipped to the lanes the GPU KV budget holds and, in sparse "
        "modes, to the host pool (announced on stderr; the record says why: clipped_by)",
    )
    steps: int = _f(32, "timed decode steps")
    warmup: int = _f(5, "untimed decode steps before them")
    out: str | None = _f(None, "append the JSON record to this file", metavar="FILE")
    record: str | None = _f(
        None,
        "also write the run as a recording (traces/SCHEMA.md) for `python -m oasis_sim replay|validate`",
        metavar="FILE",
    )
    record_hardware: str | None = _f(
        None, "simulator hardware preset of the recording (default: told from the GPU's name)", metavar="PRESET"
    )
    prompt_text: str | None = _f(
        None,
        "cut the prompts from this real text file (tokenized by the model's "
        "tokenizer; needs --model-path), or from token ids FILE.npz:KEY[:ROW], and prefill them for real, instead of "
        "synthesizing random KV; for selection=model on real weights",
        metavar="FILE",
    )
    host_fill: bool = _f(
        True,
        "write a pattern into the host pool before the run (off: left unwritten; copies "
        "time the same, it saves a pass over the pool)",
    )

    def __post_init__(self):
        for name, least in (("context", 1), ("concurrency", 1), ("steps", 1), ("warmup", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or v < least:
                raise ValueError(f"BenchConfig.{name}: must be an integer >= {least}, got {show(v)}")

    def output_tokens(self, speculative_k: int = 0) -> int:
        """The output tokens of each request: one a step, ``warmup + steps + 1`` (a speculative run: up to
        ``speculative_k + 1`` a step, so that none finishes in a timed step)."""
        return (self.warmup + self.steps + 1) * (speculative_k + 1)

    def engine_max_context(self, block_size: int, speculative_k: int = 0) -> int:
        """The engine's ``max_context`` for this run: the prompt, every decoded token and two blocks of slack."""
        return self.context + self.output_tokens(speculative_k) - 1 + 2 * block_size


def replace_config(cfg: ExecConfig, **changes) -> ExecConfig:
    """``dataclasses.replace`` that keeps ``block_score_auto`` (why ``block_score=auto`` became the scorer) where
    the scorer fields are not changed: a replaced config holds the resolved scorer, no longer ``auto``."""
    import dataclasses

    new = dataclasses.replace(cfg, **changes)
    if not {"block_score", "token_basis", "token_rank"} & changes.keys():
        object.__setattr__(new, "block_score_auto", cfg.block_score_auto)
    return new


# -- the command-line options of both (oasis_core.cliargs) -------------------------------------------------------

DUMMY_HELP = "random weights, the shape from the --model preset (the default without --model-path)"


def add_engine_options(p, *, exclude=(), helps=None, groups=()) -> None:
    """The ``ExecConfig`` options (every field but ``exclude``) and ``--dummy`` on parser or group ``p``; with
    ``groups`` (``oasis_exec.help_groups.ENGINE_GROUPS``) under headings, ``p`` then a parser."""
    cliargs.add_options(p, ExecConfig, exclude=exclude, helps=helps, groups=groups, rest="engine: other options")
    p.add_argument("--dummy", action="store_true", help=DUMMY_HELP)


def engine_config(ns, *, exclude=(), **fixed) -> ExecConfig:
    """The ``ExecConfig`` of the options given in ``ns`` (``fixed`` fields set by the caller); a bad value or
    ``--dummy`` with ``--model-path`` raises ``cliargs.CliError`` naming the option."""
    if getattr(ns, "dummy", False) and (fixed.get("model_path") or getattr(ns, "model_path", None)):
        raise cliargs.CliError("--dummy and --model-path exclude each other")
    cfg = cliargs.build(ExecConfig, ns, exclude=exclude, **fixed)

    writable_path("--record-path", cfg.record_path)  # every command checks its outputs before the work
    if cfg.model_path is None and cfg.model not in MODELS:  # checked here: records name real models in `model`
        raise cliargs.CliError(
            f"--model: must be a preset ({', '.join(sorted(MODELS))}) or a real model (--model-path), got {show(cfg.model)}"
        )
    return cfg


def add_bench_options(p) -> None:
    cliargs.add_options(p, BenchConfig)


def bench_config(ns) -> BenchConfig:
    return cliargs.build(BenchConfig, ns)

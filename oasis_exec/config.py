"""The executor's configuration: one frozen dataclass, validated on construction; field help becomes the CLI."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from oasis_core import modes
from oasis_core.specs import MODES, PAPER_SPARSITY

SOURCES = ("model", "synthetic", "replay")
TRANSFERS = ("host", "uva", "auto")
PRIORITIES = ("normal", "high", "auto")
SWITCHES = ("on", "off", "auto")
GB = 1e9


def _f(default, help):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ExecConfig:
    model: str = _f("tiny", "oasis_core model preset (qwen3-8b, llama-3.1-8b, tiny, ...)")
    model_path: str | None = _f(None, "local Hugging Face directory (config.json + *.safetensors); None = dummy")
    draft_path: str | None = _f(None, "local EAGLE-3 draft directory; None = random draft head")
    draft_vocab: int = _f(32000, "draft vocabulary of a random draft head")
    dtype: str = _f("bfloat16", "bfloat16 | float32 (CPU tests)")
    device: str = _f("cuda", "cuda | cpu")
    mode: str = _f("lookahead", "dense | quest | retrieval | proxy | lookahead")
    selection: str = _f("model", "model | synthetic | replay: where the chosen block ids come from")
    replay_path: str | None = _f(None, "recorded selections for selection=replay: a --record-path file (.npz, "
                                       "oasis_core.setrecord), at any model shape")
    replay_ids: str = _f("wrap", "selection=replay at another context: block ids wrap (kept where the context has "
                                 "them, else mod its eligible blocks) | scale (proportional); oasis_core.setrecord")
    record_path: str | None = _f(None, "write the predicted block sets of every decode step here when the engine "
                                       "closes (.npz, oasis_core.setrecord; also a traces/SCHEMA.md selection file)")
    block_size: int = _f(PAPER_SPARSITY.block_size, "tokens per KV block")
    top_k: int = _f(PAPER_SPARSITY.top_k, "resident blocks per KV head (the local block comes on top)")
    fetch_ratio: float = _f(PAPER_SPARSITY.fetch_ratio,
                            "fetch cap per head per step as a fraction of top_k (0 < r <= 1)")
    fetch_policy: str | None = _f(None, "fetch-cap policy spec (oasis_core.fetchcap.get_policy: fixed:R, unlimited, "
                                        "budget[:FRACTION][,min_cap=N][,max_ratio=R][,first_ratio=R]), evaluated on "
                                        "the device each step (oasis_exec.fetch_caps); None: fixed at fetch_ratio; "
                                        "retrieval always fetches its whole set")
    link_gb_s: float = _f(30.0, "host->GPU rate of scattered block copies, GB/s, that an adaptive fetch policy "
                                "(budget) plans with")
    max_context: int = _f(16384 + 1024, "most tokens of one request (prompt + output)")
    kv_budget_gb: float | None = _f(None, "GPU memory for KV state (slots, summaries, caches), GB")
    host_kv_gb: float | None = _f(None, "pinned host pool for the full KV cache, GB (sparse modes)")
    max_lanes: int | None = _f(None, "cap on concurrent requests (default: what --kv-budget-gb fits; else only 4)")
    transfer: str = _f("auto", "host (threaded gather into pinned staging + one DMA) | uva (direct-read gather "
                               "kernel) | auto (path and programs measured on the H200: oasis_exec/transfer_table.json)")
    host_threads: int = _f(8, "CPU threads of the host gather")
    host_kernel: str = _f("auto", "the host gather's CPU code: torch (index_select, kernels.gather."
                                  "host_gather_stage) | native (one GIL-free C call a layer, kernels.host_native; "
                                  "needs a C compiler) | "
                                  "auto (the measured table's choice where its entry names one, else native when a C "
                                  "compiler is found, else torch)")
    uva_programs: int = _f(32, "programs of the persistent UVA gather with transfer=uva (auto takes them from the "
                                "measured table)")
    uva_kernel: str = _f("loads", "the UVA gather's kernel: loads (kernels.gather.uva_gather, thread loads) | tma "
                                  "(experimental kernels.gather_tma: TMA tile loads from the pinned pool)")
    stream_priority: str = _f("auto", "CUDA priority of the prediction and copy streams: normal | high (their "
                                      "kernels are scheduled ahead of the step's waiting ones) | auto (the measured "
                                      "table's choice with transfer=auto, else normal)")
    no_transfer: bool = _f(False, "plan selections but skip the copies (overlap reference; attention reads stale "
                                  "slots)")
    prefill_chunk: int = _f(2048, "tokens per prefill chunk")
    prefill_interleave: bool = _f(True, "after a prefill chunk, run a decode step before the next chunk when requests "
                                        "are decoding (bounds their wait to one chunk); off: prompts first")
    seed: int = _f(0, "weights, sampling and synthetic-selection seed")
    fused_ops: bool = _f(True, "fused Triton kernels on CUDA: RMSNorm, q/k norm + RoPE, SwiGLU (kernels.fused_ops), "
                                "selection + copy list (kernels.plan_select) and the KV write (kernels.kv_write); off: "
                                "the plain torch ops, which are the reference")
    fused_select: bool = _f(True, "with fused_ops on CUDA: selection + copy list in one kernels.plan_select launch a "
                                  "layer; off: the torch oasis_core.selection.plan_step (the reference)")
    fused_kv_write: bool = _f(True, "with fused_ops: the decode step's K/V write by kernels.kv_write; off: advanced "
                                    "indexing (the reference)")
    cuda_graph: bool = _f(True, "capture whole decode steps as CUDA graphs (not with --profile, recording or replayed "
                                "selections, nor the host transfer path in retrieval mode)")
    copy_graph: str = _f("auto", "UVA path under CUDA graphs: on (a step's copies form a graph of their own, launched "
                                 "on the copy stream after the step's, so layer l's copy may run on until layer l of "
                                 "the next step) | off (inside the step's graph, which then ends only once they have) "
                                 "| auto (the measured table's choice with transfer=auto, else off)")
    profile: bool = _f(False, "CUDA events per layer and stage (small overhead)")
    synthetic: dict = _f(None, "SyntheticParams overrides, e.g. {'drift_rate': 0.1}; 'preset' names a base "
                               "(oasis_core.synthetic_presets: paper | smollm2), e.g. {'preset': 'smollm2'}")

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"ExecConfig.{name}: {why}, got {getattr(self, name)!r}")

        try:
            modes.get(self.mode)
        except ValueError:
            bad("mode", f"must be one of {MODES}")
        if self.selection not in SOURCES:
            bad("selection", f"must be one of {SOURCES}")
        if self.selection == "replay" and not self.replay_path:
            bad("replay_path", "selection=replay needs a file")
        if self.replay_ids not in ("wrap", "scale"):
            bad("replay_ids", "must be wrap or scale")
        if self.transfer not in TRANSFERS:
            bad("transfer", f"must be one of {TRANSFERS}")
        if self.stream_priority not in PRIORITIES:
            bad("stream_priority", f"must be one of {PRIORITIES}")
        if self.host_kernel not in ("auto", "torch", "native"):
            bad("host_kernel", "must be auto, torch or native")
        if self.uva_kernel not in ("loads", "tma"):
            bad("uva_kernel", "must be loads or tma")
        if self.copy_graph not in SWITCHES:
            bad("copy_graph", f"must be one of {SWITCHES}")
        if self.dtype not in ("bfloat16", "float32"):
            bad("dtype", "must be bfloat16 or float32")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            bad("block_size", "must be a power of two")
        if self.top_k < 1:
            bad("top_k", "must be >= 1")
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
        if isinstance(self.link_gb_s, bool) or not isinstance(self.link_gb_s, (int, float)) \
                or not self.link_gb_s > 0:
            bad("link_gb_s", "must be > 0")
        if self.max_context < self.block_size:
            bad("max_context", "must hold at least one block")
        if self.synthetic is not None:
            from oasis_core.synthetic_presets import resolve

            try:
                resolve(self.synthetic)  # an unknown preset, field or value fails here, not at the first step
            except (TypeError, ValueError) as e:
                bad("synthetic", str(e))
        for n in ("kv_budget_gb", "host_kv_gb"):
            v = getattr(self, n)
            if v is not None and v <= 0:
                bad(n, "must be > 0")

    @property
    def mode_spec(self) -> modes.Mode:
        """The mode's properties (``oasis_core.modes``): what it keeps on the GPU, transfers, selects with."""
        return modes.get(self.mode)

    @property
    def sparse(self) -> bool:
        return self.mode_spec.sparse

    def cap_policy(self):
        """The run's ``FetchCapPolicy``: ``Unlimited`` for a mode fetching on demand (retrieval), else
        ``fetch_policy`` when set, else ``Fixed(fetch_ratio)``."""
        from oasis_core.fetchcap import Fixed, Unlimited, get_policy

        if self.mode_spec.on_demand:
            return Unlimited()
        return get_policy(self.fetch_policy) if self.fetch_policy is not None else Fixed(self.fetch_ratio)

    @property
    def max_blocks(self) -> int:
        return -(-self.max_context // self.block_size)

    @staticmethod
    def help() -> dict:
        return {f.name: f.metadata.get("help", "") for f in fields(ExecConfig)}

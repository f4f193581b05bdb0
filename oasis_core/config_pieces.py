"""The configuration fields both backends share, declared once: the executor's ``ExecConfig`` and the simulator's
``SimConfig`` derive from these frozen dataclasses, so a knob both have (``--top-k``, ``--fetch-policy``,
``--speculative-k``, ...) has one name, one default and one help text. Each backend validates its configuration in
its own ``__post_init__`` (its errors name its class: ``ExecConfig.top_k``, ``top_k``) and adds its own fields.

Where the backends' defaults differ (``selection``, ``max_context``) the field's default is None, "the backend's
default", which each config's ``__post_init__`` resolves (``resolve_default``), so a built config never holds it.

stdlib only: field help becomes the options' help through ``oasis_core.cliargs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from . import speculation
from .block_scorers import AUTO, DEFAULT_SCORER, SCORER_CHOICES
from .geometry import HOST_KV_DTYPES
from .spec_predict import SPEC_PREDICT
from .specs import MODES, PAPER_SPARSITY

SELECTIONS = ("model", "synthetic", "replay")  # every backend's: the executor takes all, the simulator the last two


def _f(default, help: str, **meta):
    return field(default=default, metadata={"help": help, **meta})


def resolve_default(cfg, name: str, value) -> None:
    """Set field ``name`` of frozen ``cfg`` to its backend's default ``value`` when it holds None."""
    if getattr(cfg, name) is None:
        object.__setattr__(cfg, name, value)


@dataclass(frozen=True)
class RunFields:
    """What runs: the model, the attention mode, where selections come from, the request size bound, the seed."""

    model: str = _f(
        "qwen3-8b",
        "model preset (oasis_core.specs.MODELS: qwen3-8b, llama-3.1-8b, tiny, ...); the executor with model_path: "
        "the real model's name",
    )
    mode: str = _f(
        "lookahead", "dense | quest | retrieval | proxy | lookahead | hisparse (oasis_core.modes)", choices=MODES
    )
    selection: Optional[str] = _f(
        None,
        "where the chosen block ids come from: model (the executor's default: the draft's prediction) | synthetic "
        "(the simulator's default: oasis_core.synthetic) | replay (recorded: the executor's replay_path sets, the "
        "simulator's replay_file figures)",
        choices=SELECTIONS,
    )
    max_context: Optional[int] = _f(
        None,
        "most tokens of one request (prompt + output); default: the executor 16,384 + 1,024 (bench: its prompt "
        "and steps), the simulator the model's limit (longer requests are clipped)",
    )
    seed: int = _f(0, "seed of every random choice (weights, sampling, synthetic selection, arrivals)")
    synthetic: Optional[Mapping[str, Any]] = _f(
        None,
        "selection=synthetic: overrides of oasis_core SyntheticParams fields; 'preset': a named base "
        "(oasis_core.synthetic_presets: paper | smollm2), e.g. {'preset': 'smollm2'}",
    )
    tensor_parallel: int = _f(
        1,
        "tensor-parallel ranks a model is split over: each owns a contiguous run of the KV heads (uneven when they do "
        "not divide: 3 over 2 is 2 + 1, oasis_core.specs.tp_local), their query heads and a share of the MLP, with "
        "its own working set and host pool share; one all-reduce after attention and one after the MLP. The "
        "executor runs the ranks (oasis_exec.model.tensor_parallel: bench spawns them, or torchrun); the simulator "
        "simulates rank 0, the largest share, plus the all-reduces (split=none only)",
    )


@dataclass(frozen=True)
class KVFields:
    """The KV cache's shape: blocks, the working set a row keeps on the GPU, the host copy's element type."""

    block_size: int = _f(PAPER_SPARSITY.block_size, "tokens per KV block (a power of two)")
    top_k: int = _f(PAPER_SPARSITY.top_k, "selected (attended) blocks per KV head; the local block comes on top")
    hot_slots: Optional[int] = _f(
        None,
        "GPU blocks per (request, layer, KV head), >= top_k. mode=hisparse: its LRU hot cache, of which attention "
        "reads the step's top_k (None: 2 x top_k), misses fetched on demand. Background modes (lookahead, proxy): "
        "above top_k a victim cache, blocks the prediction dropped stay until least recently selected (a block that "
        "comes back is a hit, not a fetch) and attention reads the top_k most recently selected "
        "(oasis_core.selection.attend_slots). None: the executor 3 x top_k where the requests the config names fit "
        "its GPU budget at that size, else top_k (oasis_exec.kv.layout.victim_slots); the simulator top_k",
    )
    short_context: bool = _f(
        True,
        "sparse modes: a request whose context fits its resident set (top_k + 1 blocks) runs dense on the GPU, with "
        "no host copy, until it outgrows it; a step whose requests are all short drafts, scores and selects nothing "
        "(oasis_core.short_context; not with split=rpf); off: every request is offloaded from its prefill",
    )
    host_kv_dtype: str = _f(
        "auto",
        "element type of the host copy of K and V (sparse modes): auto (the KV dtype) | fp8_e4m3 (float8_e4m3fn with "
        "a float32 scale per (layer, block, KV head) of K and of V: half the host memory, half the bytes a fetch "
        "or an offload moves; dequantized as it is copied into the GPU slots, which stay in the KV dtype; "
        "oasis_exec.kv.host_quant; the simulator: split=none only)",
        choices=HOST_KV_DTYPES,
    )
    block_score: str = _f(
        AUTO,
        "how blocks are scored for selection (oasis_core.block_scorers; every sparse mode and the lookahead "
        "prediction): auto (the default: the executor with the real weights of a model whose channel basis ships, "
        "Gemma 3 270M (r = 64) or SmolLM2-135M (r = 24), runs tokens with that basis, else "
        f"{DEFAULT_SCORER} (dummy weights, another model, spec_predict=beside, tensor_parallel > 1); "
        f"oasis_exec.scorer_auto; the simulator, which has no weights, always {DEFAULT_SCORER}; the config holds, "
        "and records name, the scorer it became) | minmax (Quest's bound, max over a KV head's query heads) | "
        "minmax_sum (the bound summed over them) | mean (the mean key) | gauss (mean and spread: a softmax-mass estimate); +sink: block 0 always "
        "selected | tokens (token_rank key channels of every token, scored per token, normalised per query head, "
        "block 0 always selected; oasis_core.token_scorer) (experiments/block_scorers). The simulator's selections "
        "are synthetic or replayed, so there a scorer changes only the summary bytes stored and read",
        choices=SCORER_CHOICES,
    )
    token_rank: int = _f(
        0,
        "block_score=tokens: key channels (RoPE pairs) kept per token and KV head, even; 0: head_dim / 4 (2 x "
        "token_rank bytes a token in bf16: twice the min/max summaries' at block 16); block_score=auto: 0 takes "
        "the shipped basis's rank",
    )


@dataclass(frozen=True)
class TransferFields:
    """How much a row may fetch a step (the ``C`` of paper Algorithm 2)."""

    fetch_ratio: float = _f(
        PAPER_SPARSITY.fetch_ratio,
        "fetch cap per row (request, layer, KV head) per step as a fraction of top_k, in (0, 1] (1 = unlimited)",
    )
    fetch_policy: Optional[str] = _f(
        None,
        "fetch-cap policy spec (oasis_core.fetchcap.get_policy: fixed:R, unlimited, "
        "budget[:FRACTION][,min_cap=N][,max_ratio=R][,first_ratio=R], drift, per-layer:R, recall:T, or a name "
        "registered by a module in $OASIS_POLICY_MODULES: docs/policies.md); the executor evaluates it on the "
        "device each step (oasis_exec.workingset.fetch_caps), the simulator's adaptive ones need "
        "policy_sampling=exact; None: fixed at fetch_ratio; retrieval always fetches its whole set",
    )


@dataclass(frozen=True)
class BenchFields:
    """What the executor's bench runs and the simulator predicts: the GPU KV budget, the copy-less twin, decode
    chains."""

    kv_budget_gb: Optional[float] = _f(
        None,
        "GPU memory for KV state (slots, summaries, caches), GB; the executor and the simulator's engine oasis reserve "
        "whole lanes in it (oasis_core.lanes, the victim cache included), the simulator's engine vllm pages it; None: "
        "the executor takes what the GPU leaves, the simulator its HBM model",
    )
    no_transfer: bool = _f(
        False,
        "plan selections but skip the copies (the overlap reference: the bench's no-transfer twin; attention reads "
        "stale slots)",
    )
    decode_chain: int = _f(
        8,
        "ordinary decode steps run back to back on the device per scheduler step, the host reading the chain's "
        "tokens once (one synchronisation per chain); only where every row is greedy, no lane is short or crossing, "
        "no speculative_k, no profile or set recording, and no other request waits; at most block_size. The "
        "simulator pays the per-step host overhead once a chain. 1: off; why 8: docs/exec_tuning.md",
    )


@dataclass(frozen=True)
class SpeculationFields(speculation.SpeculativeFields):
    """Speculative decoding (modes dense and lookahead): draft length and the draft's relative cost."""

    speculative_k: Union[int, str] = _f(
        0,
        "speculative decoding (modes dense and lookahead, < block_size): K drafts a step as a chain, one target pass "
        "over K + 1 positions a request verifies them (greedy acceptance; rejection sampling above temperature 0) "
        "and every accepted token is emitted; auto | auto:N: K chosen per request every step in [0, N] (auto: 4) "
        "from its acceptance and the draft's relative cost (oasis_core.speculation); 0: off",
        type=speculation.cli_value,
    )
    speculative_gamma: Optional[float] = _f(
        None,
        "a drafted token's cost as a fraction of a verify pass (the speed identity's gamma); None: the executor "
        "measures it every speculative step (the draft chain's time against the pass's; speculative_k auto only), "
        "the simulator costs K steps of the predictor's draft_step",
    )
    spec_chain: int = _f(
        8,
        "speculative steps run back to back on the device per scheduler step (the host reads the chain's accepted "
        "tokens once), like decode_chain for ordinary steps: only where every row is greedy, the selection is the "
        "model's (the executor), spec_predict is after, k is fixed and no lane is short or crossing; at most block_size // (k + 1) "
        "steps (a chain fills at most one block). 1: off; why 8: docs/exec_tuning.md",
    )
    spec_predict: str = _f(
        "after",
        "speculative lookahead steps: when the next step's prediction, selection and copies run. after: once the "
        "acceptance is known, after the verify pass; beside: layer by layer beside the pass, from the query of the "
        "position the lane's acceptance estimate makes most likely, then an exact repair after the acceptance (the "
        "blocks the true position's prediction adds, under the same cap; oasis_core.spec_predict). The executor "
        "takes beside on the UVA path (or CPU) with a static fetch cap and copy_graph off, else runs after",
        choices=SPEC_PREDICT,
    )

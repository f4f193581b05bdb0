"""``block_score=auto`` (the engine's default): the per-model block scorer, resolved when an ``ExecConfig`` is built.

``auto`` becomes ``tokens`` (``oasis_core.token_scorer``) with a shipped channel basis where the model is one whose
basis ships and its weights are real, else ``oasis_core.block_scorers.DEFAULT_SCORER`` (``minmax_sum+sink``). The
rule, in order (``resolve``; the first that applies decides, and ``ExecConfig.block_score_auto`` says which):

1. no ``model_path`` (dummy weights): ``minmax_sum+sink``. A basis is fitted on a real model's keys; on random
   weights any channels are as good as others, and at the dummy Qwen3-8B shape ``tokens`` costs 15-19% of the
   16K x 44 throughput (H100, 2026-12-06, commit 1cd1217).
2. ``spec_predict=beside``: ``minmax_sum+sink`` (``tokens`` predicts after the acceptance only; an ``auto`` default
   must not make a valid configuration invalid).
3. ``tensor_parallel > 1``: ``minmax_sum+sink`` (a fitted basis holds every KV head of a layer; it is not split over
   the ranks' heads yet).
4. the model's shape (``config.json`` or the GGUF's metadata, read as the loader reads it) equals the preset of a
   shipped basis (``SHIPPED_BASES``: every architecture field of ``oasis_core.specs.MODELS[name]`` but its name, the
   context limit and the norm epsilon) and the basis file is there: ``tokens`` at the shipped rank (or
   ``token_rank`` where given; the basis must hold it), or with ``token_basis`` where given (a basis of one's own
   for the same model). Else ``minmax_sum+sink``; a ``token_basis`` given then fails validation as it does with
   any scorer but ``tokens`` (``--block-score tokens`` runs it on any model).

Which checkpoints: the bases were fitted on ``gemma-3-270m-q4_k_m.gguf`` (Gemma 3 270M base) and
``SmolLM2-135M-Instruct.Q4_1.gguf`` (``../shared/models/README.md``); another checkpoint of the same architecture (a
fine-tune, another quantisation) matches by shape and gets the same basis.

The ranks (``experiments/block_scorers/README.md``, "The default, and the goals"):

- Gemma 3 270M, r = 64 (2x the min/max summaries' bytes): the Gemma goal (32K, K = 256, mass >= 80% at <= 2x
  bytes) is met on all five texts (82.3-89.5%, CPU); end to end at 32K on the H100 every long-context task group as
  dense, retrieval +1.39% perplexity against dense, lookahead (head + prompt lookup, gate 0.5) -0.26%
  (``mean+sink`` +4.4-5.0%). r = 32 holds 78.3% on the licences: the goal's byte cap allows 64.
- SmolLM2-135M, r = 24 (3x bytes, summaries 3/16 of K + V against minmax's 1/16): the only measured SmolLM2 goal
  (retrieval within 2% of dense perplexity at 8K, K = 12.5%) is met at r = 24 (+0.5% over both texts) and not at
  r = 16 (2x bytes: +4.3%; ``minmax_sum+sink`` +6.3%); r = 32 (4x) gives no better (+0.6%). The 2x byte cap is the
  Gemma goal's, and a SmolLM2 token's K + V is 23 KB: the extra 1/8 of it costs lanes, not the goal.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from oasis_core.block_scorers import AUTO, DEFAULT_SCORER, TOKENS
from oasis_core.specs import MODELS

CALIB = Path(__file__).resolve().parents[1] / "experiments" / "block_scorers" / "calib"
# preset name (oasis_core.specs.MODELS) -> (basis file, its rank the default takes)
SHIPPED_BASES = {
    "gemma3-270m": (CALIB / "gemma3_270m_basis.npz", 64),
    "smollm2-135m": (CALIB / "smollm2_135m_basis.npz", 24),
}
_NOT_SHAPE = ("name", "max_context_tokens", "rms_eps", "dtype_bytes")  # what a checkpoint may differ in


def _shape(spec) -> tuple:
    return tuple(getattr(spec, f.name) for f in fields(spec) if f.name not in _NOT_SHAPE)


def model_spec(path: str):
    """The ``ModelSpec`` of a real model (a ``.gguf`` file or a Hugging Face directory), read as the loader reads it;
    None where it cannot be read (the loader then says why)."""
    try:
        if str(path).endswith(".gguf"):
            from .model.gguf import read_gguf

            return read_gguf(str(path)).spec
        from .model.decoder import read_hf_config

        return read_hf_config(str(path))
    except Exception:  # noqa: BLE001 - any unreadable file: the engine's loader reports it, not the default
        return None


def shipped_preset(spec) -> str | None:
    """The preset of ``SHIPPED_BASES`` whose architecture ``spec`` has, else None."""
    if spec is None:
        return None
    got = _shape(spec)
    return next((name for name in SHIPPED_BASES if _shape(MODELS[name]) == got), None)


def resolve(cfg) -> tuple[dict, str]:
    """The fields ``block_score=auto`` becomes for ``cfg`` (an ``ExecConfig`` under construction) and why."""
    fallback = {"block_score": DEFAULT_SCORER}
    if not cfg.model_path:
        return fallback, "dummy weights (no basis of real keys applies)"
    if cfg.spec_predict == "beside":
        return fallback, "spec_predict=beside (tokens predicts after the acceptance only)"
    if cfg.tensor_parallel != 1:
        return fallback, "tensor_parallel > 1 (a basis is not split over the ranks)"
    name = shipped_preset(model_spec(cfg.model_path))
    if name is None:
        return fallback, "no basis ships for this model"
    path, rank = SHIPPED_BASES[name]
    if not os.path.isfile(path):
        return fallback, f"the shipped basis {path} is missing"
    if cfg.token_basis:  # a basis of one's own for the model replaces the shipped one
        return {"block_score": TOKENS}, f"{name}: the basis given"
    return {"block_score": TOKENS, "token_basis": str(path), "token_rank": cfg.token_rank or rank}, f"{name} basis"


__all__ = ["AUTO", "SHIPPED_BASES", "model_spec", "resolve", "shipped_preset"]

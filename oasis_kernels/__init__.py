"""Triton kernels for OasisKV, one file per kernel, each with a plain-torch reference beside it.

| module | kernel |
| --- | --- |
| ``sparse_attn``    | decode attention over resident slots (per-head slot table), normal + draft query, GQA, split-K |
| ``block_score``    | Quest upper-bound score of every block of every KV head against the min/max summaries |
| ``summary_update`` | min/max of one block's keys written into the summary tensors |
| ``block_scorers``  | the other block scorers (``oasis_core.block_scorers``): their scores and their mean / std summaries |
| ``token_scorer``   | the per-token scorer (``--block-score tokens``): its block scores (two launches) and its writes |
| ``gather``         | host->GPU copy into slots: persistent direct-read (UVA) kernel; host-side staging + scatter |
| ``gather_tma``     | experimental: the direct-read gather with TMA tile loads (measured slower in the step; not used) |
| ``paged_attn``     | paged dense decode attention (dense baseline), split-K, GQA |
| ``ring_attn``      | a sliding-window layer's decode attention over its per-lane ring, read in place, split-K, GQA |
| ``splitk``         | the reduction that merges split-K partial results (shared by the attentions) |
| ``fused_ops``      | one-launch RMSNorm, residual add + RMSNorm, q/k norm + RoPE + v copy, SwiGLU (the decoder layer) |
| ``gemma_ops``      | Gemma 3's layer ops: (1 + w) RMSNorm, norm + residual add + norm, GELU-tanh x up (q/k: ``fused_ops``) |
| ``plan_select``    | Algorithm 2 (``oasis_core.selection.plan_step``) in place, sort-free, + the UVA copy list, per layer |
| ``kv_write``       | the decode step's new K/V of every (request, head) into its block, one launch for both |
| ``spec_repair``    | the speculative step's repair prediction (issue 40): filled block's score, merge_block, repair_pred |
| ``step_clock``     | the GPU's ``%globaltimer`` into a device tensor (the step time adaptive fetch caps read) |

Interpreter mode: ``triton.jit`` reads ``TRITON_INTERPRET`` when a function is *decorated*. That covers triton's own
``@jit`` helpers too (the combine functions behind ``tl.max``/``tl.min``/``tl.sum``, decorated when ``triton`` is
first imported), so the variable must be set before ``triton`` is imported anywhere in the process: a kernel
decorated under the interpreter that calls a compiled-mode helper fails with "Cannot call @triton.jit'd outside of
the scope of a kernel". This package sets it whenever CUDA is unavailable; any module that imports ``triton`` must
import ``oasis_kernels`` first. Set ``TRITON_INTERPRET=0`` explicitly to opt out. On a CUDA machine nothing changes.

Interpreter fixes (Triton 3.6, applied only when interpreting; the compiled path is untouched):
- with numpy >= 2.4, ``range(0, n)`` fails when ``n`` is a runtime scalar argument (``int()`` of a 1-element,
  1-d array);
- ``tl.dot`` on bfloat16 multiplies the raw uint16 bit patterns (bf16 is stored as uint16 there); the fix widens
  bf16 operands to fp32 first, exact for bf16 values.
"""

import os
import sys
import warnings


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is required by every kernel module anyway
        return False
    return torch.cuda.is_available()


if not _cuda_available() and "TRITON_INTERPRET" not in os.environ:
    if "triton" in sys.modules:
        warnings.warn(
            "triton was imported before oasis_kernels on a machine without CUDA: its own @jit helpers are "
            "compiled-mode, so interpreted kernels that reduce (tl.max, tl.sum) will fail; import oasis_kernels "
            "first or set TRITON_INTERPRET=1 in the environment",
            RuntimeWarning,
            stacklevel=2,
        )
    os.environ["TRITON_INTERPRET"] = "1"


def _fix_interpreter() -> None:
    import numpy as np
    from triton import language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_oasis_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._oasis_fixed = True
    interpreter._patch_lang_tensor = patched

    builder = interpreter.InterpreterBuilder
    dot = builder.create_dot

    def widen(h):
        if h.dtype.scalar == tl.bfloat16:
            f32 = (h.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(f32, tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot


if os.environ.get("TRITON_INTERPRET", "0") == "1":
    _fix_interpreter()


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (decided once, at package import)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"

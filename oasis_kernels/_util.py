"""Small helpers shared by the kernel wrappers: input checks and launch-shape arithmetic."""

from __future__ import annotations

import functools

import torch

HBM_ROOFLINE_GBPS = 4300.0  # measured HBM read rate on the H200 here (DESIGN.md), GB/s
H2D_ROOFLINE_GBPS = 55.3  # measured pinned host->GPU DMA rate on the H200 here, GB/s


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check(t: torch.Tensor, name: str, shape: tuple, dtype=None, device=None, inner_contiguous: int = 1):
    """Assert ``t`` has ``shape`` (None entries = any), ``dtype`` and ``device``, and that its last
    ``inner_contiguous`` dims are densely packed (row-major)."""
    assert isinstance(t, torch.Tensor), f"{name}: expected a tensor, got {type(t).__name__}"
    assert t.dim() == len(shape), f"{name}: expected {len(shape)} dims {shape}, got shape {tuple(t.shape)}"
    for i, (want, got) in enumerate(zip(shape, t.shape)):
        assert want is None or want == got, f"{name}: dim {i} must be {want}, got shape {tuple(t.shape)}"
    if dtype is not None:
        dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
        assert t.dtype in dtypes, f"{name}: dtype must be one of {dtypes}, got {t.dtype}"
    if device is not None:
        assert t.device == device, f"{name}: must be on {device}, got {t.device}"
    expect = 1
    for i in range(1, inner_contiguous + 1):
        if t.shape[-i] > 1:
            assert t.stride(-i) == expect, (
                f"{name}: last {inner_contiguous} dims must be contiguous, got strides {t.stride()} "
                f"for shape {tuple(t.shape)}"
            )
        expect *= t.shape[-i]


def default_n_split(rows: int, n_iters: int, device: torch.device, programs_per_sm: int = 4) -> int:
    """Split-K factor: enough programs for ``programs_per_sm`` per SM (several waves soften the tail), never more
    splits than the longest row has loop iterations."""
    return max(1, min(cdiv(programs_per_sm * num_sms(device), rows), max(1, n_iters)))


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 4  # interpreter: a few splits exercise the split-K path without slowing tests down


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
